"""Publish finished requests as OpenTelemetry spans, after the fact (measure, then publish).

The middleware measures a request into a :class:`TracedRecord` (a :class:`RequestRecord` that also
carries its trace ids, chosen at request start). When the request has finished and the sampling
policy keeps it, the record goes to the span thread (:mod:`stagescope.instrumentation.pipeline`),
which turns it into finished spans with a :class:`SpanBuilder` and hands them to an exporter or to a
tracer provider's span processors. No SDK span is ever created on the request path, and nothing is
built for requests that are not kept.

Spans per kept request: one SERVER span named ``"{METHOD} {route template}"`` (just ``METHOD`` when
no route matched, as opentelemetry-instrumentation-fastapi names it) with the same HTTP semantic
convention attributes that instrumentation gives (old names by default, new or both with
``OTEL_SEMCONV_STABILITY_OPT_IN=http`` / ``http/dup``), plus one INTERNAL child span per stage
interval named after the stage, with ``stagescope.stage`` (its name) and ``stagescope.stage.kind`` (its
kind). Times: the record's monotonic readings through ``to_wall_ns``.

**Query strings are not recorded by default.** A GET query can carry what a user typed (a prompt in
``?q=...``), and the rule is that no prompt or completion content is recorded unless asked for. So
``url.query`` is :data:`~stagescope.names.QUERY_REDACTED` and ``http.url`` ends ``?REDACTED`` when the
request had a query (``http.target`` and ``url.path`` are the path alone, as in the stock
instrumentation; the analysis groups by the route template, which has no query). With
``record_query=True`` (``instrument_app(record_query=True)`` or ``STAGESCOPE_RECORD_QUERY=1``) the query
is recorded as opentelemetry-instrumentation-asgi records it (credentials and the signature parameters
OTel's ``redact_url`` knows masked in ``http.url``).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from stagescope import __version__
from stagescope.instrumentation.otlp_json import encode_attributes
from stagescope.instrumentation.record import RequestRecord, to_wall_ns
from stagescope.instrumentation.tracestate import CallerState
from stagescope.names import (
    ATTR_BATCH_SIZE,
    ATTR_COLD_START,
    ATTR_ERROR_TYPE,
    ATTR_INPUT_HASH,
    ATTR_ITL_MAX,
    ATTR_ITL_MEAN,
    ATTR_ITL_P99,
    ATTR_MODEL,
    ATTR_QUEUE_DEPTH,
    ATTR_SAMPLED_REASON,
    ATTR_STAGE,
    ATTR_STAGE_KIND,
    ATTR_TOKEN_GAPS,
    ENV_RECORD_QUERY,
    GENAI_USAGE_INPUT_TOKENS,
    GENAI_USAGE_OUTPUT_TOKENS,
    HTTP_KNOWN_METHODS,
    QUERY_REDACTED,
    VLLM_ATTR_E2E,
    VLLM_ATTR_TTFT,
)
from stagescope.validate import parse_bool

__all__ = [
    "MAX_TOKEN_GAPS",
    "SpanBuilder",
    "TracedRecord",
    "http_server_attributes",
    "new_span_id",
    "new_trace_id",
    "resolve_record_query",
    "semconv_mode",
]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_STATUS_UNSET = Status(StatusCode.UNSET)
#: At most this many inter-token gaps are listed in ``stagescope.itl.gaps`` (the summary uses all).
MAX_TOKEN_GAPS = 4096
_KNOWN_METHODS = HTTP_KNOWN_METHODS

_getrandbits = random.getrandbits


def new_trace_id() -> int:
    """A random non-zero 128-bit trace id."""
    return _getrandbits(128) or 1


def new_span_id() -> int:
    """A random non-zero 64-bit span id."""
    return _getrandbits(64) or 1


class TracedRecord(RequestRecord):
    """A request record with its trace identity, chosen when the request arrived.

    ``trace_id``/``span_id``: this request's trace and server span (ints); ``parent_span_id``: the
    caller's span from ``traceparent`` (0 when none); ``parent_sampled``: the caller's sampled flag
    (``None`` without ``traceparent``); ``scope``: the ASGI scope (HTTP attributes are read from it
    only if the trace is kept; set to None when the request ends and its trace is not kept, so that a
    context copied during the request, as uvicorn's keep-alive timer holds one, does not keep the
    scope and all the app put in it alive); ``route_matched``: a route template matched. When another
    instrumentation's span is the request span (see :mod:`stagescope.instrumentation.otel_context`):
    ``live_span`` is it (until its attributes are set), ``live_sampled`` its sampled flag, and
    ``emit_server`` says whether stagescope still writes a server span with its identity;
    ``held_spans``: spans the request made that wait for its keep decision
    (``RequestBoundSpanProcessor``).
    """

    __slots__ = (
        "caller",
        "emit_server",
        "held_spans",
        "live_sampled",
        "live_span",
        "parent_sampled",
        "parent_span_id",
        "route_matched",
        "sampled_reason",
        "scope",
        "span_id",
        "trace_id",
        "trace_state",
    )

    trace_id: int
    span_id: int
    parent_span_id: int
    parent_sampled: bool | None
    scope: MutableMapping[str, Any] | None
    route_matched: bool
    sampled_reason: str | None
    trace_state: str | None  # W3C tracestate of the kept trace: its ``ot`` entry carries ``th``
    caller: CallerState | None  # the caller's tracestate, when one came with its traceparent
    live_span: Any  # another instrumentation's server span, when it is the request span
    live_sampled: bool
    emit_server: bool
    held_spans: list[ReadableSpan] | None

    @property
    def trace_id_hex(self) -> str:
        return format(self.trace_id, "032x")

    @property
    def traceparent(self) -> str:
        """W3C ``traceparent`` for calls this request makes downstream (joins them to its trace)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"


