"""The shared core: vocabularies, the SLO format, the per-request record."""

from __future__ import annotations

import asyncio

import pytest

import stagescope
from stagescope import names
from stagescope.errors import UserError
from stagescope.instrumentation.record import RequestRecord, reset_current_request, set_current_request
from stagescope.slo import load_slo_file, parse_slo


def test_vocabularies_are_the_pinned_ones() -> None:
    assert names.STAGES == (
        "network", "feature_fetch", "preprocess", "batch_wait", "queue", "compute",
        "prefill", "decode", "postprocess", "egress", "cold_start",
        "receive", "deserialize", "compute_input", "compute_output", "front_end", "gateway",
        "pod_pending",
    )  # fmt: skip
    assert names.LEVERS == (
        "cache-features", "cache-results", "offload-preprocessing", "cap-batch-wait",
        "reduce-batch-tokens", "scale-out", "prewarm", "quantize", "compile-runtime",
        "shrink-response", "chunked-prefill", "speculative-decoding", "shrink-request",
        "more-api-servers", "cap-output-tokens", "kv-cache-headroom", "prefix-caching",
        "surge-with-readiness", "prewarmed-pods", "scale-ahead-of-swap",
        "scale-on-queue-depth", "concurrency-limit", "kv-cache-aware-routing",
        # s4-levers-a (issue 18, workload levers)
        "separate-prefill-decode", "cap-prompt-tokens", "continuous-batching", "cascade-small-model",
    )  # fmt: skip


def test_bucket_sets_hold_non_integer_slo_thresholds() -> None:
    for family, buckets in names.DEFAULT_BUCKETS.items():
        assert list(buckets) == sorted(set(buckets)), family
    for b in (names.BUCKETS_REQUEST, names.BUCKETS_STAGE):
        assert {0.25, 0.5, 2.5} <= set(b)


@pytest.mark.parametrize(
    ("spec", "sli", "objective", "threshold_ms"),
    [
        ("p99<300ms", "e2e", 0.99, 300.0),
        ("ttft:p95<500ms", "ttft", 0.95, 500.0),
        ("itl:p99<60ms", "itl", 0.99, 60.0),
        ("p99.9 < 2.5s", "e2e", 0.999, 2500.0),
    ],
)
def test_parse_slo_spec(spec: str, sli: str, objective: float, threshold_ms: float) -> None:
    (slo,) = parse_slo(spec)
    assert (slo.sli, slo.threshold_ms) == (sli, threshold_ms)
    assert slo.objective == pytest.approx(objective)


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("p99<300ms", "p99<300ms"),
        ("p99.99999999<300ms", "p99.99999999<300ms"),  # not "p100": ten digits of the objective were lost
        ("p99<1234567ms", "p99<1234567ms"),  # not "1.23457e+06ms", which is no SLO
        ("ttft:p95<0.1234567ms", "ttft:p95<0.1234567ms"),
        ("itl:p99.9<0.06s", "itl:p99.9<60ms"),
        ("p50<2.50s", "p50<2500ms"),
    ],
)
def test_an_slo_spec_reads_back_as_the_same_slo(spec: str, shown: str) -> None:
    """``SLO.spec`` (the headline, the lever runs' SLO) is plain digits that parse back to the same SLO."""
    (slo,) = parse_slo(spec)
    assert slo.spec == shown
    (again,) = parse_slo(slo.spec)
    assert again.threshold_ms == slo.threshold_ms and again.objective == pytest.approx(slo.objective, abs=1e-13)


@pytest.mark.parametrize("spec", ["p99>300ms", "latency:p99<3ms", "p100<3ms", "p99<3", ""])
def test_bad_slo_spec_is_a_user_error(spec: str) -> None:
    with pytest.raises(UserError):
        parse_slo(spec)


def test_slo_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "slo.yaml"
    p.write_text(
        "slos:\n"
        "  - {name: predict, service: inference, sli: e2e, route: /v1/predict, threshold_ms: 300, objective: 0.99}\n"
        "  - {name: ttft, service: inference, sli: ttft, threshold_ms: 500, objective: 0.95, window: 7d}\n"
    )
    a, b = load_slo_file(p)
    assert a.route == "/v1/predict" and a.window == "30d" and a.error_budget == pytest.approx(0.01)
    assert b.sli == "ttft" and b.window == "7d"
    assert parse_slo(str(p)) == [a, b]
    p.write_text("slos:\n  - {name: x, service: s, sli: e2e, threshold_ms: 300, objective: 1.5}\n")
    with pytest.raises(UserError, match=r"slo.yaml:2: slos\[0\] \(x\): objective"):
        load_slo_file(p)
    p.write_text("slos: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_slo_file(p)


def test_stage_records_into_the_current_request_only() -> None:
    from stagescope.instrumentation.record import validate_stage

    with pytest.raises(ValueError, match="is not a label value"):
        validate_stage("gpu time")
    with pytest.raises(ValueError, match="unknown stage kind 'gpu'"):
        validate_stage("compute", kind="gpu")

    async def one(name: str) -> RequestRecord:
        rec = RequestRecord(route=name)
        token = set_current_request(rec)
        try:
            async with stagescope.stage("preprocess"):
                await asyncio.sleep(0.01)
            with stagescope.stage("postprocess"):
                pass
        finally:
            reset_current_request(token)
        return rec

    async def both() -> list[RequestRecord]:
        return list(await asyncio.gather(one("a"), one("b")))

    recs = asyncio.run(both())
    for rec in recs:
        assert [s.stage for s in rec.stages] == ["preprocess", "postprocess"]
        assert rec.stages[0].duration_s >= 0.009
    with stagescope.stage("compute"):  # outside a request: records nothing, raises nothing
        pass


def test_token_gaps_and_ttft() -> None:
    rec = RequestRecord(start_ns=0)
    for t in (50_000_000, 60_000_000, 80_000_000):
        rec.mark_token(t)
    assert rec.ttft_s == pytest.approx(0.05)
    assert rec.token_gaps_s() == pytest.approx([0.01, 0.02])
    assert rec.input_hash is None
    assert rec.set_input("same") == RequestRecord().set_input(b"same")
