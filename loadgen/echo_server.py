"""A trivial local HTTP/1.1 endpoint for benchmarking and testing the load generator itself.

Not an inference service: it answers every POST with a tiny JSON body after ``--delay-ms``, and
``/v1/generate`` with an SSE stream of ``max_tokens`` events ``--token-ms`` apart (``data: [DONE]``
last). With ``--stall-every S --stall-for D`` it freezes all answers for D seconds every S seconds
(first stall at ``--stall-offset``), the coordinated-omission test case. Built on bare asyncio
protocols so that it costs the machine as little as possible.

Run: ``python -m stagescope.loadgen.echo_server --port 0``; the first stdout line is ``PORT <n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from stagescope.procs import stop_process

__all__ = ["EchoProtocol", "StallClock", "main", "serve", "spawn"]


class StallClock:
    """When the server may answer: never inside ``[offset + k*every, offset + k*every + duration)``."""

    def __init__(self, every_s: float | None, duration_s: float, offset_s: float) -> None:
        self.start = time.monotonic()
        self.every = every_s
        self.duration = duration_s
        self.offset = offset_s

    def release_delay(self, at: float) -> float:
        """Seconds to hold an answer that is ready at monotonic time ``at``."""
        if not self.every:
            return 0.0
        t = at - self.start - self.offset
        if t < 0:
            return 0.0
        phase = t % self.every
        return self.duration - phase if phase < self.duration else 0.0


class EchoProtocol(asyncio.Protocol):
    """One keep-alive connection; requests are answered in order."""

    def __init__(self, delay_s: float, token_s: float, stall: StallClock) -> None:
        self.delay_s = delay_s
        self.token_s = token_s
        self.stall = stall
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        path = parts[1] if len(parts) > 1 else "/"
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip() or 0)
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        self.busy = True
        loop = asyncio.get_running_loop()
        ready = time.monotonic() + self.delay_s
        wait = self.delay_s + self.stall.release_delay(ready)
        if path.startswith("/v1/generate"):
            try:
                n = int(json.loads(body or b"{}").get("max_tokens", 16))
            except (ValueError, AttributeError):
                n = 16
            loop.call_later(wait, self._stream, max(n, 1))
        elif wait > 0:
            loop.call_later(wait, self._answer)
        else:
            self._answer()

    def _answer(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(
            b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
        )
        self._done()

    def _stream(self, n: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self._token(0, n)

    def _token(self, k: int, n: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        event = b'data: {"token":"t%d"}\n\n' % k if k < n else b"data: [DONE]\n\n"
        self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        if k >= n:
            self.transport.write(b"0\r\n\r\n")
            self._done()
            return
        loop = asyncio.get_running_loop()
        wait = self.token_s + self.stall.release_delay(time.monotonic() + self.token_s)
        loop.call_later(wait, self._token, k + 1, n)

    def _done(self) -> None:
        self.busy = False
        if self.buf:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(
    port: int = 0,
    *,
    delay_ms: float = 0.0,
    token_ms: float = 5.0,
    stall_every_s: float | None = None,
    stall_for_s: float = 1.0,
    stall_offset_s: float = 5.0,
    ready: asyncio.Future[int] | None = None,
) -> None:
    """Serve on 127.0.0.1 until cancelled; ``ready`` gets the bound port."""
    stall = StallClock(stall_every_s, stall_for_s, stall_offset_s)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: EchoProtocol(delay_ms / 1000.0, token_ms / 1000.0, stall), "127.0.0.1", port, backlog=1024
    )
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    async with server:
        await server.serve_forever()


@contextmanager
def spawn(*args: str) -> Iterator[str]:
    """Run the endpoint in a child process (options as on the command line); yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stagescope.loadgen.echo_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"echo server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        stop_process(proc, signal.SIGTERM, 5.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer delay (ms)")
    parser.add_argument("--token-ms", type=float, default=5.0, help="gap between stream events (ms)")
    parser.add_argument("--stall-every", type=float, default=None, help="stall period (s)")
    parser.add_argument("--stall-for", type=float, default=1.0, help="stall length (s)")
    parser.add_argument("--stall-offset", type=float, default=5.0, help="first stall starts (s after start)")
    args = parser.parse_args(argv)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[int] = loop.create_future()
        task = asyncio.ensure_future(
            serve(
                args.port,
                delay_ms=args.delay_ms,
                token_ms=args.token_ms,
                stall_every_s=args.stall_every,
                stall_for_s=args.stall_for,
                stall_offset_s=args.stall_offset,
                ready=ready,
            )
        )
        print(f"PORT {await ready}", flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
