"""CLIENT spans for load-generator requests, so the analysis can take ``network = client - server``.

Each request carries a W3C ``traceparent`` (``00-<trace id>-<span id>-01``); the span id is that of the
CLIENT span written here, so the service's SERVER span is its child in the same trace. Spans are named
``"{METHOD} {route}"``, carry ``stagescope.client=true`` and run from the actual send to the end of the
response, and say they were kept with probability 1 (tracestate ``ot=th:0``). They go to the exporter of :func:`stagescope.instrumentation.export.make_span_exporter`
(OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else the embedded JSON-lines sink).

Spans are built after the response is complete, from the recorded timestamps (measure, then publish),
and exported in batches off the sending path.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes import (
    error_attributes,
    http_attributes,
    server_attributes,
    url_attributes,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from stagescope.loadgen.results import RequestResult
from stagescope.names import ATTR_CLIENT, OT_THRESHOLD, SERVER_SPAN_NAME_FORMAT, TRACESTATE_OT

__all__ = [
    "LOADGEN_SERVICE_NAME",
    "ClientSpanWriter",
    "new_ids",
    "traceparent",
]

#: ``service.name`` of the load generator's spans.
LOADGEN_SERVICE_NAME = "stagescope-loadgen"
_SCOPE = InstrumentationScope("stagescope.loadgen", "0.1.0")
#: Every request's CLIENT span is written: kept with probability 1 (OpenTelemetry's ``ot=th:0``).
_KEPT_ALWAYS = TraceState([(TRACESTATE_OT, f"{OT_THRESHOLD}:0")])


def new_ids() -> tuple[str, str]:
    """A fresh (trace id, span id) pair: 32 and 16 lowercase hex digits, never all zero."""
    while True:
        trace_id = secrets.token_hex(16)
        span_id = secrets.token_hex(8)
        if int(trace_id, 16) and int(span_id, 16):
            return trace_id, span_id


def traceparent(trace_id: str, span_id: str) -> str:
    """The W3C ``traceparent`` header value for a sampled request."""
    return f"00-{trace_id}-{span_id}-01"


class ClientSpanWriter:
    """Turns finished :class:`RequestResult` rows into CLIENT spans and hands them to an exporter.

    ``exporter``: any OpenTelemetry ``SpanExporter``; by default the one
    ``make_span_exporter(spans_dir)`` returns. Call :meth:`write` with batches, then :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        *,
        spans_dir: str | os.PathLike[str] | None = None,
        exporter: SpanExporter | None = None,
        service_name: str | None = None,
        method: str = "POST",
    ) -> None:
        if exporter is None:
            from stagescope.instrumentation.export import make_span_exporter

            exporter = make_span_exporter(spans_dir)
        self.exporter = exporter
        self.method = method
        self.url = url.rstrip("/")
        parts = urlsplit(url)
        self._server: dict[str, str | int] = {
            server_attributes.SERVER_ADDRESS: parts.hostname or "",
            server_attributes.SERVER_PORT: parts.port or (443 if parts.scheme == "https" else 80),
        }
        # explicit argument, then OTEL_SERVICE_NAME, then "stagescope-loadgen"
        name = service_name or os.environ.get("OTEL_SERVICE_NAME") or LOADGEN_SERVICE_NAME
        self._resource = Resource.create({"service.name": name})

    def span(self, r: RequestResult) -> ReadableSpan | None:
        """The CLIENT span of one request, or ``None`` if it was never sent."""
        if r.sent_ns is None:
            return None
        end = r.end_ns if r.end_ns is not None else r.sent_ns
        attrs: dict[str, str | bool | int] = {
            ATTR_CLIENT: True,
            http_attributes.HTTP_REQUEST_METHOD: self.method,
            http_attributes.HTTP_ROUTE: r.route,
            url_attributes.URL_FULL: self.url + r.route,
            **self._server,
        }
        if r.status:
            attrs[http_attributes.HTTP_RESPONSE_STATUS_CODE] = r.status
        failed = r.error is not None or r.status == 0 or r.status >= 500
        if failed:
            attrs[error_attributes.ERROR_TYPE] = (
                str(r.status) if r.status else (r.error or "error").split(":")[0]
            )
        ctx = SpanContext(
            int(r.trace_id, 16), int(r.span_id, 16), is_remote=False, trace_flags=TraceFlags(1),
            trace_state=_KEPT_ALWAYS,
        )  # fmt: skip
        return ReadableSpan(
            name=SERVER_SPAN_NAME_FORMAT.format(method=self.method, route=r.route),
            context=ctx,
            parent=None,
            resource=self._resource,
            attributes=attrs,
            kind=SpanKind.CLIENT,
            status=Status(StatusCode.ERROR, r.error) if failed else Status(StatusCode.UNSET),
            start_time=r.sent_ns,
            end_time=end,
            instrumentation_scope=_SCOPE,
        )

    def write(self, results: Sequence[RequestResult], batch: int = 512) -> int:
        """Export the spans of ``results`` in batches; returns how many spans were handed over."""
        spans = [s for s in (self.span(r) for r in results) if s is not None]
        flush = getattr(self.exporter, "force_flush", None)
        pending = 0
        for i in range(0, len(spans), batch):
            chunk = spans[i : i + batch]
            self.exporter.export(chunk)
            pending += len(chunk)
            if flush is not None and pending >= 4096:  # let the bounded exporter queue drain
                flush(30_000)
                pending = 0
        return len(spans)

    def close(self) -> None:
        """Flush and shut the exporter down (the sink writes what it holds)."""
        flush = getattr(self.exporter, "force_flush", None)
        if flush is not None:
            flush(10_000)
        self.exporter.shutdown()
