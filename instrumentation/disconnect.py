"""Noticing a client that goes away before its answer is complete (HTTP 499, "client closed request").

A client may leave mid-upload (the app's ``receive`` gets ``http.disconnect`` before the last body
chunk, and Starlette raises ``ClientDisconnect``), while the server works on the answer, or in the
middle of a streamed answer. None of that is a server error: the middleware records it with
:data:`~stagescope.names.STATUS_CODE_CLIENT_CLOSED` and the status class
:data:`~stagescope.names.STATUS_CLASS_CLIENT_CLOSED`, logs one line (then at most one a minute, with a
count) and no traceback, and the SLO's samples and error ratio leave it out.

To see a client leave while the app is busy, :class:`ClientWatch` keeps one ``receive()`` pending
once the request body is complete (after the app read its last chunk, or at once for a request
without a body) and the request has run :data:`WATCH_AFTER_S`: the ASGI server answers it with
``http.disconnect`` when the connection drops (or when the response is done, which is then ignored).
The app's own ``receive`` calls go through the watch, so the server never sees two ``receive()`` at a
time and the app gets every message once, in order. A request that announces a body is not read ahead
(no eager ``100 Continue``, no change to flow control).

Why the delay: the pending ``receive()`` is an asyncio task, about 10 µs of event-loop time; a request
answered within 50 ms costs a dict entry instead (one timer per event loop arms the watches of the
requests in flight, oldest first). A client that left before then is still
seen when the watch starts (the server answers at once) unless the whole answer was done first: a
response under 50 ms to a client already gone is recorded as answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from asyncio import _get_running_loop
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from threading import get_ident as _get_ident
from typing import Any

from stagescope.names import STATUS_CLASS_CLIENT_CLOSED, STATUS_CODE_CLIENT_CLOSED

__all__ = ["WATCH_AFTER_S", "ClientWatch", "is_disconnect_error", "log_client_closed", "may_watch_at_start"]

_log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

#: Seconds a request runs before a ``receive()`` is kept pending to notice its client leaving.
WATCH_AFTER_S = 0.05
_WATCH_AFTER_NS = int(WATCH_AFTER_S * 1e9)

_DISCONNECT_ERRORS = ("ClientDisconnect", "ClosedResourceError", "BrokenResourceError", "EndOfStream")
_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}


def may_watch_at_start(headers: Any) -> bool:
    """True when a request has no body to read (no ``content-length`` > 0, no ``transfer-encoding``,
    no ``expect``): its only message can be read ahead without changing what the server does. (The
    middleware applies this rule in its own single pass over the headers.)"""
    for k, v in headers or ():
        if (
            k == b"transfer-encoding"
            or k == b"expect"
            or (k == b"content-length" and v.strip() not in (b"", b"0"))
        ):
            return False
    return True


def is_disconnect_error(exc: BaseException) -> bool:
    """An exception that only says the client went away (Starlette's ``ClientDisconnect``, anyio's closed
    streams, a reset or broken connection); anything else stays a server error."""
    if not isinstance(exc, Exception):
        return False  # CancelledError, KeyboardInterrupt, SystemExit: never swallowed
    return isinstance(exc, OSError) or type(exc).__name__ in _DISCONNECT_ERRORS


class _Sweeper:
    """Arms the watches of one event loop once their request has run WATCH_AFTER_S: one timer for all
    requests in flight (oldest first), instead of a timer per request. A watch's ``started`` is its
    request's start on ``time.perf_counter_ns`` (the record's ``start_ns``), so registering one reads
    no clock; the timer's delays are taken from the same clock."""

    __slots__ = ("_handle", "_loop", "_watches")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watches: dict[ClientWatch, None] = {}  # insertion order = start order (identity keys)
        self._handle: asyncio.TimerHandle | None = None

    def arm_timer(self, started_ns: int) -> None:
        """Run :meth:`_tick` when a request started at ``started_ns`` has run WATCH_AFTER_S."""
        delay = (started_ns + _WATCH_AFTER_NS - time.perf_counter_ns()) / 1e9
        self._handle = self._loop.call_later(max(0.0, delay), self._tick)

    def _tick(self) -> None:
        self._handle = None
        now = time.perf_counter_ns()
        watches = self._watches
        while watches:
            watch = next(iter(watches))
            if watch.started + _WATCH_AFTER_NS > now:
                self.arm_timer(watch.started)
                return
            del watches[watch]
            try:
                watch._arm()
            except Exception:  # never let one request's watch break the others'
                _log.debug("stagescope: arming a disconnect watch failed", exc_info=True)


#: This thread's sweeper (``.sweeper``): the one of the loop that ran in it last.
_local = threading.local()


class _NoLoop:
    """Stands for the loop of :data:`_last` before any sweeper exists: it runs in no thread."""

    _thread_id = None


