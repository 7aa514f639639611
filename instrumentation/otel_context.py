"""Living with the OpenTelemetry a service already runs: which span is the request's, and its context.

**One SERVER span per request**, whatever else the process runs. When stagescope's middleware is
reached with a *local* span current, an instrumentation outside it opened that span for this
request: FastAPI's own tracing (FastAPI 0.142 and later, once a global TracerProvider is configured
or ``FastAPI(telemetry={"tracer_provider": ...})`` is passed; ``FastAPI(telemetry={"tracing":
False})`` turns it off), opentelemetry-instrumentation-fastapi (``otel-fastapi`` mode, or
``opentelemetry-instrument``; FastAPI then turns its own tracing off), Starlette's or the ASGI
``OpenTelemetryMiddleware``. If that span is a SERVER span, or a span its sampler dropped (whose kind
cannot be seen), it **is** the request span (:func:`join_live_span`): the record takes its trace id,
span id and parent, stagescope's attributes are set on it before it ends and the stage spans are its
children. stagescope still writes a SERVER span with that same identity to its own destination,
unless the live span goes there anyway (it was made by the tracer provider stagescope delivers to,
and is sampled): each destination then holds the request span once, and a reader given both sees one
span id twice, which ``stagescope analyze`` counts once. A recording local span of another kind (a
user's INTERNAL span around the app) is the *parent* of stagescope's request span.

Otherwise (FastAPI before 0.142, its tracing off, no provider configured) stagescope's own SERVER
span, built after the request ended, is the request span. For the request's duration the middleware
makes current an OpenTelemetry context holding a ``NonRecordingSpan`` with the request's ids
(:func:`request_context`; sampled, as ``current_request().traceparent`` says, because stagescope
decides at the end), so spans made inside the handler with ``trace.get_tracer(...)`` are children of
the request span, and OTel-instrumented clients propagate the request's trace.

:class:`RequestBoundSpanProcessor` is what stagescope's own tracer provider (``handle.tracer_provider``
in fast mode) runs: the spans a request makes wait on its record and are exported only if the
request keeps its trace, so a user who routes their spans there
(``trace.set_tracer_provider(handle.tracer_provider)``) gets whole traces and no orphans.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from stagescope.instrumentation.record import _current

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span, TracerProvider

    from stagescope.instrumentation.tracing import TracedRecord

__all__ = [
    "SPAN_KEY",
    "RequestBoundSpanProcessor",
    "attach_context",
    "attach_request_context",
    "current_context",
    "detach_request_context",
    "global_sdk_provider",
    "is_otel_server_middleware",
    "join_live_span",
    "request_context",
    "request_span",
    "reset_context",
    "set_context",
    "span_processor_of",
]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_attach = otel_context.attach
_Context = otel_context.Context
#: the context key trace.set_span_in_context uses, learnt through the public API once
(_SPAN_KEY,) = trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context()).keys()
SPAN_KEY: str = _SPAN_KEY


def _runtime_context_var() -> ContextVar[otel_context.Context] | None:
    """The ContextVar that holds OpenTelemetry's current Context when the runtime context is the API's
    default one (``ContextVarsRuntimeContext``, whose ``attach``/``get_current``/``detach`` are that
    variable's ``set``/``get``/``reset``); None for any other (``OTEL_PYTHON_CONTEXT``), which is then
    only reached through the public functions."""
    try:
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    except ImportError:  # pragma: no cover - every opentelemetry-api 1.x has it
        return None
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(var, ContextVar):
        return var
    return None


_VAR = _runtime_context_var()
#: The current OpenTelemetry Context: ``opentelemetry.context.get_current()``, as one C call (the
#: variable's ``get``) under the default runtime context. Per request, the middleware reads it once
#: to see whether another instrumentation's span is current and to build the request's context.
current_context: Callable[[], otel_context.Context] = _VAR.get if _VAR is not None else otel_context.get_current
_set = _VAR.set if _VAR is not None else None
#: ``opentelemetry.context.attach`` and ``detach`` as the variable's own ``set`` and ``reset`` under the
#: default runtime context: for a context switched out and back in the same task (the last send),
#: where the token is sure to be this context's
set_context: Callable[[Any], Any] = _VAR.set if _VAR is not None else otel_context.attach
reset_context: Callable[[Any], Any] = _VAR.reset if _VAR is not None else otel_context.detach

#: Classes whose instances open a SERVER span per request (module, name), as FastAPI itself tells
#: opentelemetry-instrumentation-asgi's middleware apart (fastapi/telemetry/_asgi.py ``_legacy_otel``).
_SERVER_SPAN_MIDDLEWARE = frozenset(
    {
        ("opentelemetry.instrumentation.asgi", "OpenTelemetryMiddleware"),
        ("starlette.middleware.opentelemetry", "OpenTelemetryMiddleware"),
    }
)


def is_otel_server_middleware(cls: object) -> bool:
    """True for an ASGI middleware class that opens an OpenTelemetry SERVER span per request."""
    return (getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")) in _SERVER_SPAN_MIDDLEWARE


def global_sdk_provider() -> TracerProvider | None:
    """The SDK TracerProvider registered with ``trace.set_tracer_provider``, or None (none yet, or a
    provider that is not the SDK's, whose span processors stagescope cannot hand spans to)."""
    provider = trace.get_tracer_provider()
    return provider if hasattr(provider, "_active_span_processor") else None  # type: ignore[return-value]


def span_processor_of(obj: Any) -> Any:
    """The span processor an SDK provider or SDK span exports through (None for anything else)."""
    return getattr(obj, "_active_span_processor", None) or getattr(obj, "_span_processor", None)


class _RequestSpan(NonRecordingSpan):
    """The request's span in the OpenTelemetry context: a NonRecordingSpan whose SpanContext (the
    record's ids, sampled) is built when something first asks for it, not on every request."""

    def __init__(self, rec: TracedRecord) -> None:  # no super().__init__: the context comes later
        # the ids, not the record: a Context copied during the request (uvicorn's keep-alive timer,
        # created in the last send, holds one for up to 5 s) then keeps two ints alive, not the record
        self._trace_id = rec.trace_id
        self._span_id = rec.span_id
        self._context: SpanContext | None = None  # type: ignore[assignment]

    def get_span_context(self) -> SpanContext:
        ctx = self._context
        if ctx is None:
            ctx = self._context = SpanContext(self._trace_id, self._span_id, False, _SAMPLED)
        return ctx


_new_span = object.__new__


def request_span(rec: TracedRecord) -> _RequestSpan:
    """``_RequestSpan(rec)`` written out: ``object.__new__`` and its three attributes, without the
    class call's ``__init__`` (the middleware makes one per request)."""
    span = _new_span(_RequestSpan)
    span._trace_id = rec.trace_id
    span._span_id = rec.span_id
    span._context = None
    return span


def attach_request_context(rec: TracedRecord, current: otel_context.Context) -> object:
    """Attach a context whose current span is the request's (a NonRecordingSpan; the other values of
    ``current``, the Context current now, are kept), as ``opentelemetry.context.attach`` does; returns
    the token for :func:`detach_request_context`. Under a microsecond on an idle core
    (benchmarks/overhead.py prints it). The middleware runs the same steps inline."""
    span = request_span(rec)
    ctx = _Context({**current, _SPAN_KEY: span}) if current else _Context({_SPAN_KEY: span})
    return _set(ctx) if _set is not None else _attach(ctx)


def attach_context(ctx: otel_context.Context) -> object:
    """``opentelemetry.context.attach(ctx)`` (the variable's ``set`` under the default runtime context)."""
    return _set(ctx) if _set is not None else _attach(ctx)


def detach_request_context(token: object) -> None:
    """``opentelemetry.context.detach(token)``: the variable's ``reset`` under the default runtime
    context; a token that cannot be reset goes to the public ``detach``, which logs the failure."""
    if _VAR is not None:
        try:
            _VAR.reset(token)  # type: ignore[arg-type]
            return
        except Exception:  # the public detach below logs it
            pass
    otel_context.detach(token)  # type: ignore[arg-type]


def request_context(rec: TracedRecord) -> object:
    """:func:`attach_request_context` with the Context current now."""
    return attach_request_context(rec, current_context())


def join_live_span(
    rec: TracedRecord,
    span: Any,
    ctx: SpanContext,
    header: tuple[int, int, bool] | None,
    destination: Any,
) -> bool:
    """Make ``span`` (current, local, valid ``ctx``) the request span of ``rec`` if it is one; False when
    it is another kind of span (then it is only the parent). ``header``: the request's parsed
    ``traceparent`` (the parent of a span that does not say its own); ``destination``: the span
    processor stagescope's spans go to (that of its own provider when it has one)."""
    recording = span.is_recording()
    if recording and getattr(span, "kind", SpanKind.SERVER) != SpanKind.SERVER:
        return False
    rec.trace_id, rec.span_id = ctx.trace_id, ctx.span_id
    rec.live_span = span
    rec.live_sampled = bool(ctx.trace_flags.sampled)
    parent = getattr(span, "parent", None)  # SDK spans know their parent; a dropped span does not
    if isinstance(parent, SpanContext) and parent.is_valid:
        rec.parent_span_id, rec.parent_sampled = parent.span_id, bool(parent.trace_flags.sampled)
    elif header is not None and header[0] == ctx.trace_id:
        rec.parent_span_id, rec.parent_sampled = header[1], header[2]
    else:
        rec.parent_span_id, rec.parent_sampled = 0, None
    # the live span reaches stagescope's destination by itself only if that provider made and samples it
    goes_there = destination is not None and span_processor_of(span) is destination
    rec.emit_server = not (recording and rec.live_sampled and goes_there)
    return True


class RequestBoundSpanProcessor(SpanProcessor):
    """Hold each span a request makes until the request's keep decision, then pass it on or drop it.

    A span that ends while a stagescope request is current in the same trace waits on that request's
    record; the span pipeline exports the waiting spans with the request's own when the request keeps
    its trace, and they are dropped with it otherwise (sampled out, as the request is). A span ending
    after the decision (a background task, FastAPI's own server span) follows it at once. Spans outside
    any request go straight to ``downstream``.
    """

    def __init__(self, downstream: SpanProcessor) -> None:
        self.downstream = downstream

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self.downstream.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        rec = _current.get()
        ctx = span.context
        if rec is None or ctx is None or getattr(rec, "trace_id", None) != ctx.trace_id:
            self.downstream.on_end(span)
            return
        if rec.end_ns is None:
            held = rec.held_spans  # type: ignore[attr-defined]
            if held is None:
                rec.held_spans = [span]  # type: ignore[attr-defined]
            else:
                held.append(span)
        elif rec.sampled_reason is not None:  # type: ignore[attr-defined]
            self.downstream.on_end(span)

    def shutdown(self) -> None:
        self.downstream.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.downstream.force_flush(timeout_millis)
