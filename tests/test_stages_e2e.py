"""End to end: a team's own FastAPI service (tests/apps/stages_app.py) names its stages
(``stagescope.stage("rerank", kind="compute")``, ``retrieve`` of kind fetch, ``tokenize`` of kind cpu,
``safety-filter`` without a kind), runs under uvicorn, is driven by ``stagescope load`` and scraped by
Debian's Prometheus with the committed rules; then:

* its spans carry each stage's name and kind (``stagescope.stage``, ``stagescope.stage.kind``);
* ``/metrics`` has the stage label (and the kind label) for every stage, one count per request;
* the dashboards' ``$stage`` variable, evaluated by Prometheus as Grafana would, lists the team's
  stages; the per-stage panel and the recording rule return ``rerank`` with kind ``compute``; the
  waiting-vs-working panel, which selects by kind, shows ``rerank`` beside the batcher kinds;
* ``stagescope analyze`` names ``rerank`` (one request in ten spends 250 ms in it) with a lever of
  kind compute, and its text and HTML reports show the name with its kind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stagescope import names
from stagescope.dashboards.build import rendered
from stagescope.dashboards.queries import fill, panel_queries, variable_queries

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = shutil.which("prometheus")
RULES = sorted((ROOT / "alerts" / "generated").glob("*.yml"))
RATE, LOAD_S, SLOW_EVERY = 30.0, 8.0, 10
TEAM_STAGES = {"retrieve": "fetch", "tokenize": "cpu", "rerank": "compute", "safety-filter": "unknown"}
VALUES = {"__rate_interval": "20s", "__interval": "5s", "__range": "1m", "job": ".*", "model": ".*", "stage": ".*"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _wait(ready: Callable[[], bool], what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, ValueError, KeyError, IndexError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} not ready after {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class Run:
    tmp: Path
    spans: Path
    results: Path
    metrics_text: str
    prom: str
    t0: float
    t1: float
    served: int


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("stages")
    spans = tmp / "spans"
    port = _free_port()
    env = {**os.environ, names.ENV_SPANS_DIR: str(spans), "SLOW_EVERY": str(SLOW_EVERY), "RERANK_KIND": "compute"}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp / "uvicorn.log"
    app = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "stages_app:app", "--app-dir", str(ROOT / "tests" / "apps"),
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=tmp,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    prom_proc = None
    try:
        _wait(lambda: httpx.get(f"{url}/metrics", timeout=2).status_code == 200, "the team's service", log)
        prom_port = _free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(r) for r in RULES],
            "scrape_configs": [{"job_name": "ranker", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        plog = tmp / "prometheus.log"
        prom_proc = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=plog.open("wb"), stderr=subprocess.STDOUT, cwd=tmp,
        )  # fmt: skip
        prom = f"http://127.0.0.1:{prom_port}"
        _wait(lambda: _get(f"{prom}/api/v1/targets")["data"]["activeTargets"][0]["health"] == "up", "prometheus", plog)
        results = tmp / "results.parquet"
        t0 = time.time()
        load = subprocess.run(
            [sys.executable, "-m", "stagescope.cli", "load", "--url", url, "--route", "/v1/rank", "--rate", str(RATE),
             "--arrival", "poisson", "--duration", str(LOAD_S), "--out", str(results), "--spans-dir", str(spans),
             "--json"],
            capture_output=True, text=True, env=env, cwd=tmp, timeout=120, check=False,
        )  # fmt: skip
        assert load.returncode == 0, load.stderr[-2000:]
        time.sleep(3)  # a few more scrapes and rule evaluations
        t1 = time.time()
        metrics_text = httpx.get(f"{url}/metrics", timeout=5).text
        import pyarrow.parquet as pq

        served = sum(1 for s in pq.read_table(results).column("status").to_pylist() if s == 200)
        yield Run(tmp, spans, results, metrics_text, prom, t0, t1, served)
    finally:
        _stop(app)
        if prom_proc is not None:
            _stop(prom_proc)


def _stage_spans(spans: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(spans.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        attrs = {a["key"]: a["value"] for a in sp.get("attributes", [])}
                        if names.ATTR_STAGE in attrs:
                            out.append(attrs)
    return out


def test_spans_carry_the_name_and_kind(run: Run) -> None:
    assert run.served >= 0.9 * RATE * LOAD_S * 0.7, run.served
    spans = _stage_spans(run.spans)
    kinds: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for attrs in spans:
        stage = attrs[names.ATTR_STAGE]["stringValue"]
        kinds.setdefault(stage, set()).add(attrs[names.ATTR_STAGE_KIND]["stringValue"])
        counts[stage] = counts.get(stage, 0) + 1
    assert kinds == {s: {k} for s, k in TEAM_STAGES.items()}
    assert all(counts[s] == run.served for s in TEAM_STAGES), (counts, run.served)


def test_metrics_have_the_stage_and_kind_labels(run: Run) -> None:
    for stage, kind in TEAM_STAGES.items():
        line = f'{names.METRIC_STAGE_DURATION}_count{{kind="{kind}",model="",stage="{stage}"}} {float(run.served)}'
        assert line in run.metrics_text, line
    assert f"{names.METRIC_STAGES_FOLDED} 0.0" in run.metrics_text


def test_dashboards_list_the_teams_stages(run: Run) -> None:
    latency = json.loads(rendered()["stagescope-latency.json"])
    (var,) = [v for v in variable_queries(latency) if v.name == "stage"]
    inner = fill(var.query, VALUES).removeprefix("label_values(").removesuffix(")")
    selector, label = (part.strip() for part in inner.rsplit(",", 1))
    params = urllib.parse.urlencode({"match[]": selector, "start": run.t0, "end": run.t1})
    listed = set(_get(f"{run.prom}/api/v1/label/{label}/values?{params}")["data"])
    assert set(TEAM_STAGES) == listed  # exactly the service's stages, none hard-coded

    def series(panel_part: str, legend_part: str = "") -> set[tuple[str, str]]:
        (q,) = [q for q in panel_queries(latency) if panel_part in q.panel and legend_part in q.legend]
        got = _get(f"{run.prom}/api/v1/query?" + urllib.parse.urlencode({"query": fill(q.expr, VALUES), "time": run.t1}))
        return {(r["metric"]["stage"], r["metric"]["kind"]) for r in got["data"]["result"]}

    assert series("Per-stage p99") == set(TEAM_STAGES.items())
    assert series("Queue vs batch wait vs GPU compute", "p99") == {("rerank", "compute")}  # selected by kind
    assert series("Time per request by stage", "stage") == set(TEAM_STAGES.items())
    rule = _get(f"{run.prom}/api/v1/query?" + urllib.parse.urlencode({"query": names.RULE_STAGE_P99, "time": run.t1}))
    assert ("rerank", "compute") in {(r["metric"]["stage"], r["metric"]["kind"]) for r in rule["data"]["result"]}


def _analyze(run: Run, fmt: str) -> str:
    out = run.tmp / f"report.{fmt}"
    res = subprocess.run(
        [sys.executable, "-m", "stagescope.cli", "analyze", "--traces", str(run.spans), "--results",
         str(run.results), "--slo", "p99<100ms", "--format", fmt, "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return out.read_text()


def test_the_verdict_names_rerank_with_a_lever_of_its_kind(run: Run) -> None:
    rep = json.loads(_analyze(run, "json"))
    assert rep["breached"], rep["latency_ms"]
    assert rep["verdict"] == {"stage": "rerank", "lever": names.LEVER_QUANTIZE}, rep["attribution"][:3]
    kinds = {r["stage"]: r["kind"] for r in rep["attribution"]}
    assert {s: kinds[s] for s in TEAM_STAGES if s in kinds} == {s: k for s, k in TEAM_STAGES.items() if s in kinds}
    assert rep["attribution"][0]["stage"] == "rerank" and rep["attribution"][0]["share"] > 0.8
    first = rep["levers"][0]
    assert (first["stage"], first["kind"]) == ("rerank", "compute")
    assert "rerank (kind compute) explains" in first["rationale"] and "in rerank" in first["rationale"]
    # the team's service exports no measured variant of its model: quantize gets no made-up prediction
    assert first["predicted_p99_ms"] is None and "no effect model" in first["rationale"]
    text = _analyze(run, "text")
    print(f"\n{run.served} requests served; stagescope analyze --slo 'p99<100ms':\n{text}")
    assert "Stage: rerank [compute]" in text and "lever: quantize" in text
    html = _analyze(run, "html")
    assert "rerank [compute]" in html and "<td>rerank</td><td>compute</td>" in html
