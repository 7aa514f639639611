"""Two uvicorn workers with PROMETHEUS_MULTIPROC_DIR: /metrics answers the sum over both workers,
whichever worker serves the scrape."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_support import interrupt

APPS = Path(__file__).parent / "apps"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_two_workers_aggregate_metrics(tmp_path: Path) -> None:
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    port = _free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir), "OTEL_TRACES_SAMPLER": "always_on"}
    for key in ("STAGESCOPE_SPANS_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "STAGESCOPE_MODELS"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", "metrics_app:create_app", "--app-dir", str(APPS),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/pid", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "uvicorn exited"
            assert time.monotonic() < deadline, "uvicorn did not come up"
            time.sleep(0.2)
        # new connection per request, so the kernel spreads them over both workers' accept calls
        pids: dict[int, int] = {}
        sent = 0
        with httpx.Client(base_url=base, headers={"connection": "close"}, timeout=10) as c:
            while sent < 60 or (len(pids) < 2 and sent < 600):
                r = c.post(f"/v1/predict/{sent}")
                assert r.status_code == 200
                pids[r.json()["pid"]] = pids.get(r.json()["pid"], 0) + 1
                sent += 1
            assert len(pids) == 2, f"one worker served everything: {pids}"
            scrapes = [c.get("/metrics").text for _ in range(12)]
        key_count = (
            "stagescope_request_duration_seconds_count",
            (("model", "ranker"), ("route", "/v1/predict/{item}"), ("status_class", "2xx")),
        )
        for text in scrapes:
            s = _samples(text)
            assert s[key_count] == sent, (s.get(key_count), sent, pids)
            assert s[("stagescope_batch_size_sum", (("model", "ranker"),))] == sent
            assert s[("stagescope_model_loads_total", (("model", "ranker"),))] == 2  # one load per worker
            assert s[("stagescope_model_ready", (("model", "ranker"),))] == 1  # livemax, not a sum
            assert s[("stagescope_inflight_requests", ())] == 0
        assert len(list(mp_dir.glob("*.db"))) >= 2  # both workers wrote their values there
    finally:
        interrupt(proc)
