"""prometheus-client's histogram ``observe`` and gauge ``inc`` without their per-call checks, for the
observations stagescope makes on every request (:class:`~stagescope.instrumentation.metrics.StageMetrics`).

The checks a labelled child passes every time (observable, not ``mostrecent``) are done once, when the
child is wrapped; what is then done per observation is exactly what prometheus-client does after them,
on its own value objects and their locks (tests/test_metrics_core.py compares the expositions).
:class:`Pending` goes further for the observations of one thread in one process: it counts them in
plain Python numbers and adds them to those value objects when the registry is collected
(tests/test_metrics_deferred.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

__all__ = ["CountingChild", "Observer", "Pending", "bisect_left", "deferrable", "value_inc"]

#: ``bisect.bisect_left``: the index of the first bound >= a value (the bucket prometheus-client picks)
bisect_left = bisect.bisect_left


def deferrable(value: Any) -> bool:
    """True for a prometheus-client value object that lives in this process only (``MutexValue``:
    ``_multiprocess`` False), whose readers all go through this process's registry; False for the
    multiprocess mmap values another process reads from disk, and for anything unexpected."""
    return getattr(value, "_multiprocess", True) is False and callable(getattr(value, "inc", None))


def value_inc(metric: Any) -> Callable[[float], None]:
    """``metric._value.inc`` (prometheus-client's value object of an unlabelled counter or gauge: what
    its public ``inc``/``dec`` call once they have checked the metric is observable and, for a gauge,
    not in ``mostrecent`` mode), else ``metric.inc``. Used for the in-flight gauge only (livesum)."""
    inc = getattr(getattr(metric, "_value", None), "inc", None)
    return inc if callable(inc) else metric.inc


class Observer:
    """A histogram child's ``observe`` as prometheus-client's does it, without the per-call checks.

    ``Histogram.observe`` (prometheus-client 0.20-0.26) checks that the child is observable (a
    labelled child always is), adds the value to ``_sum`` and adds 1 to the first bucket whose upper
    bound is >= the value, walking the bounds in order; with an exemplar, it validates it and sets it
    on that bucket. This does the same two additions on the same value objects (their own locks; the
    multiprocess mmap values alike), finding the bucket by bisection (``bisect_left``: the first bound
    >= the value, ``+Inf`` last), and hands any observation with an exemplar (kept traces only) to the
    child's own ``observe``. When the child does not look like that (another prometheus-client), every
    observation goes to the child's ``observe``. Measured in-process on this machine: about half the
    interpreter work of ``observe`` per observation (benchmarks/overhead.py, README "Cost")."""

    __slots__ = ("_add_sum", "_bounds", "_buckets", "child")

    def __init__(self, child: Any) -> None:
        self.child = child
        self._add_sum: Callable[[float], None] | None = None
        self._bounds: tuple[float, ...] = ()
        self._buckets: tuple[Callable[[float], None], ...] = ()
        try:
            bounds = tuple(float(b) for b in child._upper_bounds)
            buckets = tuple(b.inc for b in child._buckets)
            add_sum = child._sum.inc
        except (AttributeError, TypeError):
            return
        if bounds and len(bounds) == len(buckets) and bounds[-1] == math.inf and callable(add_sum):
            self._add_sum, self._bounds, self._buckets = add_sum, bounds, buckets

    def observe(self, value: float, exemplar: Any = None) -> None:
        add_sum = self._add_sum
        if add_sum is None or exemplar or value != value:  # NaN: prometheus-client adds no bucket
            self.child.observe(value, exemplar)
            return
        add_sum(value)
        self._buckets[bisect_left(self._bounds, value)](1)


class Pending:
    """A histogram child's observations counted in plain Python numbers and added to the child's own
    values (its sum and bucket value objects, under their locks) when the registry is collected.

    Why: on every request stagescope observes the request histogram and one stage histogram per
    stage; through prometheus-client each observation is two ``MutexValue.inc`` calls, each a Python
    call taking a lock. Here the request path does ``counts[bisect_left(bounds, v)] += 1`` and
    ``total += v`` instead, and :meth:`flush` adds what was counted since the last flush (one ``inc``
    per bucket that moved, one for the sum). The owner (StageMetrics) guarantees a single writer: only
    the thread that owns the object writes ``counts`` and ``total`` (requests from any other thread, and
    every observation with an exemplar, go to the child's own ``observe``), and :meth:`flush` only reads
    them, so no count is lost without a lock on the request path. Only for values that live in this
    process (:func:`deferrable`): a multiprocess child is read from its file by another process, which
    cannot ask this one to flush. ``counts``/``total`` are None for a child that cannot be deferred:
    the owner then calls ``child.observe`` itself."""

    __slots__ = ("_add_sum", "_done", "_done_total", "_incs", "bounds", "child", "counts", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.counts: list[int] | None = None
        self.bounds: tuple[float, ...] = ()
        self.total = 0.0
        self._done: list[int] = []
        self._done_total = 0.0
        self._incs: tuple[Callable[[float], None], ...] = ()
        self._add_sum: Callable[[float], None] | None = None
        try:
            bounds = tuple(float(b) for b in child._upper_bounds)
            values = (*child._buckets, child._sum)
        except (AttributeError, TypeError):
            return
        if not bounds or len(bounds) != len(values) - 1 or bounds[-1] != math.inf:
            return
        if not all(deferrable(v) for v in values):
            return
        self.bounds = bounds
        self._incs = tuple(v.inc for v in values[:-1])
        self._add_sum = values[-1].inc
        self._done = [0] * len(bounds)
        self.counts = [0] * len(bounds)

    def flush(self) -> None:
        """Add what was counted since the last flush to the child's values (callers serialise flushes)."""
        counts, done = self.counts, self._done
        if counts is None or self._add_sum is None:
            return
        for k, inc in enumerate(self._incs):
            c = counts[k]
            if c != done[k]:
                inc(c - done[k])
                done[k] = c
        total = self.total
        if total != self._done_total:
            self._add_sum(total - self._done_total)
            self._done_total = total


class CountingChild:
    """A histogram child that also counts each observation in a counter."""

    __slots__ = ("_child", "_counter")

    def __init__(self, child: Any, counter: Any) -> None:
        self._child, self._counter = child, counter

    def observe(self, value: float, exemplar: Any = None) -> None:
        self._child.observe(value, exemplar)
        self._counter.inc()
