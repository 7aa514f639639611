"""The Prometheus families stagescope publishes: their names, help texts, labels and buckets.

One :class:`Instruments` set exists per ``CollectorRegistry`` (shared by every
:class:`~stagescope.instrumentation.metrics.StageMetrics` on it, so two ``instrument_app`` calls on one
registry publish one set of families); :mod:`~stagescope.instrumentation.metrics` turns records into
observations on them. All durations are **seconds**; names come from :mod:`stagescope.names` only.

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
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stagescope import names

__all__ = ["INSTRUMENTS_LOCK", "Instruments", "instruments_for", "release_instruments", "resolve_buckets"]

_HISTOGRAMS = (
    names.METRIC_REQUEST_DURATION,
    names.METRIC_STAGE_DURATION,
    names.METRIC_BATCH_SIZE,
    names.METRIC_GENAI_REQUEST_DURATION,
    names.METRIC_GENAI_TTFT,
    names.METRIC_GENAI_TPOT,
    names.METRIC_INTER_TOKEN,
)
#: Families whose per-request observations may wait in a StageMetrics until the registry is collected.
_DEFERRED = frozenset({names.METRIC_REQUEST_DURATION, names.METRIC_STAGE_DURATION})


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


class _Flushing:
    """A family that first adds its users' pending observations
    (:class:`~stagescope.instrumentation.promfast.Pending`) to its values whenever it is collected
    (a scrape, ``generate_latest``, ``registry.get_sample_value``), so a reader never sees less than
    was observed before it asked."""

    _stagescope_flush: Callable[[], None] | None = None

    def collect(self) -> Iterable[Any]:
        flush = self._stagescope_flush
        if flush is not None:
            flush()
        return super().collect()  # type: ignore[misc]


class _FlushingHistogram(_Flushing, Histogram):
    pass


class _FlushingGauge(_Flushing, Gauge):
    pass


class Instruments:
    """The prometheus-client objects of one registry (shared by every StageMetrics on that registry).

    ``flushers``: each user's ``flush`` (it adds what that StageMetrics counted on its request path
    to the request, stage and in-flight families); run before those families are collected."""

    def __init__(self, registry: CollectorRegistry, buckets: dict[str, tuple[float, ...]]) -> None:
        self.buckets = buckets
        self.users = 0  # StageMetrics objects using these instruments
        self.flushers: list[Callable[[], None]] = []
        r = registry
        m, route, stage_ = names.LABEL_MODEL, names.LABEL_ROUTE, names.LABEL_STAGE

        def hist(name: str, doc: str, labels: tuple[str, ...]) -> Histogram:
            cls = _FlushingHistogram if name in _DEFERRED else Histogram
            return cls(name, doc, labels, registry=r, buckets=buckets[name])

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
            "of custom stage names, or the name was not one stagescope can record.",
            registry=r,
        )
        self.kind_errors = Counter(
            names.METRIC_STAGE_KIND_ERRORS,
            "Stage calls given a kind that was not recorded (not a stagescope kind, or not the kind the "
            "name has in this process); the stage is recorded with the name's kind, else 'unknown'.",
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
        self.inflight = _FlushingGauge(
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
            self.ready, self.busy, self.folded, self.kind_errors,
        )  # fmt: skip
        for family in (self.request, self.stage, self.inflight):
            if isinstance(family, _Flushing):
                family._stagescope_flush = self.flush

    def flush(self) -> None:
        """Run every user's flush (each serialises its own)."""
        for flush in tuple(self.flushers):
            flush()

    def unregister(self, registry: CollectorRegistry) -> None:
        for c in self.collectors:
            with contextlib.suppress(KeyError):
                registry.unregister(c)


# registry -> its instruments, so that several StageMetrics (two instrument_app calls) share families.
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, Instruments] = weakref.WeakKeyDictionary()
INSTRUMENTS_LOCK = threading.Lock()


def instruments_for(registry: CollectorRegistry, buckets: dict[str, tuple[float, ...]]) -> Instruments:
    """The families of ``registry`` with ``buckets``, one more user counted (see :func:`release_instruments`)."""
    with INSTRUMENTS_LOCK:
        inst = _BY_REGISTRY.get(registry)
        if inst is not None and inst.buckets == buckets:
            inst.users += 1
            return inst
        if inst is not None:  # re-instrumented with other buckets: the new families replace the old
            inst.unregister(registry)
        inst = Instruments(registry, buckets)
        inst.users = 1
        _BY_REGISTRY[registry] = inst
        return inst


def release_instruments(registry: CollectorRegistry, inst: Instruments) -> bool:
    """One user fewer of ``inst``; when none is left its families leave ``registry``. True when they left."""
    with INSTRUMENTS_LOCK:
        inst.users -= 1
        if inst.users > 0:
            return False
        if _BY_REGISTRY.get(registry) is inst:
            del _BY_REGISTRY[registry]
        inst.unregister(registry)
        return True
