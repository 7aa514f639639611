"""StageMetrics: what one request record turns into, label folding, buckets, exemplars, /metrics."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from stagescope import names
from stagescope.instrumentation.metrics import StageMetrics, make_metrics_app, resolve_buckets, status_class
from stagescope.instrumentation.record import RequestRecord, StageInterval

MS = 1_000_000
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _record(**kw: object) -> RequestRecord:
    rec = RequestRecord(method="POST", route="/v1/predict", model="ranker", start_ns=0, **kw)  # type: ignore[arg-type]
    return rec


def test_request_finished_publishes_the_record() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["ranker"])
    rec = _record(end_ns=180 * MS, status_code=200)
    rec.stages += [
        StageInterval("batch_wait", 10 * MS, 30 * MS),
        StageInterval("queue", 30 * MS, 130 * MS),
        StageInterval("compute", 130 * MS, 170 * MS),
    ]
    m.request_started()
    m.request_started()
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 2
    m.request_finished(rec, TRACE_ID)
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 1
    lbl = {"route": "/v1/predict", "model": "ranker", "status_class": "2xx"}
    assert reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_count", lbl) == 1
    assert reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_sum", lbl) == pytest.approx(0.18)
    assert reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_bucket", {**lbl, "le": "0.15"}) == 0
    assert reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_bucket", {**lbl, "le": "0.2"}) == 1
    for stage, seconds in (("batch_wait", 0.02), ("queue", 0.1), ("compute", 0.04)):
        s = {"stage": stage, "kind": names.STAGE_KINDS[stage], "model": "ranker"}
        assert reg.get_sample_value(f"{names.METRIC_STAGE_DURATION}_sum", s) == pytest.approx(seconds)
    # not an LLM request: no GenAI samples
    assert reg.get_sample_value(f"{names.METRIC_GENAI_REQUEST_DURATION}_count", {"model": "ranker"}) is None


def test_llm_request_and_status_classes() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["llm"])
    rec = RequestRecord(route="/v1/generate", model="llm", start_ns=0, end_ns=1_000 * MS, status_code=503)
    for t in (200, 240, 300, 310):
        rec.mark_token(t * MS)
    rec.output_tokens = 4
    m.request_started()
    m.request_finished(rec, None)
    lbl = {"model": "llm"}
    assert reg.get_sample_value(f"{names.METRIC_GENAI_TTFT}_sum", lbl) == pytest.approx(0.2)
    assert reg.get_sample_value(f"{names.METRIC_INTER_TOKEN}_count", lbl) == 3
    assert reg.get_sample_value(f"{names.METRIC_INTER_TOKEN}_sum", lbl) == pytest.approx(0.11)
    assert reg.get_sample_value(f"{names.METRIC_GENAI_TPOT}_sum", lbl) == pytest.approx(0.11 / 3)
    assert reg.get_sample_value(f"{names.METRIC_GENAI_REQUEST_DURATION}_sum", lbl) == pytest.approx(1.0)
    e2e = {"route": "/v1/generate", "model": "llm", "status_class": "5xx"}
    assert reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_count", e2e) == 1
    assert [status_class(c) for c in (200, 302, 404, 429, 500, None)] == [
        "2xx",
        "3xx",
        "4xx",
        "4xx",
        "5xx",
        "5xx",
    ]


def test_429_answers_count_as_shed_once() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["ranker"])
    m.request_started()
    m.request_finished(_record(end_ns=MS, status_code=429))
    m.request_shed("/v1/predict", "ranker")  # a shed the middleware never saw
    assert reg.get_sample_value(names.METRIC_REQUESTS_SHED, {"route": "/v1/predict", "model": "ranker"}) == 2


def test_model_folding_from_argument_environment_or_first_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    m = StageMetrics(CollectorRegistry(), models=["a", "b"])
    assert [m.fold_model(x) for x in ("a", "b", "c", None)] == ["a", "b", names.OTHER_MODEL, ""]
    monkeypatch.setenv(names.ENV_MODELS, " x, y ,")
    m = StageMetrics(CollectorRegistry())
    assert [m.fold_model(x) for x in ("x", "y", "a")] == ["x", "y", names.OTHER_MODEL]
    monkeypatch.delenv(names.ENV_MODELS)
    m = StageMetrics(CollectorRegistry())
    seen = [m.fold_model(f"model-{i}") for i in range(20)]
    assert seen[:8] == [f"model-{i}" for i in range(8)]
    assert set(seen[8:]) == {names.OTHER_MODEL}
    assert m.fold_model("model-3") == "model-3"


def test_bucket_overrides_per_family_and_bad_sets() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, buckets={names.METRIC_GENAI_TTFT: [0.1, 0.25, 60, 300]})
    assert m.buckets[names.METRIC_GENAI_TTFT] == (0.1, 0.25, 60.0, 300.0)
    assert m.buckets[names.METRIC_REQUEST_DURATION] == names.BUCKETS_REQUEST
    rec = RequestRecord(model="x", start_ns=0)
    rec.mark_token(200 * MS)
    m.request_started()
    m.request_finished(rec)
    le = f"{names.METRIC_GENAI_TTFT}_bucket"
    assert reg.get_sample_value(le, {"model": "x", "le": "300.0"}) == 1
    assert reg.get_sample_value(le, {"model": "x", "le": "0.1"}) == 0
    assert reg.get_sample_value(le, {"model": "x", "le": "0.5"}) is None  # default bound gone
    with pytest.raises(ValueError, match="strictly increasing"):
        resolve_buckets({names.METRIC_STAGE_DURATION: [0.5, 0.25]})
    with pytest.raises(ValueError, match="empty"):
        resolve_buckets({names.METRIC_STAGE_DURATION: []})
    with pytest.raises(ValueError, match="not a histogram family"):
        resolve_buckets({names.METRIC_INFLIGHT: [1.0]})


def test_default_buckets_hold_slo_thresholds_and_llm_minutes() -> None:
    b = resolve_buckets()
    for family in (names.METRIC_REQUEST_DURATION, names.METRIC_STAGE_DURATION):
        assert {0.25, 0.5, 2.5} <= set(b[family])
    assert b[names.METRIC_GENAI_REQUEST_DURATION][-1] >= 120  # LLM requests last minutes, not 10 s
    assert b[names.METRIC_GENAI_TTFT][-1] >= 60


def test_several_instances_share_a_registry_and_rebucketing_replaces() -> None:
    reg = CollectorRegistry()
    a = StageMetrics(reg, models=["m"])
    b = StageMetrics(reg, models=["m"])  # a second instrument_app on the same registry
    a.observe_batch("m", 4)
    b.observe_batch("m", 2)
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "m"}) == 2
    c = StageMetrics(reg, models=["m"], buckets={names.METRIC_BATCH_SIZE: [1, 100]})
    c.observe_batch("m", 50)
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_bucket", {"model": "m", "le": "100.0"}) == 1
    d = StageMetrics(reg, models=["m"], buckets={names.METRIC_BATCH_SIZE: [1, 100]})
    c.unregister()  # d (another app on this registry) still publishes
    c.unregister()
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "m"}) == 1
    d.unregister()
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "m"}) is None
    StageMetrics(reg)  # the families can be registered again


def test_counters_and_gauges() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["m"])
    m.span_exported(10, "file")
    m.span_exported(0, "file")
    m.span_dropped(3, "otlp", "queue_full")
    m.model_loaded("m")
    m.set_model_ready("m", True)
    m.set_queue_depth("m", 7)
    m.executor_busy("m", 0.25)
    assert reg.get_sample_value(names.METRIC_SPANS_EXPORTED, {"exporter": "file"}) == 10
    assert reg.get_sample_value(names.METRIC_SPANS_DROPPED, {"exporter": "otlp", "reason": "queue_full"}) == 3
    assert reg.get_sample_value(names.METRIC_MODEL_LOADS, {"model": "m"}) == 1
    assert reg.get_sample_value(names.METRIC_MODEL_READY, {"model": "m"}) == 1
    assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 7
    assert reg.get_sample_value(names.METRIC_EXECUTOR_BUSY, {"model": "m"}) == 0.25


def test_series_stay_bounded_with_random_routes_and_models() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["ranker", "llm"], max_routes=16)
    rng = random.Random(1)
    for i in range(10_000):
        rec = RequestRecord(
            route=f"/r/{rng.getrandbits(40):x}", model=f"m{rng.getrandbits(30)}", start_ns=0,
            end_ns=MS, status_code=rng.choice([200, 404, 500, 429]),
        )  # fmt: skip
        rec.stages.append(StageInterval(rng.choice(names.STAGES), 0, MS))
        m.request_started()
        m.request_finished(rec, f"{i:032x}")
    families = {f.name: len(f.samples) for f in reg.collect()}
    series = sum(families.values())
    # 17 route values (16 + unmatched) x 1 model value x 4 status classes, 11 stages: a few thousand at most
    assert series < 17 * 4 * (len(names.BUCKETS_REQUEST) + 3) + 11 * (len(names.BUCKETS_STAGE) + 3) + 200


def test_exemplars_only_in_openmetrics() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg, models=["ranker"])
    rec = _record(end_ns=120 * MS, status_code=200)
    rec.stages.append(StageInterval("compute", 0, 100 * MS))
    m.request_started()
    m.request_finished(rec, TRACE_ID)
    om = openmetrics_latest(reg).decode()
    lines = [ln for ln in om.splitlines() if TRACE_ID in ln]
    assert any(ln.startswith(f"{names.METRIC_REQUEST_DURATION}_bucket") and 'le="0.15"' in ln for ln in lines)
    assert any(
        ln.startswith(f"{names.METRIC_STAGE_DURATION}_bucket") and 'stage="compute"' in ln for ln in lines
    )

    async def scrape(accept: str | None) -> httpx.Response:
        transport = httpx.ASGITransport(app=make_metrics_app(reg))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/metrics", headers={"accept": accept} if accept else {})

    r = asyncio.run(scrape("application/openmetrics-text; version=1.0.0"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/openmetrics-text")
    assert f'# {{trace_id="{TRACE_ID}"}}' in r.text
    r = asyncio.run(scrape(None))
    assert r.headers["content-type"].startswith("text/plain")
    assert TRACE_ID not in r.text and f"{names.METRIC_REQUEST_DURATION}_bucket" in r.text


def test_dead_workers_live_gauges_are_reaped_and_totals_kept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from stagescope.instrumentation.metrics import reap_dead_workers

    dead_pid = 2**31 - 2  # above any Linux pid_max
    for name in (f"gauge_livesum_{dead_pid}.db", f"gauge_livemax_{dead_pid}.db", f"counter_{dead_pid}.db",
                 f"histogram_{dead_pid}.db", f"gauge_livesum_{os.getpid()}.db"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    assert reap_dead_workers(str(tmp_path)) == [dead_pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{dead_pid}.db", f"histogram_{dead_pid}.db", f"gauge_livesum_{os.getpid()}.db"]
    )


def test_fast_observations_match_prometheus_client_observe() -> None:
    """StageMetrics observes the request and stage histograms without Histogram.observe's per-call
    checks (metrics._Observer): the exposition must be what Histogram.observe gives for the same values,
    edge values (a bucket bound itself, 0, +Inf, NaN, negative) included."""
    from prometheus_client import Histogram, generate_latest

    from stagescope.instrumentation.promfast import Observer as _Observer

    rng = random.Random(5)
    for family in (names.METRIC_REQUEST_DURATION, names.METRIC_STAGE_DURATION, names.METRIC_INTER_TOKEN):
        bounds = names.DEFAULT_BUCKETS[family]
        ref_reg, fast_reg = CollectorRegistry(), CollectorRegistry()
        ref = Histogram("h", "h", ("a",), registry=ref_reg, buckets=bounds).labels("x")
        fast = _Observer(Histogram("h", "h", ("a",), registry=fast_reg, buckets=bounds).labels("x"))
        assert fast._add_sum is not None  # the fast path is the one under test
        values = [*bounds[:-1], 0.0, -1.0, float("inf"), float("nan"), 1e9]
        values += [rng.random() * 2 * bounds[-2] for _ in range(3000)]
        values += [b * (1 + d) for b in bounds[:-1] for d in (-1e-12, 1e-12)]
        for v in values:
            ref.observe(v)
            fast.observe(v)

        def exposition(reg: CollectorRegistry) -> list[str]:
            return [line for line in generate_latest(reg).decode().splitlines() if "_created" not in line]

        assert exposition(fast_reg) == exposition(ref_reg), family

    # and through request_finished, against the public observe on the same label children
    reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    m = StageMetrics(reg, models=["ranker"])
    ref_req = Histogram(
        names.METRIC_REQUEST_DURATION, "d",
        (names.LABEL_ROUTE, names.LABEL_MODEL, names.LABEL_STATUS_CLASS), registry=ref_reg,
        buckets=names.DEFAULT_BUCKETS[names.METRIC_REQUEST_DURATION],
    )  # fmt: skip
    ref_stage = Histogram(
        names.METRIC_STAGE_DURATION, "d", (names.LABEL_STAGE, names.LABEL_KIND, names.LABEL_MODEL),
        registry=ref_reg, buckets=names.DEFAULT_BUCKETS[names.METRIC_STAGE_DURATION],
    )  # fmt: skip
    for _ in range(500):
        end = rng.randrange(1, 3_000) * MS // rng.choice((1, 7, 1000))
        rec = _record(end_ns=end, status_code=rng.choice((200, 404, 503)))
        rec.stages.append(StageInterval("compute", 0, rng.randrange(0, end + 1)))
        m.request_started()
        m.request_finished(rec, TRACE_ID if rng.random() < 0.1 else None)
        ref_req.labels("/v1/predict", "ranker", status_class(rec.status_code)).observe(end / 1e9)
        iv = rec.stages[0]
        ref_stage.labels("compute", iv.stage_kind, "ranker").observe((iv.end_ns - iv.start_ns) / 1e9)
    for family, labels in (
        (names.METRIC_REQUEST_DURATION, {"route": "/v1/predict", "model": "ranker", "status_class": "5xx"}),
        (names.METRIC_STAGE_DURATION, {"stage": "compute", "kind": "compute", "model": "ranker"}),
    ):
        for le in (*names.DEFAULT_BUCKETS[family][:-1], float("inf")):
            got = reg.get_sample_value(f"{family}_bucket", {**labels, "le": str(le) if le != float("inf") else "+Inf"})
            want = ref_reg.get_sample_value(f"{family}_bucket", {**labels, "le": str(le) if le != float("inf") else "+Inf"})
            assert got == want, (family, le)
        assert reg.get_sample_value(f"{family}_sum", labels) == pytest.approx(ref_reg.get_sample_value(f"{family}_sum", labels))
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 0