#: The sweeper :func:`_sweeper` returned last, in any thread, when its loop is an asyncio loop that
#: says which thread runs it (``_thread_id``). ClientWatch reads it first: one global read and one
#: attribute compare per request instead of the thread-local and ``getattr`` look-ups.
_last = _Sweeper(_NoLoop())  # type: ignore[arg-type]


def _sweeper() -> _Sweeper | None:
    """The running loop's sweeper; None outside asyncio (trio: only what the app receives tells).

    ClientWatch first tries :data:`_last`, whose loop is the running one while that loop's
    ``_thread_id`` is this thread (asyncio's loops set it while they run): no lookup of the running
    loop, which in CPython 3.11 costs a ``getpid`` system call per request. Otherwise (a new loop,
    uvloop, another thread's loop was the last) this looks it up, in this thread's own sweeper."""
    global _last
    loop = _get_running_loop()
    if loop is None:
        return None
    sweeper = getattr(_local, "sweeper", None)
    if sweeper is None or sweeper._loop is not loop:
        sweeper = _local.sweeper = _Sweeper(loop)  # a new loop: the old one's watches went with it
    if getattr(loop, "_thread_id", None) == _get_ident():
        _last = sweeper
    return sweeper


class ClientWatch:
    """The app's ``receive`` for one request; ``closed`` turns True when the client left before
    ``record.end_ns`` was set (see the module docstring). ``body_done``: the request has no body to read."""

    __slots__ = (
        "_armed",
        "_body_done",
        "_held",
        "_receive",
        "_sweeper",
        "_task",
        "_waiter",
        "closed",
        "record",
        "started",
    )

    def __init__(self, receive: Receive, record: Any, body_done: bool = False) -> None:
        self._receive = receive
        self.record = record
        self.closed = False
        self._held: deque[Message] | None = None  # messages the watch received for the app
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body_done = body_done
        self._armed = False
        self.started: int = record.start_ns  # time.perf_counter_ns() at the request's start
        # the last sweeper while its loop runs in this thread (see _sweeper): this runs for every request
        sweeper: _Sweeper | None = _last
        if sweeper._loop._thread_id != _get_ident():  # type: ignore[union-attr]
            sweeper = _sweeper()
        self._sweeper = sweeper
        if sweeper is not None:
            sweeper._watches[self] = None
            if sweeper._handle is None:
                sweeper.arm_timer(self.started)

    def _arm(self) -> None:
        self._armed = True
        if self._body_done:
            self._start()

    def _start(self) -> None:
        """Keep one ``receive()`` pending from now on (the body is complete, or there is none)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            try:
                msg = await self._receive()
            except asyncio.CancelledError:
                raise
            except Exception:  # a server that raises once the connection is gone
                msg = dict(_DISCONNECT)
            self._note(msg)
            if self._held is None:
                self._held = deque()
            self._held.append(msg)
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if msg.get("type") != "http.request" or msg.get("more_body", False):
                return  # disconnected, or a body after all: the app reads the rest itself

    def _note(self, msg: Message) -> None:
        if msg.get("type") == "http.disconnect" and self.record.end_ns is None:
            self.closed = True

    async def __call__(self) -> Message:
        """The ``receive`` the app sees: held messages first, then the server's."""
        while not self._held:
            task = self._task
            if task is None or task.done():
                msg = await self._receive()
                self._note(msg)
                if msg.get("type") == "http.request" and not msg.get("more_body", False):
                    self._body_done = True
                    if self._armed:
                        self._start()
                return msg
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        assert self._held is not None
        return self._held.popleft()

    def stop(self) -> None:
        """The request is over: leave the sweeper, drop a ``receive()`` still pending (servers that would
        hold it)."""
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper._watches.pop(self, None)
        task = self._task
        if task is not None and not task.done():
            task.cancel()


class _EveryMinute:
    """Counts events and says when one may be logged: the first, then at most one a minute."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._last = -1e18
        self._unlogged = 0
        self._lock = threading.Lock()

    def due(self) -> int:
        """0 when not to log now, else how many events the line covers."""
        now = time.monotonic()
        with self._lock:
            self._unlogged += 1
            if now - self._last < self.interval_s:
                return 0
            n, self._unlogged, self._last = self._unlogged, 0, now
            return n


_closed_log = _EveryMinute()


def log_client_closed(method: str, route: str, during: str) -> None:
    """One line, no traceback: a client left before its answer was complete."""
    n = _closed_log.due()
    if not n:
        return
    more = f" ({n - 1} more since the last line)" if n > 1 else ""
    with contextlib.suppress(Exception):
        _log.warning(
            "stagescope: the client of %s %s closed the connection %s; recorded as status %d (%s), not a "
            "server error%s; logged at most once a minute",
            method, route, during, STATUS_CODE_CLIENT_CLOSED, STATUS_CLASS_CLIENT_CLOSED, more,
        )  # fmt: skip
