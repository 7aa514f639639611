"""One HTTP/1.1 exchange of the load generator: the response parsed incrementally as bytes arrive.

:class:`Exchange` holds one request's bytes and fills its :class:`~stagescope.loadgen.results.RequestResult`
from the response, fed in whatever pieces the socket delivers (:mod:`stagescope.loadgen.http` feeds it
from ``data_received``; no task per request). Supported: ``Content-Length``, ``Transfer-Encoding:
chunked`` and read-until-close bodies, 1xx interim responses, heads up to 64 KiB. Stream bodies
(``text/event-stream``, NDJSON) go to a stream reader (:mod:`stagescope.loadgen.streams`) as they arrive,
each piece with the arrival time of its bytes: by default every SSE ``data:`` line or NDJSON line (not
``[DONE]``) is one token event; an OpenAI-compatible stream is read event by event.

Time: :func:`wall_ns` turns a ``time.perf_counter_ns`` reading into Unix-epoch nanoseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.streams import LineStream, StreamReader

__all__ = ["Exchange", "StreamFactory", "wall_ns"]

_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.perf_counter_ns()
_STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson", b"application/jsonl", b"application/json-seq")
_MAX_HEAD = 64 * 1024

#: Makes the reader of one streamed response body (it records token events on the result).
StreamFactory = Callable[[RequestResult], StreamReader]


def wall_ns(mono_ns: int | None = None) -> int:
    """A ``time.perf_counter_ns`` reading (default: now) as Unix-epoch nanoseconds (one anchor per process)."""
    if mono_ns is None:
        mono_ns = time.perf_counter_ns()
    return _ANCHOR_WALL_NS + (mono_ns - _ANCHOR_MONO_NS)


class Exchange:
    """One request and its response, filling a :class:`RequestResult` as bytes arrive.

    ``on_done(exchange)`` is called exactly once, when the response is complete or the exchange failed
    (``result.error`` set; ``connect_failed`` tells a refused connection apart). ``stream`` makes the
    reader of a streamed body (default :class:`~stagescope.loadgen.streams.LineStream`).
    """

    __slots__ = (
        "_body_left",
        "_buf",
        "_chunk_state",
        "_mode",
        "_reader",
        "_stream",
        "_stream_factory",
        "connect_failed",
        "done",
        "keep_alive",
        "on_done",
        "payload",
        "result",
        "retried",
        "timer",
    )

    def __init__(
        self,
        payload: bytes,
        result: RequestResult,
        on_done: Callable[[Exchange], None],
        stream: StreamFactory | None = None,
    ) -> None:
        self.payload = payload
        self._stream_factory: StreamFactory = stream or LineStream
        self.result = result
        self.on_done = on_done
        self.done = False
        self.connect_failed = False
        self.keep_alive = True
        self.retried = False
        self.timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._mode = "head"  # head | length | chunked | close | done
        self._body_left = 0
        self._chunk_state = "size"  # size | data | crlf | trailer
        self._stream = False
        self._reader: StreamReader | None = None

    @property
    def got_bytes(self) -> bool:
        return self.result.first_byte_ns is not None

    def finish(self, error: str | None = None, *, connect_failed: bool = False) -> None:
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        r = self.result
        if error is not None:
            r.error = error
            self.keep_alive = False
        else:
            r.end_ns = wall_ns()
            if r.status >= 400:
                r.error = f"HTTP {r.status}"
        self.connect_failed = connect_failed
        self.on_done(self)

    # ------------------------------------------------------------------ parsing
    def feed(self, data: bytes, now_wall: int) -> bool:
        """Consume response bytes; returns True when the response is complete."""
        r = self.result
        if r.first_byte_ns is None:
            r.first_byte_ns = now_wall
        buf = self._buf
        buf += data
        while True:
            if self._mode == "head":
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise ValueError("response head too large")
                    return False
                head = bytes(buf[:end])
                del buf[: end + 4]
                if not self._parse_head(head):
                    continue  # 1xx interim response: the real one follows
                if self._mode == "done":
                    return True
            elif self._mode == "length":
                take = min(len(buf), self._body_left)
                if take:
                    self._body(bytes(buf[:take]), now_wall)
                    del buf[:take]
                    self._body_left -= take
                if self._body_left == 0:
                    self._end_stream(now_wall)
                    return True
                return False
            elif self._mode == "close":
                if buf:
                    self._body(bytes(buf), now_wall)
                    buf.clear()
                return False
            elif self._mode == "chunked":
                if self._chunked(buf, now_wall):
                    self._end_stream(now_wall)
                    return True
                return False
            else:
                return True

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(status_line[1])
        if 100 <= status < 200:
            return False
        self.result.status = status
        length: int | None = None
        chunked = False
        ctype = b""
        self.keep_alive = status_line[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            value = value.strip()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"content-type":
                ctype = value.split(b";")[0].strip().lower()
            elif key == b"connection":
                v = value.lower()
                if b"close" in v:
                    self.keep_alive = False
                elif b"keep-alive" in v:
                    self.keep_alive = True
        self._stream = ctype in _STREAM_TYPES
        if self._stream:
            self.result.token_ns = []
            self.result.usage_output_tokens = None
            self._reader = self._stream_factory(self.result)
        if status in (204, 304):
            self._mode = "done"
        elif chunked:
            self._mode = "chunked"
        elif length is not None:
            self._mode = "length"
            self._body_left = length
            if length == 0:
                self._mode = "done"
        else:
            self._mode = "close"
            self.keep_alive = False
        return True

    def _chunked(self, buf: bytearray, now_wall: int) -> bool:
        while True:
            if self._chunk_state == "size":
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return False
                size = int(bytes(buf[:eol]).split(b";")[0].strip() or b"0", 16)
                del buf[: eol + 2]
                if size == 0:
                    self._chunk_state = "trailer"
                else:
                    self._body_left = size
                    self._chunk_state = "data"
            elif self._chunk_state == "data":
                take = min(len(buf), self._body_left)
                if take:
                    self._body(bytes(buf[:take]), now_wall)
                    del buf[:take]
                    self._body_left -= take
                if self._body_left:
                    return False
                self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(buf) < 2:
                    return False
                del buf[:2]
                self._chunk_state = "size"
            else:  # trailer section ends with an empty line
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return False
                del buf[: eol + 2]
                if eol == 0:
                    return True

    def _body(self, data: bytes, now_wall: int) -> None:
        if self._reader is not None:
            self._reader.feed(data, now_wall)

    def _end_stream(self, now_wall: int) -> None:
        if self._reader is not None:
            self._reader.close(now_wall)
            self._reader = None
        self._mode = "done"

    def connection_closed(self) -> None:
        """The server closed the connection: complete for read-until-close bodies, else a failure."""
        if self._mode == "close":
            self._end_stream(wall_ns())
            self.finish()
        else:
            self.finish("connection closed by server before the response was complete")
