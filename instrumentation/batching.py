"""A dynamic batcher that keeps waiting-for-a-batch, waiting-for-an-executor and compute apart.

:class:`DynamicBatcher` collects submitted items into batches and runs each batch on one of
``executors`` concurrent runners (think: model replicas or CUDA streams)::

    batcher = DynamicBatcher(run_batch, max_batch_size=16, max_wait_ms=5, executors=1, model="ranker")
    await batcher.start()
    result = await batcher.submit(features)    # inside a request: the three stages land on its record

A batch **closes** when it holds ``max_batch_size`` items or ``max_wait_ms`` after its first item was
enqueued, whichever comes first, whether or not an executor is free. A closed batch then waits for a free
executor. For every submitting request (its record is captured with ``current_request()`` at submit)
three intervals are recorded, each bounded by two ``perf_counter_ns`` timestamps:

* ``batch_wait``: the item was enqueued (``submit`` called) -> the batch it joined was closed;
* ``queue``: the batch was closed -> an executor started running it (right before ``run_batch`` is
  called; so event-loop scheduling delay counts as queue);
* ``compute``: ``run_batch`` called -> ``run_batch`` returned (or raised).

Also ``record.batch_size`` (items in the executed batch) and ``record.queue_depth`` (requests waiting in
this batcher when the item was enqueued, itself excluded). Metrics (through
:func:`~stagescope.instrumentation.metrics.default_metrics` unless ``metrics=`` is given):
``stagescope_queue_depth`` (items waiting: open batch plus closed batches not yet started),
``stagescope_batch_size`` (one observation per executed batch) and
``stagescope_executor_busy_seconds_total``.

``max_queue`` bounds the waiting items: a submit past it raises :class:`QueueFull` carrying a suggested
retry-after (the service answers 429 with a ``Retry-After`` header). An exception from ``run_batch`` is
raised to every waiter of that batch. ``max_batch_size``, ``max_wait_ms``, ``executors`` and ``max_queue``
can be changed while running (from the event loop's thread); they apply to the open batch at once.

Teams with their own batcher record the same intervals with the four hooks of
:mod:`~stagescope.instrumentation.batch_hooks` (``record_enqueue``, ``record_batch_closed``,
``record_batch_start``, ``record_batch_end``; also importable from here).

Time is in nanoseconds on ``time.perf_counter_ns`` (``at_ns=`` overrides "now"); durations published
as metrics are in seconds.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stagescope.instrumentation.batch_admission import QueueFull, estimate_retry_after_s
from stagescope.instrumentation.batch_hooks import (
    BatchTicket,
    record_batch_closed,
    record_batch_end,
    record_batch_start,
    record_enqueue,
)
from stagescope.instrumentation.metrics import StageMetrics, default_metrics
from stagescope.instrumentation.record import now_ns

__all__ = [
    "BatchTicket",
    "DynamicBatcher",
    "QueueFull",
    "record_batch_closed",
    "record_batch_end",
    "record_batch_start",
    "record_enqueue",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True, eq=False)
class _Entry:
    item: Any
    future: asyncio.Future[Any]
    ticket: BatchTicket


class DynamicBatcher(Generic[T, R]):
    """Batches ``submit``-ted items for ``run_batch`` (``async (list[item]) -> list[result]``, one result
    per item, in order). See the module docstring for the stage definitions.

    ``max_batch_size`` >= 1 items; ``max_wait_ms`` >= 0 (0: a batch closes on the next event-loop
    iteration, so it holds what was submitted in the same turn); ``max_queue``: bound on
    waiting items (``None``: unbounded); ``executors`` >= 1 concurrent batches; ``model``: the model label
    of the metrics; ``metrics``: a StageMetrics (default: the one the latest ``instrument_app`` installed).
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int | None = None,
        executors: int = 1,
        model: str | None = None,
        metrics: StageMetrics | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._max_batch_size = _check_int("max_batch_size", max_batch_size, 1)
        self._max_wait_ns = _check_wait(max_wait_ms)
        self._max_queue = None if max_queue is None else _check_int("max_queue", max_queue, 1)
        self._executors = _check_int("executors", executors, 1)
        self.model = model
        self._metrics = metrics
        self._pending: list[_Entry] = []  # the open batch
        self._ready: deque[list[_Entry]] = deque()  # closed batches waiting for an executor
        self._waiting = 0  # items in _pending and _ready
        self._running = 0  # batches being executed
        self._timer: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Event | None = None
        self._stopped = False
        self._batch_s: float | None = None  # moving average of batch execution seconds
        self._depth_metrics: StageMetrics | None = None  # where the queue depth was last published
        self._depth_published = 0
        self._run_starts: list[int] = []  # start times of the running batches
        self.batches_run = 0

    # -- settings (changeable at runtime, from the event loop's thread) --------------------------
    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, value: int) -> None:
        self._max_batch_size = _check_int("max_batch_size", value, 1)
        if len(self._pending) >= self._max_batch_size:
            self._close_batch()

    @property
    def max_wait_ms(self) -> float:
        return self._max_wait_ns / 1e6

    @max_wait_ms.setter
    def max_wait_ms(self, value: float) -> None:
        self._max_wait_ns = _check_wait(value)
        if self._pending:
            self._arm_timer()

    @property
    def executors(self) -> int:
        return self._executors

    @executors.setter
    def executors(self, value: int) -> None:
        self._executors = _check_int("executors", value, 1)
        if self._loop is not None:
            self._dispatch()

    @property
    def max_queue(self) -> int | None:
        return self._max_queue

    @max_queue.setter
    def max_queue(self, value: int | None) -> None:
        self._max_queue = None if value is None else _check_int("max_queue", value, 1)

    def configure(self, **settings: Any) -> None:
        """Change several settings at once: ``configure(max_wait_ms=5, executors=2)``."""
        allowed = {"max_batch_size", "max_wait_ms", "executors", "max_queue"}
        unknown = set(settings) - allowed
        if unknown:
            raise ValueError(f"unknown batcher setting(s) {sorted(unknown)}; settable: {sorted(allowed)}")
        for key, value in settings.items():
            setattr(self, key, value)

    # -- state ------------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Items waiting (open batch plus closed batches no executor has started)."""
        return self._waiting

    @property
    def running(self) -> int:
        """Batches being executed right now."""
        return self._running

    async def start(self) -> None:
        """Bind to the running event loop and accept items (``submit`` also starts implicitly)."""
        self._bind()
        self._stopped = False

    async def stop(self, *, drain: bool = True) -> None:
        """Stop accepting items. ``drain``: close the open batch and wait for every batch to finish;
        otherwise waiting items fail with ``RuntimeError`` and running batches are cancelled."""
        self._stopped = True
        if self._loop is None:
            return
        if drain:
            if self._pending:
                self._close_batch()
            while self._running or self._ready or self._pending:
                assert self._idle is not None
                self._idle.clear()
                await self._idle.wait()
            return
        self._cancel_timer()
        waiting = self._pending + [e for batch in self._ready for e in batch]
        self._pending.clear()
        self._ready.clear()
        self._waiting = 0
        for e in waiting:
            if not e.future.done():
                e.future.set_exception(RuntimeError("batcher stopped"))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._publish_depth()

    # -- submit -----------------------------------------------------------------------------------
    async def submit(self, item: T) -> R:
        """Queue ``item``, wait for its batch to run, return its result (or raise the batch's error).

        Raises :class:`QueueFull` when ``max_queue`` items are already waiting.
        """
        if self._stopped:
            raise RuntimeError("batcher stopped")
        loop = self._bind()
        depth = self._waiting
        if self._max_queue is not None and depth >= self._max_queue:
            wait_s = estimate_retry_after_s(
                depth, self._max_batch_size, self._executors, self._max_wait_ns, self._batch_s, self._run_starts
            )
            raise QueueFull(depth, self._max_queue, wait_s)
        entry = _Entry(item, loop.create_future(), record_enqueue(queue_depth=depth))
        self._pending.append(entry)
        self._waiting += 1
        self._publish_depth()
        if len(self._pending) >= self._max_batch_size:
            self._close_batch()
        elif len(self._pending) == 1:
            self._arm_timer()
        try:
            result: R = await entry.future
        except asyncio.CancelledError:
            self._withdraw(entry)
            raise
        return result

    # -- internals --------------------------------------------------------------------------------
    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._running or self._ready or self._pending:
                raise RuntimeError("DynamicBatcher is busy on another event loop")
            self._loop = loop
            self._idle = asyncio.Event()
            self._timer = None
        return loop

    def _metrics_now(self) -> StageMetrics:
        return default_metrics() if self._metrics is None else self._metrics

    def _publish_depth(self) -> None:
        """Move the queue-depth gauge by this batcher's change since it last published, so batchers
        sharing a model label add up (and a newly installed StageMetrics takes over the whole count)."""
        m = self._metrics_now()
        if m is not self._depth_metrics:
            if self._depth_metrics is not None and self._depth_published:
                self._depth_metrics.add_queue_depth(self.model, -self._depth_published)
            self._depth_metrics, self._depth_published = m, 0
        delta = self._waiting - self._depth_published
        if delta:
            m.add_queue_depth(self.model, delta)
            self._depth_published = self._waiting

    def _withdraw(self, entry: _Entry) -> None:
        """A waiter was cancelled: drop its item if its batch has not closed yet."""
        try:
            self._pending.remove(entry)
        except ValueError:
            return  # already in a closed batch: it runs, its result is discarded
        self._waiting -= 1
        self._publish_depth()
        if not self._pending:
            self._cancel_timer()
            self._notify_idle()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_timer(self) -> None:
        """(Re)arm the close timer for the open batch's first item."""
        self._cancel_timer()
        assert self._loop is not None and self._pending
        due_ns = self._pending[0].ticket.enqueue_ns + self._max_wait_ns
        delay = (due_ns - now_ns()) / 1e9
        if delay <= 0:
            self._timer = self._loop.call_soon(self._on_timer)
        else:
            self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._pending:
            return
        if now_ns() >= self._pending[0].ticket.enqueue_ns + self._max_wait_ns:
            self._close_batch()
        else:  # the first item was withdrawn: wait for the new first item's deadline
            self._arm_timer()

    def _close_batch(self) -> None:
        """Close the open batch (in chunks of max_batch_size when the size was lowered) and dispatch."""
        self._cancel_timer()
        while self._pending:
            batch = self._pending[: self._max_batch_size]
            del self._pending[: self._max_batch_size]
            record_batch_closed([e.ticket for e in batch])
            self._ready.append(batch)
            if len(self._pending) < self._max_batch_size:
                break
        if self._pending:
            self._arm_timer()
        self._dispatch()

    def _dispatch(self) -> None:
        assert self._loop is not None
        started = False
        while self._ready and self._running < self._executors:
            batch = self._ready.popleft()
            self._running += 1
            self._waiting -= len(batch)
            task = self._loop.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started = True
        if started:
            self._publish_depth()

    async def _run(self, batch: list[_Entry]) -> None:
        tickets = [e.ticket for e in batch]
        start = record_batch_start(tickets)
        self._run_starts.append(start)
        try:
            out = self._run_batch([e.item for e in batch])
            results = await out if inspect.isawaitable(out) else out
            if len(results) != len(batch):
                raise ValueError(f"run_batch returned {len(results)} results for {len(batch)} items")
        except asyncio.CancelledError:  # stop(drain=False): the waiters learn why, the task ends
            self._finish(tickets, start)
            for e in batch:
                if not e.future.done():
                    e.future.set_exception(RuntimeError("batcher stopped"))
            raise
        except Exception as exc:
            self._finish(tickets, start)
            for e in batch:
                if not e.future.done():
                    e.future.set_exception(exc)
        else:
            self._finish(tickets, start)
            for e, r in zip(batch, results, strict=True):
                if not e.future.done():
                    e.future.set_result(r)
        finally:
            self._run_starts.remove(start)
            self._running -= 1
            self._dispatch()
            self._notify_idle()

    def _finish(self, tickets: list[BatchTicket], start: int) -> None:
        end = record_batch_end(tickets, model=self.model, metrics=self._metrics_now())
        seconds = (end - start) / 1e9
        self._batch_s = seconds if self._batch_s is None else 0.8 * self._batch_s + 0.2 * seconds
        self.batches_run += 1

    def _notify_idle(self) -> None:
        if self._idle is not None and not (self._running or self._ready or self._pending):
            self._idle.set()


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_wait(max_wait_ms: float) -> int:
    if not isinstance(max_wait_ms, int | float) or isinstance(max_wait_ms, bool) or not max_wait_ms >= 0:
        raise ValueError(f"max_wait_ms must be a number >= 0, got {max_wait_ms!r}")
    return int(max_wait_ms * 1e6)
