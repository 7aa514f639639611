"""End to end: Debian's Prometheus, with the committed rules, scrapes the reference service under load
for about a minute; then every PromQL expression of every dashboard panel (variables filled in the way
Grafana fills "All") is evaluated through the HTTP API.

Asserted: every expression parses and evaluates; every rule evaluates without error (rules API
health); every dashboard variable finds values; the predict SLO's page fires while the service
breaches it; latency buckets carry exemplars (trace ids); at least 90% of panel queries return
data (a non-empty result), at least 90% of the queries over the live service return finite values,
and the only NaN-only answers come from the recorded vLLM/Triton scrapes. Printed: both shares, and
each query without finite data with the reason.

Scrape targets (all on 127.0.0.1, scraped every second):

* ``inference``: the reference service (``stagescope serve``) in the ``slow-compute`` scenario (8% of
  predict inputs need a ~394 ms forward pass, so the p99 < 300 ms SLO burns) with a short batcher
  queue, driven on ``/v1/predict`` (plus one burst mid-run that the queue partly sheds with 429) and
  on ``/v1/generate`` (token streams). Its SIMULATED accelerator exports
  ``DCGM_FI_DEV_GPU_UTIL{modelName="simulated-accelerator"}``.
* ``recorded-fixture-vllm``, ``recorded-fixture-triton``, ``recorded-fixture-dcgm``: RECORDED scrapes
  of real vLLM, Triton and dcgm-exporter servers from ``external/prometheus/`` (PROVENANCE.md there),
  served unchanged except for a final newline where the file lacks one, labelled
  ``fixture="recorded"``. A recording does not move: rates over it are 0, so quantiles and ratios of
  rates are NaN, which this test counts as no data.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stagescope import names
from stagescope.dashboards.build import rendered
from stagescope.dashboards.queries import (
    PanelQuery,
    fill,
    metric_names,
    panel_queries,
    text_values,
    variable_queries,
)

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "alerts" / "generated").glob("*.yml"))
PROMETHEUS = shutil.which("prometheus")
LOAD_S = float(os.environ.get("STAGESCOPE_E2E_SECONDS", "60"))
SCENARIO = "slow-compute"
#: A short batcher queue and one burst of simultaneous requests mid-run: the burst overflows the queue
#: and is partly shed (429), so the shed panel is fed by real refusals.
MAX_QUEUE = 6
BURST = 40
PREDICT_RPS, GENERATE_RPS = 20.0, 3.0
STEP_S = 5
#: Grafana's $__rate_interval is max(4 x scrape interval, step + scrape interval); 20 s covers a 5 s step.
VALUES = {"__rate_interval": "20s", "__interval": "5s", "__range": "1m"}
FIXTURES = {
    "recorded-fixture-vllm": ROOT / "external/prometheus/vllm/datadog_vllm_metrics.txt",
    "recorded-fixture-triton": ROOT / "external/prometheus/triton/datadog_triton_metrics.txt",
    "recorded-fixture-dcgm": ROOT / "external/prometheus/dcgm-exporter/datadog_dcgm_metrics.txt",
}
MIN_SHARE_WITH_DATA = 0.90

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait(ready: Callable[[], bool], what: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    pytest.fail(
        f"{what} not ready after {timeout:.0f} s; log tail:\n{log.read_text(errors='replace')[-3000:]}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# ---------------------------------------------------------------------------------------------------
# the three processes: recorded fixtures (a thread), the reference service, Prometheus
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixture_server() -> Iterator[str]:
    bodies = {}
    for job, path in FIXTURES.items():
        raw = path.read_bytes()
        bodies[f"/{job}/metrics"] = raw if raw.endswith(b"\n") else raw + b"\n"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("service")
    port = _free_port()
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "stagescope.cli", "serve", "--scenario", SCENARIO, "--port", str(port),
           "--spans-out", str(tmp / "spans"), "--slow-threshold-ms", "300", "--baseline-sample", "0.05",
           "--set", f"max_queue={MAX_QUEUE}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "stagescope serve", 60, log)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, service: str, fixture_server: str) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus")
    jobs: list[dict[str, Any]] = [
        {"job_name": "inference", "static_configs": [{"targets": [service.removeprefix("http://")]}]}
    ]
    for job in FIXTURES:
        jobs.append({"job_name": job, "metrics_path": f"/{job}/metrics",
                     "static_configs": [{"targets": [fixture_server], "labels": {"fixture": "recorded"}}]})  # fmt: skip
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(r) for r in RULES],
        "scrape_configs": jobs,
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = _free_port()
    log = tmp / "prometheus.log"
    proc = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage",
         "--storage.tsdb.retention.time=1d", "--log.level=warn"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def targets_up() -> bool:
        active = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
        return len(active) == 1 + len(FIXTURES) and all(t["health"] == "up" for t in active)

    try:
        _wait(lambda: _get(f"{url}/api/v1/status/buildinfo")["status"] == "success", "prometheus", 60, log)
        _wait(targets_up, "every scrape target up", 30, log)
        yield url
    finally:
        _stop(proc)


# ---------------------------------------------------------------------------------------------------
# load: open loop, fixed rates, on both routes
# ---------------------------------------------------------------------------------------------------
async def _drive(url: str, seconds: float) -> dict[str, int]:
    rng = random.Random(7)
    statuses: dict[str, int] = {}
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]

    async def predict(client: httpx.AsyncClient) -> None:
        body = {"inputs": [rng.random() for _ in range(16)], "entity_id": rng.randrange(1000)}
        r = await client.post(f"{url}/v1/predict", json=body)
        statuses[f"predict {r.status_code}"] = statuses.get(f"predict {r.status_code}", 0) + 1

    async def generate(client: httpx.AsyncClient) -> None:
        prompt = " ".join(rng.choice(words) for _ in range(rng.randrange(8, 64)))
        async with client.stream(
            "POST", f"{url}/v1/generate", json={"prompt": prompt, "max_tokens": 24}
        ) as r:
            async for _ in r.aiter_bytes():
                pass
        statuses[f"generate {r.status_code}"] = statuses.get(f"generate {r.status_code}", 0) + 1

    async def send(client: httpx.AsyncClient, fn: Any) -> None:
        try:
            await fn(client)
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        n_predict = n_generate = 0
        burst_at = seconds / 2
        while (now := time.monotonic() - start) < seconds:
            if now >= burst_at:
                tasks += [asyncio.create_task(send(client, predict)) for _ in range(BURST)]
                burst_at = math.inf
            while n_predict < now * PREDICT_RPS:
                tasks.append(asyncio.create_task(send(client, predict)))
                n_predict += 1
            while n_generate < now * GENERATE_RPS:
                tasks.append(asyncio.create_task(send(client, generate)))
                n_generate += 1
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
    return statuses


# ---------------------------------------------------------------------------------------------------
# evaluating the dashboards
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    query: PanelQuery
    expr: str
    status: str  # "data" | "nan" | "empty" | "error"
    detail: str


def _range_query(prom: str, expr: str, start: float, end: float) -> dict[str, Any]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": STEP_S})
    try:
        return dict(_get(f"{prom}/api/v1/query_range?{params}"))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read() or b"{}") or {"status": "error", "error": str(exc)})


def _evaluate(prom: str, q: PanelQuery, values: dict[str, str], start: float, end: float) -> Outcome:
    expr = fill(q.expr, values)
    answer = _range_query(prom, expr, start, end)
    if answer.get("status") != "success":
        return Outcome(q, expr, "error", str(answer.get("error")))
    series = answer["data"]["result"]
    finite = [v for s in series for _, v in s["values"] if math.isfinite(float(v))]
    if finite:
        return Outcome(q, expr, "data", f"{len(series)} series")
    return Outcome(q, expr, "nan" if series else "empty", "")


def _why(prom: str, outcome: Outcome, end: float) -> str:
    """Why a query has no data: which metric it reads has no series, or 0/0 over unmoving counters."""
    missing = []
    for metric in sorted(metric_names(outcome.expr)):
        params = urllib.parse.urlencode({"query": f"count({metric})", "time": end})
        if not _get(f"{prom}/api/v1/query?{params}")["data"]["result"]:
            missing.append(metric)
    fixture = any(m.startswith(("vllm:", "nv_")) for m in metric_names(outcome.expr))
    if missing:
        why = "no series of " + ", ".join(missing) + " in this run"
        if "ALERTS" in missing:
            why += " (no alert pending or firing for the selected SLOs)"
        if names.METRIC_REQUESTS_SHED in missing:
            why += " (no request was shed: the queue never filled)"
        return why
    if outcome.status == "nan":
        src = "a RECORDED fixture scrape" if fixture else "this run"
        return f"only NaN: a quantile or ratio of rates over counters that did not move in {src} (0/0)"
    return "series exist but none matched after aggregation"


def _variable_values(
    prom: str, dash: dict[str, Any], values: dict[str, str], start: float, end: float
) -> dict[str, list[str]]:
    out = {}
    for v in variable_queries(dash):
        inner = fill(v.query, values).removeprefix("label_values(").removesuffix(")")
        selector, label = (part.strip() for part in inner.rsplit(",", 1))
        params = urllib.parse.urlencode({"match[]": selector, "start": start, "end": end})
        out[v.name] = list(_get(f"{prom}/api/v1/label/{label}/values?{params}")["data"])
    return out


def test_every_panel_query_against_a_real_prometheus(prometheus: str, service: str) -> None:
    t0 = time.time()
    statuses = asyncio.run(_drive(service, LOAD_S))
    t1 = time.time()
    print(f"\nload: {LOAD_S:.0f} s of /v1/predict at {PREDICT_RPS:g}/s and /v1/generate at {GENERATE_RPS:g}/s "
          f"({SCENARIO} scenario): {dict(sorted(statuses.items()))}")  # fmt: skip
    assert statuses.get("predict 200", 0) > 0.5 * LOAD_S * PREDICT_RPS, statuses
    assert statuses.get("predict 200", 0) + statuses.get("predict 429", 0) > 0.95 * LOAD_S * PREDICT_RPS
    assert statuses.get("generate 200", 0) > 0.5 * LOAD_S * GENERATE_RPS, statuses
    time.sleep(3)  # a few more scrapes and rule evaluations

    # every rule evaluates without error
    groups = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for f in RULES for g in yaml.safe_load(f.read_text())["groups"])
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy, unhealthy

    # the recording rules the autoscalers and dashboards read have values
    for rule in (
        names.RULE_QUEUE_DEPTH,
        names.RULE_STAGE_P99,
        names.RULE_STAGE_MEAN,
        names.RULE_REQUEST_P99,
        names.RULE_SLO_BUDGET_REMAINING,
        names.RULE_SLI_ERROR_RATIO_FORMAT.format(window="5m"),
    ):
        params = urllib.parse.urlencode({"query": f'{rule}{{job="inference"}}'})
        assert _get(f"{prometheus}/api/v1/query?{params}")["data"]["result"], f"{rule} has no value"

    # the breach pages
    alerts = _get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    firing = sorted(
        {(a["labels"]["alertname"], a["labels"][names.LABEL_SLO]) for a in alerts if a["state"] == "firing"}
    )
    print(f"alerts firing: {firing}")
    assert (names.ALERT_FAST_BURN, "predict-latency") in firing

    # exemplars: latency buckets carry the trace ids of kept traces
    params = urllib.parse.urlencode(
        {"query": f"{names.METRIC_REQUEST_DURATION}_bucket", "start": t0, "end": t1}
    )
    exemplars = [
        e for s in _get(f"{prometheus}/api/v1/query_exemplars?{params}")["data"] for e in s["exemplars"]
    ]
    print(f"exemplars on {names.METRIC_REQUEST_DURATION}_bucket: {len(exemplars)}")
    assert exemplars and all(len(e["labels"]["trace_id"]) == 32 for e in exemplars)

    outcomes: list[Outcome] = []
    variables_without_values = []
    for name, text in rendered().items():
        dash = json.loads(text)
        values = {**VALUES, **text_values(dash)}  # a price variable: its default
        for v in variable_queries(dash):
            values[v.name] = v.all_value or ".*"
        for var, found in _variable_values(prometheus, dash, values, t0, t1).items():
            if not found:
                variables_without_values.append(f"{name}: ${var}")
        outcomes += [_evaluate(prometheus, q, values, t0, t1) for q in panel_queries(dash)]

    errors = [o for o in outcomes if o.status == "error"]
    returned = [o for o in outcomes if o.status in ("data", "nan")]
    finite = [o for o in outcomes if o.status == "data"]
    live = [o for o in outcomes if not _reads_recording(o)]
    live_finite = [o for o in live if o.status == "data"]
    n = len(outcomes)
    print(f"panel queries returning data: {len(returned)}/{n} = {len(returned) / n:.1%}")
    print(f"  with finite values: {len(finite)}/{n} = {len(finite) / n:.1%}; "
          f"over the live service (no vLLM/Triton recording): {len(live_finite)}/{len(live)}")  # fmt: skip
    for o in outcomes:
        if o.status != "data":
            label = "NO DATA " if o.status == "empty" else "ONLY NaN" if o.status == "nan" else "ERROR   "
            print(f"  {label} {o.query.dashboard} / {o.query.panel} [{o.query.ref_id} {o.query.legend}]: "
                  f"{o.detail or _why(prometheus, o, t1)}")  # fmt: skip
    assert not errors, "\n".join(f"{o.query.panel}: {o.detail}\n{o.expr}" for o in errors)
    assert not variables_without_values, variables_without_values
    assert len(returned) / n >= MIN_SHARE_WITH_DATA
    assert len(live_finite) / len(live) >= MIN_SHARE_WITH_DATA
    nan_live = [f"{o.query.panel} [{o.query.ref_id}]" for o in outcomes if o.status == "nan" and o in live]
    assert not nan_live, f"NaN-only over the live service: {nan_live}"


#: Metric names only the recorded vLLM and Triton scrapes provide (their counters never move).
RECORDED_ONLY = {
    v for k, v in vars(names).items() if k.startswith(("VLLM_", "TRITON_")) and isinstance(v, str)
}


def _reads_recording(o: Outcome) -> bool:
    base = {
        m.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for m in metric_names(o.expr)
    }
    return bool(base & RECORDED_ONLY)
