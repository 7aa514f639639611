"""The stack's Prometheus and Alertmanager, run for real (Debian's binaries) with the stack's own files.

Only service addresses are substituted (compose service names -> 127.0.0.1 and free ports). Prometheus
gets the flags docker-compose.yml gives it (exemplar storage ...), except paths and listen address.
It scrapes the reference service (`stagescope serve`, loaded by `stagescope load`) and the GPU exporter
(no GPU here: it serves `stagescope_gpu_exporter_up 0`); the collector, Tempo and dcgm-exporter do not
run on this machine, so their targets point at closed ports and are reported down.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagescope import names

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or ALERTMANAGER is None,
        reason="Debian's prometheus and prometheus-alertmanager are not installed (.ci/run installs them)",
    ),
]
STAGESCOPE = [sys.executable, "-m", "stagescope.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for(
    what: str, check: Callable[[], Any], procs: list[subprocess.Popen[bytes]], timeout: float = 90
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args!r} exited with {p.returncode} while waiting for {what}"
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.terminate()
    for p in started:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def start(procs: list[subprocess.Popen[bytes]], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    f = log.open("wb")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    procs.append(p)
    return p


def test_prometheus_and_alertmanager_with_the_stack_config(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    svc_port, gpu_port, am_port, prom_port, closed = (free_port() for _ in range(5))

    # the reference service, keeping every trace (so every latency bucket gets an exemplar)
    start(procs, [*STAGESCOPE, "serve", "--host", "127.0.0.1", "--port", str(svc_port), "--scenario", "healthy",
                  "--spans-out", str(tmp_path / "spans"), "--slow-threshold-ms", "0", "--baseline-sample", "1"],
          tmp_path / "serve.log")  # fmt: skip
    start(procs, [*STAGESCOPE, "gpu-exporter", "--port", str(gpu_port)], tmp_path / "gpu.log")

    am_cfg = ROOT / COMPOSE["services"]["alertmanager"]["volumes"][0].split(":")[0]
    start(procs, [str(ALERTMANAGER), f"--config.file={am_cfg}", f"--storage.path={tmp_path / 'am'}",
                  f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
          tmp_path / "alertmanager.log")  # fmt: skip

    addresses = {
        "inference:8000": f"127.0.0.1:{svc_port}",
        "stagescope-gpu-exporter:9400": f"127.0.0.1:{gpu_port}",
        "alertmanager:9093": f"127.0.0.1:{am_port}",
        "localhost:9090": f"127.0.0.1:{prom_port}",
        "otel-collector:8888": f"127.0.0.1:{closed}",  # not run here: reported down
        "otel-collector:8889": f"127.0.0.1:{closed}",
        "dcgm-exporter:9400": f"127.0.0.1:{closed}",
        "tempo:3200": f"127.0.0.1:{closed}",
    }
    text = (ROOT / "stack/prometheus.yml").read_text()
    text = text.replace("/etc/prometheus/rules/", f"{ROOT / 'alerts/generated'}/")
    for old, new in addresses.items():
        assert old in text, old
        text = text.replace(old, new)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text)
    flags = [f for f in COMPOSE["services"]["prometheus"]["command"]
             if not f.startswith(("--config.file", "--storage.tsdb.path"))]  # fmt: skip
    assert "--enable-feature=exemplar-storage" in flags
    start(procs, ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{prom_port}", *flags], tmp_path / "prometheus.log")  # fmt: skip
    prom = f"http://127.0.0.1:{prom_port}"

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{svc_port}/readyz", timeout=2) as r:
            return r.status == 200

    wait_for("the reference service", ready, procs)
    load = subprocess.run(
        [*STAGESCOPE, "load", "--url", f"http://127.0.0.1:{svc_port}", "--rate", "20", "--duration", "4",
         "--out", str(tmp_path / "results.parquet"), "--no-progress", "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert load.returncode == 0, load.stderr

    # the lifecycle endpoints are off with the compose flags: any local page could POST them
    for endpoint in ("/-/quit", "/-/reload"):
        req = urllib.request.Request(prom + endpoint, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        assert refused.value.code == 403, endpoint

    # Alertmanager is reachable from Prometheus
    def alertmanagers() -> list[str]:
        data = get_json(f"{prom}/api/v1/alertmanagers")["data"]
        return [a["url"] for a in data["activeAlertmanagers"]]

    ams = wait_for("Prometheus to discover Alertmanager", alertmanagers, procs)
    assert ams == [f"http://127.0.0.1:{am_port}/api/v2/alerts"]
    assert get_json(f"http://127.0.0.1:{am_port}/api/v2/status")["cluster"]["status"] in ("disabled", "ready")

    # every rule group from alerts/generated loaded and evaluated without error
    def rules_evaluated() -> list[dict[str, Any]] | None:
        groups = get_json(f"{prom}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = wait_for("every rule to be evaluated", rules_evaluated, procs, timeout=120)
    assert not [r["name"] for r in rules if r.get("lastError")]
    files = {g["file"] for g in get_json(f"{prom}/api/v1/rules")["data"]["groups"]}
    assert {Path(f).name for f in files} == {p.name for p in (ROOT / "alerts/generated").glob("*.yml")}
    assert any(r["type"] == "alerting" for r in rules) and any(r["type"] == "recording" for r in rules)

    # the service and the GPU exporter are scraped; the services not run here are down
    def targets() -> dict[str, str] | None:
        active = get_json(f"{prom}/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in active}
        return (
            health
            if health.get("inference") == "up" and health.get("stagescope-gpu-exporter") == "up"
            else None
        )

    health = wait_for("the inference and GPU exporter targets to be up", targets, procs)
    assert health["otel-collector"] != "up" and health["tempo"] != "up"  # down, or not scraped yet

    def query(q: str) -> list[dict[str, Any]]:
        return list(
            get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q}))["data"]["result"]
        )

    def requests_seen() -> list[dict[str, Any]]:
        return query(f'sum({names.METRIC_REQUEST_DURATION}_count{{job="inference"}}) > 0')

    wait_for("request histograms from the service", requests_seen, procs)
    (up,) = query(f'{names.METRIC_GPU_EXPORTER_UP}{{job="stagescope-gpu-exporter"}}')
    assert up["value"][1] in ("0", "1")  # 0 on this machine (no NVML); it serves instead of crashing

    # exemplars carry trace_id, the label Grafana's exemplarTraceIdDestinations links to Tempo
    def exemplars() -> list[dict[str, Any]]:
        now = time.time()
        q = urllib.parse.urlencode({"query": f'{names.METRIC_REQUEST_DURATION}_bucket{{job="inference"}}',
                                    "start": now - 300, "end": now + 60})  # fmt: skip
        data = get_json(f"{prom}/api/v1/query_exemplars?{q}")["data"]
        return [e for series in data for e in series["exemplars"]]

    found = wait_for("exemplars on the latency histogram", exemplars, procs)
    datasources = yaml.safe_load(
        (ROOT / "stack/grafana/provisioning/datasources/datasources.yaml").read_text()
    )
    prom_ds = next(d for d in datasources["datasources"] if d["type"] == "prometheus")
    label = prom_ds["jsonData"]["exemplarTraceIdDestinations"][0]["name"]
    assert all(len(e["labels"][label]) == 32 for e in found)
