"""The engine registry, the SLO's quality budget and the quality gate's rules (no onnx extra needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import pytest

from stagescope import names as N
from stagescope.analysis import levers as L
from stagescope.analysis import quality as QL
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.demo.cli import DEFAULT_SCENARIO
from stagescope.errors import UserError
from stagescope.service.engines import ENGINES, engine_for_backend, get_engine
from stagescope.slo import load_slo_file, parse_slo


def test_every_engine_names_its_scenarios_and_the_default_stays_simulated() -> None:
    assert get_engine("simulated").default_scenario == DEFAULT_SCENARIO
    for eng in ENGINES.values():
        assert eng.default_scenario in eng.scenarios and eng.label
        for sc in eng.scenarios.values():
            assert (sc.true_stage is None) == (sc.lever is None)
            assert sc.slo.threshold_ms > 0
    assert engine_for_backend("onnx").name == "onnx" and engine_for_backend("numpy").name == "simulated"
    with pytest.raises(UserError, match="unknown engine 'nope'; known engines: simulated, onnx"):
        get_engine("nope")
    onnx = get_engine("onnx")
    cmd = onnx.serve_command(onnx.scenarios["slow-compute"], port=1, spans_dir=Path("s"), apply_lever=True)
    assert cmd[cmd.index("--backend") + 1] == "onnx" and cmd[-1] == "--apply-lever"


def test_quality_budget_in_the_slo_file(tmp_path: Path) -> None:
    def write(extra: str) -> Path:
        p = tmp_path / "slo.yaml"
        p.write_text(f"slos:\n  - {{name: p, service: s, sli: e2e, threshold_ms: 300, objective: 0.99{extra}}}\n")
        return p

    assert load_slo_file(write(""))[0].quality_budget is None
    (slo,) = load_slo_file(write(", quality_budget: 0.5"))
    assert slo.quality_budget == 0.5 and slo.to_dict()["quality_budget"] == 0.5
    for bad in ("-1", "101", "'half'", "true", ".nan"):
        with pytest.raises(UserError, match=r"quality_budget \(accuracy points\) must be a finite number in \[0, 100\]"):
            load_slo_file(write(f", quality_budget: {bad}"))


def _synth(budget: float | None) -> dict:  # type: ignore[type-arg]
    """The synthetic slow-compute incident, whose SYNTHETIC service says INT8 costs 0.22 points."""
    data = S.generate("slow-compute", 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    return analyze(con, dataclasses.replace(parse_slo("p99<300ms")[0], quality_budget=budget))


def test_the_gate_rules_on_a_synthetic_incident() -> None:
    """The rule logic only; the real model's own measured drop is tested in test_onnx_engine.py."""
    ok = _synth(0.5)
    assert ok["verdict"]["lever"] == N.LEVER_QUANTIZE and ok["levers"][0]["acceptable"] is True
    assert ok["model_quality"]["accuracy"] == {N.VARIANT_SERVING: 0.9711, N.LEVER_QUANTIZE: 0.9689}
    # measured ratio 171/380 at 45 rows, not an assumed factor
    assert "x0.45 at 45 rows" in ok["levers"][0]["rationale"]
    tight = _synth(0.1)
    first, chosen = tight["levers"][0], tight["levers"][1]
    assert first["lever"] == N.LEVER_QUANTIZE and first["acceptable"] is False
    assert first["rationale"].startswith("not acceptable") and first["predicted_p99_ms"] is not None
    assert tight["verdict"]["lever"] == chosen["lever"] == N.LEVER_COMPILE_RUNTIME
    # the synthetic service measured no compile-runtime variant: no effect model, no invented number
    assert chosen["predicted_p99_ms"] is None and "measure after applying" in chosen["rationale"]
    assert _synth(None)["verdict"]["lever"] == N.LEVER_QUANTIZE  # no budget: no gate


