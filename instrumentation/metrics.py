"""Every Prometheus instrument stagescope publishes, owned by one object: :class:`StageMetrics`.

Measuring is kept apart from publishing: the middleware, the batcher and the stream wrapper fill a
:class:`~stagescope.instrumentation.record.RequestRecord` (timestamps from one monotonic clock) and
call :meth:`StageMetrics.request_finished` once per request; that method turns the record into
histogram observations. All durations are **seconds**. Metric and label names come from
:mod:`stagescope.names` only.

The families (names, labels, buckets) are defined in :mod:`~stagescope.instrumentation.families`;
serving them (``/metrics``, multiprocess mode) is :mod:`~stagescope.instrumentation.exposition`.

Bounded labels: ``route`` is the route template the middleware found (a safety cap folds anything past
``max_routes`` distinct values into ``names.UNMATCHED_ROUTE``); ``model`` is folded by
:meth:`StageMetrics.fold_model` into a configured set (``models=`` argument, else ``STAGESCOPE_MODELS``,
a comma list) with everything else reported as ``names.OTHER_MODEL``.

Exemplars ``{"trace_id": <32 hex>}`` are attached to the latency histograms when a trace id is given;
they are only shown when the scraper negotiates OpenMetrics (``Accept: application/openmetrics-text``),
and prometheus-client does not keep them in multiprocess mode.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from threading import get_ident as _get_ident
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from stagescope import names
from stagescope.instrumentation.exposition import MULTIPROC_ENV, make_metrics_app, reap_dead_workers
from stagescope.instrumentation.families import instruments_for, release_instruments, resolve_buckets
from stagescope.instrumentation.promfast import CountingChild as _CountingChild
from stagescope.instrumentation.promfast import Observer as _Observer
from stagescope.instrumentation.promfast import Pending as _Pending
from stagescope.instrumentation.promfast import bisect_left as _bisect_left
from stagescope.instrumentation.promfast import deferrable as _deferrable
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

#: With no configured model set, the first this-many distinct model names keep their own label value.
UNCONFIGURED_MODEL_CAP = 8
#: Safety cap on distinct route label values (route templates are bounded by the app already).
DEFAULT_MAX_ROUTES = 256
NO_MODEL = ""  # label value for requests that name no model
#: The owner thread empties its deferred duration lists every this-plus-one requests (a power of two
#: minus one: a mask); a scrape in between adds what they hold without emptying them.
_COMPACT_MASK = 1023


def status_class(code: int | None) -> str:
    """``200 -> "2xx"``; ``None`` (no response started: the app raised) counts as ``"5xx"``; 499 (the
    client went away before its answer was complete) is ``"client_closed"``, not a client or server error."""
    if code == names.STATUS_CODE_CLIENT_CLOSED:
        return names.STATUS_CLASS_CLIENT_CLOSED
    if code is None or not 100 <= code <= 599:
        return "5xx"
    return f"{code // 100}xx"


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

    **Deferred observations.** In one process (not prometheus-client's multiprocess mode) the
    request and stage observations and the in-flight count of the requests served on one thread (the
    first that calls :meth:`request_started`: the event loop's) are appended to lists as integer
    nanoseconds (:class:`~stagescope.instrumentation.promfast.Pending`: one ``list.append`` each; the
    buckets are counted in C when the lists are flushed) and added to the families whenever the registry is collected
    (:meth:`flush`, run by the families themselves), so every reader sees every observation made
    before it asked. Observations with an exemplar (kept traces), from other threads and in
    multiprocess mode go to prometheus-client at once.
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
        self._i = instruments_for(self.registry, self.buckets)
        #: inflight + amount: the gauge's value's own ``inc`` when prometheus-client exposes it (what
        #: ``Gauge.inc`` and ``Gauge.dec`` call after their checks), else the gauge's ``inc``
        self._inflight_add: Callable[[float], None] = _value_inc(self._i.inflight)
        self._folded: dict[str | None, str] = {None: NO_MODEL}
        self._routes: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._req_children: dict[tuple[str, str, int | None], _Observer] = {}  # (route, model, status)
        self._stage_children: dict[tuple[str, str, str], _Observer] = {}
        self._released = False
        # deferred observations (see the class docstring): the thread that owns them (0: none yet,
        # -1: never, multiprocess values), its counts of started and finished requests, and what of
        # them the in-flight gauge has been given
        self._owner = 0 if _deferrable(getattr(self._i.inflight, "_value", None)) else -1
        self._started = 0
        self._finished = 0
        self._inflight_done = 0
        self._req_pending: dict[tuple[str, str, int | None], _Pending] = {}
        self._stage_pending: dict[tuple[str, str, str], _Pending] = {}
        # the same keys -> their Pending's ``add`` (what the request path calls)
        self._req_add: dict[tuple[str, str, int | None], Callable[[int], Any]] = {}
        self._stage_add: dict[tuple[str, str, str], Callable[[int], Any]] = {}
        self._flush_lock = threading.Lock()
        self._owner_lock = threading.Lock()
        self._i.flushers.append(self.flush)

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
        if _get_ident() == self._owner:
            self._started += 1
        elif self._owner == 0:
            self._claim()
            self.request_started()
        else:
            self._inflight_add(1)

    def _claim(self) -> None:
        """The first thread to start a request owns the deferred counts (see the class docstring)."""
        with self._owner_lock:
            if self._owner == 0:
                self._owner = _get_ident()

    def flush(self) -> None:
        """Add the deferred observations and in-flight count to the families (run before each
        collection of the registry; also safe to call at any time, from any thread)."""
        with self._flush_lock:
            finished = self._finished  # read before started: a request finishes after it started
            inflight = self._started - finished
            if inflight != self._inflight_done:
                self._inflight_add(inflight - self._inflight_done)
                self._inflight_done = inflight
            for pending in (*self._req_pending.values(), *self._stage_pending.values()):
                pending.flush()

    def request_finished(self, record: RequestRecord, trace_id: str | None = None) -> None:
        """Inflight - 1 and publish everything measured on ``record`` (call once, after its end).

        ``trace_id`` (32 lowercase hex) becomes the exemplar of every latency observation; pass it only
        for traces that are kept, so an exemplar never points at a trace that was sampled out.
        """
        i = self._i
        try:
            model = self._folded[record.model]
        except KeyError:
            model = self.fold_model(record.model)
        end = record.end_ns
        start = record.start_ns
        route = record.route or names.UNMATCHED_ROUTE
        if route not in self._routes:
            route = self._route(route)
        code = record.status_code
        if trace_id is None and _get_ident() == self._owner:
            # deferred (the class docstring): each duration appended, in integer nanoseconds
            n = self._finished = self._finished + 1
            if end is not None:
                add = self._req_add.get((route, model, code))
                if add is None:
                    add = self._pending_request(route, model, code).add
                add(end - start)
            stage_add = self._stage_add
            for iv in record.stages:
                add = stage_add.get((iv.stage, iv.kind, model))
                if add is None:
                    add = self._pending_stage(iv.stage, iv.kind, iv.stage_kind, model).add
                add(iv.end_ns - iv.start_ns)
            if code == 429:
                self._child(i.shed, route, model).inc()
            if not n & _COMPACT_MASK:
                self._compact()
            if not record.token_ns and record.output_tokens is None and record.input_tokens is None:
                return  # not an LLM request
            self._genai(record, model, None)
            return
        self._inflight_add(-1)
        ex = {"trace_id": trace_id} if trace_id else None
        # the request and stage observations are _Observer.observe written out (durations from integer
        # nanoseconds are never NaN)
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
        if not record.token_ns and record.output_tokens is None and record.input_tokens is None:
            return  # not an LLM request
        self._genai(record, model, ex)

    def _pending_request(self, route: str, model: str, code: int | None) -> _Pending:
        pend = _Pending(self._i.request.labels(route, model, status_class(code)))
        with self._flush_lock:  # flush reads the pending objects under this lock
            self._req_pending[(route, model, code)] = pend
        self._req_add[(route, model, code)] = pend.add
        return pend

    def _pending_stage(self, stage: str, kind: str, stage_kind: str, model: str) -> _Pending:
        child = self._i.stage.labels(stage, stage_kind, model)
        # folded intervals are also counted: that child's observe runs (no deferral)
        pend = _Pending(_CountingChild(child, self._i.folded) if stage == names.STAGE_OVERFLOW else child)
        with self._flush_lock:
            self._stage_pending[(stage, kind, model)] = pend
        self._stage_add[(stage, kind, model)] = pend.add
        return pend

    def _compact(self) -> None:
        """On the owner thread, every ``_COMPACT_MASK + 1`` requests: add the deferred durations to
        the families and empty their lists, so that they stay short without a scrape. Skipped (until
        the next time) while a flush holds the lock: the request path never waits."""
        if not self._flush_lock.acquire(blocking=False):
            return
        try:
            for pending in (*self._req_pending.values(), *self._stage_pending.values()):
                pending.compact()
        finally:
            self._flush_lock.release()

    def _genai(self, record: RequestRecord, model: str, ex: dict[str, str] | None) -> None:
        """The GenAI families of a request that produced or consumed tokens."""
        i = self._i
        end = record.end_ns
        start = record.start_ns
        tokens = record.token_ns
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

    def stage_kind_error(self) -> None:
        """A stage call whose kind was not recorded (see :mod:`~stagescope.instrumentation.stagenames`)."""
        self._i.kind_errors.inc()

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
        self.flush()  # families another StageMetrics still uses keep this one's observations
        with contextlib.suppress(ValueError):
            self._i.flushers.remove(self.flush)
        if not release_instruments(self.registry, self._i):
            return
        self._children.clear()
        self._req_children.clear()
        self._stage_children.clear()
        with self._flush_lock:
            self._req_pending.clear()
            self._stage_pending.clear()
        self._req_add.clear()
        self._stage_add.clear()


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
