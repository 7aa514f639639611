"""The open-loop engine: send each request at its intended time, whatever is still outstanding.

Timing. A dedicated sender thread walks the schedule and sleeps (``time.sleep``: ``clock_nanosleep``
on Linux, tens of microseconds of overshoot) until each request's intended time, then hands it to the
event loop with ``call_soon_threadsafe``, which wakes the loop at once through its self-pipe (asyncio's
own timers round sleeps up to whole milliseconds). The thread also builds the next request's body while
it waits, so body building never delays a send. During the run the interpreter's GIL switch interval is
lowered to 0.2 ms so the sender is not held up by the loop thread's work (restored afterwards).

Measurement. ``intended`` is the schedule time; ``sent`` is taken in the request's task right before the
HTTP request is issued; ``first byte`` when the response headers arrived; each token event of a stream
(one SSE ``data:`` event or one NDJSON line, ``[DONE]`` excluded) when its chunk was read; ``end`` when
the body was fully read. With ``concurrency_cap`` a due request waits for a free slot and is still
measured from its intended time. Every timestamp comes from ``time.perf_counter_ns`` converted to Unix
ns through one anchor.

Stopping. ``stop`` (an ``asyncio.Event``; the CLI sets it on Ctrl-C) ends sending; requests in flight get
``grace_s`` to finish, then are cancelled and recorded with ``error="interrupted"``. A run against a
server that refuses connections stops after ``max_connect_failures`` consecutive refusals and says so.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from stagescope.loadgen.bodies import BodyFactory, PreparedBody
from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.schedule import Schedule
from stagescope.loadgen.spans import new_ids, traceparent

__all__ = ["Engine", "ProgressSnapshot", "send_request", "wall_ns"]

_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.perf_counter_ns()
_STREAM_TYPES = ("text/event-stream", "application/x-ndjson", "application/jsonl", "application/json-seq")
_NON_TOKEN_PREFIXES = (b":", b"event:", b"id:", b"retry:")


def wall_ns(mono_ns: int) -> int:
    """Convert a ``time.perf_counter_ns`` reading to Unix-epoch nanoseconds (one anchor per process)."""
    return _ANCHOR_WALL_NS + (mono_ns - _ANCHOR_MONO_NS)


def _wall(mono_ns: int) -> int:
    return _ANCHOR_WALL_NS + (mono_ns - _ANCHOR_MONO_NS)


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


def _token_count(line: bytes) -> int:
    s = line.strip()
    if not s or s.startswith(_NON_TOKEN_PREFIXES):
        return 0
    if s.startswith(b"data:"):
        s = s[5:].strip()
    return 0 if s in (b"[DONE]", b"") else 1


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    base_headers: dict[str, str],
    prepared: PreparedBody,
    r: RequestResult,
) -> bool:
    """POST one request and fill ``r`` (sent, first byte, tokens, end, status, error).

    ``r.sent_ns`` is taken right before the request is issued. Never raises except on cancellation
    (then ``r.error == "interrupted"``). Returns True when the connection could not be made.
    """
    headers = {**base_headers, "traceparent": traceparent(r.trace_id, r.span_id)}
    r.sent_ns = _wall(time.perf_counter_ns())
    try:
        async with session.post(url, data=prepared.body, headers=headers) as resp:
            r.first_byte_ns = _wall(time.perf_counter_ns())
            r.status = resp.status
            ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype in _STREAM_TYPES:
                tokens: list[int] = []
                buf = b""
                async for chunk in resp.content.iter_any():
                    now = _wall(time.perf_counter_ns())
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        tokens.extend([now] * _token_count(line))
                if _token_count(buf):
                    tokens.append(_wall(time.perf_counter_ns()))
                r.token_ns = tokens
            else:
                await resp.read()
            r.end_ns = _wall(time.perf_counter_ns())
        if r.status >= 400:
            r.error = f"HTTP {r.status}"
    except asyncio.CancelledError:
        r.error = "interrupted"
        raise
    except aiohttp.ClientConnectorError as exc:
        r.error = f"connect: {exc.os_error.strerror if exc.os_error and exc.os_error.strerror else exc}"
        return True
    except TimeoutError:
        r.error = "timeout: no complete response in time"
    except aiohttp.ClientError as exc:
        r.error = f"{type(exc).__name__}: {exc}"[:200]
    return False


class Engine:
    """One open-loop run of ``schedule`` against ``url + route``. Use :func:`stagescope.loadgen.run_load`."""

    def __init__(
        self,
        url: str,
        route: str,
        schedule: Schedule,
        bodies: BodyFactory,
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
    ) -> None:
        if concurrency_cap is not None and concurrency_cap < 1:
            raise ValueError(f"concurrency_cap must be >= 1, got {concurrency_cap}")
        self.url = url.rstrip("/") + route
        self.route = route
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
        self.headers = {"content-type": "application/json", **(headers or {})}
        self.results: list[RequestResult] = []
        self.stopped_early: str | None = None
        self.elapsed_s = 0.0
        self._handoff: collections.deque[tuple[int, int, PreparedBody]] = collections.deque()
        self._backlog: collections.deque[tuple[int, int, PreparedBody]] = collections.deque()
        self._wake_pending = False
        self._thread_stop = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._due = 0
        self._sent = 0
        self._errors = 0
        self._connect_failures = 0
        self._recent_sends: collections.deque[int] = collections.deque(maxlen=100_000)
        self._recent_latency: collections.deque[float] = collections.deque(maxlen=2000)
        self._sender_done = False
        self._idle: asyncio.Event | None = None
        self._stop_reason: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._t0 = 0

    # ---------------------------------------------------------------- sender thread
    def _sender(self) -> None:
        offsets = self.schedule.offsets_s
        loop = self._loop
        assert loop is not None
        try:
            for i in range(len(offsets)):
                if self._thread_stop.is_set():
                    return
                body = self.bodies(i)
                target = self._t0 + int(offsets[i] * 1e9)
                while True:
                    remaining = target - time.perf_counter_ns()
                    if remaining <= 0:
                        break
                    if self._thread_stop.is_set():
                        return
                    time.sleep(min(remaining / 1e9, 0.1))
                self._handoff.append((i, target, body))
                if not self._wake_pending:
                    self._wake_pending = True
                    try:
                        loop.call_soon_threadsafe(self._drain)
                    except RuntimeError:  # loop closed under us
                        return
        finally:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._sender_finished)

    def _sender_finished(self) -> None:
        self._sender_done = True
        self._check_idle()

    # ---------------------------------------------------------------- loop side
    def _drain(self) -> None:
        self._wake_pending = False
        while self._handoff:
            item = self._handoff.popleft()
            self._due += 1
            if self.cap is not None and self._in_flight >= self.cap:
                self._backlog.append(item)
            else:
                self._start(item)

    def _start(self, item: tuple[int, int, PreparedBody]) -> None:
        self._in_flight += 1
        task = asyncio.ensure_future(self._request(*item))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        if self._backlog and not self._thread_stop.is_set():
            self._start(self._backlog.popleft())
        self._check_idle()

    def _check_idle(self) -> None:
        if self._sender_done and not self._handoff and not self._backlog and self._in_flight == 0:
            assert self._idle is not None
            self._idle.set()

    async def _request(self, i: int, intended_mono: int, prepared: PreparedBody) -> None:
        trace_id, span_id = new_ids()
        r = RequestResult(
            request_id=i,
            trace_id=trace_id,
            route=self.route,
            intended_ns=_wall(intended_mono),
            prompt_tokens=prepared.prompt_tokens,
            output_tokens=prepared.output_tokens,
            input_hash=prepared.input_hash,
            span_id=span_id,
        )
        self._sent += 1
        self._recent_sends.append(time.perf_counter_ns())
        try:
            connect_failed = await send_request(self._session_or_fail(), self.url, self.headers, prepared, r)
        finally:
            if r.error is not None:
                self._errors += 1
            elif r.end_ns is not None:
                self._recent_latency.append((r.end_ns - r.intended_ns) / 1e6)
            self.results.append(r)
            if self.on_result is not None:
                self.on_result(r)
        if connect_failed:
            self._connect_failures += 1
            if self._connect_failures >= self.max_connect_failures and self.stopped_early is None:
                self.stopped_early = (
                    f"{self.url}: {self._connect_failures} connections in a row failed ({r.error})"
                )
                self.request_stop()
        else:
            self._connect_failures = 0

    def _session_or_fail(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Engine.run() opens the session"
        return self._session

    def request_stop(self) -> None:
        """Stop sending (idempotent); in-flight requests get ``grace_s`` to finish."""
        self._thread_stop.set()
        if self._stop_reason is not None:
            self._stop_reason.set()

    def snapshot(self) -> ProgressSnapshot:
        now = time.perf_counter_ns()
        recent = self._recent_sends
        while recent and recent[0] < now - 1_000_000_000:
            recent.popleft()
        lat = sorted(self._recent_latency)
        return ProgressSnapshot(
            elapsed_s=max(0.0, (now - self._t0) / 1e9),
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

    async def run(self, stop: asyncio.Event | None = None) -> list[RequestResult]:
        """Send the whole schedule (or until ``stop`` is set); returns the per-request results."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._stop_reason = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        old_switch = sys.getswitchinterval()
        reporter: asyncio.Task[None] | None = None
        watch: asyncio.Task[Any] | None = None
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        ) as session:
            self._session = session
            sys.setswitchinterval(0.0002)
            self._t0 = time.perf_counter_ns() + int(self.start_delay_s * 1e9)
            thread = threading.Thread(target=self._sender, name="stagescope-loadgen-sender", daemon=True)
            thread.start()
            if self.progress is not None:
                reporter = asyncio.ensure_future(self._report())
            if stop is not None:
                watch = asyncio.ensure_future(self._watch(stop))
            try:
                idle = asyncio.ensure_future(self._idle.wait())
                stopping = asyncio.ensure_future(self._stop_reason.wait())
                await asyncio.wait({idle, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not idle.done():
                    if self.stopped_early is None:
                        self.stopped_early = "stopped by user"
                    self._record_backlog()
                    if self._tasks:
                        await asyncio.wait(set(self._tasks), timeout=self.grace_s)
                    for task in list(self._tasks):
                        task.cancel()
                    if self._tasks:
                        await asyncio.wait(set(self._tasks), timeout=1.0)
                idle.cancel()
                stopping.cancel()
            finally:
                self._thread_stop.set()
                self.elapsed_s = (time.perf_counter_ns() - self._t0) / 1e9
                sys.setswitchinterval(old_switch)
                for t in (reporter, watch):
                    if t is not None:
                        t.cancel()
                for task in list(self._tasks):
                    task.cancel()
                if self._tasks:
                    await asyncio.wait(set(self._tasks), timeout=1.0)
                if self.progress is not None:
                    self.progress(self.snapshot())
                thread.join(timeout=1.0)
        return self.results

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.request_stop()

    def _record_backlog(self) -> None:
        """Due requests held back by the cap when sending stopped: recorded, never sent."""
        while self._handoff:
            self._due += 1
            self._backlog.append(self._handoff.popleft())
        while self._backlog:
            i, intended_mono, prepared = self._backlog.popleft()
            trace_id, span_id = new_ids()
            self.results.append(
                RequestResult(
                    request_id=i,
                    trace_id=trace_id,
                    route=self.route,
                    intended_ns=_wall(intended_mono),
                    error="not sent: run stopped",
                    prompt_tokens=prepared.prompt_tokens,
                    output_tokens=prepared.output_tokens,
                    input_hash=prepared.input_hash,
                    span_id=span_id,
                )
            )