def test_ratio_follows_the_batch_size_nearest_each_requests_compute() -> None:
    facts = {"batch_ms": {"serving": {1: 1.0, 100: 50.0, 5000: 300.0}, "quantize": {1: 0.4, 100: 30.0, 5000: 150.0}}}
    curve = QL.speed_curve(facts, N.LEVER_QUANTIZE)
    assert [r for _, _, r in curve] == [1, 100, 5000]
    con = duckdb.connect()
    got = [con.execute(f"SELECT {QL.ratio_sql(curve, str(ms))}").fetchone()[0] for ms in (0.5, 6.0, 8.0, 400.0)]  # type: ignore[index]
    assert got == [0.4, 0.4, 0.6, 0.5]  # the boundary between 1 and 100 rows is sqrt(1 x 50) ms
    assert QL.speed_curve(facts, N.LEVER_COMPILE_RUNTIME) == []
    assert L.quality({}, N.LEVER_QUANTIZE) is None


def test_llama_engine_serves_through_its_gateway_and_passes_the_analysis_running_cap() -> None:
    llama = get_engine("llama-cpp")
    assert "RANDOM-WEIGHT" in llama.label and llama.default_scenario in llama.scenarios
    sc = llama.scenarios["llama-many-slots"]
    cmd = llama.serve_command(sc, port=7, spans_dir=Path("s"), apply_lever=True, overrides={"parallel": 3})
    assert cmd[cmd.index("-m") + 1] == "stagescope.service.llama_cpp.serve" and "--backend" not in cmd
    assert cmd[cmd.index("--set") + 1] == "parallel=3" and cmd[-1] == "--apply-lever"
    report = {"evidence": {"running_cap": 5}}
    assert llama.lever_settings(N.LEVER_REDUCE_BATCH_TOKENS, report) == {"parallel": 5}
    assert llama.lever_settings(N.LEVER_SCALE_OUT, report) == {}  # no value for another lever
    assert llama.lever_settings(N.LEVER_REDUCE_BATCH_TOKENS, {"evidence": {"running_cap": 0}}) == {}
    assert get_engine("onnx").lever_settings(N.LEVER_REDUCE_BATCH_TOKENS, report) == {}


def test_lever_check_reports_the_measured_error_of_the_prediction(tmp_path: Path) -> None:
    from stagescope.demo.main import lever_check
    from stagescope.demo.runner import RunResult

    def report(q: float, levers: list[dict[str, object]]) -> dict[str, object]:
        return {"status": "breached", "breached": True, "quantile_ms": q,
                "slo": {"threshold_ms": 40.0, "spec": "itl:p99<40ms", "objective": 0.99},
                "verdict": {"stage": N.STAGE_DECODE, "lever": N.LEVER_REDUCE_BATCH_TOKENS} if levers else None,
                "levers": levers}  # fmt: skip

    before = RunResult("llama-many-slots", False, tmp_path, report(60.0, [
        {"lever": N.LEVER_REDUCE_BATCH_TOKENS, "predicted_p99_ms": 30.0}]), 10, None, engine="llama-cpp")  # fmt: skip
    after = RunResult("llama-many-slots", True, tmp_path, {**report(36.0, []), "status": "met"}, 10, None,
                      engine="llama-cpp")  # fmt: skip
    check = lever_check(before, after)
    assert check["predicted_p99_ms"] == 30.0 and check["p99_after_ms"] == 36.0 and check["within_slo_after"]
    assert check["prediction_error"] == pytest.approx(0.2)
    assert check["outside_cores_before"] is None  # no CPU counters recorded in these runs' folders
    no_data = RunResult("x", True, tmp_path, {**report(36.0, []), "status": N.STATUS_NO_DATA, "quantile_ms": None},
                        0, None)  # fmt: skip
    gone = lever_check(before, no_data)
    assert gone["prediction_error"] is None and gone["within_slo_after"] is None


