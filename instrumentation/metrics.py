"""Every Prometheus instrument stagescope publishes, owned by one object: :class:`StageMetrics`.

Measuring is kept apart from publishing: the middleware, the batcher and the stream wrapper fill a
:class:`~stagescope.instrumentation.record.RequestRecord` (timestamps from one monotonic clock) and
call :meth:`StageMetrics.request_finished` once per request; that method turns the record into
histogram observations. All durations are **seconds**. Metric and label names come from
:mod:`stagescope.names` only.

Families (labels in brackets):

* ``stagescope_request_duration_seconds`` [route, model, status_class]: server e2e (arrival to last
  byte handed to the server);
* ``stagescope_stage_duration_seconds`` [stage, kind, model]: one observation per stage interval (``kind``
  is the stage's kind, one per stage name in a process, so it adds no series; it lets queries and
  dashboards select a team's own stages by what they are);
* ``stagescope_stages_folded_total``: stage intervals recorded under the overflow stage name because
  the process had reached its cap of custom stage names (see :mod:`~stagescope.instrumentation.stagenames`);
* ``stagescope_queue_depth`` [model] and ``stagescope_inflight_requests`` gauges;
* ``stagescope_batch_size`` [model]: one observation per executed batch;
* ``stagescope_requests_shed_total`` [route, model]: 429 answers;
* ``stagescope_spans_exported_total`` [exporter] and ``stagescope_spans_dropped_total`` [exporter, reason];
* ``stagescope_model_loads_total`` [model], ``stagescope_model_ready`` [model],
  ``stagescope_executor_busy_seconds_total`` [model];
* GenAI (OpenTelemetry semantic conventions as Prometheus renders them), label model:
  ``gen_ai_server_time_to_first_token_seconds`` (arrival at the server to the first token handed to the
  response, vLLM's definition), ``gen_ai_server_time_per_output_token_seconds`` (one per request:
  first to last token divided by tokens - 1), ``gen_ai_server_request_duration_seconds`` (e2e of
  requests that produced or consumed tokens), and ``stagescope_inter_token_latency_seconds`` (one
  sample per gap between consecutive token hand-offs, vLLM's inter-token latency).

Bounded labels: ``route`` is the route template the middleware found (a safety cap folds anything past
``max_routes`` distinct values into ``names.UNMATCHED_ROUTE``); ``model`` is folded by
:meth:`StageMetrics.fold_model` into a configured set (``models=`` argument, else ``STAGESCOPE_MODELS``,
a comma list) with everything else reported as ``names.OTHER_MODEL``.

Exemplars ``{"trace_id": <32 hex>}`` are attached to the latency histograms when a trace id is given;
they are only shown when the scraper negotiates OpenMetrics (``Accept: application/openmetrics-text``),
and prometheus-client does not keep them in multiprocess mode.

Multiprocess (``uvicorn --workers N``, gunicorn): set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory
before the workers start; every worker writes its values there and :func:`make_metrics_app` serves the
sum over workers (gauges: ``livesum``; ``stagescope_model_ready``: ``livemax``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from stagescope import names
from stagescope.instrumentation.promfast import Observer as _Observer
from stagescope.instrumentation.promfast import bisect_left as _bisect_left
from stagescope.instrumentation.promfast import value_inc as _value_inc
from stagescope.instrumentation.record import RequestRecord

__all__ = [
    "MULTIPROC_ENV",
    "StageMetrics",
    "default_metrics",
    "make_metrics_app",
    "reap_dead_workers",
    "resolve_buckets",
    "set_default_metrics",
    "status_class",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: With no configured model set, the first this-many distinct model names keep their own label value.
UNCONFIGURED_MODEL_CAP = 8
#: Safety cap on distinct route label values (route templates are bounded by the app already).
DEFAULT_MAX_ROUTES = 256
NO_MODEL = ""  # label value for requests that name no model

_HISTOGRAMS = (
    names.METRIC_REQUEST_DURATION,
    names.METRIC_STAGE_DURATION,
    names.METRIC_BATCH_SIZE,
    names.METRIC_GENAI_REQUEST_DURATION,
    names.METRIC_GENAI_TTFT,
    names.METRIC_GENAI_TPOT,
    names.METRIC_INTER_TOKEN,
)


def resolve_buckets(overrides: Mapping[str, Sequence[float]] | None = None) -> dict[str, tuple[float, ...]]:
    """Default bucket set per histogram family with ``overrides`` applied (keys: ``names.METRIC_*``).

    Raises ``ValueError`` for an unknown family, an empty set, or bounds that are not strictly increasing.
    """
    out = dict(names.DEFAULT_BUCKETS)
    for family, bounds in (overrides or {}).items():
        if family not in out:
            raise ValueError(
                f"buckets: {family!r} is not a histogram family; known: {', '.join(_HISTOGRAMS)}"
            )
        vals = tuple(float(b) for b in bounds)
        if not vals:
            raise ValueError(f"buckets for {family} are empty")
        if any(b <= a for a, b in itertools.pairwise(vals)):
            raise ValueError(f"buckets for {family} must be strictly increasing, got {list(vals)}")
        out[family] = vals
    return out


def status_class(code: int | None) -> str:
    """``200 -> "2xx"``; ``None`` (no response started: the app raised) counts as ``"5xx"``; 499 (the
    client went away before its answer was complete) is ``"client_closed"``, not a client or server error."""
    if code == names.STATUS_CODE_CLIENT_CLOSED:
        return names.STATUS_CLASS_CLIENT_CLOSED
    if code is None or not 100 <= code <= 599:
        return "5xx"
    return f"{code // 100}xx"


class _Instruments:
    """The prometheus-client objects of one registry (shared by every StageMetrics on that registry)."""

    def __init__(self, registry: CollectorRegistry, buckets: dict[str, tuple[float, ...]]) -> None:
        self.buckets = buckets
        self.users = 0  # StageMetrics objects using these instruments
        r = registry
        m, route, stage_ = names.LABEL_MODEL, names.LABEL_ROUTE, names.LABEL_STAGE

        def hist(name: str, doc: str, labels: tuple[str, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets[name])

        self.request = hist(
            names.METRIC_REQUEST_DURATION,
            "Server request duration in seconds: arrival to last response byte handed to the server.",
            (route, m, names.LABEL_STATUS_CLASS),
        )
        self.stage = hist(
            names.METRIC_STAGE_DURATION,
            "Seconds per stage interval of a request (batch_wait, queue, compute, a team's own ...), "
            "with the stage's kind.",
            (stage_, names.LABEL_KIND, m),
        )
        self.folded = Counter(
            names.METRIC_STAGES_FOLDED,
            f"Stage intervals recorded as stage {names.STAGE_OVERFLOW!r}: the process had reached its cap "
            "of custom stage names.",
            registry=r,
        )
        self.batch = hist(names.METRIC_BATCH_SIZE, "Items per executed batch.", (m,))
        self.genai_request = hist(
            names.METRIC_GENAI_REQUEST_DURATION,
            "GenAI server request duration in seconds (requests that produced or consumed tokens).",
            (m,),
        )
        self.ttft = hist(
            names.METRIC_GENAI_TTFT,
            "Seconds from request arrival at the server to the first token handed to the response.",
            (m,),
        )
        self.tpot = hist(
            names.METRIC_GENAI_TPOT,
            "Per request: seconds from first to last token divided by (output tokens - 1).",
            (m,),
        )
        self.itl = hist(
            names.METRIC_INTER_TOKEN,
            "Seconds between consecutive token hand-offs of one stream (one sample per gap).",
            (m,),
        )
        self.queue_depth = Gauge(
            names.METRIC_QUEUE_DEPTH,
            "Requests waiting in the batcher (for a batch to fill or for a free executor).",
            (m,),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.inflight = Gauge(
            names.METRIC_INFLIGHT,
            "Requests being served right now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.shed = Counter(
            names.METRIC_REQUESTS_SHED, "Requests answered 429 (load shed).", (route, m), registry=r
        )
        self.exported = Counter(
            names.METRIC_SPANS_EXPORTED, "Spans handed to an exporter successfully.", (names.LABEL_EXPORTER,),
            registry=r,
        )  # fmt: skip
        self.dropped = Counter(
            names.METRIC_SPANS_DROPPED,
            "Spans dropped (exporter down, buffer full, ...).",
            (names.LABEL_EXPORTER, names.LABEL_REASON),
            registry=r,
        )
        self.loads = Counter(names.METRIC_MODEL_LOADS, "Model (re)loads.", (m,), registry=r)
        self.ready = Gauge(
            names.METRIC_MODEL_READY, "1 when the model is loaded and serving.", (m,), registry=r,
            multiprocess_mode="livemax",
        )  # fmt: skip
        self.busy = Counter(
            names.METRIC_EXECUTOR_BUSY, "Seconds executors spent running batches.", (m,), registry=r
        )
        self.collectors: tuple[Any, ...] = (
            self.request, self.stage, self.batch, self.genai_request, self.ttft, self.tpot, self.itl,
            self.queue_depth, self.inflight, self.shed, self.exported, self.dropped, self.loads,
            self.ready, self.busy, self.folded,
        )  # fmt: skip

    def unregister(self, registry: CollectorRegistry) -> None:
        for c in self.collectors:
            with contextlib.suppress(KeyError):
                registry.unregister(c)


# registry -> its instruments, so that several StageMetrics (two instrument_app calls) share families.
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, _Instruments] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _instruments_for(registry: CollectorRegistry, buckets: dict[str, tuple[float, ...]]) -> _Instruments:
    with _LOCK:
        inst = _BY_REGISTRY.get(registry)
        if inst is not None and inst.buckets == buckets:
            inst.users += 1
            return inst
        if inst is not None:  # re-instrumented with other buckets: the new families replace the old
            inst.unregister(registry)
        inst = _Instruments(registry, buckets)
        inst.users = 1
        _BY_REGISTRY[registry] = inst
        return inst


def _models_from_env() -> frozenset[str] | None:
    raw = os.environ.get(names.ENV_MODELS, "")
    models = frozenset(m.strip() for m in raw.split(",") if m.strip())
    return models or None


class StageMetrics:
    """Owns every stagescope Prometheus instrument of one registry and turns records into samples.

    ``registry``: a ``CollectorRegistry`` (default: prometheus-client's global one). ``models``: the
    model names that keep their own label value (default: ``STAGESCOPE_MODELS``; with neither, the
    first ``UNCONFIGURED_MODEL_CAP`` names seen). ``buckets``: per-family bucket overrides keyed by
    ``names.METRIC_*``. Label children are cached, so an observation costs one dict lookup plus
    prometheus-client's own work.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        models: Iterable[str] | None = None,
        buckets: Mapping[str, Sequence[float]] | None = None,
        *,
        max_routes: int = DEFAULT_MAX_ROUTES,
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.buckets = resolve_buckets(buckets)
        configured = frozenset(models) if models is not None else _models_from_env()
        self.models: frozenset[str] | None = configured
        self.max_routes = max_routes
        self._i = _instruments_for(self.registry, self.buckets)
        #: inflight + amount: the gauge's value's own ``inc`` when prometheus-client exposes it (what
        #: ``Gauge.inc`` and ``Gauge.dec`` call after their checks), else the gauge's ``inc``
        self._inflight_add: Callable[[float], None] = _value_inc(self._i.inflight)
        self._folded: dict[str | None, str] = {None: NO_MODEL}
        self._routes: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._req_children: dict[tuple[str, str, int | None], _Observer] = {}  # (route, model, status)
        self._stage_children: dict[tuple[str, str, str], _Observer] = {}
        self._released = False

    # -- label folding --------------------------------------------------------------------------
    def fold_model(self, name: str | None) -> str:
        """The label value for model ``name``: itself if configured, else ``names.OTHER_MODEL``."""
        try:
            return self._folded[name]
        except KeyError:
            pass
        assert name is not None
        if self.models is not None:
            value = name if name in self.models else names.OTHER_MODEL
        else:
            admitted = sum(1 for v in self._folded.values() if v not in (NO_MODEL, names.OTHER_MODEL))
            value = name if admitted < UNCONFIGURED_MODEL_CAP else names.OTHER_MODEL
        if len(self._folded) < 10_000:  # memoise; past that, fold without remembering
            self._folded[name] = value
        return value

    def _route(self, route: str) -> str:
        if route in self._routes:
            return route
        if len(self._routes) >= self.max_routes:
            return names.UNMATCHED_ROUTE
        self._routes.add(route)
        return route

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            if isinstance(metric, Histogram):
                child = _Observer(child)
            self._children[key] = child
        return child

    # -- per request ----------------------------------------------------------------------------
    def request_started(self) -> None:
        """A request entered the server (inflight + 1)."""
        self._inflight_add(1)

    def request_finished(self, record: RequestRecord, trace_id: str | None = None) -> None:
        """Inflight - 1 and publish everything measured on ``record`` (call once, after its end).

        ``trace_id`` (32 lowercase hex) becomes the exemplar of every latency observation; pass it only
        for traces that are kept, so an exemplar never points at a trace that was sampled out.
        """
        i = self._i
        self._inflight_add(-1)
        try:
            model = self._folded[record.model]
        except KeyError:
            model = self.fold_model(record.model)
        ex = {"trace_id": trace_id} if trace_id else None
        end = record.end_ns
        start = record.start_ns
        route = record.route or names.UNMATCHED_ROUTE
        if route not in self._routes:
            route = self._route(route)
        code = record.status_code
        # the request and stage observations are _Observer.observe written out (durations from integer
        # nanoseconds are never NaN): this runs for every request
        if end is not None:
            key = (route, model, code)
            obs = self._req_children.get(key)
            if obs is None:
                obs = self._req_children[key] = _Observer(i.request.labels(route, model, status_class(code)))
            v = (end - start) / 1e9
            add_sum = obs._add_sum
            if add_sum is None or ex is not None:
                obs.child.observe(v, ex)
            else:
                add_sum(v)
                obs._buckets[_bisect_left(obs._bounds, v)](1)
        if code == 429:
            self._child(i.shed, route, model).inc()
        stage_children = self._stage_children
        for iv in record.stages:
            skey = (iv.stage, iv.kind, model)
            obs = stage_children.get(skey)
            if obs is None:
                obs = stage_children[skey] = self._stage_child(iv.stage, iv.stage_kind, model)
            v = (iv.end_ns - iv.start_ns) / 1e9
            add_sum = obs._add_sum
            if add_sum is None or ex is not None:
                obs.child.observe(v, ex)
            else:
                add_sum(v)
                obs._buckets[_bisect_left(obs._bounds, v)](1)
        tokens = record.token_ns
        if not tokens and record.output_tokens is None and record.input_tokens is None:
            return  # not an LLM request
        if end is not None:
            self._child(i.genai_request, model).observe((end - start) / 1e9, ex)
        if record.first_token_ns is not None:
            self._child(i.ttft, model).observe((record.first_token_ns - start) / 1e9, ex)
        if len(tokens) >= 2:
            gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(tokens)]
            itl = self._child(i.itl, model)
            # the exemplar goes on the stream's largest gap only: the tail buckets, the ones worth a
            # click, still get one, and a long stream does not pay exemplar cost per token
            worst = max(range(len(gaps)), key=gaps.__getitem__) if ex else -1
            for k, gap in enumerate(gaps):
                itl.observe(gap, ex if k == worst else None)
            n = record.output_tokens if record.output_tokens and record.output_tokens >= 2 else len(tokens)
            self._child(i.tpot, model).observe((tokens[-1] - tokens[0]) / 1e9 / (n - 1), ex)

    def _stage_child(self, stage: str, kind: str, model: str) -> _Observer:
        child = self._i.stage.labels(stage, kind, model)
        if stage == names.STAGE_OVERFLOW:  # folded intervals are also counted (no cost for the others)
            return _Observer(_CountingChild(child, self._i.folded))  # no _add_sum: its observe runs
        return _Observer(child)

    def request_shed(self, route: str, model: str | None = None) -> None:
        """Count a request shed outside the middleware's view (429s that pass through
        :meth:`request_finished` are already counted there: do not call both for one request)."""
        self._child(self._i.shed, self._route(route), self.fold_model(model)).inc()

    # -- span export ----------------------------------------------------------------------------
    def span_exported(self, n: int, exporter: str) -> None:
        if n:
            self._child(self._i.exported, exporter).inc(n)

    def span_dropped(self, n: int, exporter: str, reason: str) -> None:
        if n:
            self._child(self._i.dropped, exporter, reason).inc(n)

    # -- batcher and model lifecycle ------------------------------------------------------------
    def set_queue_depth(self, model: str | None, n: int) -> None:
        """Requests waiting in the batcher of ``model`` right now (one batcher per model label)."""
        self._child(self._i.queue_depth, self.fold_model(model)).set(n)

    def add_queue_depth(self, model: str | None, delta: int) -> None:
        """Change the waiting count of ``model`` by ``delta``: composes when several batchers (or
        several folded models) share one label value, which :meth:`set_queue_depth` cannot."""
        self._child(self._i.queue_depth, self.fold_model(model)).inc(delta)

    def observe_batch(self, model: str | None, size: int) -> None:
        """One executed batch of ``size`` items."""
        self._child(self._i.batch, self.fold_model(model)).observe(size)

    def executor_busy(self, model: str | None, seconds: float) -> None:
        """An executor of ``model`` spent ``seconds`` running a batch."""
        self._child(self._i.busy, self.fold_model(model)).inc(max(0.0, seconds))

    def model_loaded(self, model: str | None) -> None:
        self._child(self._i.loads, self.fold_model(model)).inc()

    def set_model_ready(self, model: str | None, ready: bool) -> None:
        self._child(self._i.ready, self.fold_model(model)).set(1 if ready else 0)

    def unregister(self) -> None:
        """Release this object's families (``uninstrument_app``): they leave the registry when no other
        StageMetrics on the same registry (another instrumented app) still uses them. Idempotent."""
        if self._released:
            return
        self._released = True
        with _LOCK:
            self._i.users -= 1
            if self._i.users > 0:
                return
            if _BY_REGISTRY.get(self.registry) is self._i:
                del _BY_REGISTRY[self.registry]
            self._i.unregister(self.registry)
        self._children.clear()
        self._req_children.clear()
        self._stage_children.clear()


