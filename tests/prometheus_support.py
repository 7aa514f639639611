"""A real Prometheus (Debian's) for the tests that query a live server: serving a TSDB backfilled by
promtool from OpenMetrics text, or scraping live targets; bound to 127.0.0.1 on a free port, stopped on
exit."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from service_support import free_port

from stagescope.procs import stop_process


@contextmanager
def backfilled_prometheus(tmp_path: Path, openmetrics: str) -> Iterator[str]:
    """Backfill ``openmetrics`` (ending in ``# EOF``) into a TSDB under ``tmp_path``, start Prometheus on
    it with a 100-year retention and no scrape targets, and yield its URL once ``/-/ready`` answers."""
    (tmp_path / "in.om").write_text(openmetrics)
    data = tmp_path / "data"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "in.om"), str(data)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    with _prometheus(tmp_path / "prometheus.yml", data, "--storage.tsdb.retention.time=100y") as url:
        yield url


@contextmanager
def scraping_prometheus(tmp_path: Path, targets: dict[str, str], interval_s: float = 1.0) -> Iterator[str]:
    """Start Prometheus scraping ``targets`` (job -> ``host:port``, path ``/metrics``) every
    ``interval_s`` into a TSDB under ``tmp_path``, as a deployment's would (its own Accept header, so the
    exposition format each target negotiates is the one it serves a real Prometheus); yield its URL."""
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs: [{{targets: ['{addr}']}}]\n" for job, addr in targets.items()
    )
    (tmp_path / "prometheus.yml").write_text(f"global:\n  scrape_interval: {interval_s:g}s\nscrape_configs:\n{jobs}")
    with _prometheus(tmp_path / "prometheus.yml", tmp_path / "data") as url:
        yield url


@contextmanager
def _prometheus(config: Path, data: Path, *flags: str) -> Iterator[str]:
    """Prometheus on ``config`` and the TSDB ``data``, on 127.0.0.1 and a free port, until ready."""
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}", *flags,
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url)
        yield url
    finally:
        stop_process(proc, signal.SIGTERM, 10.0)


def _wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            pytest.fail("prometheus did not become ready")
        time.sleep(0.2)
