"""``instrument_app`` / ``uninstrument_app``: add stagescope to a FastAPI (or Starlette) app.

::

    import stagescope
    app = FastAPI()
    handle = stagescope.instrument_app(app, service_name="ranker", models=["ranker-v3"])

What it installs:

* a :class:`~stagescope.instrumentation.metrics.StageMetrics` (every Prometheus instrument) on
  ``registry`` (default: prometheus-client's global registry), made the process default so the
  batcher and stream wrapper find it, and served at ``metrics_path`` (``/metrics``);
* the pure-ASGI :class:`~stagescope.instrumentation.middleware.StagescopeMiddleware` (``mode="fast"``,
  the default), or, with ``mode="otel-fastapi"``, opentelemetry-instrumentation-fastapi's
  ``FastAPIInstrumentor.instrument_app`` for the server span (its hooks and header capture; pass
  them in ``otel_fastapi_options``; its tracer provider is ``tracer_provider``, else the application's
  global one, else stagescope's own) with stagescope's middleware inside it for the stages and metrics;
* span export: through ``tracer_provider`` when given (an SDK ``TracerProvider``: spans go to its
  processors); else through the application's own global SDK provider when it registered one
  (``trace.set_tracer_provider`` before this call, or ``opentelemetry-instrument``) and either
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (that provider already exports there: no second exporter to
  the same collector) or no ``spans_dir`` is given; else OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT``
  is set, else the embedded sink in ``spans_dir`` / ``$STAGESCOPE_SPANS_DIR``; with none of them,
  metrics only (a warning says so). stagescope never registers a global provider;
  ``handle.tracer_provider`` is the one its spans go to, for a user to register if they want their
  own spans there (in fast mode it holds a request's spans until the request's keep decision);
* which span is the request's when FastAPI, the stock instrumentor or ``opentelemetry-instrument``
  make their own, and how the handler's spans become its children:
  :mod:`stagescope.instrumentation.otel_context`;
* the sampling policy (:mod:`stagescope.instrumentation.sampling`): slow (``slow_threshold_ms``) and
  failed requests always keep their trace, a ``baseline_sample`` share of the rest, and
  ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` are honoured;
* a graceful stop: when the app's ASGI lifespan shutdown completes (SIGTERM or SIGINT under uvicorn or
  gunicorn), at interpreter exit, and on ``Instrumentation.shutdown()``, every kept span of the
  requests answered so far is written or sent, for at most ``shutdown_timeout_s`` (argument, else
  ``$STAGESCOPE_SHUTDOWN_TIMEOUT_S``, else 5 s); what is left then is counted (``reason="shutdown"``)
  and logged once (see :mod:`stagescope.instrumentation.lifecycle`);
* query strings: not recorded unless ``record_query`` (argument, else ``$STAGESCOPE_RECORD_QUERY``, else
  False): a GET query can hold a prompt, so ``url.query`` is ``REDACTED`` and ``http.url`` ends
  ``?REDACTED``, on stagescope's server spans and, in otel-fastapi mode, on the stock instrumentor's
  (a ``server_request_hook`` stagescope adds before the user's; see
  :mod:`~stagescope.instrumentation.tracing`);
* with ``max_custom_stages``, the process's cap of a team's own stage names (else
  ``$STAGESCOPE_MAX_CUSTOM_STAGES``, else 32; see :mod:`~stagescope.instrumentation.stagenames`).

Idempotent and symmetric: instrumenting an instrumented app returns the existing handle;
``uninstrument_app`` removes the middleware, the metrics route and (otel-fastapi mode) the stock
instrumentation, flushes and stops the span pipeline and unregisters the metric families. The
middleware goes first in ``app.user_middleware`` (outermost of the user's middleware), or just inside
an OpenTelemetry middleware found there (Starlette's or the ASGI ``OpenTelemetryMiddleware``, whose span
is then the request's), and is put there again whenever the app builds its middleware stack, so a
middleware added after ``instrument_app`` (CORS, auth, a rate limiter) is inside it and measured; an
app that already served gets its middleware stack rebuilt on the next request.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from starlette.middleware import Middleware

from stagescope.instrumentation.export import make_span_exporter, otlp_endpoint_configured
from stagescope.instrumentation.exposition import metrics_route
from stagescope.instrumentation.lifecycle import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    argument_or_env,
    env_or_fallback,
    resolve_shutdown_timeout,
)
from stagescope.instrumentation.metrics import StageMetrics, make_metrics_app, set_default_metrics
from stagescope.instrumentation.middleware import (
    MiddlewareState,
    RecordHook,
    RouteResolver,
    StagescopeMiddleware,
)
from stagescope.instrumentation.otel_context import (
    RequestBoundSpanProcessor,
    global_sdk_provider,
    is_otel_server_middleware,
    span_processor_of,
)
from stagescope.instrumentation.pipeline import SpanPipeline, deliver_to_provider
from stagescope.instrumentation.sampling import SamplingPolicy
from stagescope.instrumentation.sink import JsonLinesSpanExporter
from stagescope.instrumentation.spanqueue import QueuedSpanExporter
from stagescope.instrumentation.stagenames import configure as configure_stage_names
from stagescope.instrumentation.tracing import SpanBuilder, http_server_attributes, resolve_record_query
from stagescope.names import (
    DROP_SHUTDOWN,
    ENV_INSTRUMENTATION_MODE,
    ENV_MODELS,
    ENV_SHUTDOWN_TIMEOUT_S,
    ENV_SPANS_DIR,
    METRIC_SPANS_DROPPED,
)

__all__ = ["MODES", "Instrumentation", "instrument_app", "uninstrument_app"]

_log = logging.getLogger(__name__)
MODES = ("fast", "otel-fastapi")
_ATTR = "_stagescope_instrumentation"


class _AsgiEndpoint:
    """Wraps an ASGI callable so Starlette's ``Route`` calls it as an app, not as a request handler."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Instrumentation:
    """The handle ``instrument_app`` returns: what was installed, plus ``force_flush`` and ``shutdown``."""

    def __init__(
        self,
        app: Any,
        *,
        service_name: str,
        mode: str,
        metrics: StageMetrics,
        policy: SamplingPolicy,
        state: MiddlewareState,
        pipeline: SpanPipeline | None,
        exporter: SpanExporter | None,
        tracer_provider: Any,
        owns_provider: bool,
        metrics_route: Any,
        shutdown_timeout_s: float = 5.0,
    ) -> None:
        self.app = app
        self.service_name = service_name
        self.mode = mode
        self.metrics = metrics
        self.policy = policy
        self.state = state
        self.pipeline = pipeline
        self.exporter = exporter
        self.tracer_provider = tracer_provider
        self._owns_provider = owns_provider
        self._metrics_route = metrics_route
        self.shutdown_timeout_s = shutdown_timeout_s
        self._closed = False
        self._drain_lock = threading.Lock()

    @property
    def tracing(self) -> bool:
        """True when spans are exported (a destination was configured)."""
        return self.pipeline is not None

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export every kept trace of requests finished so far; True when done in time."""
        if self.pipeline is None:
            return True
        return self.pipeline.force_flush(timeout_s)

    def drain(self, timeout_s: float | None = None) -> int:
        """Write or send every kept span of the requests finished so far, for at most ``timeout_s``
        (default: the shutdown timeout). What could not be exported by then is dropped, counted
        (``reason="shutdown"``) and logged once; returns that number of spans. Export keeps running
        afterwards (an app whose lifespan restarts keeps exporting). Called when the app's lifespan
        shutdown completes, at interpreter exit and by :meth:`shutdown`."""
        timeout = self.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        with self._drain_lock:
            dropped = 0
            if self.pipeline is not None:
                dropped += self.pipeline.drain(deadline)
            flushed = True
            if isinstance(self.exporter, QueuedSpanExporter):
                dropped += self.exporter.drain(deadline)
            elif self.pipeline is not None and not self._owns_provider and self.tracer_provider is not None:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    flushed = bool(self.tracer_provider.force_flush(left_ms))
                except Exception:
                    flushed = False
        if dropped:
            _log.warning(
                "stagescope: %d spans could not be exported within the shutdown timeout (%g s, %s); "
                'counted in %s{reason="%s"}',
                dropped, timeout, ENV_SHUTDOWN_TIMEOUT_S, METRIC_SPANS_DROPPED, DROP_SHUTDOWN,
            )  # fmt: skip
        elif not flushed:
            _log.warning(
                "stagescope: the tracer provider did not flush within the shutdown timeout (%g s)", timeout
            )
        return dropped

    def shutdown(self) -> None:
        """Drain (at most the shutdown timeout) and stop span export (the middleware keeps measuring,
        metrics keep working)."""
        if self._closed:
            return
        self._closed = True
        self.drain()
        if self.pipeline is not None:
            self.pipeline.shutdown(0.1)
        if self._owns_provider and self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        elif self.exporter is not None:
            self.exporter.shutdown()


def _resolve_mode(mode: str | None) -> str:
    source = "mode" if mode else f"environment variable {ENV_INSTRUMENTATION_MODE}"
    mode = mode or os.environ.get(ENV_INSTRUMENTATION_MODE, "").strip() or "fast"
    if mode not in MODES:
        raise ValueError(f"{source} must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def instrument_app(
    app: Any,
    *,
    service_name: str,
    models: Iterable[str] | None = None,
    mode: str | None = None,
    spans_dir: str | os.PathLike[str] | None = None,
    slow_threshold_ms: float | None = None,
    baseline_sample: float | None = None,
    buckets: Mapping[str, Sequence[float]] | None = None,
    registry: Any = None,
    tracer_provider: Any = None,
    metrics_path: str = "/metrics",
    record_hook: RecordHook | None = None,
    otel_fastapi_options: Mapping[str, Any] | None = None,
    shutdown_timeout_s: float | None = None,
    max_custom_stages: int | None = None,
    record_query: bool | None = None,
) -> Instrumentation:
    """Instrument ``app``; see the module docstring. ``mode``: argument, ``$STAGESCOPE_INSTRUMENTATION_MODE``,
    ``"fast"``. ``models``: argument, ``$STAGESCOPE_MODELS``. ``record_hook(record)`` runs once per finished
    request before publishing (add attributes); its failures are logged once and never reach the request.
    ``shutdown_timeout_s``: argument, ``$STAGESCOPE_SHUTDOWN_TIMEOUT_S``, 5 s (seconds a graceful stop may
    spend exporting what is queued). ``record_query``: argument, ``$STAGESCOPE_RECORD_QUERY``, False (record
    request query strings on server spans; off, they read ``REDACTED``)."""
    existing = getattr(app, _ATTR, None)
    if existing is not None:
        return existing
    # arguments are checked (a bad one raises); a bad environment variable is one warning and the
    # default (env_or_fallback): a deployment's typo never stops the service
    mode = argument_or_env(mode or None, _resolve_mode, "fast", "using mode fast")
    shutdown_timeout = argument_or_env(
        shutdown_timeout_s, resolve_shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT_S, f"using {DEFAULT_SHUTDOWN_TIMEOUT_S:g} s"
    )
    record_query = argument_or_env(
        record_query, resolve_record_query, False, "query strings are not recorded (REDACTED)"
    )
    configure_stage_names(max_custom_stages)
    if models is None and os.environ.get(ENV_MODELS, "").strip():
        models = [m.strip() for m in os.environ[ENV_MODELS].split(",") if m.strip()]
    defaults = SamplingPolicy.resolve(slow_threshold_ms=slow_threshold_ms, baseline_sample=baseline_sample, env={})
    policy = env_or_fallback(
        lambda: SamplingPolicy.resolve(slow_threshold_ms=slow_threshold_ms, baseline_sample=baseline_sample),
        defaults,
        "sampling with the defaults (and the arguments given)",
    )
    metrics = StageMetrics(registry=registry, models=models, buckets=buckets)
    set_default_metrics(metrics)

    owns_provider = False
    exporter: SpanExporter | None = None
    user_provider = global_sdk_provider()  # the application's own, if it registered one; never ours
    provider = tracer_provider
    if (
        provider is None
        and user_provider is not None
        and (otlp_endpoint_configured() or not _has_local_destination(spans_dir))
    ):  # the user's pipeline already goes to that collector (or stagescope was given nowhere else)
        provider = user_provider
    if provider is None and (mode == "otel-fastapi" or _has_destination(spans_dir)):
        exporter = _span_exporter(spans_dir, metrics, shutdown_timeout) if _has_destination(spans_dir) else None
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        # fast mode decides at a request's end, so its provider records every span (the keep decision
        # drops them later); otel-fastapi mode's sampler (OTEL_TRACES_SAMPLER) decides at the start
        provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ALWAYS_ON if mode == "fast" else None,
        )
        if exporter is not None:  # our exporters only enqueue, so the simple processor never blocks
            processor: Any = SimpleSpanProcessor(exporter)
            # fast mode decides at the end of a request: spans made inside it wait for the decision
            provider.add_span_processor(RequestBoundSpanProcessor(processor) if mode == "fast" else processor)
        owns_provider = True
    elif provider is None:
        _log.warning(
            "stagescope: no span destination (spans_dir=, %s, OTEL_EXPORTER_OTLP_ENDPOINT or a global "
            "TracerProvider): metrics only",
            ENV_SPANS_DIR,
        )

    resource = getattr(provider, "resource", None) or Resource.create({"service.name": service_name})
    builder = SpanBuilder(resource, fold_model=metrics.fold_model, record_query=record_query)
    pipeline: SpanPipeline | None = None
    if provider is not None and hasattr(provider, "_active_span_processor"):
        if owns_provider and exporter is not None:  # straight to our exporter
            pipeline = SpanPipeline(
                builder, exporter.export, exporter_label="stagescope", metrics=metrics,
                flush_downstream=lambda ms: exporter.force_flush(ms),
                deliver_encoded=exporter.export_encoded if isinstance(exporter, JsonLinesSpanExporter) else None,
            )  # fmt: skip
        elif not owns_provider:
            pipeline = SpanPipeline(
                builder, deliver_to_provider(provider), exporter_label="tracer_provider", metrics=metrics,
                count_exported=True, flush_downstream=lambda ms: provider.force_flush(ms),
            )  # fmt: skip
    elif provider is not None:
        _log.warning("stagescope: tracer_provider is not an SDK TracerProvider; no spans are exported")

    state = MiddlewareState(
        resolver=RouteResolver(app),
        metrics=metrics,
        policy=policy,
        pipeline=pipeline,
        builder=builder,
        mode=mode,
        excluded_paths=frozenset({metrics_path}),
        record_hook=record_hook,
        destination=span_processor_of(provider) if pipeline is not None else None,
    )
    metrics_route = _mount_metrics(app, metrics_path, metrics)
    state.resolver.last = metrics_route
    if mode == "otel-fastapi":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        options: dict[str, Any] = {"exclude_spans": ["receive", "send"]}
        for key, value in (otel_fastapi_options or {}).items():  # user hooks can never fail a request
            options[key] = _guarded_hook(key, value) if key.endswith("_hook") and callable(value) else value
        excluded = options.pop("excluded_urls", None)
        if not record_query:  # the stock span records the query: replace it as stagescope's own span does
            options["server_request_hook"] = _redact_query_hook(builder.semconv, options.get("server_request_hook"))
        FastAPIInstrumentor.instrument_app(  # the user's provider if they have one, as the stock default
            app,
            tracer_provider=tracer_provider or user_provider or provider,
            excluded_urls=",".join(x for x in (excluded, metrics_path) if x),
            **options,
        )
    # like app.add_middleware, but also on an app that already served (the stack is rebuilt lazily);
    # first, or just inside a middleware that opens the request's span (so that span is the request's)
    entry = Middleware(StagescopeMiddleware, state=state)
    _place_middleware(app, entry)
    _keep_middleware_first(app, entry)
    app.middleware_stack = None
    handle = Instrumentation(
        app, service_name=service_name, mode=mode, metrics=metrics, policy=policy, state=state,
        pipeline=pipeline, exporter=exporter, tracer_provider=provider, owns_provider=owns_provider,
        metrics_route=metrics_route, shutdown_timeout_s=shutdown_timeout,
    )  # fmt: skip
    setattr(app, _ATTR, handle)
    ref = weakref.ref(handle)
    if pipeline is not None:
        state.on_shutdown = lambda: (h := ref()) is not None and h.drain()
    atexit.register(lambda: (h := ref()) is not None and not h._closed and h.drain())
    return handle


def _place_middleware(app: Any, entry: Any) -> None:
    """Put stagescope's middleware first in ``app.user_middleware`` (outermost of the user's), or just
    inside a middleware there that opens the request's span (so that span is the request's)."""
    mw = app.user_middleware
    mw[:] = [m for m in mw if m is not entry]
    at = max((i + 1 for i, m in enumerate(mw) if is_otel_server_middleware(m.cls)), default=0)
    mw.insert(at, entry)


_BUILD_ATTR = "_stagescope_build_middleware_stack"


def _keep_middleware_first(app: Any, entry: Any) -> None:
    """Place stagescope's middleware again whenever the app builds its middleware stack: a middleware
    added after ``instrument_app`` (``app.add_middleware(CORSMiddleware)``, ``@app.middleware("http")``:
    the usual order, an app is instrumented right after it is made) goes first in ``user_middleware``,
    outside stagescope's, and its time (an auth call, a rate limiter's 429) was never measured: the
    client's latency held it, the server's did not, and the analysis called it network."""
    build = getattr(app, "build_middleware_stack", None)
    if build is None or not hasattr(app, "user_middleware"):
        return
    previous = app.__dict__.get("build_middleware_stack")  # an instance's own (the stock instrumentor's)

    def build_middleware_stack() -> Any:
        try:
            _place_middleware(app, entry)
        except Exception:  # never fail the app's start for it: the order stays as the app made it
            _log.warning("stagescope: could not place its middleware first", exc_info=True)
        return build()

    setattr(app, _BUILD_ATTR, previous)
    app.build_middleware_stack = build_middleware_stack


def _release_middleware_stack(app: Any) -> None:
    """Undo :func:`_keep_middleware_first`."""
    if _BUILD_ATTR not in app.__dict__:
        return
    previous = app.__dict__.pop(_BUILD_ATTR)
    if previous is None:
        app.__dict__.pop("build_middleware_stack", None)
    else:
        app.build_middleware_stack = previous


def _guarded_hook(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a user hook: an exception in it is logged once and swallowed, the request goes on."""
    warned = False

    def guarded(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        try:
            return hook(*args, **kwargs)
        except Exception:
            if not warned:
                warned = True
                _log.warning("stagescope: %s failed (further failures not logged)", name, exc_info=True)
            return None

    return guarded


def _redact_query_hook(semconv: str, user_hook: Callable[..., Any] | None) -> Callable[..., Any]:
    """A ``server_request_hook`` for the stock instrumentor: the span's ``http.url`` / ``url.query`` (set
    from the raw query as the span started) become what :func:`http_server_attributes` gives without
    the query, then the user's own hook runs (guarded on its own: a failure of either is logged once)."""

    def redact(span: Any, scope: Any) -> None:
        if scope.get("query_string") and span.is_recording():
            ours = http_server_attributes(scope, None, None, semconv, record_query=False)
            present = getattr(span, "attributes", None)  # an SDK span's; only replace what it has
            keys = [k for k in ("http.url", "url.query") if k in ours and (present is None or k in present)]
            span.set_attributes({k: ours[k] for k in keys})

    guarded = _guarded_hook("redacting the query string", redact)

    def hook(span: Any, scope: Any) -> None:
        guarded(span, scope)
        if user_hook is not None:
            user_hook(span, scope)

    return hook


def _span_exporter(spans_dir: Any, metrics: StageMetrics, shutdown_timeout: float) -> SpanExporter | None:
    """The exporter for ``spans_dir`` (an argument: its errors raise) or the environment's destination
    (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, STAGESCOPE_SPANS_DIR), which, when it cannot be used (not a URL,
    a folder that cannot be created), is one warning and no span export: the service and its metrics run."""
    from_env = spans_dir is None or otlp_endpoint_configured()
    try:
        return make_span_exporter(spans_dir, metrics=metrics, shutdown_timeout_s=shutdown_timeout)
    except (ValueError, OSError) as exc:
        if not from_env:
            raise
        # the endpoint's value is not logged: a URL may carry credentials (user:password@host)
        where = (
            "the OTLP endpoint in OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT"
            if otlp_endpoint_configured()
            else f"{ENV_SPANS_DIR}={os.environ.get(ENV_SPANS_DIR, '').strip()[:200]!r}"
        )
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _log.warning("stagescope: %s cannot be used (%s): no spans are exported, metrics only",
                     where, reason.replace("\n", " "))  # fmt: skip
        return None


def _has_local_destination(spans_dir: object) -> bool:
    return spans_dir is not None or bool(os.environ.get(ENV_SPANS_DIR, "").strip())


def _has_destination(spans_dir: object) -> bool:
    return _has_local_destination(spans_dir) or otlp_endpoint_configured()


def _mount_metrics(app: Any, path: str, metrics: StageMetrics) -> Any:
    route = metrics_route(path, _AsgiEndpoint(make_metrics_app(metrics.registry)))
    app.router.routes.append(route)
    return route


def uninstrument_app(app: Any) -> None:
    """Undo :func:`instrument_app` on ``app`` (a no-op when it is not instrumented)."""
    handle: Instrumentation | None = getattr(app, _ATTR, None)
    if handle is None:
        return
    handle.state.enabled = False
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not StagescopeMiddleware]
    _release_middleware_stack(app)
    if handle._metrics_route in app.router.routes:
        app.router.routes.remove(handle._metrics_route)
    if handle.mode == "otel-fastapi":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.uninstrument_app(app)
    app.middleware_stack = None  # rebuilt without us on the next request
    handle.shutdown()
    handle.metrics.unregister()
    set_default_metrics(None)
    delattr(app, _ATTR)
