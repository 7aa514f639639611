"""Contract: /metrics of an instrumented FastAPI app serves every metric family issue 2 names, with
exemplars pointing at exported traces, and its series stay bounded under random paths and models.

The expected names are spelled out here on purpose (an independent list, as vLLM's contract test
does), so renaming a constant in ``stagescope.names`` fails this test.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent / "apps"))
from asgi_support import asgi_request
from metrics_app import build_app

# family name (counters without _total, as OpenMetrics names families) -> type
EXPECTED = {
    "stagescope_request_duration_seconds": "histogram",
    "stagescope_stage_duration_seconds": "histogram",
    "stagescope_queue_depth": "gauge",
    "stagescope_inflight_requests": "gauge",
    "stagescope_batch_size": "histogram",
    "stagescope_inter_token_latency_seconds": "histogram",
    "stagescope_spans_exported": "counter",
    "stagescope_spans_dropped": "counter",
    "stagescope_requests_shed": "counter",
    "stagescope_model_loads": "counter",
    "stagescope_model_ready": "gauge",
    "stagescope_executor_busy_seconds": "counter",
    "stagescope_stages_folded": "counter",
    "stagescope_stage_kind_errors": "counter",
    "gen_ai_server_time_to_first_token_seconds": "histogram",
    "gen_ai_server_time_per_output_token_seconds": "histogram",
    "gen_ai_server_request_duration_seconds": "histogram",
}
# families that must hold samples after the traffic below (spans_dropped stays empty: nothing drops)
MUST_HAVE_SAMPLES = set(EXPECTED) - {"stagescope_spans_dropped"}
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture(autouse=True)
def _keep_every_trace(clean_telemetry_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")


def _trace_ids_in(spans_dir: Path) -> set[str]:
    ids = set()
    for f in spans_dir.glob("spans-*.jsonl"):
        for line in f.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    ids.update(s["traceId"].lower() for s in ss.get("spans", []))
    return ids


def test_metrics_endpoint_serves_every_family_with_exemplars(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = build_app(registry=reg, spans_dir=str(tmp_path), max_queue=4)

    async def traffic() -> tuple[list[int], httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            statuses = [
                r.status_code for r in await asyncio.gather(*(c.post(f"/v1/predict/{i}") for i in range(40)))
            ]
            for _ in range(3):
                r = await c.get("/v1/generate", params={"n": 6})
                assert r.status_code == 200 and r.text.startswith("t0 t1")
            app.state.stagescope.force_flush(10)
            om = await c.get("/metrics", headers={"accept": OPENMETRICS})
            text = await c.get("/metrics")
            return statuses, om, text

    statuses, om, text = asyncio.run(traffic())
    assert 200 in statuses and 429 in statuses  # the batcher's queue bound shed some
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in text_string_to_metric_families(om.text)}
    missing = {name for name in EXPECTED if name not in families}
    assert not missing, f"/metrics lacks {sorted(missing)}"
    for name, kind in EXPECTED.items():
        assert families[name].type == kind, name
    empty = {name for name in MUST_HAVE_SAMPLES if not families[name].samples}
    assert not empty, f"no samples for {sorted(empty)}"

    def value(family: str, sample: str, **labels: str) -> float:
        return sum(
            s.value for s in families[family].samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        )  # fmt: skip

    n_ok = statuses.count(200)
    n_shed = statuses.count(429)
    req = "stagescope_request_duration_seconds"
    assert value(req, f"{req}_count", route="/v1/predict/{item}", model="ranker", status_class="2xx") == n_ok
    assert value(req, f"{req}_count", route="/v1/predict/{item}", status_class="4xx") == n_shed
    assert value("stagescope_requests_shed", "stagescope_requests_shed_total", model="ranker") == n_shed
    stage = "stagescope_stage_duration_seconds"
    for s, k in (("preprocess", "cpu"), ("batch_wait", "batch_wait"), ("queue", "queue"), ("compute", "compute")):
        assert value(stage, f"{stage}_count", stage=s, kind=k, model="ranker") >= n_ok, s
    batch = "stagescope_batch_size"
    assert value(batch, f"{batch}_sum", model="ranker") == n_ok  # every served item ran in one batch
    itl = "stagescope_inter_token_latency_seconds"
    assert value(itl, f"{itl}_count", model="llm") == 3 * 5  # one sample per gap
    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert value(ttft, f"{ttft}_count", model="llm") == 3
    assert value("stagescope_model_ready", "stagescope_model_ready", model="llm") == 1
    assert value("stagescope_spans_exported", "stagescope_spans_exported_total") > 0

    # exemplars: on latency buckets, only in OpenMetrics, pointing at traces that were exported
    exemplar_ids = {
        s.exemplar.labels["trace_id"]
        for name in (req, stage, ttft)
        for s in families[name].samples
        if s.exemplar is not None
    }
    assert exemplar_ids, "no exemplar on the latency histograms"
    assert all(len(t) == 32 and int(t, 16) for t in exemplar_ids)
    assert exemplar_ids <= _trace_ids_in(tmp_path)
    assert text.headers["content-type"].startswith("text/plain")
    assert not any(t in text.text for t in exemplar_ids)


async def _asgi_call(app: Any, method: str, path: str, query: str) -> int:
    return (await asgi_request(app, method, path, query=query))[0]


def test_ten_thousand_random_paths_and_models_keep_series_bounded() -> None:
    reg = CollectorRegistry()
    app = build_app(registry=reg)
    rng = random.Random(3)

    def request() -> Any:
        model = f"model-{rng.getrandbits(32):x}" if rng.random() < 0.9 else rng.choice(["ranker", "llm"])
        kind = rng.random()
        if kind < 0.5:
            return _asgi_call(app, "POST", f"/v1/predict/{rng.getrandbits(31)}", f"model={model}")
        if kind < 0.55:
            return _asgi_call(app, "GET", "/v1/generate", f"n=2&model={model}")
        return _asgi_call(app, "GET", f"/{rng.getrandbits(64):x}/{rng.getrandbits(16)}", f"model={model}")

    async def main() -> list[int]:
        out: list[int] = []
        for _ in range(100):
            out += await asyncio.gather(*(request() for _ in range(100)))
        return out

    statuses = asyncio.run(main())
    assert len(statuses) == 10_000 and {200, 404} <= set(statuses)
    series = [s for f in reg.collect() for s in f.samples]
    routes = {s.labels["route"] for s in series if "route" in s.labels}
    models = {s.labels["model"] for s in series if "model" in s.labels}
    assert routes <= {"/v1/predict/{item}", "/v1/generate", "unmatched"}, routes
    assert models <= {"ranker", "llm", "other", ""}, models
    # 3 routes x 4 model values x 5 status classes of request buckets, 11 stages x 4 models, the rest
    bound = 3 * 4 * 5 * 30 + 11 * 4 * 30 + 4 * 6 * 30 + 100
    print(f"10,000 requests -> {len(series)} samples in the registry (bound {bound})")
    assert len(series) < bound, len(series)
