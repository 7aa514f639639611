"""The span thread: a bounded queue of kept request records, published off the event loop.

The middleware calls :meth:`SpanPipeline.submit` for every request the sampling policy keeps (a
``deque.append``). One background thread drains the queue, turns each record into spans with a
:class:`~stagescope.instrumentation.tracing.SpanBuilder` and hands them on: to the embedded sink as
OTLP/JSON objects built straight from the record, to any other exporter as ReadableSpans, or to a
tracer provider's span processors (``deliver_to_provider``). A record whose request span is another
instrumentation's, and reaches the destination by itself, gets its stage spans only
(``TracedRecord.emit_server``); spans the request made that waited for its keep decision
(``TracedRecord.held_spans``) go out with it, as ReadableSpans to ``deliver``. When the queue is full
new records are dropped and counted (``stagescope_spans_dropped_total{reason="queue_full"}``); the
request never waits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan

from stagescope.instrumentation.otlp_json import EncodedSpans
from stagescope.instrumentation.spanqueue import after_fork_in_child
from stagescope.instrumentation.tracing import SpanBuilder, TracedRecord
from stagescope.names import DROP_BUILD_FAILED, DROP_EXPORT_FAILED, DROP_QUEUE_FULL, DROP_SHUTDOWN

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["YIELD_EVERY", "Deliver", "SpanPipeline", "deliver_to_provider"]

_log = logging.getLogger(__name__)

#: The span thread releases the GIL after this many records, so the event loop never waits long for it.
YIELD_EVERY = 8

#: (spans) -> None; must not block for long (exporters made by export.py only enqueue).
Deliver = Callable[[Sequence[ReadableSpan]], object]


def deliver_to_provider(provider: TracerProvider) -> Deliver:
    """Hand finished spans to an SDK tracer provider's span processors (as ``Span.end`` would)."""
    processor = provider._active_span_processor

    def deliver(spans: Sequence[ReadableSpan]) -> None:
        for s in spans:
            processor.on_end(s)

    return deliver


class SpanPipeline:
    """Bounded queue of kept records, drained by one background thread that builds and exports spans.

    With ``deliver_encoded`` (the embedded sink) spans go out as OTLP/JSON objects built straight from
    the record (:meth:`SpanBuilder.otlp_spans`), else as ReadableSpans to ``deliver``.

    ``submit`` (request path) is a ``deque.append`` and, once per ``batch_size`` records, a wake-up;
    when ``max_queue`` records wait, new ones are dropped and counted
    (``span_dropped(n, exporter_label, "queue_full")``, n = spans the record would have made).
    """

    def __init__(
        self,
        builder: SpanBuilder,
        deliver: Deliver,
        *,
        exporter_label: str,
        metrics: Any = None,
        count_exported: bool = False,
        max_queue: int = 16384,
        batch_size: int = 128,
        interval_s: float = 0.2,
        flush_downstream: Callable[[int], object] | None = None,
        deliver_encoded: Callable[[EncodedSpans], object] | None = None,
    ) -> None:
        self.builder = builder
        self.deliver = deliver
        self.deliver_encoded = deliver_encoded
        self.exporter_label = exporter_label
        self.metrics = metrics
        self.count_exported = count_exported
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.flush_downstream = flush_downstream
        self._queue: deque[TracedRecord] = deque()
        self._submitted = 0
        self._done = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopped = False
        self._warned = False
        self._thread: threading.Thread | None = None
        self._start_thread()
        after_fork_in_child(self, "_after_fork")

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stagescope-spans", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        self._queue.clear()
        self._submitted = self._done = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        if not self._stopped:
            self._start_thread()

    def submit(self, rec: TracedRecord) -> None:
        """Queue a kept record (never blocks; drops and counts when the queue is full)."""
        q = self._queue
        if len(q) >= self.max_queue or self._stopped:
            self._count_dropped(1 + len(rec.stages), DROP_QUEUE_FULL if not self._stopped else DROP_SHUTDOWN)
            return
        q.append(rec)
        self._submitted += 1
        if len(q) >= self.batch_size:
            self._wake.set()

    def _count_dropped(self, n: int, reason: str) -> None:
        if n and self.metrics is not None:
            with contextlib.suppress(Exception):  # telemetry never raises into the service
                self.metrics.span_dropped(n, self.exporter_label, reason)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._drain()
            if self._stopped:
                self._drain()
                return

    def _drain(self) -> None:
        q = self._queue
        while q:
            batch: list[TracedRecord] = []
            while q and len(batch) < self.batch_size:
                batch.append(q.popleft())
            spans: list[Any] = []
            held: list[Any] = []
            build: Callable[..., list[Any]] = (
                self.builder.build if self.deliver_encoded is None else self.builder.otlp_spans
            )
            for i, rec in enumerate(batch):
                try:
                    spans.extend(build(rec, server=rec.emit_server))
                except Exception:
                    self._warn("building spans failed")
                    self._count_dropped(1 + len(rec.stages), DROP_BUILD_FAILED)
                if rec.held_spans:
                    held.extend(rec.held_spans)
                    rec.held_spans = None
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    time.sleep(0)  # hand the GIL to the event loop if it waits (short, frequent holds)
            try:
                if spans and self.deliver_encoded is not None:
                    self.deliver_encoded(EncodedSpans(self.builder.resource, self.builder.scope, spans))
                    spans = []
                spans.extend(held)
                if spans:
                    self.deliver(spans)
                    if self.count_exported and self.metrics is not None:
                        self.metrics.span_exported(len(spans), self.exporter_label)
            except Exception:
                self._warn("delivering spans failed")
                self._count_dropped(len(spans), DROP_EXPORT_FAILED)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("stagescope: %s (further failures are counted, not logged)", what, exc_info=True)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every record submitted so far is exported, then flush downstream with the time
        left (``flush_downstream(milliseconds)``); True when both finished within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        target = self._submitted
        self._wake.set()
        with self._cond:
            ok = self._cond.wait_for(lambda: self._done >= target, timeout=timeout_s)
        if self.flush_downstream is not None:
            try:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                ok = bool(self.flush_downstream(left_ms)) and ok
            except Exception:
                self._warn("flushing the exporter failed")
                ok = False
        return bool(ok)

    def drain(self, deadline: float) -> int:
        """Hand every record submitted so far on to the exporter until ``deadline`` (``time.monotonic()``);
        records still queued then are dropped and counted as ``shutdown``. Returns the spans dropped.
        Does not flush downstream (the caller drains the exporter next, with what time is left)."""
        target = self._submitted
        self._wake.set()
        with self._cond:
            ok = self._cond.wait_for(lambda: self._done >= target, timeout=max(0.0, deadline - time.monotonic()))
        if ok:
            return 0
        dropped = records = 0
        while True:
            try:
                rec = self._queue.popleft()
            except IndexError:
                break
            dropped += 1 + len(rec.stages)
            records += 1
        self._count_dropped(dropped, DROP_SHUTDOWN)
        with self._cond:
            self._done += records
            self._cond.notify_all()
        return dropped

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what is queued (for at most ``timeout_s``), then stop the thread; later records are
        dropped and counted."""
        if self._stopped:
            return
        self.drain(time.monotonic() + timeout_s)
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
