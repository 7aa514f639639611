"""The open-loop engine: send each request at its intended time, whatever is still outstanding.

Timing. A dedicated sender thread sleeps to each request's intended time and hands the request, built
ahead, to the event loop (:mod:`stagescope.loadgen.sender`), which only stamps the send time and writes
to a socket (:mod:`stagescope.loadgen.http`: no task per request). During the run the interpreter's GIL
switch interval is lowered to 0.2 ms so that the sender thread is not held up by the loop thread
(restored afterwards).

Measurement. ``intended`` is the schedule time; ``sent`` is stamped right before the request is
written (or its connection opened); ``first byte`` when the first response byte arrived; each token
event of a stream when the bytes completing it arrived; ``end`` when the body was complete. With
``concurrency_cap`` a due request waits for a free slot and is still measured from its intended time.
Every timestamp is ``time.perf_counter_ns`` converted to Unix ns through one anchor.

Priority. With ``realtime=True`` the sender thread and the event-loop thread run under ``SCHED_FIFO``
(priority 10) for the duration of the run, so that on a busy machine the kernel wakes them on time
(the load generator itself uses about a fifth of a core at 1,000 req/s; the kernel's real-time
throttling keeps 5 % of each second for everything else). It needs root or ``CAP_SYS_NICE``; when
refused the run goes on at normal priority and ``Engine.realtime_active`` says so. Off by default: do
not starve a service under test that runs on the same machine.

Stopping. ``stop`` (an ``asyncio.Event``; the CLI sets it on Ctrl-C) ends sending; requests in flight get
``grace_s`` to finish, then are recorded with ``error="interrupted"``. A run against a server that
refuses connections stops after ``max_connect_failures`` consecutive refusals and says so.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stagescope.gcheap import frozen_heap
from stagescope.loadgen.bodies import BodyFactory, NoBody
from stagescope.loadgen.http import ConnectionPool, Exchange, StreamFactory, origin_and_path, wall_ns
from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.schedule import Schedule
from stagescope.loadgen.sender import PreparedRequest, SenderThread, set_realtime

__all__ = ["Engine", "PreparedRequest", "ProgressSnapshot"]


@dataclass(frozen=True)
class ProgressSnapshot:
    """Live state for a progress display. Latencies (ms, corrected) over the last completed requests."""

    elapsed_s: float
    duration_s: float
    due: int
    sent: int
    completed: int
    errors: int
    in_flight: int
    waiting: int  # due but held back by the concurrency cap
    total: int
    rate_rps: float  # sends over the last second
    p50_ms: float | None
    p99_ms: float | None


class Engine(SenderThread):
    """One open-loop run of ``schedule`` against ``url + route``. Use :func:`stagescope.loadgen.run_load`.

    ``path``: the request target, when it is not ``url``'s path + ``route`` (a query string);
    ``stream``: the reader of streamed bodies (default: one token event per SSE/NDJSON line)."""

    def __init__(
        self,
        url: str,
        route: str,
        schedule: Schedule,
        bodies: BodyFactory | NoBody,
        *,
        concurrency_cap: int | None = None,
        timeout_s: float = 60.0,
        grace_s: float = 5.0,
        max_connect_failures: int = 50,
        start_delay_s: float = 0.05,
        progress: Callable[[ProgressSnapshot], None] | None = None,
        progress_interval_s: float = 0.25,
        on_result: Callable[[RequestResult], None] | None = None,
        headers: dict[str, str] | None = None,
        method: str = "POST",
        realtime: bool = False,
        path: str | None = None,
        stream: StreamFactory | None = None,
        content_type: bool = True,
    ) -> None:
        if concurrency_cap is not None and concurrency_cap < 1:
            raise ValueError(f"concurrency_cap must be >= 1, got {concurrency_cap}")
        self.origin, base_path, self.host_header = origin_and_path(url)
        self.path = path if path is not None else base_path + route
        self.stream = stream
        self.url = url.rstrip("/") + route
        self.route = route
        self.method = method
        self.schedule = schedule
        self.bodies = bodies
        self.cap = concurrency_cap
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.max_connect_failures = max_connect_failures
        self.start_delay_s = start_delay_s
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.on_result = on_result
        # no Content-Type on requests without a body (content_type False: a GET with none)
        self.headers = {**({"Content-Type": "application/json"} if content_type else {}), **(headers or {})}
        self.realtime = realtime
        self.realtime_active = False  # both threads got SCHED_FIFO
        self._sender_rt = False
        self.results: list[RequestResult] = []
        self.stopped_early: str | None = None
        self.elapsed_s = 0.0
        self._handoff: collections.deque[PreparedRequest] = collections.deque()
        self._backlog: collections.deque[PreparedRequest] = collections.deque()
        self._wake_pending = False
        self._thread_stop = threading.Event()
        self._in_flight = 0
        self._due = 0
        self._sent = 0
        self._errors = 0
        self._connect_failures = 0
        self._recent_sends: collections.deque[int] = collections.deque(maxlen=100_000)
        self._recent_latency: collections.deque[float] = collections.deque(maxlen=2000)
        self._sender_done = False
        self._idle: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ConnectionPool | None = None
        self._t0 = 0
        self._started = threading.Event()  # t0 set: the first requests are built

    def _sender_finished(self) -> None:
        self._sender_done = True
        self._check_idle()

    # ---------------------------------------------------------------- loop side
    def _drain(self) -> None:
        self._wake_pending = False
        while self._handoff:
            item = self._handoff.popleft()
            self._due += 1
            if self._thread_stop.is_set() or (self.cap is not None and self._in_flight >= self.cap):
                self._backlog.append(item)
            else:
                self._start(item)

    def _start(self, item: PreparedRequest) -> None:
        pool = self._pool
        assert pool is not None
        self._in_flight += 1
        self._sent += 1
        now = time.perf_counter_ns()
        item.result.sent_ns = wall_ns(now)
        self._recent_sends.append(now)
        pool.submit(Exchange(item.payload, item.result, self._on_done, self.stream))

    def _on_done(self, ex: Exchange) -> None:
        r = ex.result
        self._in_flight -= 1
        if r.error is not None:
            self._errors += 1
        elif r.end_ns is not None:
            self._recent_latency.append((r.end_ns - r.intended_ns) / 1e6)
        self.results.append(r)
        if self.on_result is not None:
            self.on_result(r)
        if ex.connect_failed:
            self._connect_failures += 1
            if self._connect_failures >= self.max_connect_failures and self.stopped_early is None:
                self.stopped_early = (
                    f"{self.url}: {self._connect_failures} connections in a row failed ({r.error})"
                )
                self.request_stop()
        else:
            self._connect_failures = 0
        if self._backlog and not self._thread_stop.is_set():
            self._start(self._backlog.popleft())
        self._check_idle()

    def _check_idle(self) -> None:
        if self._sender_done and not self._handoff and not self._backlog and self._in_flight == 0:
            assert self._idle is not None
            self._idle.set()

    def request_stop(self) -> None:
        """Stop sending (idempotent); in-flight requests get ``grace_s`` to finish."""
        self._thread_stop.set()
        if self._stopping is not None:
            self._stopping.set()

    def snapshot(self) -> ProgressSnapshot:
        now = time.perf_counter_ns()
        recent = self._recent_sends
        while recent and recent[0] < now - 1_000_000_000:
            recent.popleft()
        lat = sorted(self._recent_latency)
        return ProgressSnapshot(
            elapsed_s=max(0.0, (now - self._t0) / 1e9) if self._t0 else 0.0,
            duration_s=self.schedule.duration_s,
            due=self._due,
            sent=self._sent,
            completed=len(self.results),
            errors=self._errors,
            in_flight=self._in_flight,
            waiting=len(self._backlog),
            total=len(self.schedule),
            rate_rps=float(len(recent)),
            p50_ms=lat[len(lat) // 2] if lat else None,
            p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        )

    async def _report(self) -> None:
        assert self.progress is not None
        while True:
            self.progress(self.snapshot())
            await asyncio.sleep(self.progress_interval_s)

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.request_stop()

    async def run(self, stop: asyncio.Event | None = None) -> list[RequestResult]:
        """Send the whole schedule (or until ``stop`` is set); returns the per-request results.

        The process's heap is frozen for the run (:func:`stagescope.gcheap.frozen_heap`): a full garbage
        collection of the demo's process took 145-160 ms, a pause that would be measured as the
        service's latency."""
        with frozen_heap():
            return await self._run(stop)

    async def _run(self, stop: asyncio.Event | None) -> list[RequestResult]:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._stopping = asyncio.Event()
        self._pool = pool = ConnectionPool(self.origin, timeout_s=self.timeout_s)
        old_switch = sys.getswitchinterval()
        helpers: list[asyncio.Task[None]] = []
        idle = asyncio.ensure_future(self._idle.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        if self.realtime:  # resolve first: executor threads started under SCHED_FIFO would keep it
            with contextlib.suppress(OSError):
                await self._loop.getaddrinfo(pool.host, pool.port)
        sys.setswitchinterval(0.0002)
        restore_rt = set_realtime() if self.realtime else None
        thread = threading.Thread(target=self._sender, name="stagescope-loadgen-sender", daemon=True)
        thread.start()
        while not self._started.is_set():  # the thread builds the first second of requests
            await asyncio.sleep(0.005)
        if self.progress is not None:
            helpers.append(asyncio.ensure_future(self._report()))
        if stop is not None:
            helpers.append(asyncio.ensure_future(self._watch(stop)))
        try:
            await asyncio.wait({idle, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not idle.done():
                if self.stopped_early is None:
                    self.stopped_early = "stopped by user"
                self._record_unsent()
                if self._in_flight:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._idle_or_empty(), self.grace_s)
        finally:
            self._thread_stop.set()
            self.elapsed_s = (time.perf_counter_ns() - self._t0) / 1e9 if self._t0 else 0.0
            sys.setswitchinterval(old_switch)
            if restore_rt is not None:
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(0, restore_rt[0], restore_rt[1])
            pool.close("interrupted")  # anything still in flight is recorded as interrupted
            self._record_unsent()
            for t in (*helpers, idle, stopping):
                t.cancel()
            if self.progress is not None:
                self.progress(self.snapshot())
            thread.join(timeout=1.0)
            self.realtime_active = restore_rt is not None and self._sender_rt
        return self.results

    async def _idle_or_empty(self) -> None:
        while self._in_flight:
            await asyncio.sleep(0.01)

    def _record_unsent(self) -> None:
        """Due requests not sent when sending stopped (held back by the cap): recorded, never sent."""
        while self._handoff:
            self._due += 1
            self._backlog.append(self._handoff.popleft())
        while self._backlog:
            r = self._backlog.popleft().result
            r.error = "not sent: run stopped"
            self.results.append(r)
