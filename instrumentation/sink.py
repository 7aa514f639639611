"""The embedded span sink: OTLP/JSON lines in local files, for services without a collector.

``JsonLinesSpanExporter(directory)`` is an OpenTelemetry ``SpanExporter`` whose ``export`` only puts
the spans on a bounded in-memory queue and returns: one background thread encodes them (one
``ExportTraceServiceRequest`` JSON object per line, exactly as the collector's ``file`` exporter
writes, see :mod:`stagescope.instrumentation.otlp_json`) and appends them to
``<directory>/spans-<pid>-<n>.jsonl``. Each process writes its own files (several uvicorn or gunicorn
workers never share one); a file is rotated to ``n + 1`` when it would exceed ``max_bytes``.

Bounded: at most ``max_queue_spans`` spans wait; beyond that new spans are dropped and counted
(``stagescope_spans_dropped_total{exporter="jsonl",reason="queue_full"}``). Flushed every
``flush_interval_s`` seconds, on ``force_flush``, on ``shutdown`` and at interpreter exit. A request
never waits on it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stagescope.instrumentation.otlp_json import EncodedSpans, encode_spans

__all__ = [
    "JsonLinesSpanExporter",
    "QueuedSpanExporter",
    "SpanCounter",
    "after_fork_in_child",
    "resolve_metrics",
]

_log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_QUEUE_SPANS = 16384
#: At most this many spans go in one line (one ExportTraceServiceRequest).
SPANS_PER_LINE = 128


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
        self.dropped[reason] = self.dropped.get(reason, 0) + n
        m = self._m()
        if m is not None and n:
            with contextlib.suppress(Exception):
                m.span_dropped(n, self.label, reason)


class QueuedSpanExporter(SpanExporter):
    """The request side that stagescope's span exporters share: ``export`` puts spans on a bounded
    queue that one background thread drains, and never blocks. With the queue full, or the exporter
    stopped, the spans are dropped and counted.

    A subclass calls :meth:`_init_queue` from its ``__init__`` (and :meth:`_reset_queue` in a forked
    child, where locks and threads do not survive), drains ``_queue`` in its thread under ``_lock``
    (keeping ``_queued`` right), calls :meth:`_mark_done` after each batch, and says in
    :meth:`_wake_now` when enough is queued to wake its thread before the next interval.
    """

    def _init_queue(self, counter: SpanCounter, max_queue_spans: int) -> None:
        self.counter = counter
        self.max_queue_spans = max_queue_spans
        self._queue: deque[Any] = deque()
        self._stopped = False
        self._reset_queue()

    def _reset_queue(self) -> None:
        self._queue.clear()
        self._queued = 0  # spans waiting
        self._accepted = 0  # export calls accepted
        self._done = 0  # of those, handled by the thread (exported, written or dropped)
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
            self.counter.drop(n, "shutdown")
            return SpanExportResult.FAILURE
        if self._queued + n > self.max_queue_spans:
            self.counter.drop(n, "queue_full")
            return SpanExportResult.FAILURE
        with self._lock:
            self._queue.append(item)
            self._queued += n
            self._accepted += 1
        if self._wake_now():
            self._wake.set()
        return SpanExportResult.SUCCESS

    def _mark_done(self, calls: int) -> None:
        """The thread handled ``calls`` queued export calls (exported, written or dropped)."""
        with self._cond:
            self._done += calls
            self._cond.notify_all()

    def _wait_done(self, timeout_millis: int) -> bool:
        """Wake the thread and wait until every call accepted so far is handled."""
        with self._lock:
            target = self._accepted
        self._wake.set()
        with self._cond:
            return bool(self._cond.wait_for(lambda: self._done >= target, timeout=timeout_millis / 1000))


class JsonLinesSpanExporter(QueuedSpanExporter):
    """Writes spans as OTLP/JSON lines to ``<directory>/spans-<pid>-<n>.jsonl`` from a background thread."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
        flush_interval_s: float = 1.0,
        metrics: Any = None,
        exporter_label: str = "jsonl",
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self._init_queue(SpanCounter(exporter_label, metrics), max_queue_spans)
        self._file: IO[bytes] | None = None
        self._file_pid = -1
        self._file_index = -1
        self._file_size = 0
        self.files: list[Path] = []
        self._thread: threading.Thread | None = None
        self._start()
        atexit.register(_shutdown_ref, weakref.ref(self))
        after_fork_in_child(self, "_after_fork")

    # ------------------------------------------------------------------ request side (non-blocking)
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._enqueue(spans, len(spans))

    def export_encoded(self, group: EncodedSpans) -> SpanExportResult:
        """Like :meth:`export` for spans already in OTLP/JSON form (stagescope's own fast path)."""
        return self._enqueue(group, len(group.spans))

    def _wake_now(self) -> bool:
        return self._queued >= SPANS_PER_LINE

    # ------------------------------------------------------------------ writer thread
    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stagescope-jsonl", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        self._reset_queue()
        self._file = None  # the parent's file stays the parent's
        if not self._stopped:
            self._start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._write_pending()
            if self._stopped:
                self._write_pending()
                return

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                batch: list[ReadableSpan] = []
                groups: list[EncodedSpans] = []
                calls = n = 0
                while self._queue and n < SPANS_PER_LINE:
                    item = self._queue.popleft()
                    if isinstance(item, EncodedSpans):
                        groups.append(item)
                        n += len(item.spans)
                    else:
                        batch.extend(item)
                        n += len(item)
                    calls += 1
                self._queued -= n
            try:
                line = encode_spans(batch, groups) + b"\n"
                self._write(line)
                self.counter.ok(n)
            except Exception:
                _log.warning("stagescope: writing spans to %s failed", self.directory, exc_info=True)
                self.counter.drop(n, "write_failed")
            self._mark_done(calls)
            time.sleep(0)  # let the event loop thread take the GIL between lines

    def _write(self, line: bytes) -> None:
        pid = os.getpid()
        if self._file is None or self._file_pid != pid or self._file_size + len(line) > self.max_bytes:
            self._open_next(pid)
        f = self._file
        assert f is not None
        f.write(line)
        f.flush()
        self._file_size += len(line)

    def _open_next(self, pid: int) -> None:
        if self._file is not None and self._file_pid == pid:
            self._file.close()
        if self._file_pid != pid:
            self._file_index = -1
        self._file_pid = pid
        while True:
            self._file_index += 1
            path = self.directory / f"spans-{pid}-{self._file_index}.jsonl"
            if not path.exists():
                break
        self._file = open(path, "ab")  # noqa: SIM115 - kept open across writes, closed on rotation/shutdown
        self._file_size = 0
        self.files.append(path)

    # ------------------------------------------------------------------ SpanExporter lifecycle
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write everything accepted so far; True when done within the timeout."""
        return self._wait_done(timeout_millis)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self.force_flush(10000)
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None


def _shutdown_ref(ref: weakref.ref[JsonLinesSpanExporter]) -> None:
    exporter = ref()
    if exporter is not None:
        exporter.shutdown()
