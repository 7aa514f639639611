"""prometheus-client's histogram ``observe`` and gauge ``inc`` without their per-call checks, for the
observations stagescope makes on every request (:class:`~stagescope.instrumentation.metrics.StageMetrics`).

The checks a labelled child passes every time (observable, not ``mostrecent``) are done once, when the
child is wrapped; what is then done per observation is exactly what prometheus-client does after them,
on its own value objects and their locks (tests/test_metrics_core.py compares the expositions).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

__all__ = ["Observer", "bisect_left", "value_inc"]

#: ``bisect.bisect_left``: the index of the first bound >= a value (the bucket prometheus-client picks)
bisect_left = bisect.bisect_left


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
