"""The embedded span sink: OTLP/JSON lines in local files, for services without a collector.

``JsonLinesSpanExporter(directory)`` is an OpenTelemetry ``SpanExporter`` whose ``export`` only puts
the spans on a bounded in-memory queue and returns: one background thread encodes them (one
``ExportTraceServiceRequest`` JSON object per line, exactly as the collector's ``file`` exporter
writes, see :mod:`stagescope.instrumentation.otlp_json`) and appends them to
``<directory>/spans-<pid>-<n>.jsonl``. Each process writes its own files (several uvicorn or gunicorn
workers never share one; a file is created exclusively, so two containers whose services are both pid
1 on one volume do not either); a file is rotated to ``n + 1`` when it would exceed ``max_bytes``.

Bounded: at most ``max_queue_spans`` spans wait; beyond that new spans are dropped and counted
(``stagescope_spans_dropped_total{exporter="jsonl",reason="queue_full"}``). Flushed every
``flush_interval_s`` seconds, on ``force_flush``, on ``drain``/``shutdown`` and at interpreter exit
(bounded by the shutdown timeout, see :mod:`stagescope.instrumentation.lifecycle`). A request never
waits on it.

**Never a corrupt file** (:class:`SpanFile`): a line is written with ``os.write`` calls on an
``O_APPEND`` descriptor; when one fails (disk full, quota, I/O error) the file is truncated back to its
last whole line, or, if even that fails, closed and the next line starts a new file. The failed line's
spans are dropped and counted (``reason="write_failed"``), and the next line is tried as usual, so
writing resumes when space comes back. A span file or directory deleted under the writer (log
cleanup, ``rm -rf``) is noticed before the next line (its link count is 0) and recreated. Repeated
failures log one line a minute, not a traceback per write (:class:`~.lifecycle.RateLimitedLog`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from stagescope.instrumentation.lifecycle import RateLimitedLog, resolve_shutdown_timeout
from stagescope.instrumentation.otlp_json import EncodedSpans, encode_spans
from stagescope.instrumentation.spanqueue import (
    QueuedSpanExporter,
    SpanCounter,
    after_fork_in_child,
    resolve_metrics,
)
from stagescope.names import DROP_BUILD_FAILED, DROP_WRITE_FAILED

__all__ = [
    "JsonLinesSpanExporter",
    "QueuedSpanExporter",
    "SpanCounter",
    "SpanFile",
    "after_fork_in_child",
    "resolve_metrics",
]

_log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_QUEUE_SPANS = 16384
#: At most this many spans go in one line (one ExportTraceServiceRequest).
SPANS_PER_LINE = 128


class SpanFile:
    """The current ``spans-<pid>-<n>.jsonl`` of one process: whole lines only (see the module docstring).

    :meth:`write` raises ``OSError`` when a line could not be written, after putting the file back to
    its last whole line (or giving it up, so the next line opens a new one).
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.fd: int | None = None
        self.path: Path | None = None
        self.size = 0  # bytes of whole lines in the current file
        self.pid = -1
        self.index = -1
        self.files: list[Path] = []
        self.reopened = 0  # files recreated after being deleted
        self.cut = 0  # half-written lines truncated away after a failed write

    def write(self, line: bytes) -> None:
        pid = os.getpid()
        if self.fd is None or self.pid != pid or self.size + len(line) > self.max_bytes:
            self._open_next(pid)
        elif self._deleted():  # deleted (file or whole directory) under us: recreate
            _log.warning("stagescope: span file %s was deleted; continuing in a new file", self.path)
            self.reopened += 1
            self._open_next(pid)
        fd = self.fd
        assert fd is not None
        view = memoryview(line)
        written = 0
        try:
            while written < len(line):
                n = os.write(fd, view[written:])
                if n <= 0:  # pragma: no cover - a regular file never accepts 0 bytes without an error
                    raise OSError(errno.EIO, "write accepted no bytes")
                written += n
        except OSError:
            if written:
                self._truncate_back()
            raise
        self.size += written

    def _deleted(self) -> bool:
        try:
            assert self.fd is not None
            return os.fstat(self.fd).st_nlink == 0
        except OSError:  # the descriptor itself is gone bad: start a new file
            return True

    def _truncate_back(self) -> None:
        """Cut a half-written line off (ftruncate needs no free space); else give the file up."""
        try:
            assert self.fd is not None
            os.ftruncate(self.fd, self.size)
            self.cut += 1
        except OSError:
            self.close()  # the next line starts a new file; this one ends with a partial line we cannot cut

    def _open_next(self, pid: int) -> None:
        if self.fd is not None and self.pid == pid:
            self.close()
        self.fd = None  # a forked child leaves the parent's descriptor alone
        if self.pid != pid:
            self.index = -1
        self.pid = pid
        self.directory.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        while True:
            self.index += 1
            path = self.directory / f"spans-{pid}-{self.index}.jsonl"
            try:
                self.fd = os.open(path, flags, 0o644)
            except FileExistsError:
                continue
            break
        self.path = path
        self.size = 0
        self.files.append(path)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


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
        shutdown_timeout_s: float | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self.shutdown_timeout_s = resolve_shutdown_timeout(shutdown_timeout_s)
        self._init_queue(SpanCounter(exporter_label, metrics), max_queue_spans)
        self._file = SpanFile(self.directory, max_bytes)
        self._write_log = RateLimitedLog(_log, f"writing spans to {self.directory}")
        self._thread: threading.Thread | None = None
        self._start()
        atexit.register(_shutdown_ref, weakref.ref(self))
        after_fork_in_child(self, "_after_fork")

    @property
    def files(self) -> list[Path]:
        """Every span file this exporter opened, oldest first."""
        return self._file.files

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
        self._file = SpanFile(self.directory, self.max_bytes)  # the parent's file stays the parent's
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
        while self._queue:
            items, n, calls = self._take(SPANS_PER_LINE)
            batch: list[ReadableSpan] = []
            groups: list[EncodedSpans] = []
            for item in items:
                if isinstance(item, EncodedSpans):
                    groups.append(item)
                else:
                    batch.extend(item)
            try:
                line = encode_spans(batch, groups) + b"\n"
            except Exception as exc:
                self.counter.drop(n, DROP_BUILD_FAILED)
                self._write_log.failed(f"encoding {n} spans: {exc!r}", "those spans are dropped and counted")
            else:
                try:
                    self._file.write(line)
                except OSError as exc:
                    self.counter.drop(n, DROP_WRITE_FAILED)
                    self._write_log.failed(
                        exc.strerror or exc, f"{n} spans dropped (counted, reason={DROP_WRITE_FAILED})"
                    )
                else:
                    self.counter.ok(n)
                    self._write_log.recovered()
            self._mark_done(calls)
            time.sleep(0)  # let the event loop thread take the GIL between lines

    # ------------------------------------------------------------------ SpanExporter lifecycle
    def shutdown(self) -> None:
        """Write what is queued (at most the shutdown timeout), then stop the thread and close the file."""
        if self._stopped:
            return
        self.drain(time.monotonic() + self.shutdown_timeout_s)
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)
        self._file.close()


def _shutdown_ref(ref: weakref.ref[JsonLinesSpanExporter]) -> None:
    exporter = ref()
    if exporter is not None:
        exporter.shutdown()