def test_the_report_carries_the_running_cap_its_prediction_is_for() -> None:
    """The reduce-batch-tokens prediction is for one running-batch cap: the report's evidence says which,
    so the llama-cpp lever check applies that cap (not the scenario's own guess)."""
    data = S.generate("llm-decode-heavy", 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert rep["verdict"]["lever"] == N.LEVER_REDUCE_BATCH_TOKENS
    cap = rep["evidence"]["running_cap"]
    assert isinstance(cap, int) and cap >= 1
    lever = next(x for x in rep["levers"] if x["lever"] == N.LEVER_REDUCE_BATCH_TOKENS)
    assert f"capped at {cap} streams" in lever["rationale"]
    assert get_engine("llama-cpp").lever_settings(N.LEVER_REDUCE_BATCH_TOKENS, rep) == {"parallel": cap}


def test_workload_overrides_change_the_load_not_the_service() -> None:
    from stagescope.demo.runner import WORKLOAD_PREFIX, apply_workload

    sc = get_engine("llama-cpp").scenarios["llama-long-prompts"]
    sized, rest = apply_workload(sc, {f"{WORKLOAD_PREFIX}long_prompt_tokens": 3210, "parallel": 2})
    assert sized.workload.long_prompt_tokens == 3210 and sc.workload.long_prompt_tokens == 1500
    assert rest == {"parallel": 2} and sized.overrides == sc.overrides
    assert apply_workload(sc, None) == (sc, {})
    with pytest.raises(UserError, match="unknown workload setting"):
        apply_workload(sc, {f"{WORKLOAD_PREFIX}nope": 1})
    # the healthy scenario is not sized (no server is started for it)
    assert get_engine("llama-cpp").sizing(get_engine("llama-cpp").scenarios["llama-healthy"]) == ({}, None)
    # a sizing's scenario overrides: rate and SLO; bad ones are one UserError line
    own, _ = apply_workload(sc, {"scenario.rate_rps": 6.5, "scenario.slo_spec": "ttft:p95<900ms"})
    assert own.rate_rps == 6.5 and own.slo.threshold_ms == 900.0 and sc.rate_rps == 3.0
    for bad in ({"scenario.nope": 1}, {"scenario.rate_rps": 0}, {"scenario.rate_rps": "x"},
                {"scenario.slo_spec": "itl:p99<"}):  # fmt: skip
        with pytest.raises(UserError):
            apply_workload(sc, bad)


def test_decode_and_slot_faults_are_sized_from_the_measured_times() -> None:
    from stagescope.service.llama_cpp import sizing as S

    # median gaps a + b n with a = 6, b = 1; 16 slots, 96 tokens, 10 ms prompts
    pts = [(4, 10.0), (8, 14.0), (16, 22.0)]
    assert S.step_fit(pts) == pytest.approx((6.0, 1.0))
    rate, itl = S.decode_load(pts, slots=16, max_tokens=96, prompt_ms=10.0)
    running = S.DECODE_LOAD_SHARE * 16
    assert rate * (10.0 + 96 * (6.0 + running)) / 1000.0 == pytest.approx(running)  # Little's law
    assert itl == pytest.approx(S.ITL_SLO_OVER_STEP * (6.0 + 8.0))  # the step with half the slots
    with pytest.raises(UserError, match="does not grow"):
        S.decode_load([(4, 10.0), (16, 9.0)], slots=16, max_tokens=96, prompt_ms=10.0)
    rate, ttft = S.slot_load(1.25, slots=2)
    assert rate == pytest.approx(S.SLOTS_OVERLOAD * 2 / 1.25) and ttft == pytest.approx(S.TTFT_SLO_OVER_SERVICE * 1250.0)
    with pytest.raises(UserError):
        S.slot_load(0.0, slots=2)


def test_long_prompt_length_follows_the_measured_step_time() -> None:
    from stagescope.service.llama_cpp.engine import tokens_for

    # a step of a + b n^2 through both probes: 512 tokens in 128 ms, 2,048 in 1,024 ms
    probes = [(512, 128.0), (2048, 1024.0)]
    n = tokens_for(1500.0, probes)
    b = (1024.0 / 2048 - 128.0 / 512) / (2048 - 512)
    a = 128.0 / 512 - b * 512
    assert abs(a * n + b * n * n - 1500.0) < 3.0 and 2048 < n < 1500 / 0.25
    assert tokens_for(1000.0, [(512, 512.0), (2048, 1800.0)]) == int(1000.0 * 2048 / 1800.0)  # bends down: linear
