"""Which reader reads a trace file: ONE function (:func:`detect`) that asks each reader in turn.

A reader is one foreign format. It says from a file's first bytes whether the file is its own
(``claims``), and reads its files into the flat ``spans`` table (``load``); every reader turns its
input into the same table, and the pinned relations (requests, stages, token gaps) are derived from
it (:mod:`~stagescope.analysis.ingest.derive`). Each names the upstream file whose shape it follows
(``upstream``). Readers are asked in the order of :data:`READERS`, the way ``prometheus_client``'s
parser or OpenTelemetry's propagators are chosen; a new format is a new module and one line here.

Conventions that other servers follow *inside* OTLP spans (Triton's OpenTelemetry mode keeps its
timestamps in span events) are not file formats: they run over the spans every reader produced
(:data:`SPAN_CONVENTIONS`), whichever format carried them (OTLP, Jaeger, Zipkin).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from stagescope.analysis.ingest.files import SniffedFile
    from stagescope.analysis.ingest.traces import TraceLoader

__all__ = ["READERS", "SPAN_CONVENTIONS", "Head", "Reader", "detect", "known_formats"]


@dataclass(frozen=True)
class Head:
    """What detection sees of a file: its first 256 KiB (decompressed, leading whitespace removed)
    and whether it holds one JSON value per line."""

    path: Path
    text: bytes
    lines: bool

    @property
    def window(self) -> bytes:
        """The first 8 KiB, where every format shows its keys."""
        return self.text[:8192]


class Reader(Protocol):
    """One trace format."""

    #: short name, in the per-file summaries (``FileSummary.kind``)
    kind: str
    #: what it is, for messages
    title: str
    #: the upstream file (repository and path) whose shape the reader follows
    upstream: str

    def claims(self, head: Head) -> bool:
        """Whether the file is in this format (from its first bytes only)."""
        ...

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        """Insert the files' spans into ``loader.con``'s ``spans`` (bad input through ``loader.bad``)."""
        ...

    def kind_of(self, path: Path) -> str:
        """The kind a claimed file gets (``kind``, or a variant the file name tells)."""
        ...


class _Reader:
    kind = ""

    def kind_of(self, path: Path) -> str:
        return self.kind


_SINK_NAME = re.compile(r"spans-\d+-\d+\.jsonl(\.gz)?$")
_V3_RESULT = re.compile(rb'^\{\s*"result"\s*:')
_V3_ERROR = re.compile(rb'^\{\s*"error"\s*:\s*\{')
_TRITON = re.compile(rb'^\[\s*\{\s*"id"\s*:\s*\d+\s*,\s*"(model_name|timestamps|activity)"\s*:')
_ZIPKIN = re.compile(rb"^\[\s*(\[\s*)?\{")


class OtlpOther(_Reader):
    kind = "otlp"
    title = "OTLP logs or metrics"
    upstream = "open-telemetry/opentelemetry-proto opentelemetry/proto/collector/{logs,metrics}/v1/*.proto"

    def claims(self, head: Head) -> bool:
        w = head.window
        return b'"resourceSpans"' not in w and (b'"resourceLogs"' in w or b'"resourceMetrics"' in w)

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        from stagescope.analysis.ingest.traces import FileSummary

        for f in files:
            loader.files.append(FileSummary(str(f.path), self.kind, note="OTLP logs/metrics, no spans"))
            loader.warnings.append(f"{f.path}: OTLP logs or metrics, not traces: nothing read from it")


class JaegerApiV3(_Reader):
    """Jaeger v2's query API (``/api/v3/traces``, ``/api/v3/traces/{id}``): OTLP/JSON under ``result``,
    one document (jaegertracing/jaeger cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/
    http_gateway.go ``returnTraces`` combines the traces into one ``GRPCGatewayWrapper``) or one
    per line (Jaeger 1.x's grpc-gateway streamed them). An ``{"error": {...}}`` answer
    (``GRPCGatewayError``: ``httpCode``, ``message``) is reported as such."""

    kind = "jaeger-v3"
    title = "Jaeger query API v3 (OTLP under result)"
    upstream = "jaegertracing/jaeger cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/http_gateway.go"

    def claims(self, head: Head) -> bool:
        return bool(
            _V3_RESULT.match(head.text) or (_V3_ERROR.match(head.text) and b'"message"' in head.window)
        )

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        from stagescope.analysis.ingest.check import Problem, api_error

        ok = []
        for f in files:
            err = api_error(f.path) if _V3_ERROR.match(f.head) else None
            if err is not None:
                loader.bad(f.path, [Problem(1, err)], self.kind)
            else:
                ok.append(f)
        loader.load_otlp(ok, wrapper="result")


class Otlp(_Reader):
    kind = "otlp"
    title = "OTLP/JSON"
    upstream = "open-telemetry/opentelemetry-proto opentelemetry/proto/collector/trace/v1/trace_service.proto"

    def claims(self, head: Head) -> bool:
        return b'"resourceSpans"' in head.window

    def kind_of(self, path: Path) -> str:
        return "sink" if _SINK_NAME.search(path.name) else self.kind

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        loader.load_otlp(files)


class TritonTraceFile(_Reader):
    kind = "triton-trace"
    title = "Triton trace file"
    upstream = "triton-inference-server/server src/tracer.cc"

    def claims(self, head: Head) -> bool:
        return bool(_TRITON.match(head.text))

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        from stagescope.analysis.ingest.triton_file import load_triton_files

        load_triton_files(loader, files)


class Zipkin(_Reader):
    kind = "zipkin"
    title = "Zipkin v2 JSON"
    upstream = "openzipkin/zipkin-api zipkin2-api.yaml"

    def claims(self, head: Head) -> bool:
        w = head.window
        return bool(_ZIPKIN.match(head.text)) and b'"traceId"' in w and b'"traceID"' not in w

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        from stagescope.analysis.ingest.zipkin import load_zipkin_files

        load_zipkin_files(loader, files)


class Jaeger(_Reader):
    kind = "jaeger"
    title = "Jaeger JSON (query API v1/v2 or UI export)"
    upstream = "jaegertracing/jaeger model/json/model.go"

    def claims(self, head: Head) -> bool:
        w = head.window
        return b'"traceID"' in w or (head.text[:1] == b"{" and b'"data"' in w)

    def load(self, loader: TraceLoader, files: list[SniffedFile]) -> None:
        from stagescope.analysis.ingest.jaeger import load_jaeger_files

        load_jaeger_files(loader, files)


#: The trace readers, asked in this order (the more specific shapes first).
READERS: tuple[Reader, ...] = (OtlpOther(), JaegerApiV3(), Otlp(), TritonTraceFile(), Zipkin(), Jaeger())


def detect(head: Head) -> Reader | None:
    """The first reader of :data:`READERS` that claims the file, or None (a shape no reader knows)."""
    for reader in READERS:
        if reader.claims(head):
            return reader
    return None


def known_formats() -> str:
    """The formats the readers read, for the message about a file none of them claims."""
    return ", ".join(r.title for r in READERS if r.kind != "otlp" or r.title == "OTLP/JSON")


def _triton_otel(loader: TraceLoader) -> None:
    from stagescope.analysis.ingest.triton_otel import apply

    apply(loader)


#: Passes over the loaded ``spans`` that read a server's convention inside standard spans.
SPAN_CONVENTIONS: tuple[Callable[[TraceLoader], None], ...] = (_triton_otel,)
