"""A local OTLP/HTTP trace receiver for tests: decodes real protobuf export requests on 127.0.0.1.

Its ``mode`` switches what a collector outage looks like: ``"ok"`` answers 200 and records the spans,
``"hang"`` accepts the connection and never answers (until the mode changes), ``"refuse"`` closes the
listening socket so connections are refused; switching back to ``"ok"`` listens on the same port again.
``"fail:CODE:N[:RETRY_AFTER]"`` answers the next N requests with HTTP CODE (and a ``Retry-After``
header when given), recording nothing, then behaves as ``"ok"``; ``"reject:N"`` answers 200 with a
partial success that rejects N spans of the next request. Every request's arrival time is kept.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "ReceiverProcess"]


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class OtlpReceiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trace_ids: list[str] = []
        self.spans: list[tuple[str, int, str]] = []  # (trace id hex, kind, name) of every span received
        self.requests = 0
        self.arrivals: list[float] = []  # time.monotonic() of every POST, answered or not
        self._fail: tuple[int, int, str | None] | None = None  # (code, remaining, retry-after)
        self._reject = 0
        self._mode = "ok"
        self._release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self._listen()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spans_received(self) -> int:
        with self.lock:
            return len(self.trace_ids)

    def _listen(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as collectors do

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if receiver._mode == "refuse":  # a kept-alive connection of before: drop it unanswered
                    self.close_connection = True
                    return
                with receiver.lock:
                    receiver.arrivals.append(time.monotonic())
                if receiver._mode == "hang":
                    receiver._release.wait(60)
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    fail = receiver._fail
                    if fail is not None:
                        code, left, retry_after = fail
                        receiver._fail = (code, left - 1, retry_after) if left > 1 else None
                    reject, receiver._reject = receiver._reject, 0
                if fail is not None:
                    self.send_response(fail[0])
                    if fail[2] is not None:
                        self.send_header("Retry-After", fail[2])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest.FromString(body)
                spans = [
                    (s.trace_id.hex(), int(s.kind), s.name)
                    for rs in req.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                ]
                with receiver.lock:
                    receiver.trace_ids.extend(t for t, _, _ in spans)
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                resp = ExportTraceServiceResponse()
                if reject:
                    resp.partial_success.rejected_spans = reject
                    resp.partial_success.error_message = "rejected by the test receiver"
                out = resp.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def set_mode(self, mode: str) -> None:
        if mode.startswith("fail:"):
            _, code, count, *retry_after = mode.split(":", 3)  # an HTTP date holds colons
            with self.lock:
                self._fail = (int(code), int(count), retry_after[0] if retry_after else None)
            mode = "ok"
        elif mode.startswith("reject:"):
            with self.lock:
                self._reject = int(mode.split(":")[1])
            mode = "ok"
        assert mode in ("ok", "hang", "refuse")
        if self._mode == "hang":
            self._release.set()  # let hanging handlers go
            self._release = threading.Event()
        if mode == "refuse":
            self._close()
        elif self._server is None:
            self._listen()
        self._mode = mode

    def close(self) -> None:
        self._release.set()
        self._close()


class ReceiverProcess:
    """:class:`OtlpReceiver` in its own process (a collector is never in the service's process).

    Controlled over its stdin/stdout: ``set_mode(mode)``, ``spans_received``, ``spans()`` (every
    span received as ``(trace id, kind, name)``) and ``arrivals()`` (monotonic time of every POST).
    """

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.port = int(self._ask("port"))

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, mode: str) -> None:
        assert self._ask(mode) == "ok"

    @property
    def spans_received(self) -> int:
        return int(self._ask("count"))

    def spans(self) -> list[tuple[str, int, str]]:
        return [tuple(x) for x in json.loads(self._ask("spans"))]  # type: ignore[misc]

    def arrivals(self) -> list[float]:
        return [float(x) for x in json.loads(self._ask("arrivals"))]

    def close(self) -> None:
        if self.proc.poll() is None:
            self._ask("quit")
            self.proc.wait(10)


def _serve_stdio() -> None:
    import sys

    receiver = OtlpReceiver()
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "port":
            print(receiver.port, flush=True)
        elif cmd == "count":
            print(receiver.spans_received, flush=True)
        elif cmd == "spans":
            with receiver.lock:
                print(json.dumps(receiver.spans), flush=True)
        elif cmd == "arrivals":
            with receiver.lock:
                print(json.dumps(receiver.arrivals), flush=True)
        elif cmd in ("ok", "hang", "refuse") or cmd.startswith(("fail:", "reject:")):
            receiver.set_mode(cmd)
            print("ok", flush=True)
        elif cmd == "quit":
            receiver.close()
            print("ok", flush=True)
            return


if __name__ == "__main__":
    _serve_stdio()