def semconv_mode() -> str:
    """``old`` (default), ``new`` or ``dup``, from ``OTEL_SEMCONV_STABILITY_OPT_IN`` as OTel reads it."""
    opt = {p.strip() for p in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}
    if "http/dup" in opt:
        return "dup"
    if "http" in opt:
        return "new"
    return "old"


def resolve_record_query(value: bool | None = None) -> bool:
    """Whether server spans record request query strings: ``value``, else ``$STAGESCOPE_RECORD_QUERY``
    (``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``), else False. Anything else raises
    ``ValueError`` naming the variable (``stagescope serve`` refuses it; ``instrument_app`` warns once and
    keeps query strings REDACTED: see lifecycle.env_or_fallback)."""
    if value is not None:
        if not isinstance(value, bool):
            raise ValueError(f"record_query must be True or False, got {value!r}")
        return value
    raw = os.environ.get(ENV_RECORD_QUERY, "")
    on = parse_bool(raw) if raw.strip() else False
    if on is not None:
        return on
    raise ValueError(f"environment variable {ENV_RECORD_QUERY}={raw!r} is not one of 1, true, yes, on, 0, false, no, off")


def _header(scope: MutableMapping[str, Any], name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() == name]


_UTIL: tuple[Callable[[str], str], Callable[[str | None], str | None]] | None = None
#: Query parameters OTel's ``redact_url`` masks; a URL without them (or credentials) is left as it is.
_REDACTED_PARAMS = ("AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature")


def _optional_util() -> tuple[Callable[[str], str], Callable[[str | None], str | None]]:
    global _UTIL
    if _UTIL is None:
        try:  # the same URL redaction and synthetic user-agent rule as OTel's HTTP instrumentations
            from opentelemetry.util.http import detect_synthetic_user_agent, redact_url

            _UTIL = redact_url, detect_synthetic_user_agent
        except ImportError:  # pragma: no cover - opentelemetry-util-http ships with the otel-fastapi extra
            _UTIL = (lambda u: u), (lambda ua: None)
    return _UTIL


def http_server_attributes(
    scope: MutableMapping[str, Any],
    route: str | None,
    status: int | None,
    mode: str,
    *,
    record_query: bool = False,
) -> dict[str, Any]:
    """The HTTP attributes opentelemetry-instrumentation-asgi puts on a server span, from the scope;
    without ``record_query`` a query string is recorded as :data:`~stagescope.names.QUERY_REDACTED`."""
    old, new = mode in ("old", "dup"), mode in ("new", "dup")
    redact_url, synthetic = _optional_util()
    out: dict[str, Any] = {}
    server = scope.get("server") or ("0.0.0.0", 80)
    port = server[1]
    server_host = server[0] + (":" + str(port) if str(port) != "80" else "")
    host_values = _header(scope, b"host")
    url_host = host_values[0] if host_values else server_host
    scheme = scope.get("scheme") or "http"
    path = scope.get("path") or ""
    qs_raw = scope.get("query_string") or b""
    query = qs_raw.decode("utf8") if isinstance(qs_raw, bytes) else str(qs_raw)
    if query and not record_query:
        query = QUERY_REDACTED
    url = scheme + "://" + url_host + path + ("?" + unquote(query) if query else "")
    if scope.get("scheme"):
        _put(out, old, new, "http.scheme", "url.scheme", scheme)
    if server_host:
        if old:
            out["http.host"] = server_host
        if new:
            out.setdefault("server.address", server_host)
    if port:
        with contextlib.suppress(TypeError, ValueError):
            _put(out, old, new, "net.host.port", "server.port", int(port))
    if scope.get("http_version"):
        _put(out, old, new, "http.flavor", "network.protocol.version", scope["http_version"])
    if path:
        if old:
            out["http.target"] = path
        if new:
            out["url.path"] = path
            if query:
                out["url.query"] = query
    if old:  # redact_url parses the URL twice: only pay that when there is something to redact
        needs = "@" in url_host or (query and any(q in query for q in _REDACTED_PARAMS))
        out["http.url"] = redact_url(url) if needs else url
    raw_method = (scope.get("method") or "").strip()
    if raw_method:
        method = raw_method.upper()
        method = method if method in _KNOWN_METHODS else "_OTHER"
        if new and raw_method != method:
            out["http.request.method_original"] = raw_method
        _put(out, old, new, "http.method", "http.request.method", method)
    if old and host_values:
        out["http.server_name"] = ",".join(host_values)
    ua = _header(scope, b"user-agent")
    if ua:
        _put(out, old, new, "http.user_agent", "user_agent.original", ua[0])
        kind = synthetic(ua[0])
        if kind:
            out["user_agent.synthetic.type"] = kind
    client = scope.get("client")
    if client:
        _put(out, old, new, "net.peer.ip", "client.address", client[0])
        with contextlib.suppress(TypeError, ValueError):
            _put(out, old, new, "net.peer.port", "client.port", int(client[1]))
    if route:
        out["http.route"] = route
    if status is not None:
        _put(out, old, new, "http.status_code", "http.response.status_code", status)
        if new and status >= 500:
            out[ATTR_ERROR_TYPE] = str(status)
    return out


