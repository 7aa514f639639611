"""`stagescope serve --feature-store redis://...` keeps serving while Redis is down, as its design says.

Down at start: one warning, `/readyz` and `/v1/predict` 503, `/v1/generate` 200; ready as soon as a real
Redis comes up on that port; 503 again (one more line, no traceback) when Redis goes away mid-run.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

EXE = shutil.which("stagescope", path=str(Path(sys.executable).parent)) or "stagescope"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(port: int, method: str, path: str, body: bytes = b"") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _wait_for(port: int, method: str, path: str, expected: int, body: bytes = b"", timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(port, method, path, body)
        if status == expected or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _redis(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("redis-server did not start")


def test_serve_keeps_serving_while_redis_is_down() -> None:
    redis_port = _free_port()
    serve = subprocess.Popen(
        [EXE, "serve", "--port", "0", "--feature-store", f"redis://127.0.0.1:{redis_port}/0"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert serve.stderr is not None
    port = 0
    for line in serve.stderr:
        lines.append(line)
        if "listening on http://127.0.0.1:" in line:
            port = int(line.rsplit(":", 1)[1])
            break
    assert port, "".join(lines)
    reader = threading.Thread(target=lambda: lines.extend(serve.stderr or []), daemon=True)
    reader.start()
    predict = b'{"inputs": [1.0, 2.0]}'
    generate = b'{"prompt": "a b c", "max_tokens": 2, "stream": false}'
    redis = None
    try:
        assert _wait_for(port, "GET", "/healthz", 200) == 200
        assert _status(port, "GET", "/readyz") == 503
        assert _status(port, "POST", "/v1/predict", predict) == 503
        assert _status(port, "POST", "/v1/generate", generate) == 200
        redis = _redis(redis_port)
        assert _wait_for(port, "GET", "/readyz", 200) == 200
        assert _status(port, "POST", "/v1/predict", predict) == 200
        redis.terminate()
        redis.wait(10)
        redis = None
        assert _wait_for(port, "POST", "/v1/predict", 503, predict) == 503
        assert _status(port, "GET", "/readyz") == 503
        for _ in range(20):  # many failing requests: still one line a minute, not one per request
            _status(port, "POST", "/v1/predict", predict)
    finally:
        if redis is not None:
            redis.kill()
        serve.terminate()
        serve.wait(20)
        reader.join(30)  # the whole log, to the end of the pipe, however long a loaded machine takes
    log = "".join(lines)
    assert "Traceback" not in log, log
    warnings = [line for line in log.splitlines() if "feature store" in line]
    assert len(warnings) == 3, log  # unreachable at start, reachable again, lost mid-run
    assert "is unreachable" in warnings[0] and "reachable again" in warnings[1]
