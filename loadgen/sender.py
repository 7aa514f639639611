"""The open-loop engine's sender thread: requests built ahead and handed over at their intended time.

Timing. A dedicated sender thread walks the schedule and sleeps (``time.sleep``: ``clock_nanosleep``
on Linux, tens of microseconds of overshoot) until each request's intended time, then hands it to the
event loop with ``call_soon_threadsafe``, which wakes the loop at once through its self-pipe (asyncio's
own timers round sleeps up to whole milliseconds). Requests (body, trace ids, serialized bytes) are
built ahead in the time between sends, up to one second of schedule (the first second before the
clock starts, since traces often open with a burst), so the loop side only stamps the send time and
writes to a socket (:mod:`stagescope.loadgen.http`: no task per request).

:class:`SenderThread` is the part of :class:`~stagescope.loadgen.runner.Engine` that runs on that
thread (``_prepare``, ``_sender``); the engine supplies the state declared on it and the loop side
(``_drain``, ``_sender_finished``). Times are ``time.perf_counter_ns`` (the intended time is stamped
as Unix ns through :func:`~stagescope.loadgen.http_exchange.wall_ns`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stagescope.loadgen.bodies import BodyFactory, NoBody
from stagescope.loadgen.http import build_request, wall_ns
from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.schedule import Schedule
from stagescope.loadgen.spans import new_ids, traceparent

__all__ = [
    "LOOKAHEAD_BYTES",
    "LOOKAHEAD_MAX",
    "LOOKAHEAD_S",
    "PreparedRequest",
    "SenderThread",
    "set_realtime",
]


#: How far ahead the sender thread builds requests: seconds of schedule, requests, bytes.
LOOKAHEAD_S = 1.0
LOOKAHEAD_MAX = 2048
LOOKAHEAD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request built ahead of its send time (by the sender thread)."""

    request_id: int
    offset_ns: int  # intended send, nanoseconds after the run's t0
    payload: bytes
    result: RequestResult


def set_realtime() -> tuple[int, os.sched_param] | None:
    """Put the calling thread under SCHED_FIFO priority 10; returns what to restore, None if refused."""
    try:
        old = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, OSError):
        return None
    return old


class SenderThread:
    """The sender thread's half of :class:`~stagescope.loadgen.runner.Engine` (a base class of it)."""

    # set by Engine.__init__ and Engine.run
    bodies: BodyFactory | NoBody
    headers: dict[str, str]
    host_header: str
    method: str
    path: str
    realtime: bool
    route: str
    schedule: Schedule
    start_delay_s: float
    _handoff: collections.deque[PreparedRequest]
    _loop: asyncio.AbstractEventLoop | None
    _sender_rt: bool
    _started: threading.Event
    _t0: int
    _thread_stop: threading.Event
    _wake_pending: bool
    # the loop side, defined by Engine
    _drain: Callable[[], None]
    _sender_finished: Callable[[], None]

    def _prepare(self, i: int, offset_ns: int) -> PreparedRequest:
        """Build request ``i`` (body, trace ids, bytes); its intended time is set when ``_t0`` is known."""
        body = self.bodies(i)
        trace_id, span_id = new_ids()
        headers = {**self.headers, "traceparent": traceparent(trace_id, span_id)}
        payload = build_request(self.method, self.path, self.host_header, body.body, headers)
        result = RequestResult(
            request_id=i,
            trace_id=trace_id,
            route=self.route,
            intended_ns=0,
            prompt_tokens=body.prompt_tokens,
            output_tokens=body.output_tokens,
            input_hash=body.input_hash,
            span_id=span_id,
        )
        return PreparedRequest(i, offset_ns, payload, result)

    def _sender(self) -> None:
        """Prepare requests ahead (up to LOOKAHEAD_S of schedule, LOOKAHEAD_MAX requests and
        LOOKAHEAD_BYTES) in the time between sends, sleep to each intended time, hand over."""
        offsets_ns = (self.schedule.offsets_s * 1e9).astype("int64")
        n = len(offsets_ns)
        loop = self._loop
        assert loop is not None
        if self.realtime:
            self._sender_rt = set_realtime() is not None
        ahead: collections.deque[PreparedRequest] = collections.deque()
        ahead_bytes = 0
        nxt = 0  # next request to prepare
        horizon = int(LOOKAHEAD_S * 1e9)
        prep_ns = 0  # recent cost of building one request (decaying maximum)

        def room(clock_offset_ns: int) -> bool:
            return (
                nxt < n
                and len(ahead) < LOOKAHEAD_MAX
                and ahead_bytes < LOOKAHEAD_BYTES
                and offsets_ns[nxt] - clock_offset_ns < horizon
            )

        try:
            # the first second of the schedule (a trace may start with a burst) is built before the clock starts
            while room(0) and not self._thread_stop.is_set():
                item = self._prepare(nxt, int(offsets_ns[nxt]))
                ahead.append(item)
                ahead_bytes += len(item.payload)
                nxt += 1
            self._t0 = t0 = time.perf_counter_ns() + int(self.start_delay_s * 1e9)
            self._started.set()
            while ahead or nxt < n:
                if self._thread_stop.is_set():
                    return
                if not ahead:
                    item = self._prepare(nxt, int(offsets_ns[nxt]))
                    ahead.append(item)
                    ahead_bytes += len(item.payload)
                    nxt += 1
                item = ahead[0]
                target = t0 + item.offset_ns
                now = time.perf_counter_ns()
                remaining = target - now
                if remaining > 0:
                    # build the next request only if it will very likely be done before this one is due
                    if remaining > 2 * prep_ns + 200_000 and room(now - t0):
                        extra = self._prepare(nxt, int(offsets_ns[nxt]))
                        took = time.perf_counter_ns() - now
                        prep_ns = max(took, (7 * prep_ns + took) // 8)
                        ahead.append(extra)
                        ahead_bytes += len(extra.payload)
                        nxt += 1
                    else:
                        time.sleep(min(remaining / 1e9, 0.1))
                    continue
                ahead.popleft()
                ahead_bytes -= len(item.payload)
                item.result.intended_ns = wall_ns(target)
                self._handoff.append(item)
                if not self._wake_pending:
                    self._wake_pending = True
                    try:
                        loop.call_soon_threadsafe(self._drain)
                    except RuntimeError:  # loop closed under us
                        return
        finally:
            self._started.set()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._sender_finished)