class _CountingChild:
    """A histogram child that also counts each observation in a counter."""

    __slots__ = ("_child", "_counter")

    def __init__(self, child: Any, counter: Any) -> None:
        self._child, self._counter = child, counter

    def observe(self, value: float, exemplar: Any = None) -> None:
        self._child.observe(value, exemplar)
        self._counter.inc()


_default: StageMetrics | None = None
_DEFAULT_LOCK = threading.Lock()


def default_metrics() -> StageMetrics:
    """The StageMetrics installed by the latest ``instrument_app``; else one on the global registry."""
    global _default
    with _DEFAULT_LOCK:
        if _default is None:
            _default = StageMetrics()
        return _default


def set_default_metrics(metrics: StageMetrics | None) -> None:
    """Install ``metrics`` as the default (``None``: the next :func:`default_metrics` creates one)."""
    global _default
    _default = metrics


def make_metrics_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """An ASGI app answering GET with the exposition of ``registry`` (default: the global one).

    Content negotiation is prometheus-client's: ``Accept: application/openmetrics-text`` gets OpenMetrics
    (with exemplars), anything else the text format (no exemplars); gzip when accepted. When
    ``PROMETHEUS_MULTIPROC_DIR`` is set (read here, when the app is built) the answer aggregates the
    values every worker process wrote to that directory.
    """
    from prometheus_client import make_asgi_app

    source: CollectorRegistry = REGISTRY if registry is None else registry
    mp_dir = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    if mp_dir:
        from prometheus_client import multiprocess

        source = CollectorRegistry()
        multiprocess.MultiProcessCollector(source, path=mp_dir)
    inner = make_asgi_app(source)

    async def metrics_app(
        scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope.get("type") != "http":
            if scope.get("type") == "lifespan":  # mounted standalone: accept lifespan politely
                while True:
                    msg = await receive()
                    if msg["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif msg["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            return
        if mp_dir:
            reap_dead_workers(mp_dir)
        await inner(scope, receive, send)

    return metrics_app


_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def reap_dead_workers(path: str) -> list[int]:
    """Drop the live-gauge files of worker processes that no longer exist (multiprocess mode).

    prometheus-client keeps a dead worker's ``live*`` gauges (in-flight requests, queue depth) until
    someone calls ``mark_process_dead``; gunicorn has a hook for it, uvicorn's supervisor has none, so
    the metrics app does it on each scrape. Counters and histograms of dead workers stay (they are
    totals). Returns the pids reaped.
    """
    from prometheus_client import multiprocess

    dead = set()
    try:
        entries = os.listdir(path)
    except OSError:
        return []
    for name in entries:
        m = _LIVE_GAUGE_FILE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            dead.add(int(m.group(1)))
    for pid in dead:
        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid, path)
    return sorted(dead)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
