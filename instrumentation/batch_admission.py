"""The batcher's admission limit: :class:`QueueFull` and the ``Retry-After`` it suggests.

:class:`~stagescope.instrumentation.batching.DynamicBatcher` raises :class:`QueueFull` from ``submit``
when ``max_queue`` items are already waiting; the service answers 429 with the error's
``retry_after_header``. :func:`estimate_retry_after_s` estimates, from the batcher's state, how long
until a slot frees (seconds).
"""

from __future__ import annotations

import math

from stagescope.instrumentation.record import now_ns

__all__ = ["QueueFull", "estimate_retry_after_s"]


class QueueFull(RuntimeError):
    """The batcher holds ``max_queue`` waiting items; retry after ``retry_after_s`` seconds."""

    def __init__(self, depth: int, max_queue: int, retry_after_s: float) -> None:
        super().__init__(
            f"batch queue full ({depth} waiting, max_queue={max_queue}); retry in {retry_after_s:.3f} s"
        )
        self.depth = depth
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` value: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


def estimate_retry_after_s(
    depth: int,
    max_batch_size: int,
    executors: int,
    max_wait_ns: int,
    mean_batch_s: float | None,
    run_starts_ns: list[int],
) -> float:
    """Estimated seconds until a slot frees for a batcher holding ``depth`` waiting items: the batches
    ahead at the mean batch time ``mean_batch_s`` (or the oldest running batch's elapsed time, from
    ``run_starts_ns`` on ``perf_counter_ns``, when longer or when no batch has finished yet), spread
    over the ``executors``, plus one batch wait (``max_wait_ns``); at least 0.01 s."""
    batches_ahead = math.ceil((depth + 1) / max_batch_size)
    per_batch = mean_batch_s or 0.0
    if run_starts_ns:
        per_batch = max(per_batch, (now_ns() - min(run_starts_ns)) / 1e9)
    wait_s = max_wait_ns / 1e9
    return max(0.01, batches_ahead * per_batch / executors + wait_s)
