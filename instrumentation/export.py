"""Where spans go: OTLP/HTTP when a collector is configured, else the embedded file sink.

``make_span_exporter(spans_dir=None)``:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set: OTLP/HTTP
  (protobuf, :mod:`stagescope.instrumentation.otlp_http`) to that endpoint, sent by a
  :class:`BackgroundSpanExporter`;
* otherwise the :class:`~stagescope.instrumentation.sink.JsonLinesSpanExporter` in ``spans_dir``,
  else ``$STAGESCOPE_SPANS_DIR``; with neither, a ``ValueError`` says what to set.

Telemetry never hurts the service: ``export`` on either only appends to a bounded queue and returns;
a slow, hanging or refusing collector costs the request path nothing. The background thread sends
batches of up to 128 spans with a short timeout (``OTEL_EXPORTER_OTLP_TIMEOUT`` /
``..._TRACES_TIMEOUT`` in seconds if set, else 2 s) and **retries** a batch that failed in a way the
OTLP specification calls retryable (no answer, timeout, HTTP 429/502/503/504): after the collector's
``Retry-After`` when it sends one (at most ``max_retry_after_s``), else after a backoff of 0.25 s
doubling to 5 s with +-20 % jitter, which keeps growing while the collector stays down and resets on
the first success. A batch is tried at most ``max_attempts`` times, then dropped and counted
(``reason="export_failed"``); one the collector refuses for good (any other 4xx/5xx, or the
``rejected_spans`` of a partial success) is counted as ``reason="rejected"``. While a batch waits, new
spans queue behind it up to ``max_queue_spans`` (beyond that: ``reason="queue_full"``), and export
resumes by itself once the collector answers. A drain (graceful stop) keeps trying until its
deadline, then aborts the request in flight and counts what is left as ``reason="shutdown"``.
Failures are logged one line a minute.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stagescope.instrumentation.lifecycle import RateLimitedLog, resolve_shutdown_timeout
from stagescope.instrumentation.otlp_http import OtlpHttpClient, OtlpHttpConfig, SendOutcome
from stagescope.instrumentation.sink import (
    DEFAULT_MAX_QUEUE_SPANS,
    JsonLinesSpanExporter,
    QueuedSpanExporter,
    SpanCounter,
    after_fork_in_child,
)
from stagescope.names import DROP_EXPORT_FAILED, DROP_REJECTED, DROP_SHUTDOWN, ENV_SPANS_DIR

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
    spans_dir: str | os.PathLike[str] | None = None,
    *,
    metrics: Any = None,
    shutdown_timeout_s: float | None = None,
) -> SpanExporter:
    """OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else the file sink (argument, then env).

    Both are non-blocking, bounded, and count what they export and drop on ``metrics`` (a StageMetrics;
    default: the one installed by the latest ``instrument_app``). ``shutdown_timeout_s`` bounds their
    ``shutdown`` (default ``$STAGESCOPE_SHUTDOWN_TIMEOUT_S``, else 5 s).
    """
    if otlp_endpoint_configured():
        client = OtlpHttpClient(OtlpHttpConfig.from_env(timeout_s=DEFAULT_OTLP_TIMEOUT_S))
        return BackgroundSpanExporter(
            client, label="otlp_http", metrics=metrics, shutdown_timeout_s=shutdown_timeout_s
        )
    directory = spans_dir if spans_dir is not None else os.environ.get(ENV_SPANS_DIR, "").strip()
    if not directory:
        raise ValueError(
            f"no span destination: pass spans_dir=, set {ENV_SPANS_DIR} (embedded sink) "
            "or OTEL_EXPORTER_OTLP_ENDPOINT (OTLP/HTTP collector)"
        )
    return JsonLinesSpanExporter(directory, metrics=metrics, shutdown_timeout_s=shutdown_timeout_s)


@dataclass
class _Batch:
    spans: list[ReadableSpan]
    n: int
    calls: int
    attempts: int = 0
    body: bytes | None = None


class BackgroundSpanExporter(QueuedSpanExporter):
    """Sends span batches from one background thread behind a bounded queue; ``export`` never blocks.

    ``sender`` is an :class:`~stagescope.instrumentation.otlp_http.OtlpHttpClient` (its answers say
    what is retryable and for how long to wait) or any ``SpanExporter`` (a ``FAILURE`` or an exception
    is retried like a lost connection). Retry policy: see the module docstring.
    """

    def __init__(
        self,
        sender: OtlpHttpClient | SpanExporter,
        *,
        label: str,
        metrics: Any = None,
        max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
        interval_s: float = 0.5,
        max_attempts: int = 4,
        initial_backoff_s: float = 0.25,
        max_backoff_s: float = 5.0,
        max_retry_after_s: float = 30.0,
        shutdown_timeout_s: float | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.sender = sender
        self.interval_s = interval_s
        self.max_attempts = max_attempts
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.shutdown_timeout_s = resolve_shutdown_timeout(shutdown_timeout_s)
        self._backoff = 0.0  # grows while consecutive attempts fail, 0 after a success
        self._held: _Batch | None = None  # the batch being tried
        self._retry_at = 0.0  # time.monotonic() of its next attempt
        self._aborted = False
        where = sender.endpoint if isinstance(sender, OtlpHttpClient) else type(sender).__name__
        self._fail_log = RateLimitedLog(_log, f"exporting spans to {where}")
        self._init_queue(SpanCounter(label, metrics), max_queue_spans)
        self._thread = threading.Thread(target=self._run, name=f"stagescope-{label}", daemon=True)
        self._thread.start()
        after_fork_in_child(self, "_after_fork")

    @property
    def inner(self) -> OtlpHttpClient | SpanExporter:
        """The sender (kept under its former name)."""
        return self.sender

    @property
    def backing_off(self) -> bool:
        """True while the last attempt failed (the endpoint is down, refusing, throttling or hanging)."""
        return self._backoff > 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._enqueue(spans, len(spans))

    def _wake_now(self) -> bool:
        return self._queued >= BATCH_SPANS and self._held is None

    def _after_fork(self) -> None:
        self._reset_queue()
        self._held = None
        self._backoff = 0.0
        if isinstance(self.sender, OtlpHttpClient):
            self.sender._conn = None  # the parent's connection stays the parent's
        if not self._stopped:
            self._thread = threading.Thread(target=self._run, name=self._thread.name, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the sender thread
    def _run(self) -> None:
        while True:
            self._wake.wait(self._wait_s())
            self._wake.clear()
            self._send_pending()
            if self._stopped:
                return

    def _wait_s(self) -> float:
        if self._held is None:
            return self.interval_s
        wait = self._retry_at - time.monotonic()
        deadline = self._deadline
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
        return max(0.0, wait)

    def _release(self, batch: _Batch) -> None:
        self._held = None
        self._mark_done(batch.calls)

    def _send_pending(self) -> None:
        while True:
            batch = self._held
            if batch is None:
                if not self._queue:
                    return
                items, n, calls = self._take(BATCH_SPANS)
                batch = self._held = _Batch([s for item in items for s in item], n, calls)
                self._retry_at = time.monotonic() + self._backoff  # still down: wait before trying
            now = time.monotonic()
            deadline = self._deadline
            if self._aborted or (deadline is not None and now >= deadline):
                self._aborted = False
                self.counter.drop(batch.n, DROP_SHUTDOWN)
                self._release(batch)
                continue
            if now < self._retry_at and not self._stopped:
                return  # waiting out a backoff or Retry-After
            outcome = self._attempt(batch, None if deadline is None else deadline - now)
            batch.attempts += 1
            if outcome.ok:
                self._backoff = 0.0
                self._aborted = False
                self.counter.ok(batch.n - min(outcome.rejected, batch.n))
                self.counter.drop(min(outcome.rejected, batch.n), DROP_REJECTED)
                self._fail_log.recovered()
                self._release(batch)
                time.sleep(0)  # let the event loop thread take the GIL between batches
                continue
            self._backoff = min(self.max_backoff_s, max(self.initial_backoff_s, self._backoff * 2))
            if self._aborted or (self._deadline is not None and time.monotonic() >= self._deadline):
                continue  # counted as shutdown at the top
            if not outcome.retryable:
                self.counter.drop(batch.n, DROP_REJECTED)
                self._fail_log.failed(outcome.detail, f"{batch.n} spans refused for good (counted, reason=rejected)")
                self._release(batch)
                continue
            if batch.attempts >= self.max_attempts or self._stopped:
                self.counter.drop(batch.n, DROP_EXPORT_FAILED)
                self._fail_log.failed(
                    outcome.detail,
                    f"{batch.n} spans dropped after {batch.attempts} attempts (counted, reason=export_failed)",
                )
                self._release(batch)
                continue
            if outcome.retry_after_s is not None:
                wait = min(outcome.retry_after_s, self.max_retry_after_s)
            else:
                wait = self._backoff * random.uniform(0.8, 1.2)
            self._retry_at = time.monotonic() + wait
            self._fail_log.failed(outcome.detail, f"retrying in {wait:.2g} s")
            return

    def _attempt(self, batch: _Batch, time_left_s: float | None) -> SendOutcome:
        sender = self.sender
        if isinstance(sender, OtlpHttpClient):
            try:
                if batch.body is None:
                    batch.body = sender.encode(batch.spans)
            except Exception as exc:
                return SendOutcome(ok=False, retryable=False, detail=f"encoding spans failed: {exc!r}")
            return sender.send(batch.body, time_left_s)
        try:
            ok = sender.export(batch.spans) == SpanExportResult.SUCCESS
        except Exception as exc:
            return SendOutcome(ok=False, retryable=True, detail=repr(exc))
        return SendOutcome(ok=True) if ok else SendOutcome(ok=False, retryable=True, detail="export returned FAILURE")

    def _abort_in_flight(self) -> None:
        if self._held is not None:
            self._aborted = True
            self._wake.set()
            if isinstance(self.sender, OtlpHttpClient):
                self.sender.abort()

    # ------------------------------------------------------------------ lifecycle
    def drain(self, deadline: float) -> int:
        try:
            return super().drain(deadline)
        finally:
            self._aborted = False  # an abort is about the batch held at that deadline only

    def shutdown(self) -> None:
        """Send what is queued (at most the shutdown timeout), then stop the thread."""
        if self._stopped:
            return
        self.drain(time.monotonic() + self.shutdown_timeout_s)
        self._stopped = True
        self._wake.set()
        self._thread.join(1.0)
        if isinstance(self.sender, OtlpHttpClient):
            self.sender.close()
        else:
            self.sender.shutdown()
