"""The request side that stagescope's span exporters share: a bounded queue that ``export`` appends
to and one background thread drains, with counting and a deadline-bounded drain.

* ``export`` never blocks: with the queue full, or the exporter stopped, the spans are dropped and
  counted (``stagescope_spans_dropped_total{reason}``, reasons in :data:`stagescope.names.DROP_REASONS`).
* :meth:`QueuedSpanExporter.drain` waits until everything accepted so far is written or sent, up to a
  deadline; what is still queued then is dropped and counted as ``shutdown``, the request in flight is
  aborted (:meth:`QueuedSpanExporter._abort_in_flight`) and the exporter keeps running (an app whose
  lifespan restarts, as test clients do, keeps exporting).
* Threads do not survive ``fork`` (gunicorn ``--preload``): :func:`after_fork_in_child` restarts them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stagescope.names import DROP_QUEUE_FULL, DROP_SHUTDOWN

__all__ = ["QueuedSpanExporter", "SpanCounter", "after_fork_in_child", "resolve_metrics"]

#: After the deadline, how long a drain waits for the thread to account for the batch it holds (s).
_IN_FLIGHT_GRACE_S = 0.25


def after_fork_in_child(obj: object, method: str) -> None:
    """Call ``obj.<method>()`` in a forked child (gunicorn ``--preload``): threads do not survive fork."""
    ref = weakref.ref(obj)

    def callback() -> None:
        target = ref()
        if target is not None:
            getattr(target, method)()

    os.register_at_fork(after_in_child=callback)


def resolve_metrics(metrics: Any) -> Any:
    """``metrics`` if given, else the StageMetrics installed by the latest ``instrument_app`` (or None)."""
    if metrics is not None:
        return metrics
    try:
        from stagescope.instrumentation.metrics import default_metrics

        return default_metrics()
    except Exception:
        return None


class SpanCounter:
    """Counts exported and dropped spans on a StageMetrics, resolved lazily, never raising."""

    def __init__(self, label: str, metrics: Any = None) -> None:
        self.label = label
        self._metrics = metrics
        self.exported = 0
        self.dropped: dict[str, int] = {}

    def _m(self) -> Any:
        return resolve_metrics(self._metrics)

    def ok(self, n: int) -> None:
        self.exported += n
        m = self._m()
        if m is not None and n:
            with contextlib.suppress(Exception):
                m.span_exported(n, self.label)

    def drop(self, n: int, reason: str) -> None:
        if not n:
            return
        self.dropped[reason] = self.dropped.get(reason, 0) + n
        m = self._m()
        if m is not None:
            with contextlib.suppress(Exception):
                m.span_dropped(n, self.label, reason)


class QueuedSpanExporter(SpanExporter):
    """Bounded queue of ``(item, spans)`` pairs drained by one background thread (see the module docstring).

    A subclass calls :meth:`_init_queue` from its ``__init__`` (and :meth:`_reset_queue` in a forked
    child, where locks and threads do not survive), takes items with :meth:`_take` in its thread, calls
    :meth:`_mark_done` after handling them (exported, written or dropped), and says in :meth:`_wake_now`
    when enough is queued to wake its thread before the next interval.
    """

    def _init_queue(self, counter: SpanCounter, max_queue_spans: int) -> None:
        self.counter = counter
        self.max_queue_spans = max_queue_spans
        self._queue: deque[tuple[Any, int]] = deque()
        self._stopped = False
        self._reset_queue()

    def _reset_queue(self) -> None:
        self._queue.clear()
        self._queued = 0  # spans waiting
        self._accepted = 0  # export calls accepted
        self._done = 0  # of those, handled by the thread (exported, written or dropped)
        self._deadline: float | None = None  # set while a drain runs: time.monotonic() it ends at
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()

    def _wake_now(self) -> bool:
        """True when the thread should run now rather than at its next interval."""
        return False

    def _enqueue(self, item: Any, n: int) -> SpanExportResult:
        if not n:
            return SpanExportResult.SUCCESS
        if self._stopped:
            self.counter.drop(n, DROP_SHUTDOWN)
            return SpanExportResult.FAILURE
        if self._queued + n > self.max_queue_spans:
            self.counter.drop(n, DROP_QUEUE_FULL)
            return SpanExportResult.FAILURE
        with self._lock:
            self._queue.append((item, n))
            self._queued += n
            self._accepted += 1
        if self._wake_now():
            self._wake.set()
        return SpanExportResult.SUCCESS

    def _take(self, max_spans: int) -> tuple[list[Any], int, int]:
        """(items, spans, calls) from the head of the queue: at least one item, then up to ``max_spans``."""
        items: list[Any] = []
        n = calls = 0
        with self._lock:
            q = self._queue
            while q and (not items or n + q[0][1] <= max_spans):
                item, k = q.popleft()
                items.append(item)
                n += k
                calls += 1
            self._queued -= n
        return items, n, calls

    def _mark_done(self, calls: int) -> None:
        """The thread handled ``calls`` queued export calls (exported, written or dropped)."""
        if not calls:
            return
        with self._cond:
            self._done += calls
            self._cond.notify_all()

    def _wait_done(self, timeout_s: float) -> bool:
        """Wake the thread and wait until every call accepted so far is handled."""
        with self._lock:
            target = self._accepted
        self._wake.set()
        with self._cond:
            return bool(self._cond.wait_for(lambda: self._done >= target, timeout=max(0.0, timeout_s)))

    @property
    def draining(self) -> bool:
        """True while a drain runs (the thread tries at once, within the deadline)."""
        return self._deadline is not None

    def _abort_in_flight(self) -> None:
        """At the drain deadline: make the thread give up the batch it holds (default: nothing)."""

    def drain(self, deadline: float) -> int:
        """Write or send everything accepted so far until ``deadline`` (``time.monotonic()``); then drop
        what is still queued and count it as ``shutdown``. Returns the spans dropped for the deadline."""
        before = self.counter.dropped.get(DROP_SHUTDOWN, 0)
        with self._lock:
            target = self._accepted
        self._deadline = deadline
        try:
            self._wake.set()
            with self._cond:
                done = self._cond.wait_for(
                    lambda: self._done >= target, timeout=max(0.0, deadline - time.monotonic())
                )
            if not done:
                with self._lock:
                    dropped = calls = 0
                    while self._queue:
                        dropped += self._queue.popleft()[1]
                        calls += 1
                    self._queued -= dropped
                self.counter.drop(dropped, DROP_SHUTDOWN)
                self._mark_done(calls)
                self._abort_in_flight()  # the batch in the thread's hands: it counts it when it gives up
                with self._cond:
                    self._cond.wait_for(lambda: self._done >= target, timeout=_IN_FLIGHT_GRACE_S)
        finally:
            self._deadline = None
        return self.counter.dropped.get(DROP_SHUTDOWN, 0) - before

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write or send everything accepted so far; True when done within the timeout (nothing is dropped)."""
        return self._wait_done(timeout_millis / 1000)
