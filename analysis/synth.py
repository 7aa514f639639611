"""Low-level writer of synthetic OTLP/JSON trace lines (for tests, scenarios and benchmarks).

The output is exactly what the OpenTelemetry collector's ``file`` exporter and stagescope's embedded
sink write: one ``ExportTraceServiceRequest`` per line, ids as lowercase hex, 64-bit integers
(timestamps in **Unix nanoseconds**, ``intValue``) as decimal strings, ``kind`` as the integer enum.

This module knows nothing about scenarios: callers build :class:`SynthSpan` values (see
:func:`request_spans` for the common "server span + one child per stage" shape) and hand them to
:func:`write_otlp_lines`.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from stagescope.names import ATTR_CLIENT, ATTR_STAGE, ATTR_STAGE_KIND, STAGE_KINDS

__all__ = [
    "KIND_CLIENT",
    "KIND_INTERNAL",
    "KIND_SERVER",
    "SynthSpan",
    "otlp_attributes",
    "request_spans",
    "write_otlp_lines",
]

KIND_INTERNAL = 1
KIND_SERVER = 2
KIND_CLIENT = 3

AttrValue = str | bool | int | float | Sequence[float] | Sequence[int] | Sequence[str]


@dataclass
class SynthSpan:
    """One span. Times in Unix nanoseconds; ids lowercase hex (32 / 16 digits)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    parent_span_id: str = ""
    kind: int = KIND_INTERNAL
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    status_code: int = 0  # OTLP status: 0 unset, 1 ok, 2 error
    service: str = "synthetic-service"  # resource service.name
    events: Sequence[tuple[str, int]] = ()  # (name, Unix ns) span events
    scope: str = "stagescope.synth"  # instrumentation scope name


def _value(v: AttrValue) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    return {"arrayValue": {"values": [_value(x) for x in v]}}


def otlp_attributes(attrs: Mapping[str, AttrValue]) -> list[dict[str, Any]]:
    """OTLP/JSON ``KeyValue`` list for a mapping (bool, int, float, str or a list of them)."""
    return [{"key": k, "value": _value(v)} for k, v in attrs.items()]


def _span_json(s: SynthSpan) -> dict[str, Any]:
    d: dict[str, Any] = {
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns),
        "attributes": otlp_attributes(s.attributes),
        "status": {"code": s.status_code} if s.status_code else {},
    }
    if s.parent_span_id:
        d["parentSpanId"] = s.parent_span_id
    if s.events:
        d["events"] = [{"timeUnixNano": str(ns), "name": name} for name, ns in s.events]
    return d


def _export_request(spans: Sequence[SynthSpan]) -> dict[str, Any]:
    by_service: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in spans:
        by_service.setdefault((s.service, s.scope), []).append(_span_json(s))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": otlp_attributes({"service.name": svc})},
                "scopeSpans": [{"scope": {"name": scope}, "spans": js}],
            }
            for (svc, scope), js in by_service.items()
        ]
    }


def _chunks(spans: Iterable[SynthSpan], n: int) -> Iterator[list[SynthSpan]]:
    buf: list[SynthSpan] = []
    for s in spans:
        buf.append(s)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf


def write_otlp_lines(
    path: str | Path | IO[bytes],
    spans: Iterable[SynthSpan],
    *,
    spans_per_line: int = 512,
    compress: bool | None = None,
) -> int:
    """Write ``spans`` as OTLP/JSON lines (``spans_per_line`` spans per export request).

    ``path`` may be an open binary file. ``compress`` defaults to ``path`` ending in ``.gz``.
    Returns the number of spans written.
    """
    if not isinstance(path, str | os.PathLike):
        return _write(path, spans, spans_per_line)
    p = Path(path)
    if compress is None:
        compress = p.suffix == ".gz"
    if compress:
        with gzip.open(p, "wb", compresslevel=3) as gz:
            return _write(gz, spans, spans_per_line)
    with open(p, "wb") as f:
        return _write(f, spans, spans_per_line)


def _write(f: IO[bytes] | gzip.GzipFile, spans: Iterable[SynthSpan], spans_per_line: int) -> int:
    n = 0
    for chunk in _chunks(spans, max(1, spans_per_line)):
        f.write(orjson.dumps(_export_request(chunk)))
        f.write(b"\n")
        n += len(chunk)
    return n


def request_spans(
    trace_id: str,
    start_ns: int,
    stages: Sequence[tuple[str, float, float] | tuple[str, float, float, str | None]],
    *,
    duration_ms: float | None = None,
    name: str = "POST /v1/predict",
    route: str = "/v1/predict",
    status: int = 200,
    attributes: Mapping[str, AttrValue] | None = None,
    client_ms: float | None = None,
    service: str = "synthetic-service",
) -> list[SynthSpan]:
    """One request as stagescope emits it: a SERVER span and one child span per stage.

    ``stages`` holds ``(stage, offset_ms, duration_ms)`` relative to ``start_ns``, or ``(stage,
    offset_ms, duration_ms, kind)``: the ``stagescope.stage.kind`` attribute (default: the built-in
    stage's kind, none for other names; None: no kind attribute). ``duration_ms``
    defaults to the end of the last stage. With ``client_ms`` a load-generator CLIENT span
    (``stagescope.client=true``) becomes the root, starting half the network time earlier.
    """
    root_id = trace_id[:16]
    end_ms = max((st[1] + st[2] for st in stages), default=0.0)
    dur_ms = end_ms if duration_ms is None else duration_ms
    attrs: dict[str, AttrValue] = {"http.route": route, "http.response.status_code": status}
    attrs.update(attributes or {})
    out = []
    parent = ""
    if client_ms is not None:
        parent = f"{int(root_id, 16) ^ 0xC11E:016x}"
        lead = int((client_ms - dur_ms) * 1e6 / 2)
        out.append(
            SynthSpan(trace_id, parent, name, start_ns - lead, start_ns - lead + int(client_ms * 1e6),
                      kind=KIND_CLIENT, attributes={ATTR_CLIENT: True}, service="loadgen")
        )  # fmt: skip
    out.append(
        SynthSpan(trace_id, root_id, name, start_ns, start_ns + int(dur_ms * 1e6), parent, KIND_SERVER,
                  attrs, 2 if status >= 500 else 0, service)
    )  # fmt: skip
    for i, st in enumerate(stages):
        stage, off_ms, d_ms = st[0], st[1], st[2]
        kind = st[3] if len(st) > 3 else STAGE_KINDS.get(stage)
        stage_attrs: dict[str, AttrValue] = {ATTR_STAGE: stage}
        if kind is not None:
            stage_attrs[ATTR_STAGE_KIND] = kind
        s0 = start_ns + int(off_ms * 1e6)
        out.append(
            SynthSpan(trace_id, f"{int(root_id, 16) ^ (i + 1):016x}", stage, s0, s0 + int(d_ms * 1e6),
                      root_id, KIND_INTERNAL, stage_attrs, 0, service)
        )  # fmt: skip
    return out
