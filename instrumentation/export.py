"""Where spans go: OTLP/HTTP when a collector is configured, else the embedded file sink.

``make_span_exporter(spans_dir=None)``:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set: OTLP/HTTP
  (protobuf) to that endpoint, wrapped in a :class:`BackgroundSpanExporter`;
* otherwise the :class:`~stagescope.instrumentation.sink.JsonLinesSpanExporter` in ``spans_dir``,
  else ``$STAGESCOPE_SPANS_DIR``; with neither, a ``ValueError`` says what to set.

Telemetry never hurts the service: ``export`` on either only appends to a bounded queue and returns.
A background thread sends batches with a short timeout (``OTEL_EXPORTER_OTLP_TIMEOUT`` /
``..._TRACES_TIMEOUT`` if set, else 2 s). When the endpoint refuses or hangs, the failed batch is
dropped and counted (``reason="export_failed"``), the thread backs off (0.25 s doubling to 5 s) while
new spans queue up to ``max_queue_spans`` (beyond that: ``reason="queue_full"``), and export resumes
by itself once the endpoint answers again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stagescope.instrumentation.sink import (
    DEFAULT_MAX_QUEUE_SPANS,
    JsonLinesSpanExporter,
    QueuedSpanExporter,
    SpanCounter,
    after_fork_in_child,
)
from stagescope.names import ENV_SPANS_DIR

__all__ = ["BackgroundSpanExporter", "make_span_exporter", "otlp_endpoint_configured"]

_log = logging.getLogger(__name__)

DEFAULT_OTLP_TIMEOUT_S = 2.0
BATCH_SPANS = 128


def otlp_endpoint_configured() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def make_span_exporter(
    spans_dir: str | os.PathLike[str] | None = None, *, metrics: Any = None
) -> SpanExporter:
    """OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else the file sink (argument, then env).

    Both are non-blocking, bounded, and count what they export and drop on ``metrics`` (a StageMetrics;
    default: the one installed by the latest ``instrument_app``).
    """
    if otlp_endpoint_configured():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        timeout_env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_TIMEOUT"
        )
        timeout = None if timeout_env else DEFAULT_OTLP_TIMEOUT_S
        return BackgroundSpanExporter(OTLPSpanExporter(timeout=timeout), label="otlp_http", metrics=metrics)
    directory = spans_dir if spans_dir is not None else os.environ.get(ENV_SPANS_DIR, "").strip()
    if not directory:
        raise ValueError(
            f"no span destination: pass spans_dir=, set {ENV_SPANS_DIR} (embedded sink) "
            "or OTEL_EXPORTER_OTLP_ENDPOINT (OTLP/HTTP collector)"
        )
    return JsonLinesSpanExporter(directory, metrics=metrics)


class BackgroundSpanExporter(QueuedSpanExporter):
    """Runs any exporter on a background thread behind a bounded queue; ``export`` never blocks."""

    def __init__(
        self,
        inner: SpanExporter,
        *,
        label: str,
        metrics: Any = None,
        max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
        interval_s: float = 0.5,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.inner = inner
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self._backoff = 0.0
        self._init_queue(SpanCounter(label, metrics), max_queue_spans)
        self._thread = threading.Thread(target=self._run, name=f"stagescope-{label}", daemon=True)
        self._thread.start()
        after_fork_in_child(self, "_after_fork")

    @property
    def backing_off(self) -> bool:
        """True while the last send failed (the endpoint is down, refusing or hanging)."""
        return self._backoff > 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._enqueue(spans, len(spans))

    def _wake_now(self) -> bool:
        return self._queued >= BATCH_SPANS and not self._backoff

    def _after_fork(self) -> None:
        self._reset_queue()
        if not self._stopped:
            self._thread = threading.Thread(target=self._run, name=self._thread.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._backoff or self.interval_s)
            self._wake.clear()
            self._send_pending()
            if self._stopped:
                return

    def _send_pending(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                batch: list[ReadableSpan] = []
                calls = 0
                while self._queue and len(batch) < BATCH_SPANS:
                    batch.extend(self._queue.popleft())
                    calls += 1
                self._queued -= len(batch)
            try:
                ok = self.inner.export(batch) == SpanExportResult.SUCCESS
            except Exception:
                ok = False
            if ok:
                self.counter.ok(len(batch))
                self._backoff = 0.0
            else:
                self.counter.drop(len(batch), "export_failed")
                self._backoff = min(self.max_backoff_s, max(0.25, self._backoff * 2))
            self._mark_done(calls)
            time.sleep(0)  # let the event loop thread take the GIL between batches
            if not ok and not self._stopped:
                return  # wait out the backoff before the next batch

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._backoff = 0.0  # try now, not after the backoff
        return self._wait_done(timeout_millis)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self.force_flush(5000)
        self._stopped = True
        self._wake.set()
        self._thread.join(5)
        self.inner.shutdown()
