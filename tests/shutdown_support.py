"""Test support for graceful-stop tests: run an instrumented app under a real server, drive it with
requests that carry our own trace ids, stop it with a signal, and read back what was exported.

Not a test module (no ``test_`` prefix); imported by tests/test_shutdown_*.py.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagescope import names

APPS = Path(__file__).parent / "apps"
SERVER_KIND = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(server: str, port: int, graceful_timeout_s: int = 20) -> list[str]:
    """``uvicorn`` (one process), ``uvicorn2`` (``--workers 2``) or ``gunicorn2`` (two uvicorn workers,
    ``--graceful-timeout``) serving ``tests/apps/multiworker_app.py``."""
    if server == "gunicorn2":
        return [sys.executable, "-m", "gunicorn", "--chdir", str(APPS), "-w", "2", "-k", "uvicorn_worker.UvicornWorker",
                "-b", f"127.0.0.1:{port}", "--log-level", "warning", "--graceful-timeout", str(graceful_timeout_s),
                "multiworker_app:app"]  # fmt: skip
    workers = ["--workers", "2"] if server == "uvicorn2" else []
    return [sys.executable, "-m", "uvicorn", *workers, "--app-dir", str(APPS), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", "multiworker_app:app"]  # fmt: skip


def sink_env(spans_dir: Path) -> dict[str, str]:
    env = _base_env()
    env[names.ENV_SPANS_DIR] = str(spans_dir)
    return env


def otlp_env(endpoint: str) -> dict[str, str]:
    env = _base_env()
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    return env


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STAGESCOPE_", "PROMETHEUS_"))}
    env["OTEL_TRACES_SAMPLER"] = "always_on"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start(
    server: str, env: dict[str, str], tmp: Path, timeout_s: float = 60.0, graceful_timeout_s: int = 20
) -> Running:
    """Start the app and wait until ``GET /pid`` answers (every worker imports the app first)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = tmp / f"server-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(  # own session: a group signal (Ctrl-C at a terminal) reaches only it
            server_command(server, port, graceful_timeout_s),
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run = Running(proc, port, log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{server} exited with {proc.returncode}: {run.log()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"{server} not listening after {timeout_s} s: {run.log()[-3000:]}"
                ) from None
            time.sleep(0.05)
    return run


def drive(port: int, n: int, *, threads: int = 4, new_connection: bool = False) -> list[str]:
    """Send ``n`` ``GET /pid`` requests from ``threads`` threads, each with a ``traceparent`` of a fresh
    trace id (the app joins it); return those trace ids. Raises if any answer is not 200."""
    ids = [secrets.token_hex(16) for _ in range(n)]
    errors: list[str] = []
    lock = threading.Lock()
    it = iter(ids)

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while True:
            with lock:
                tid = next(it, None)
            if tid is None:
                break
            for attempt in range(3):
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    headers = {"traceparent": f"00-{tid}-{secrets.token_hex(8)}-01"}
                    if new_connection:
                        headers["Connection"] = "close"
                    conn.request("GET", "/pid", headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        with lock:
                            errors.append(f"{tid}: HTTP {resp.status}")
                    if new_connection or resp.will_close:
                        conn.close()
                        conn = None
                    break
                except OSError as exc:  # a worker still starting: retry on a new connection
                    if conn is not None:
                        conn.close()
                    conn = None
                    if attempt == 2:
                        with lock:
                            errors.append(f"{tid}: {exc!r}")
                    time.sleep(0.1)
        if conn is not None:
            conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise AssertionError(f"{len(errors)} requests failed: {errors[:5]}")
    return ids


def stop(
    run: Running, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60.0, group: bool = False
) -> float:
    """Send ``sig`` now (to the server's whole process group with ``group``, as Ctrl-C at a terminal
    does) and wait for the exit; returns the seconds it took."""
    t0 = time.monotonic()
    if group:
        os.killpg(run.proc.pid, sig)
    else:
        run.proc.send_signal(sig)
    try:
        run.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait(10)
        raise AssertionError(
            f"the server did not exit within {timeout_s} s of {sig.name}: {run.log()[-3000:]}"
        ) from None
    return time.monotonic() - t0


def sink_spans(spans_dir: Path) -> list[tuple[str, int, str]]:
    """Every span in the sink's files as ``(trace id, kind, name)``; every line must parse."""
    out: list[tuple[str, int, str]] = []
    for f in sorted(spans_dir.glob("spans-*.jsonl")):
        for i, line in enumerate(f.read_bytes().splitlines(), 1):
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise AssertionError(f"{f.name}:{i} does not parse: {exc}") from None
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        out.append((s["traceId"].lower(), int(s["kind"]), s["name"]))
    return out


def missing(ids: list[str], spans: list[tuple[str, int, str]], stages_per_request: int = 2) -> dict[str, Any]:
    """What is missing for our trace ids: server spans, and requests without all their stage spans."""
    servers = Counter(t for t, kind, _ in spans if kind == SERVER_KIND)
    stages = Counter(t for t, kind, _ in spans if kind != SERVER_KIND)
    no_server = [t for t in ids if servers[t] != 1]
    no_stages = [t for t in ids if stages[t] != stages_per_request]
    return {"server": len(no_server), "stages": len(no_stages), "examples": (no_server + no_stages)[:3]}
