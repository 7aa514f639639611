"""prometheus-client's histogram ``observe`` and gauge ``inc`` without their per-call checks, for the
observations stagescope makes on every request (:class:`~stagescope.instrumentation.metrics.StageMetrics`).

The checks a labelled child passes every time (observable, not ``mostrecent``) are done once, when the
child is wrapped; what is then done per observation is exactly what prometheus-client does after them,
on its own value objects and their locks (tests/test_metrics_core.py compares the expositions).
:class:`Pending` goes further for the observations of one thread in one process: it keeps them as
integer nanoseconds and adds them to those value objects when the registry is collected
(tests/test_metrics_deferred.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

__all__ = ["CountingChild", "Observer", "Pending", "bisect_left", "deferrable", "ns_limit", "value_inc"]

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


#: 2**63 nanoseconds: no duration reaches it (a bound past it holds every duration)
_NS_CAP = 1 << 63


def ns_limit(bound: float) -> int | None:
    """The largest integer ``n`` with ``n / 1e9 <= bound`` (None for ``+Inf``): a duration of ``n``
    nanoseconds falls in the bucket of ``bound`` or below exactly when ``n <= ns_limit(bound)``, the
    same test as ``seconds <= bound`` on ``n / 1e9`` (division rounds correctly, so it is monotonic)."""
    if bound == math.inf:
        return None
    if not -_NS_CAP < bound * 1e9 < _NS_CAP:  # past any duration a clock gives (292 years)
        return _NS_CAP if bound > 0 else -_NS_CAP
    n = math.floor(bound * 1e9)
    while (n + 1) / 1e9 <= bound:
        n += 1
    while n / 1e9 > bound:
        n -= 1
    return n


class Pending:
    """A histogram child's observations, kept as integer nanoseconds on the request path and added to
    the child's own values (its bucket and sum value objects, under their locks) when the registry is
    collected.

    Why: on every request stagescope observes the request histogram and one stage histogram per
    stage; through prometheus-client each observation is two ``MutexValue.inc`` calls, each a Python
    call taking a lock. Here the request path calls :attr:`add` with the duration in nanoseconds,
    which is ``list.append`` (an int is not tracked by the garbage collector, so the list costs it
    nothing), and :meth:`flush` sorts what came since the last flush and counts each bucket with one
    bisection per bound (C code, not a Python step per observation): one ``inc`` per bucket that moved,
    one for the sum. The owner (StageMetrics) guarantees a single writer: only the thread that owns the
    object appends (requests from any other thread, and every observation with an exemplar, go to the
    child's own ``observe``), :meth:`flush` only reads up to the length it saw, and only the owner,
    holding the flush lock, empties the list (:meth:`compact`), so no observation is lost or counted
    twice without a lock on the request path. Only for values that live in this process
    (:func:`deferrable`): a multiprocess child is read from its file by another process, which cannot
    ask this one to flush. ``ns`` is None for a child that cannot be deferred: :attr:`add` then
    observes on the child at once (``child.observe(ns / 1e9)``)."""

    __slots__ = ("_add_sum", "_done", "_incs", "_limits", "add", "child", "ns")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.ns: list[int] | None = None
        self.add: Callable[[int], Any] = self._observe_now
        self._done = 0  # ns[:_done] are in the child's values already
        self._limits: tuple[int, ...] = ()
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
        limits = [ns_limit(b) for b in bounds[:-1]]
        if any(lim is None for lim in limits):
            return
        self._limits = tuple(lim for lim in limits if lim is not None)
        self._incs = tuple(v.inc for v in values[:-1])
        self._add_sum = values[-1].inc
        ns: list[int] = []
        self.ns = ns
        self.add = ns.append

    def _observe_now(self, ns: int) -> None:
        self.child.observe(ns / 1e9)

    def flush(self) -> None:
        """Add what was observed since the last flush to the child's values (callers serialise flushes
        and :meth:`compact`)."""
        ns = self.ns
        if ns is None or self._add_sum is None:
            return
        n = len(ns)  # the owner may append meanwhile: those are the next flush's
        if n == self._done:
            return
        new = sorted(ns[self._done : n])
        self._done = n
        below = 0
        incs = self._incs
        for k, limit in enumerate(self._limits):
            c = bisect.bisect_right(new, limit)  # how many are <= this bucket's bound
            if c != below:
                incs[k](c - below)
                below = c
            if below == len(new):
                break
        if below != len(new):
            incs[-1](len(new) - below)  # +Inf
        self._add_sum(sum(new) / 1e9)

    def compact(self) -> None:
        """Flush, then empty the list (only its owner thread may call this, holding the flush lock)."""
        ns = self.ns
        if ns is None:
            return
        self.flush()
        del ns[:]  # the same list: ``add`` is its bound append
        self._done = 0


class CountingChild:
    """A histogram child that also counts each observation in a counter."""

    __slots__ = ("_child", "_counter")

    def __init__(self, child: Any, counter: Any) -> None:
        self._child, self._counter = child, counter

    def observe(self, value: float, exemplar: Any = None) -> None:
        self._child.observe(value, exemplar)
        self._counter.inc()
