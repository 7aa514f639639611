"""The load generator's HTTP/1.1 client: response parsing fed in awkward pieces, timeouts, Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stagescope.loadgen import run_load, synthetic_schedule
from stagescope.loadgen.echo_server import spawn
from stagescope.loadgen.http import Exchange
from stagescope.loadgen.results import RequestResult


def _exchange() -> tuple[Exchange, list[Exchange]]:
    done: list[Exchange] = []
    r = RequestResult(request_id=0, trace_id="0" * 31 + "1", route="/v1/generate", intended_ns=0)
    return Exchange(b"", r, done.append), done


def _feed_bytewise(ex: Exchange, data: bytes) -> int:
    """Feed one byte at a time; returns the index of the byte that completed the response (or -1)."""
    for i in range(len(data)):
        if ex.feed(data[i : i + 1], 1_000 + i):
            return i
    return -1


def test_chunked_sse_stream_split_anywhere() -> None:
    events = [
        b'data: {"index": 0, "token": "a"}\n\n',
        b": comment\n\n",
        b'data: {"index": 1}\n\n',
        b"data: [DONE]\n\n",
    ]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nX-Trailer: 1\r\n\r\n"
    head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
    ex, _ = _exchange()
    end = _feed_bytewise(ex, head + body)
    assert end == len(head + body) - 1  # complete exactly at the last byte of the trailer section
    r = ex.result
    assert r.status == 200 and ex.keep_alive
    assert (
        r.token_ns is not None and len(r.token_ns) == 2
    )  # two data events; comment and [DONE] are not tokens
    assert r.first_byte_ns == 1_000


def test_content_length_json_and_ndjson_and_close_delimited() -> None:
    ex, _ = _exchange()
    assert ex.feed(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", 5)
    assert ex.result.status == 429 and not ex.keep_alive and ex.result.token_ns is None
    ex2, _ = _exchange()
    data = b'HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: 15\r\n\r\n{"t":1}\n{"t"'
    assert not ex2.feed(data, 7)
    assert ex2.feed(b":2}", 9)  # last line without a newline still counts
    assert ex2.result.token_ns == [7, 9]
    ex3, done = _exchange()
    assert not ex3.feed(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"ok":', 3)
    ex3.connection_closed()  # HTTP/1.0 without a length: the body ends when the server closes
    assert done == [ex3] and ex3.result.error is None and ex3.result.end_ns is not None
    ex4, done4 = _exchange()
    ex4.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 3)
    ex4.connection_closed()
    assert (
        done4 == [ex4] and ex4.result.error == "connection closed by server before the response was complete"
    )


def test_timeout_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    with spawn("--delay-ms", "1500") as url:
        run = asyncio.run(
            run_load(url, synthetic_schedule(20.0, 0.3, "constant"), route="/v1/predict", timeout_s=0.3)
        )
    rows = run.table.to_pylist()
    assert rows and all(r["status"] == 0 and r["error"].startswith("timeout") for r in rows)
    assert all(r["end_unix_ns"] is None and r["latency_ms"] is None for r in rows)
    assert run.summary.ok == 0 and run.error is None  # a slow server is a finding, not a refused URL


def test_ctrl_c_on_the_command_writes_what_was_recorded(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    with spawn("--delay-ms", "5") as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stagescope.cli", "load", "--url", url, "--rate", "100", "--duration", "60",
             "--out", str(out), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(4.0)  # leave the interpreter time to start and install its handler
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "stopped by user; results so far written to" in stderr and "Traceback" not in stderr
    rows = pq.read_table(out).to_pylist()
    assert 20 <= len(rows) < 6000 and sum(r["status"] == 200 for r in rows) >= 20
    assert '"stopped_early": "stopped by user"' in stdout


def test_a_run_in_which_no_request_was_answered_ok_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every POST answered 404 (a URL whose path the service does not serve): the results are written,
    one line names the answers and what to check, exit status 3; the same server's GETs exit 0."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from stagescope.cli import main

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def do_POST(self) -> None:
            self._answer(404)

        def do_GET(self) -> None:
            self._answer(200)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1/score"
    try:
        out = tmp_path / "post.parquet"
        rc = main(["load", "--url", url, "--rate", "20", "--duration", "0.5", "--arrival", "constant", "--no-progress", "--out", str(out)])
        err = capsys.readouterr().err
        rows = pq.read_table(out).to_pylist()
        assert rc == 3 and rows and all(r["status"] == 404 for r in rows)
        assert f"none of the {len(rows)} requests was answered OK (404 x{len(rows)})" in err and "Traceback" not in err
        rc_get = main(["load", "--url", url, "--method", "GET", "--rate", "20", "--duration", "0.5",
                       "--no-progress", "--out", str(tmp_path / "get.parquet")])  # fmt: skip
        assert rc_get == 0 and "answered OK" not in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
