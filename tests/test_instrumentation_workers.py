"""Two uvicorn worker processes: spans from both workers, each in its own files, none lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from service_support import interrupt

from stagescope import names

APPS = Path(__file__).parent / "apps"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_spans_by_pid(spans_dir: Path) -> tuple[Counter[int], Counter[int]]:
    """Per worker pid (from the file name): server spans and stage spans written so far."""
    servers: Counter[int] = Counter()
    stages: Counter[int] = Counter()
    for f in spans_dir.glob("spans-*.jsonl"):
        pid = int(f.name.split("-")[1])
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        if s["kind"] == 2:
                            servers[pid] += 1
                        else:
                            stages[pid] += 1
    return servers, stages


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_uvicorn_workers_both_export_spans(tmp_path: Path) -> None:
    spans_dir, prom_dir = tmp_path / "spans", tmp_path / "prom"
    prom_dir.mkdir()
    port = _free_port()
    env = dict(os.environ)
    env.update({
        names.ENV_SPANS_DIR: str(spans_dir),
        "OTEL_TRACES_SAMPLER": "always_on",
        "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
    })  # fmt: skip
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--workers", "2", "--app-dir", str(APPS), "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "multiworker_app:app"],
        env=env,
    )  # fmt: skip
    served: Counter[int] = Counter()
    try:
        deadline = time.monotonic() + 60
        # a new connection per request, so the kernel spreads them over both workers' accept()
        while (len(served) < 2 or sum(served.values()) < 200) and time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/pid", timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            assert r.status_code == 200
            served[r.json()["pid"]] += 1
        assert len(served) == 2, f"only one worker answered: {served}"
        # every worker writes its own spans (flushed within about a second)
        deadline = time.monotonic() + 20
        while _server_spans_by_pid(spans_dir)[0] != served and time.monotonic() < deadline:
            time.sleep(0.3)
        servers, stages = _server_spans_by_pid(spans_dir)
        assert servers == served
        assert stages == Counter({pid: 2 * n for pid, n in served.items()})
    finally:
        interrupt(proc)
    # nothing is written twice or lost at shutdown
    assert _server_spans_by_pid(spans_dir)[0] == served
    assert {f.name.split("-")[1] for f in spans_dir.glob("spans-*.jsonl")} == {str(p) for p in served}
