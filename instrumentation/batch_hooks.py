"""Four hooks that record a batch's ``batch_wait``, ``queue`` and ``compute`` stages, for any batcher.

:class:`~stagescope.instrumentation.batching.DynamicBatcher` calls them; teams with their own batcher
record the same intervals with them::

    t = record_enqueue()                # in the request, when the item is queued (captures the record)
    record_batch_closed(tickets)        # the batch stops accepting items
    record_batch_start(tickets)         # an executor starts it
    record_batch_end(tickets, model=m)  # it finished: stages, batch size and metrics are recorded

Each request's three intervals are bounded by two of its :class:`BatchTicket`'s timestamps:

* ``batch_wait``: ``enqueue_ns`` (the item was queued) -> ``closed_ns`` (its batch was closed);
* ``queue``: ``closed_ns`` -> ``start_ns`` (an executor started the batch);
* ``compute``: ``start_ns`` -> ``end_ns`` (the batch finished).

Time is in nanoseconds on ``time.perf_counter_ns`` (``at_ns=`` overrides "now"); durations published
as metrics (``stagescope_batch_size``, ``stagescope_executor_busy_seconds_total``) are in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stagescope.instrumentation.metrics import StageMetrics, default_metrics
from stagescope.instrumentation.record import RequestRecord, StageInterval, current_request, now_ns
from stagescope.names import (
    KIND_BATCH_WAIT,
    KIND_COMPUTE,
    KIND_QUEUE,
    STAGE_BATCH_WAIT,
    STAGE_COMPUTE,
    STAGE_QUEUE,
)

__all__ = [
    "BatchTicket",
    "record_batch_closed",
    "record_batch_end",
    "record_batch_start",
    "record_enqueue",
]


@dataclass(slots=True)
class BatchTicket:
    """One queued item's timestamps (``perf_counter_ns``) and the request record it belongs to."""

    record: RequestRecord | None
    enqueue_ns: int
    closed_ns: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None


def record_enqueue(
    record: RequestRecord | None = None, *, at_ns: int | None = None, queue_depth: int | None = None
) -> BatchTicket:
    """An item was queued for batching. ``record`` defaults to the current request's (call this inside
    the request); ``queue_depth`` (items already waiting) is stored on the record."""
    rec = current_request() if record is None else record
    if rec is not None and queue_depth is not None:
        rec.queue_depth = queue_depth
    return BatchTicket(rec, now_ns() if at_ns is None else at_ns)


def record_batch_closed(tickets: Sequence[BatchTicket], *, at_ns: int | None = None) -> int:
    """The batch holding ``tickets`` stopped accepting items (ends ``batch_wait``). Returns the time."""
    t = now_ns() if at_ns is None else at_ns
    for tk in tickets:
        tk.closed_ns = t
    return t


def record_batch_start(tickets: Sequence[BatchTicket], *, at_ns: int | None = None) -> int:
    """An executor started the batch (ends ``queue``, starts ``compute``). Without a prior
    :func:`record_batch_closed` the batch counts as closed now (no ``queue`` time)."""
    t = now_ns() if at_ns is None else at_ns
    for tk in tickets:
        if tk.closed_ns is None:
            tk.closed_ns = t
        tk.start_ns = t
    return t


def record_batch_end(
    tickets: Sequence[BatchTicket],
    *,
    at_ns: int | None = None,
    model: str | None = None,
    metrics: StageMetrics | None = None,
) -> int:
    """The batch finished (ends ``compute``): add the three stages and the batch size to every ticket's
    record, observe the batch size and the executor's busy seconds. Returns the time.

    ``model`` labels the batch metrics, and also every ticket's request (its request and stage
    histograms, its span's ``stagescope.model``) unless the request set its own ``record.model``."""
    t = now_ns() if at_ns is None else at_ns
    size = len(tickets)
    start = t
    for tk in tickets:
        if tk.start_ns is None or tk.closed_ns is None:
            raise ValueError("record_batch_end: record_batch_start was not called for this batch")
        start = tk.start_ns
        tk.end_ns = t
        rec = tk.record
        if rec is None:
            continue
        rec.stages.append(
            StageInterval(STAGE_BATCH_WAIT, tk.enqueue_ns, max(tk.enqueue_ns, tk.closed_ns), KIND_BATCH_WAIT)
        )
        rec.stages.append(StageInterval(STAGE_QUEUE, tk.closed_ns, max(tk.closed_ns, tk.start_ns), KIND_QUEUE))
        rec.stages.append(StageInterval(STAGE_COMPUTE, tk.start_ns, max(tk.start_ns, t), KIND_COMPUTE))
        rec.batch_size = size
        if rec.model is None:  # the batch's model labels the request's metrics, unless it named its own
            rec.model = model
    if size:
        m = default_metrics() if metrics is None else metrics
        m.observe_batch(model, size)
        m.executor_busy(model, (t - start) / 1e9)
    return t