def _put(out: dict[str, Any], old: bool, new: bool, old_key: str, new_key: str, value: Any) -> None:
    if old:
        out[old_key] = value
    if new:
        out[new_key] = value


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]  # nearest rank


class SpanBuilder:
    """Turns a finished :class:`TracedRecord` into spans (a server span and one span per stage)."""

    def __init__(
        self,
        resource: Resource,
        *,
        fold_model: Callable[[str], str] | None = None,
        semconv: str | None = None,
        record_query: bool = False,
    ) -> None:
        self.resource = resource
        self.scope = InstrumentationScope("stagescope", __version__)
        self.semconv = semconv or semconv_mode()
        self.record_query = record_query
        self._fold = fold_model or (lambda m: m)

    def stagescope_attributes(self, rec: TracedRecord) -> dict[str, Any]:
        """Server-span attributes that are stagescope's own (stage summary, model, tokens, stream)."""
        out: dict[str, Any] = {}
        if rec.sampled_reason is not None:
            out[ATTR_SAMPLED_REASON] = rec.sampled_reason
        if rec.model is not None:
            out[ATTR_MODEL] = self._fold(rec.model)
        if rec.batch_size is not None:
            out[ATTR_BATCH_SIZE] = rec.batch_size
        if rec.input_hash is not None:
            out[ATTR_INPUT_HASH] = rec.input_hash
        out[ATTR_COLD_START] = bool(rec.cold_start)
        if rec.queue_depth is not None:
            out[ATTR_QUEUE_DEPTH] = rec.queue_depth
        if rec.input_tokens is not None:
            out[GENAI_USAGE_INPUT_TOKENS] = rec.input_tokens
        if rec.output_tokens is not None:
            out[GENAI_USAGE_OUTPUT_TOKENS] = rec.output_tokens
        if rec.first_token_ns is not None:
            out[VLLM_ATTR_TTFT] = (rec.first_token_ns - rec.start_ns) / 1e9
            if rec.end_ns is not None:
                out[VLLM_ATTR_E2E] = (rec.end_ns - rec.start_ns) / 1e9
            gaps = rec.token_gaps_s()
            if gaps:
                out[ATTR_ITL_MEAN] = sum(gaps) / len(gaps)
                out[ATTR_ITL_P99] = _p99(gaps)
                out[ATTR_ITL_MAX] = max(gaps)
                out[ATTR_TOKEN_GAPS] = gaps[:MAX_TOKEN_GAPS]
        if rec.error_type is not None:
            out[ATTR_ERROR_TYPE] = rec.error_type
        if rec.attributes:
            out.update(rec.attributes)
        return out

    def _server_parts(self, rec: TracedRecord) -> tuple[str, dict[str, Any], bool]:
        """Name, attributes and failed flag of the server span."""
        method = (rec.method or "").upper()
        method = method if method in _KNOWN_METHODS else "HTTP"
        route = rec.route if rec.route_matched else None
        name = f"{method} {route}" if route else method
        attrs: dict[str, Any] = {}
        if rec.scope is not None:
            attrs = http_server_attributes(
                rec.scope, route, rec.status_code, self.semconv, record_query=self.record_query
            )
        http_error = attrs.get(ATTR_ERROR_TYPE)
        attrs.update(self.stagescope_attributes(rec))
        if http_error is not None:  # new HTTP semconv: the status code wins, as in the stock instrumentor
            attrs[ATTR_ERROR_TYPE] = http_error
        failed = rec.error_type is not None or (rec.status_code or 0) >= 500
        return name, attrs, failed

    def server_span(self, rec: TracedRecord, ts: TraceState | None = None) -> ReadableSpan:
        name, attrs, failed = self._server_parts(rec)
        status = Status(StatusCode.ERROR, rec.error_type) if failed else _STATUS_UNSET
        parent = None
        if rec.parent_span_id:
            flags = _SAMPLED if rec.parent_sampled else TraceFlags(0)
            parent = SpanContext(rec.trace_id, rec.parent_span_id, is_remote=True, trace_flags=flags)
        end_ns = rec.end_ns if rec.end_ns is not None else rec.start_ns
        return ReadableSpan(
            name=name,
            context=SpanContext(
                rec.trace_id, rec.span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=ts
            ),
            parent=parent,
            resource=self.resource,
            attributes=attrs,
            kind=SpanKind.SERVER,
            status=status,
            start_time=to_wall_ns(rec.start_ns),
            end_time=to_wall_ns(end_ns),
            instrumentation_scope=self.scope,
        )

    def stage_spans(self, rec: TracedRecord, ts: TraceState | None = None) -> list[ReadableSpan]:
        parent = SpanContext(rec.trace_id, rec.span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=ts)
        out = []
        for iv in list(rec.stages):
            out.append(
                ReadableSpan(
                    name=iv.stage,
                    context=SpanContext(
                        rec.trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED, trace_state=ts
                    ),
                    parent=parent,
                    resource=self.resource,
                    attributes={ATTR_STAGE: iv.stage, ATTR_STAGE_KIND: iv.stage_kind},
                    kind=SpanKind.INTERNAL,
                    start_time=to_wall_ns(iv.start_ns),
                    end_time=to_wall_ns(iv.end_ns),
                    instrumentation_scope=self.scope,
                )
            )
        return out

    def otlp_spans(self, rec: TracedRecord, *, server: bool = True) -> list[dict[str, Any]]:
        """The same spans as :meth:`build`, straight to OTLP/JSON span objects (what the sink writes;
        about 4x cheaper than building ReadableSpans and encoding them)."""
        trace_hex = f"{rec.trace_id:032x}"
        server_hex = f"{rec.span_id:016x}"
        out: list[dict[str, Any]] = []
        ts = rec.trace_state
        if server:
            name, attrs, failed = self._server_parts(rec)
            span: dict[str, Any] = {"traceId": trace_hex, "spanId": server_hex}
            if ts:
                span["traceState"] = ts
            if rec.parent_span_id:
                span["parentSpanId"] = f"{rec.parent_span_id:016x}"
            span["flags"] = 0x301 if rec.parent_span_id else 0x101  # sampled | has-is-remote (| remote)
            span["name"] = name
            span["kind"] = 2  # SERVER
            span["startTimeUnixNano"] = str(to_wall_ns(rec.start_ns))
            end_ns = rec.end_ns if rec.end_ns is not None else rec.start_ns
            span["endTimeUnixNano"] = str(to_wall_ns(end_ns))
            if attrs:
                span["attributes"] = encode_attributes(attrs)
            if failed:
                span["status"] = {"code": 2, "message": rec.error_type} if rec.error_type else {"code": 2}
            else:
                span["status"] = {}
            out.append(span)
        for iv in list(rec.stages):
            stage: dict[str, Any] = {"traceId": trace_hex, "spanId": f"{new_span_id():016x}"}
            if ts:
                stage["traceState"] = ts
            out.append(
                stage
                | {
                    "parentSpanId": server_hex,
                    "flags": 0x101,
                    "name": iv.stage,
                    "kind": 1,  # INTERNAL
                    "startTimeUnixNano": str(to_wall_ns(iv.start_ns)),
                    "endTimeUnixNano": str(to_wall_ns(iv.end_ns)),
                    "attributes": [
                        {"key": ATTR_STAGE, "value": {"stringValue": iv.stage}},
                        {"key": ATTR_STAGE_KIND, "value": {"stringValue": iv.stage_kind}},
                    ],
                    "status": {},
                }
            )
        return out

    def build(self, rec: TracedRecord, *, server: bool = True) -> list[ReadableSpan]:
        """All spans of one request; ``server=False`` when another library owns the server span."""
        ts = _trace_state(rec.trace_state)
        spans = self.stage_spans(rec, ts)
        if server:
            spans.insert(0, self.server_span(rec, ts))
        return spans


def _trace_state(header: str | None) -> TraceState | None:
    """The SDK TraceState of a tracestate header value (None when there is none or it is invalid)."""
    if not header:
        return None
    ts = TraceState.from_header([header])
    return ts if len(ts) else None
