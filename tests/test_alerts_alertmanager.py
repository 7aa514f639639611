"""Alertmanager routes pages and tickets and inhibits an SLO's ticket while its page fires; the
Kubernetes autoscaling examples read the queue-depth series the rules generate."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagescope import names
from stagescope.alerts.build import STAGE_RULES

ROOT = Path(__file__).resolve().parents[1]
AM_CONFIG = ROOT / "alerts" / "alertmanager.yml"
K8S = ROOT / "alerts" / "k8s"
AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (apt-get install prometheus-alertmanager)")
def test_amtool_check_config() -> None:
    proc = subprocess.run([str(AMTOOL), "check-config", str(AM_CONFIG)], capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (apt-get install prometheus-alertmanager)")
@pytest.mark.parametrize(
    ("severity", "receiver"), [(names.SEVERITY_PAGE, "page"), (names.SEVERITY_TICKET, "ticket")]
)
def test_routes(severity: str, receiver: str) -> None:
    proc = subprocess.run(
        [str(AMTOOL), "config", "routes", "test", f"--config.file={AM_CONFIG}", f"--verify.receivers={receiver}",
         f"{names.LABEL_SEVERITY}={severity}", f"{names.LABEL_SLO}=predict-latency"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    if ALERTMANAGER is None:
        pytest.skip("prometheus-alertmanager not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [str(ALERTMANAGER), f"--config.file={AM_CONFIG}", f"--storage.path={tmp_path}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "am.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break

            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("alertmanager did not start: " + (tmp_path / "am.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_page_inhibits_the_ticket_of_the_same_slo(alertmanager: str) -> None:
    def alert(name: str, severity: str, slo: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, names.LABEL_SEVERITY: severity, names.LABEL_SLO: slo}}

    _api(
        f"{alertmanager}/api/v2/alerts",
        [
            alert(names.ALERT_FAST_BURN, names.SEVERITY_PAGE, "a"),
            alert(names.ALERT_SLOW_BURN, names.SEVERITY_TICKET, "a"),
            alert(names.ALERT_SLOW_BURN, names.SEVERITY_TICKET, "b"),  # another SLO: not inhibited
        ],
    )
    state: dict[tuple[str, str], str] = {}
    for _ in range(50):
        got = _api(f"{alertmanager}/api/v2/alerts")
        state = {(a["labels"]["alertname"], a["labels"][names.LABEL_SLO]): a["status"]["state"] for a in got}
        if len(state) == 3 and state[(names.ALERT_SLOW_BURN, "a")] == "suppressed":
            break
        time.sleep(0.1)
    assert state == {
        (names.ALERT_FAST_BURN, "a"): "active",
        (names.ALERT_SLOW_BURN, "a"): "suppressed",
        (names.ALERT_SLOW_BURN, "b"): "active",
    }


def _recorded(name: str) -> set[str]:
    groups = yaml.safe_load((ROOT / "alerts" / "generated" / name).read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def test_k8s_examples_scale_on_the_generated_queue_depth_series() -> None:
    assert names.RULE_QUEUE_DEPTH in _recorded(STAGE_RULES)
    keda = yaml.safe_load((K8S / "keda-scaledobject.yaml").read_text())
    assert keda["kind"] == "ScaledObject" and keda["apiVersion"] == "keda.sh/v1alpha1"
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"].startswith(f"sum({names.RULE_QUEUE_DEPTH}{{")
    assert float(trigger["metadata"]["threshold"]) > 0

    hpa = yaml.safe_load((K8S / "hpa-queue-depth.yaml").read_text())
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["target"]["type"] == "AverageValue"

    adapter = yaml.safe_load((K8S / "prometheus-adapter-config.yaml").read_text())
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    assert rule["seriesQuery"].startswith(names.RULE_QUEUE_DEPTH + "{")
    assert rule["name"]["as"] == metric["external"]["metric"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == keda["spec"]["scaleTargetRef"]["name"]
