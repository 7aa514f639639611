"""A team's own stage names: validation, kinds, the per-process cap and its folding, and how name and
kind reach the record, the spans and the metrics (instrumentation side; the analysis side is in
test_analysis_stage_kinds.py, end to end in test_stages_e2e.py)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation import stagenames
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.record import (
    RequestRecord,
    reset_current_request,
    set_current_request,
    validate_stage,
)
from stagescope.instrumentation.stagenames import StageNames


@pytest.fixture(autouse=True)
def fresh_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with a process registry of its own (as a fresh process would)."""
    monkeypatch.delenv(names.ENV_MAX_CUSTOM_STAGES, raising=False)
    monkeypatch.setattr(stagenames, "_NAMES", None)
    yield


def _record_stages(*calls: tuple[str, str | None]) -> RequestRecord:
    rec = RequestRecord(route="/r")
    token = set_current_request(rec)
    try:
        for name, kind in calls:
            with stagescope.stage(name, kind=kind):
                pass
    finally:
        reset_current_request(token)
    return rec


def test_any_name_with_a_kind_is_recorded_with_that_kind() -> None:
    rec = _record_stages(("rerank", "compute"), ("retrieve", "fetch"), ("safety-filter", "cpu"),
                         ("feature_fetch", None), ("compute", "compute"))  # fmt: skip
    assert [(s.stage, s.kind) for s in rec.stages] == [
        ("rerank", "compute"), ("retrieve", "fetch"), ("safety-filter", "cpu"),
        ("feature_fetch", "fetch"), ("compute", "compute"),
    ]  # fmt: skip
    rec.add_stage("tokenize", 0, 10, kind="cpu")
    assert (rec.stages[-1].stage, rec.stages[-1].stage_kind) == ("tokenize", "cpu")


