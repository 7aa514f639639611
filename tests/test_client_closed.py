"""A client that goes away mid-request is recorded as client-closed (499), not as a server error.

A real uvicorn serves tests/apps/disconnect_app.py; raw sockets leave mid-upload, while the server
works on the answer (GET and POST), and in the middle of a streamed answer. Each such request must
land in ``status_class="client_closed"`` (and status 499 on its span), none in 5xx; the server log holds
one line about it and no traceback. Requests whose client stays get their answers unchanged.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import pytest
import shutdown_support as S
from prometheus_client.parser import text_string_to_metric_families

from stagescope import names


def _start(tmp: Path) -> S.Running:
    env = S.sink_env(tmp / "spans")
    port = S.free_port()
    log = tmp / "server.log"
    cmd = [S.sys.executable, "-m", "uvicorn", "--app-dir", str(S.APPS), "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "info", "disconnect_app:app"]  # fmt: skip
    with log.open("wb") as fh:
        proc = S.subprocess.Popen(cmd, env=env, stdout=fh, stderr=S.subprocess.STDOUT)
    run = S.Running(proc, port, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return run
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, run.log()[-2000:]
            time.sleep(0.05)


def _leave_mid_upload(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
                  b"Content-Length: 100000\r\n\r\n" + b"x" * 1000)  # fmt: skip
        time.sleep(0.05)


def _leave_before_the_answer(port: int, method: str) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = b"abc" if method == "POST" else b""
        s.sendall(
            f"{method} /slow HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        time.sleep(0.1)


def _leave_mid_stream(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while b"chunk 0" not in got:
            data = s.recv(4096)
            assert data, got
            got += data


def _request_counts(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != names.METRIC_REQUEST_DURATION.removesuffix("_seconds") + "_seconds":
            continue
        for s in fam.samples:
            if s.name.endswith("_count"):
                key = f"{s.labels[names.LABEL_ROUTE]} {s.labels[names.LABEL_STATUS_CLASS]}"
                out[key] = out.get(key, 0) + s.value
    return out


_CLOSED = names.STATUS_CLASS_CLIENT_CLOSED
#: the request counts per "route status_class" once every handler has finished
_EXPECTED = {
    f"/upload {_CLOSED}": 30, f"/slow {_CLOSED}": 20, f"/stream {_CLOSED}": 5,
    "/echo 2xx": 20, "/stream 2xx": 1, "/disconnected 2xx": 1,
}  # fmt: skip


def _seen(counts: dict[str, float]) -> dict[str, float]:
    """``counts`` for the routes the test drives (the polls of ``/metrics`` count themselves too)."""
    return {k: v for k, v in counts.items() if not k.startswith("/metrics ")}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_clients_that_leave_are_client_closed_not_server_errors(tmp_path: Path) -> None:
    run = _start(tmp_path)
    try:
        for _ in range(30):
            _leave_mid_upload(run.port)
        for _ in range(10):
            _leave_before_the_answer(run.port, "GET")
            _leave_before_the_answer(run.port, "POST")
        for _ in range(5):
            _leave_mid_stream(run.port)
        # clients that stay: answers unchanged, nothing misread
        conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=10)
        for i in range(20):
            payload = f"payload {i} ".encode() * (i + 1)
            conn.request("POST", "/echo", body=payload)
            r = conn.getresponse()
            assert r.status == 200 and r.read() == payload
        conn.request("GET", "/stream")
        r = conn.getresponse()
        assert r.status == 200 and r.read().count(b"chunk") == 20
        conn.request("GET", "/disconnected")
        r = conn.getresponse()
        assert json.loads(r.read()) == {"disconnected": False}
        conn.close()
        # the handlers of the clients that left finish their work (0.5 s for /slow, 1 s for /stream)
        # and count themselves: wait for the expected counts, on a loaded machine longer than 1 s;
        # a wrong count (a missed or misclassified request) still fails below once this gives up
        deadline = time.monotonic() + 30
        while _seen(counts := _request_counts(run.port)) != _EXPECTED and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        S.stop(run, S.signal.SIGTERM)
    closed = names.STATUS_CLASS_CLIENT_CLOSED
    assert counts.get(f"/upload {closed}") == 30, counts
    assert counts.get(f"/slow {closed}") == 20, counts
    assert counts.get(f"/stream {closed}") == 5, counts
    assert counts.get("/echo 2xx") == 20 and counts.get("/stream 2xx") == 1, counts
    assert not [k for k in counts if k.endswith("5xx")], counts
    assert _seen(counts) == _EXPECTED, counts
    log = run.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "closed the connection" in line]
    assert len(lines) == 1, lines  # one line, then at most one a minute
    spans = {}
    for f in (tmp_path / "spans").glob("spans-*.jsonl"):
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        if s["kind"] == 2:
                            attrs = {a["key"]: a["value"] for a in s.get("attributes", [])}
                            code = attrs.get("http.status_code", attrs.get("http.response.status_code", {}))
                            spans.setdefault(s["name"], []).append(int(code.get("intValue", 0)))
    assert spans["POST /upload"].count(names.STATUS_CODE_CLIENT_CLOSED) == 30, spans.get("POST /upload")
    assert all(c != 500 for codes in spans.values() for c in codes), spans
    # the analysis leaves them out of the SLO's samples, and says so
    from stagescope.analysis.api import analyze
    from stagescope.analysis.ingest import load_dataset

    report = analyze(load_dataset(traces=[tmp_path / "spans"]), "p99<300ms")
    answered = sum(len(codes) for codes in spans.values()) - 55
    per_route = {r["route"]: r for r in report["routes"]}  # each route analysed on its own
    assert sum(r["requests"] for r in per_route.values()) == answered, (per_route, answered)
    for route, n in (("/upload", 30), ("/slow", 20), ("/stream", 5)):
        assert any(f"{n} requests were closed by their client" in w for w in per_route[route]["warnings"]), route
    # a route whose every request was abandoned has no data, and says why: not a verdict
    for route in ("/upload", "/slow"):
        assert per_route[route]["status"] == "no_data" and per_route[route]["breached"] is None
        assert "closed by their client" in per_route[route]["no_data_reason"], per_route[route]
