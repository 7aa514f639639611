"""The pure-ASGI middleware that measures every HTTP request into a :class:`TracedRecord`.

Per request, on the hot path, it only: resolves the route *template* (first full Starlette match,
cached per method and path, :data:`~stagescope.names.UNMATCHED_ROUTE` when nothing matches, so
labels stay bounded); reads the caller's W3C ``traceparent`` (the request joins that trace) or draws
a new trace id, so the trace id is known from the start (exemplars, propagation via
``current_request().traceparent``); opens the record and makes it current (``stagescope.stage`` and
the batcher write into it); and wraps ``send`` to read the status and to notice the last body chunk
(``more_body`` false). The record ends there, so a streamed response's record covers the whole
stream. Then the publishers run: StageMetrics observes it (every request), the sampling policy
decides whether its trace is kept, and a kept record is queued for the span thread (tracing.py).

Responses with status 429 are counted as shed. An exception from the app ends the record with
``error.type`` and status 500 and is re-raised. A client that leaves before its answer is complete
(mid-upload, while the app works, mid-stream; see :mod:`~stagescope.instrumentation.disconnect`) ends
the record with status 499 (``status_class="client_closed"``), not a server error; the exception that
only says so (Starlette's ``ClientDisconnect``, a reset connection) is not re-raised, so the server
logs no traceback: one line a minute says it happened. Nothing the telemetry does can fail a request:
every publisher call and user hook is wrapped, and a failure is logged once and then only counted.

**Graceful stop.** The middleware also sees the ASGI ``lifespan`` scope: when the app has finished its
own shutdown (it sends ``lifespan.shutdown.complete`` or ``.failed``), ``MiddlewareState.on_shutdown``
drains the span pipeline and the exporter (bounded by the shutdown timeout, in a worker thread so the
loop stays responsive) before the server hears that shutdown is complete. That is what makes a
SIGTERM under uvicorn or gunicorn lose nothing (see :mod:`stagescope.instrumentation.lifecycle`).

When another instrumentation's span is current as the request comes in (the stock instrumentor in
``otel-fastapi`` mode, FastAPI's own tracing, ``opentelemetry-instrument``), that span is the request
span: this middleware takes its ids, puts stagescope's attributes on it before it ends and emits the
stage spans under it. Otherwise stagescope's own span is the request span, and an OpenTelemetry
context holding its ids is current while the request runs, so the handler's own spans are its
children (rules in :mod:`stagescope.instrumentation.otel_context`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span

from stagescope.instrumentation.disconnect import ClientWatch, is_disconnect_error, log_client_closed
from stagescope.instrumentation.otel_context import (
    SPAN_KEY,
    _Context,
    _RequestSpan,
    current_context,
    detach_request_context,
    join_live_span,
    reset_context,
    set_context,
)
from stagescope.instrumentation.pipeline import SpanPipeline
from stagescope.instrumentation.record import _current, now_ns
from stagescope.instrumentation.routes import RouteResolver
from stagescope.instrumentation.sampling import REASON_BASELINE, SamplingPolicy
from stagescope.instrumentation.serversend import server_send_only
from stagescope.instrumentation.tracestate import parse_traceparent, parse_tracestate
from stagescope.instrumentation.tracing import SpanBuilder, TracedRecord, new_span_id
from stagescope.names import STATUS_CODE_CLIENT_CLOSED, UNMATCHED_ROUTE

__all__ = ["MiddlewareState", "RouteResolver", "StagescopeMiddleware", "parse_traceparent"]

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The request headers the middleware reads (trace context; whether a body may follow).
_READ_HEADERS = frozenset({b"traceparent", b"tracestate", b"content-length", b"transfer-encoding", b"expect"})
_getrandbits = random.getrandbits
_HTTP_ROUTE = "http.route"
_new_record = object.__new__
_new_span = object.__new__


RecordHook = Callable[[TracedRecord], None]


@dataclass(slots=True)
class MiddlewareState:
    """What the middleware publishes to; shared by every request (built by ``instrument_app``)."""

    resolver: RouteResolver
    metrics: Any  # StageMetrics
    policy: SamplingPolicy
    pipeline: SpanPipeline | None
    builder: SpanBuilder
    mode: str = "fast"  # "fast" | "otel-fastapi"
    excluded_paths: frozenset[str] = frozenset()
    record_hook: RecordHook | None = None
    #: the span processor stagescope's spans go to (its tracer provider's), to tell whether a live
    #: request span reaches stagescope's destination by itself
    destination: Any = None
    enabled: bool = True
    #: Runs (in a worker thread) when the app's lifespan shutdown is complete: drains span export.
    on_shutdown: Callable[[], object] | None = None
    _warned: set[str] = field(default_factory=set)

    def warn_once(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            _log.warning(
                "stagescope: %s failed; the request goes on (further failures not logged)",
                what,
                exc_info=True,
            )


class _Exchange(ClientWatch):
    """One request's ``receive`` (the :class:`ClientWatch`) and ``send`` (:meth:`send_wrapper`: reads
    the status; the last body chunk ends the record). One object per request rather than two closures
    and their six cells: what a request holds is fewer objects for the garbage collector to count."""

    __slots__ = ("_finish_first", "_mw", "_otel_token", "_quiet", "_send", "_token")

    def __init__(
        self,
        receive: Receive,
        send: Send,
        rec: TracedRecord,
        body_done: bool,
        mw: StagescopeMiddleware,
        finish_first: bool,
    ) -> None:
        ClientWatch.__init__(self, receive, rec, body_done)
        self._send = send
        self._mw = mw  # its _finish ends the record (the middleware, not a bound method made per request)
        self._finish_first = finish_first
        self._quiet = not finish_first and server_send_only(send)
        self._token: Any = None  # of the record's context variable, and of the OpenTelemetry context
        self._otel_token: Any = None

    def end(self, during: str = "before the answer was complete") -> None:
        rec = self.record
        if self.closed:
            rec.status_code = STATUS_CODE_CLIENT_CLOSED
            log_client_closed(rec.method, rec.route, during)
        self._mw._finish(rec)

    def send_wrapper(self, message: Message) -> Awaitable[None]:
        """The app's ``send``. Not a coroutine function itself: a message that needs nothing after it
        (the response's start, a body chunk that is not the last) is the server's ``send`` as it is,
        with no coroutine of stagescope's made and run around it; the last chunk goes through
        :meth:`_send_last`."""
        mtype = message["type"]
        if mtype == "http.response.start":
            self.record.status_code = message["status"]
        elif (
            mtype == "http.response.body" and not message.get("more_body", False) and self.record.end_ns is None
        ):
            return self._send_last(message)
        return self._send(message)

    async def _send_last(self, message: Message) -> None:
        if self._finish_first:
            self.end()
            await self._send(message)
            return
        if self._quiet:  # only the server's code runs in it: out of the context its timer copies
            await self._send_outside(message)
        else:
            await self._send(message)
        self.end()

    async def _send_outside(self, message: Message) -> None:
        """The last send with the record's context variable and the request's OpenTelemetry context
        reset, set again after it (see :mod:`~stagescope.instrumentation.serversend`). In another task
        than the request's (a body sent from a task group, where the tokens do not apply) it runs as is."""
        try:
            _current.reset(self._token)
        except (ValueError, RuntimeError):
            await self._send(message)
            return
        otel = self._otel_token
        ctx = current_context() if otel is not None else None
        if otel is not None:
            reset_context(otel)  # this task's token, reset in this task: the variable's own reset
        try:
            await self._send(message)
        finally:
            self._token = _current.set(self.record)
            if otel is not None:
                self._otel_token = set_context(ctx)


class StagescopeMiddleware:
    """Pure-ASGI middleware: one :class:`TracedRecord` per HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp, state: MiddlewareState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        if (
            scope["type"] != "http"
            or not state.enabled
            or scope.get("path") in state.excluded_paths
            or (scope.get("root_path") and _route_path(scope) in state.excluded_paths)
        ):
            if scope["type"] == "lifespan" and state.on_shutdown is not None:
                send = self._lifespan_send(send)
            await self.app(scope, receive, send)
            return
        try:
            rec, no_body, otel_current = self._open(scope)
            # a live request span (another instrumentation's) ends inside the last send, so the record
            # is finished (and the span annotated) just before that chunk is handed over.
            exchange = _Exchange(receive, send, rec, no_body, self, rec.live_span is not None)
        except Exception:
            state.warn_once("opening the request record")
            await self.app(scope, receive, send)
            return
        exchange._token = _current.set(rec)
        # our own span is the request span: make its ids the current OpenTelemetry context
        # (attach_request_context(rec, otel_current), inline: two calls less per request)
        if rec.live_span is None:
            span = _new_span(_RequestSpan)
            span._trace_id = rec.trace_id
            span._span_id = rec.span_id
            span._context = None
            exchange._otel_token = set_context(
                _Context({**otel_current, SPAN_KEY: span}) if otel_current else _Context({SPAN_KEY: span})
            )
        try:
            await self.app(scope, exchange, exchange.send_wrapper)
        except BaseException as exc:
            if rec.end_ns is None:
                if exchange.closed and is_disconnect_error(exc):
                    exchange.end("mid-request")
                    return  # nobody to answer: no 500, no traceback (the server closes the connection)
                rec.error_type = type(exc).__qualname__
                if rec.status_code is None:
                    rec.status_code = 500
                self._finish(rec)
            raise
        finally:
            otel_token = exchange._otel_token
            if otel_token is not None:
                try:  # detach_request_context(otel_token), inline
                    reset_context(otel_token)
                except Exception:  # it says why, through OpenTelemetry's own detach
                    detach_request_context(otel_token)
            _current.reset(exchange._token)
            exchange.stop()
            if rec.end_ns is None:  # the app returned without finishing its response
                exchange.end()

    def _lifespan_send(self, send: Send) -> Send:
        """``send`` of the lifespan scope: drain span export once the app's own shutdown is over."""
        on_shutdown = self.state.on_shutdown

        async def lifespan_send(message: Message) -> None:
            if on_shutdown is not None and message.get("type") in (
                "lifespan.shutdown.complete",
                "lifespan.shutdown.failed",
            ):
                try:
                    await asyncio.get_running_loop().run_in_executor(None, on_shutdown)
                except Exception:
                    self.state.warn_once("draining span export at shutdown")
            await send(message)

        return lifespan_send

    def _open(self, scope: Scope) -> tuple[TracedRecord, bool, Any]:
        """The request's record, whether the request has no body to read (``ClientWatch``'s
        ``body_done``: :func:`~stagescope.instrumentation.disconnect.may_watch_at_start`'s rule, read in
        the same pass over the headers) and the OpenTelemetry Context current on arrival."""
        state = self.state
        route = state.resolver.resolve(scope)
        # TracedRecord(method=..., route=...) written out: every slot set once, without the dataclass
        # __init__'s keyword binding and default checks (about 0.5 us a request on this machine);
        # tests/test_instrumentation_record_fast.py checks it sets what the constructor sets
        rec = _new_record(TracedRecord)
        rec.method = scope.get("method", "")
        rec.route = route or UNMATCHED_ROUTE
        rec.start_ns = now_ns()
        rec.end_ns = rec.status_code = rec.model = rec.batch_size = rec.input_hash = None
        rec.input_tokens = rec.output_tokens = rec.first_token_ns = rec.queue_depth = rec.error_type = None
        rec.stages = []
        rec.token_ns = []
        rec.attributes = {}
        rec.cold_start = False
        rec.route_matched = route is not None
        rec.scope = scope
        rec.sampled_reason = rec.live_span = rec.held_spans = rec.trace_state = rec.caller = None
        rec.live_sampled = False
        rec.emit_server = True
        header = None
        seen = False
        no_body = True
        caller_state = b""
        for k, v in scope.get("headers") or ():
            if k not in _READ_HEADERS:  # most headers: one set look-up
                continue
            if k == b"traceparent":
                if not seen:
                    header, seen = parse_traceparent(v), True
            elif k == b"tracestate":  # W3C: several tracestate headers are one comma-joined list
                caller_state = caller_state + b"," + v if caller_state else v
            elif k == b"content-length":
                if v.strip() not in (b"", b"0"):
                    no_body = False
            else:  # transfer-encoding, expect: a body may come
                no_body = False
        current = current_context()
        live = current.get(SPAN_KEY)  # opentelemetry.trace.get_current_span(), from the same read
        ctx = None
        if live is not None and live is not INVALID_SPAN and isinstance(live, Span):
            ctx = live.get_span_context()
        if ctx is not None and ctx.is_valid and not ctx.is_remote:
            if join_live_span(rec, live, ctx, header, state.destination):
                if state.mode == "otel-fastapi":  # its tracer provider's sampler decided (and set th)
                    rec.trace_state = ctx.trace_state.to_header() if ctx.trace_state else None
            else:
                # another kind of local span (a user's span around the app): our span's parent
                rec.trace_id, rec.parent_span_id = ctx.trace_id, ctx.span_id
                rec.parent_sampled = bool(ctx.trace_flags.sampled)
                rec.span_id = new_span_id()
            if caller_state and header is not None and header[0] == rec.trace_id:
                rec.caller = parse_tracestate(caller_state.decode("latin-1"))
        else:
            if header is None:
                rec.trace_id = _getrandbits(128) or 1  # new_trace_id() and new_span_id(), inline
                rec.parent_span_id = 0
                rec.parent_sampled = None
            else:
                rec.trace_id, rec.parent_span_id, rec.parent_sampled = header
                if caller_state:  # only with a valid traceparent (W3C: tracestate goes with it)
                    rec.caller = parse_tracestate(caller_state.decode("latin-1"))
            rec.span_id = _getrandbits(64) or 1
        try:
            state.metrics.request_started()
        except Exception:
            state.warn_once("StageMetrics.request_started")
        return rec, no_body, current

    def _finish(self, rec: TracedRecord) -> None:
        end = rec.end_ns = now_ns()
        state = self.state
        try:
            status = rec.status_code
            failed = rec.error_type is not None or (status is not None and status >= 500)
            if state.mode == "otel-fastapi":  # the instrumentor's sampler decided when the span started
                reason = REASON_BASELINE if rec.live_sampled else None
            else:
                caller = rec.caller
                reason, threshold = state.policy.keep(
                    rec.trace_id, rec.parent_sampled, end - rec.start_ns, failed,
                    caller.rv if caller is not None else None, rec.route, end,
                )  # fmt: skip
                if reason is not None:
                    rec.trace_state = state.policy.tracestate(
                        reason, rec.trace_id, rec.parent_sampled, caller, threshold
                    )
            rec.sampled_reason = reason
            if state.record_hook is not None:
                try:
                    state.record_hook(rec)
                except Exception:
                    state.warn_once("the record_hook")
            metrics = state.metrics
            try:  # also counts a 429 answer as shed (stagescope_requests_shed_total)
                metrics.request_finished(rec, format(rec.trace_id, "032x") if reason else None)
            except Exception:
                state.warn_once("publishing metrics")
            if rec.live_span is not None:
                _annotate_live_span(rec, state.builder)
            if reason is not None and state.pipeline is not None:
                state.pipeline.submit(rec)
            else:  # only a kept trace reads the scope (its HTTP attributes, in the span thread); see
                rec.scope = None  # TracedRecord: a context copied in the last send keeps the record
        except Exception:
            state.warn_once("publishing the request record")


def _route_path(scope: Scope) -> str:
    """The path the app's routes see: the request path less the ``root_path`` it starts with (Starlette's
    ``get_route_path``). Behind a proxy (``uvicorn --root-path /api``, ``FastAPI(root_path=...)``) the
    server's path keeps the prefix (``/api/metrics``) while ``/metrics`` is what the route answers."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def _annotate_live_span(rec: TracedRecord, builder: SpanBuilder) -> None:
    span = rec.live_span
    rec.live_span = None
    if span is not None and span.is_recording():
        attrs = builder.stagescope_attributes(rec)
        # the stock instrumentor names a route inside a mounted app by the mount ("/admin"): the
        # template stagescope's metrics carry ("/admin/users/{uid}", routes.py) replaces it, so the
        # span and the metrics (and the analysis of either) name one route
        present = getattr(span, "attributes", None)
        stock = present.get(_HTTP_ROUTE) if present is not None and rec.route_matched else None
        if stock is not None and stock != rec.route:
            attrs[_HTTP_ROUTE] = rec.route
            name = getattr(span, "name", "")
            span.update_name(f"{name.split(' ', 1)[0]} {rec.route}" if name.endswith(" " + stock) else name)
        span.set_attributes(attrs)