@pytest.mark.parametrize(
    "bad",
    ["", " rerank", "re rank", "rerank\n", "-rerank", "x" * 65, "rérank", "a/b", "a{b}", 'a"b', 7, None, b"rerank"],
)
def test_bad_names_are_programmer_errors(bad: object) -> None:
    with pytest.raises(ValueError, match=r"stage name|a stage name is a string"):
        validate_stage(bad)  # type: ignore[arg-type]
    # on the request path the stage is recorded anyway, folded into the overflow name
    assert (stagescope.stage(bad).name, stagescope.stage(bad, kind="cpu").kind) == (names.STAGE_OVERFLOW, "cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("good", ["a", "A9", "retrieve.v2", "safety-filter", "ns:stage", "x" * 64, "7b_decode"])
def test_label_shaped_names_are_accepted(good: str) -> None:
    assert stagescope.stage(good, kind="cpu").name == good


@pytest.mark.parametrize("reserved", [names.UNATTRIBUTED, names.STAGE_OVERFLOW])
def test_reserved_names_are_refused(reserved: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        validate_stage(reserved, kind="cpu")
    assert stagescope.stage(reserved, kind="cpu").name == names.STAGE_OVERFLOW


@pytest.mark.parametrize("bad", ["gpu", "unknown", "Compute", "", "fetch,cpu"])
def test_a_bad_kind_lists_the_kinds(bad: str) -> None:
    with pytest.raises(ValueError) as err:
        validate_stage("rerank", kind=bad)
    assert f"unknown stage kind {bad!r}" in str(err.value)
    assert ", ".join(names.KINDS) in str(err.value)
    assert (stagescope.stage("rerank", kind=bad).kind, stagescope.stage("queue", kind=bad).kind) == ("unknown", "queue")


def test_a_built_in_stage_implies_its_kind_and_refuses_another() -> None:
    assert stagescope.stage("queue").kind == "queue"
    assert stagescope.stage("preprocess", kind="cpu").kind == "cpu"
    with pytest.raises(ValueError, match="built in with kind 'queue'"):
        validate_stage("queue", kind="compute")
    assert stagescope.stage("queue", kind="compute").kind == "queue"  # the request path: the name's kind


def test_one_kind_per_name_in_a_process() -> None:
    stagescope.stage("rerank", kind="compute")
    with pytest.raises(ValueError, match="already has kind 'compute'"):
        validate_stage("rerank", kind="cpu")
    with pytest.raises(ValueError, match="already has kind 'compute'"):
        validate_stage("rerank")
    assert stagescope.stage("rerank", kind="cpu").kind == stagescope.stage("rerank").kind == "compute"


def test_a_custom_name_without_a_kind_is_unknown_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="stagescope.instrumentation"):
        for _ in range(50):
            assert stagescope.stage("rerank").kind == names.KIND_UNKNOWN
        stagescope.stage("compute")  # built in: no warning
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'rerank' has no kind" in lines[0] and "kind=" in lines[0]


def test_names_past_the_cap_fold_into_one_stage_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    reg = StageNames(max_custom=3)
    with caplog.at_level(logging.WARNING, logger="stagescope.instrumentation"):
        kept = [reg.resolve(f"s{i}", "cpu") for i in range(3)]
        folded = [reg.resolve(f"s{i}", "fetch") for i in range(3, 200)]
        again = [reg.resolve(f"s{i}", "fetch") for i in range(3, 10)]
    assert kept == [(f"s{i}", "cpu") for i in range(3)]
    assert set(folded) == set(again) == {(names.STAGE_OVERFLOW, "fetch")}  # the kind is kept
    assert reg.resolve("compute") == ("compute", "compute")  # built-ins never count against the cap
    logs = [r.getMessage() for r in caplog.records]
    assert len(logs) == 1 and "more than 3 custom stage names" in logs[0] and "'s3'" in logs[0]
    assert names.METRIC_STAGES_FOLDED in logs[0] and names.ENV_MAX_CUSTOM_STAGES in logs[0]
    assert list(reg.custom) == ["s0", "s1", "s2"]
    with pytest.raises(ValueError):  # folding never hides a programmer error
        reg.resolve("bad name", "cpu")
    with pytest.raises(ValueError):
        reg.resolve("s500", "gpu")


def test_the_cap_comes_from_argument_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert StageNames().max_custom == names.DEFAULT_MAX_CUSTOM_STAGES == 32
    monkeypatch.setenv(names.ENV_MAX_CUSTOM_STAGES, "5")
    assert StageNames().max_custom == 5
    assert StageNames(max_custom=2).max_custom == 2
    monkeypatch.setenv(names.ENV_MAX_CUSTOM_STAGES, "many")
    assert StageNames().max_custom == names.DEFAULT_MAX_CUSTOM_STAGES  # logged, default kept
    with pytest.raises(ValueError, match="max_custom_stages"):
        StageNames(max_custom=-1)
    app = FastAPI()
    handle = stagescope.instrument_app(app, service_name="t", registry=CollectorRegistry(), max_custom_stages=1)
    try:
        assert stagenames.stage_names().max_custom == 1
        assert stagescope.stage("a", kind="cpu").name == "a"
        assert stagescope.stage("b", kind="cpu").name == names.STAGE_OVERFLOW
    finally:
        stagescope.uninstrument_app(app)
        handle.shutdown()


def test_folded_intervals_are_counted_and_series_stay_bounded() -> None:
    stagenames._NAMES = StageNames(max_custom=4)
    reg = CollectorRegistry()
    metrics = StageMetrics(reg, models=["m"])
    rng = random.Random(7)
    folded = 0
    for i in range(10_000):  # a name built from request data: the worst case the cap exists for
        rec = RequestRecord(route="/r", model="m", start_ns=0, end_ns=10, status_code=200)
        name = f"user-{rng.getrandbits(40):x}" if i % 2 else rng.choice(["rerank", "retrieve"])
        rec.add_stage(name, 0, 5, kind="compute")
        rec.add_stage("compute", 5, 10)
        folded += rec.stages[0].stage == names.STAGE_OVERFLOW
        metrics.request_finished(rec)
    stage_labels = {
        (s.labels["stage"], s.labels["kind"])
        for f in reg.collect() for s in f.samples if "stage" in s.labels
    }  # fmt: skip
    assert len(stage_labels) <= 4 + 1 + 1, stage_labels
    assert (names.STAGE_OVERFLOW, "compute") in stage_labels and ("compute", "compute") in stage_labels
    assert folded > 4_000
    assert reg.get_sample_value(names.METRIC_STAGES_FOLDED) == folded
    count = f"{names.METRIC_STAGE_DURATION}_count"
    assert reg.get_sample_value(count, {"stage": names.STAGE_OVERFLOW, "kind": "compute", "model": "m"}) == folded
    assert len(stagenames._NAMES._cache) < 4096 + 50  # the cache of folded names is bounded too


def test_name_and_kind_reach_spans_and_metrics() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reg = CollectorRegistry()
    app = FastAPI()

    @app.get("/rank")
    async def rank() -> dict[str, bool]:
        async with stagescope.stage("retrieve", kind="fetch"):
            await asyncio.sleep(0.001)
        with stagescope.stage("rerank", kind="compute"):
            pass
        with stagescope.stage("safety-filter"):
            pass
        return {"ok": True}

    handle = stagescope.instrument_app(
        app, service_name="t", registry=reg, tracer_provider=provider, baseline_sample=1.0
    )

    async def go() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            assert (await c.get("/rank")).status_code == 200
            handle.force_flush(5)
            return (await c.get("/metrics")).text

    try:
        text = asyncio.run(go())
    finally:
        stagescope.uninstrument_app(app)
    stages = {
        s.attributes[names.ATTR_STAGE]: s.attributes[names.ATTR_STAGE_KIND]
        for s in exporter.get_finished_spans() if s.attributes and names.ATTR_STAGE in s.attributes
    }  # fmt: skip
    assert stages == {"retrieve": "fetch", "rerank": "compute", "safety-filter": "unknown"}
    for stage, kind in stages.items():
        assert f'{names.METRIC_STAGE_DURATION}_count{{kind="{kind}",model="",stage="{stage}"}} 1.0' in text


def test_a_stage_call_with_a_bad_kind_or_name_never_fails_the_request(caplog: pytest.LogCaptureFixture) -> None:
    """A typo in a kind (or a name) is a programmer error, but a request must not get a 500 for its
    telemetry: the stage runs, is recorded (kind unknown, or folded), warned about once per distinct
    mistake with the kinds listed, and counted."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reg = CollectorRegistry()
    app = FastAPI()
    ran: list[str] = []

    @app.get("/rank")
    async def rank() -> dict[str, bool]:
        with stagescope.stage("rerank", kind="comptue"):  # the typo
            ran.append("rerank")
        async with stagescope.stage("retrieve", kind="GPU"):
            ran.append("retrieve")
        with stagescope.stage("queue", kind="compute"):  # a built-in given another kind
            ran.append("queue")
        with stagescope.stage("re rank", kind="compute"):  # no label value
            ran.append("re rank")
        rec = stagescope.current_request()
        assert rec is not None
        rec.add_stage("tokenize", 0, 1, kind="cpus")
        return {"ok": True}

    handle = stagescope.instrument_app(
        app, service_name="t", registry=reg, tracer_provider=provider, baseline_sample=1.0
    )
    n = 20
    counted: list[float | None] = []

    async def go() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            codes = [(await c.get("/rank")).status_code for _ in range(n)]
            handle.force_flush(5)
            counted.extend(reg.get_sample_value(m) for m in (names.METRIC_STAGE_KIND_ERRORS, names.METRIC_STAGES_FOLDED))
            return codes

    try:
        with caplog.at_level(logging.WARNING, logger="stagescope.instrumentation"):
            codes = asyncio.run(go())
    finally:
        stagescope.uninstrument_app(app)
    assert codes == [200] * n and len(ran) == 4 * n
    stages = {
        (s.attributes[names.ATTR_STAGE], s.attributes[names.ATTR_STAGE_KIND])
        for s in exporter.get_finished_spans() if s.attributes and names.ATTR_STAGE in s.attributes
    }  # fmt: skip
    assert stages == {("rerank", "unknown"), ("retrieve", "unknown"), ("queue", "queue"),
                      (names.STAGE_OVERFLOW, "compute"), ("tokenize", "unknown")}  # fmt: skip
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines  # one per distinct mistake, not per request
    for bad in ("'comptue'", "'GPU'", "'cpus'"):
        (line,) = [x for x in lines if f"unknown stage kind {bad}" in x]
        assert ", ".join(names.KINDS) in line and "recorded as kind 'unknown'" in line
    assert any("built in with kind 'queue'" in x for x in lines)
    assert any("'re rank'" in x and names.STAGE_OVERFLOW in x for x in lines)
    assert counted == [4 * n, n]  # kind errors: three typos and the built-in; folded: the bad name's intervals
