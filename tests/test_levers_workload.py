"""The workload levers (issue 18): separate prefill and decode pools, a prompt-length budget,
continuous batching and cascade routing to a smaller model. Each fires on its own SYNTHETIC incident
(analysis.synth_workload) and on none of the existing scenarios, and its effect model's prediction is
within 10 % of what the generator's physics gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from stagescope import names as N
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis import synth_workload as W
from stagescope.analysis.api import analyze
from stagescope.analysis.synth_multi import MULTI, generate_multi

NEW = {
    N.LEVER_SEPARATE_PREFILL_DECODE, N.LEVER_CAP_PROMPT_TOKENS, N.LEVER_CONTINUOUS_BATCHING,
    N.LEVER_CASCADE_SMALL_MODEL,
}  # fmt: skip
N_REQ = 1500


def _levers(rep: dict[str, Any]) -> set[str]:
    """Every lever a report names (listed or chosen, its own and its routes')."""
    got = {lv["lever"] for lv in rep.get("levers") or [] if lv.get("lever")}
    got |= {st["lever"] for st in rep.get("plan") or []}
    for sub in rep.get("routes") or []:
        got |= _levers(sub)
    return got


def _incident(name: str, seed: int = 1) -> tuple[W.WorkloadIncident, dict[str, Any]]:
    inc = W.generate(name, N_REQ, seed=seed)
    con = duckdb.connect()
    W.to_tables(con, inc)
    return inc, analyze(con, inc.slo)


@pytest.mark.parametrize("name", list(W.WORKLOAD))
def test_each_incident_gets_its_lever_and_a_prediction_near_the_truth(name: str) -> None:
    inc, rep = _incident(name)
    sc = inc.data.scenario
    assert rep["status"] == N.STATUS_BREACHED
    assert rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}, [(x["lever"], x["stage"]) for x in rep["levers"]]
    assert _levers(rep) & NEW <= {sc.lever}  # no other new lever on it
    lv = next(x for x in rep["levers"] if x["lever"] == sc.lever and x.get("acceptable") is not False)
    truth = inc.true_quantile(rep["evidence"].get("prompt_cap_tokens"))
    assert lv["predicted_p99_ms"] == pytest.approx(truth, rel=0.10), lv["rationale"]
    assert lv["predicted_p99_ms"] < rep["quantile_ms"]


def test_the_rationales_cite_what_was_measured() -> None:
    _, rep = _incident("llm-prefill-interference")
    ev, why = rep["evidence"], rep["levers"][0]["rationale"]
    assert ev["slow_gap_prefill_overlap"] >= 0.9 and ev["normal_gap_prefill_overlap"] < 0.3
    assert ev["slow_gap_to_prefill"] < 0.2  # chunked: a slow gap is a fraction of the prefill beside it
    # the prefills are most of the slow gaps' time against same-batch gaps beside none (each gap's batch)
    assert ev["slow_gap_prefill_excess"] >= 0.6 and ev["slow_gap_matched_share"] >= 0.9
    assert ev["gap_running_per_gap"] is True
    assert (f"the prefills add {ev['slow_gap_prefill_excess']:.0%} of the slow gaps' time over the gaps at the same "
            "running batch (per gap)") in why
    assert "(already chunked: a slow gap is a fraction of the prefill)" in why
    assert f"{ev['slow_gap_prefill_overlap']:.0%}" in why and "--kv-transfer-config" in why
    assert "--disaggregation-mode" in why and "chunk budget" in why
    # unchunked, the same interference gets the cheaper lever first
    _, rep = _incident("llm-prefill-interference-unchunked")
    assert rep["evidence"]["slow_gap_to_prefill"] >= 0.9 and rep["evidence"]["slow_gap_prefill_excess"] >= 0.8
    assert "Enable chunked prefill first" in rep["levers"][0]["rationale"]
    assert f"the prefills add {rep['evidence']['slow_gap_prefill_excess']:.0%}" in rep["levers"][0]["rationale"]
    _, rep = _incident("llm-long-contexts")
    ev = rep["evidence"]
    assert ev["long_prompt_share_tail"] >= 0.9
    assert ev["prefill_ms_per_token_long"] <= ev["prefill_ms_per_token_baseline"] * 1.25
    assert f"{ev['prompt_cap_tokens']:.0f} tokens" in rep["levers"][0]["rationale"]
    _, rep = _incident("llm-static-batches")
    assert rep["evidence"]["streaming_share"] == 1.0 and rep["evidence"]["batch_close_together"] > 0.9
    assert "continuous (iteration-level) batching" in rep["levers"][0]["rationale"]


def test_chunked_prefill_needs_prompts_longer_than_a_chunk() -> None:
    """Slow gaps beside whole prefills are chunked prefill's only where those prompts are longer than
    one chunk: a prompt of at most a chunk is one engine step with chunking on or off (a CI run of the
    llama.cpp many-slots scenario, 8-token prompts, was given chunked prefill for a running batch too large)."""
    from stagescope.analysis.llm_levers import CHUNK_TOKENS

    inc, rep = _incident("llm-prefill-interference-unchunked")
    assert rep["evidence"]["slow_gap_chunkable_share"] >= 0.6  # the rest overlap only short prompts
    assert rep["verdict"]["lever"] == N.LEVER_CHUNKED_PREFILL
    assert f"beside a prompt longer than one {CHUNK_TOKENS}-token chunk" in rep["levers"][0]["rationale"]
    # the same gaps and prefills, every prompt recorded as one chunk at most
    req = {**inc.data.requests, "input_tokens": np.minimum(inc.data.requests["input_tokens"], CHUNK_TOKENS)}
    con = duckdb.connect()
    S.to_tables(con, dataclasses.replace(inc.data, requests=req))
    rep = analyze(con, inc.slo)
    assert rep["evidence"]["slow_gap_to_prefill"] >= 0.9  # the gaps still cover whole prefills
    assert rep["evidence"]["slow_gap_chunkable_share"] == 0.0
    assert N.LEVER_CHUNKED_PREFILL not in {lv["lever"] for lv in rep["levers"]}, rep["levers"]


def _old_interference_conditions(ev: dict[str, Any]) -> bool:
    """The separate-prefill-decode condition before the matched excess: slow gaps overlap a prefill
    (0.6, twice the normal gaps' share), each a fraction (under half) of the prefill it overlaps."""
    slow, normal, ratio = (ev[k] for k in ("slow_gap_prefill_overlap", "normal_gap_prefill_overlap",
                                           "slow_gap_to_prefill"))  # fmt: skip
    return slow >= 0.6 and slow >= 2 * normal and ratio < 0.5


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_prompts_beside_a_large_batch_are_not_prefill_interference(seed: int) -> None:
    """The SIMULATED engine with short prompts (8-32 tokens, ~2 ms of a step) arriving in groups beside
    a running batch that costs 1 ms per stream: slow gaps overlap the groups' prefills and are a fraction
    of each prefill window (it holds the wait for its step), as in llama.cpp's many-slots run, but the
    steps are slow for the batch they carry. Overlap alone named separate prefill and decode pools; the
    gaps at the same running batch beside no prefill are as slow, so the batch's lever is chosen."""
    inc, rep = _incident("llm-short-prompts-large-batch", seed=seed)
    ev = rep["evidence"]
    assert rep["status"] == N.STATUS_BREACHED
    assert _old_interference_conditions(ev), ev  # what fired before
    assert ev["overlap_prompt_tokens"] <= 32 and ev["slow_gap_chunkable_share"] == 0.0
    assert ev["slow_gap_prefill_excess"] < 0.2 and ev["slow_gap_matched_share"] >= 0.6
    assert rep["verdict"] == {"stage": N.STAGE_DECODE, "lever": N.LEVER_REDUCE_BATCH_TOKENS}, rep["levers"]
    named = _levers(rep)
    assert N.LEVER_SEPARATE_PREFILL_DECODE not in named and N.LEVER_CHUNKED_PREFILL not in named
    assert ev["batch_slope_ms"] == pytest.approx(W.PHYSICS_VARIANTS[inc.data.scenario.name][1].per_seq_ms, rel=0.15)


def test_prompts_of_one_chunk_that_double_the_step_get_separate_pools() -> None:
    """Prompts of at most one chunk (150-256 tokens) that double the steps they ride in: chunking cannot
    split them (the chunked-prefill rule stays off), the matched excess says the prefills are most of the
    slow gaps, so separate prefill and decode pools, the rationale saying why not chunking, and the
    prediction near the generator's gaps without the prompts' cost."""
    inc, rep = _incident("llm-chunk-sized-prompts")
    ev = rep["evidence"]
    assert ev["slow_gap_to_prefill"] >= 0.9 and ev["slow_gap_chunkable_share"] == 0.0  # one step each
    assert ev["slow_gap_prefill_excess"] >= 0.6
    assert rep["verdict"] == {"stage": N.STAGE_DECODE, "lever": N.LEVER_SEPARATE_PREFILL_DECODE}, rep["levers"]
    why = rep["levers"][0]["rationale"]
    assert "(only 0% of the slow gaps beside a prompt longer than one 256-token chunk" in why
    assert N.LEVER_CHUNKED_PREFILL not in _levers(rep)
    assert rep["levers"][0]["predicted_p99_ms"] == pytest.approx(inc.true_quantile(), rel=0.10)


def test_the_running_batch_is_matched_per_stream_and_unknown_claims_no_interference() -> None:
    """Without per-gap running batches the stream's mean batch is matched on (the reference service
    records only that) and the interference incident keeps its lever; with no running batch at all the
    prefill's cost cannot be told from the batch's, and no interference is claimed."""
    inc, _ = _incident("llm-prefill-interference")
    gaps = {k: v for k, v in inc.data.gaps.items() if k != "running"}
    con = duckdb.connect()
    S.to_tables(con, dataclasses.replace(inc.data, gaps=gaps))
    rep = analyze(con, inc.slo)
    assert rep["evidence"]["gap_running_per_gap"] is False and rep["evidence"]["slow_gap_prefill_excess"] >= 0.5
    assert rep["verdict"]["lever"] == N.LEVER_SEPARATE_PREFILL_DECODE
    assert "(per stream)" in rep["levers"][0]["rationale"]
    req = {k: v for k, v in inc.data.requests.items() if k != "batch_size"}  # no batch recorded
    S.to_tables(con, dataclasses.replace(inc.data, gaps=gaps, requests=req, metrics=[]))
    rep = analyze(con, inc.slo)
    assert rep["evidence"]["slow_gap_prefill_overlap"] >= 0.9  # the overlap is still there ...
    assert rep["evidence"]["slow_gap_prefill_excess"] is None  # ... but not what it costs
    assert N.LEVER_SEPARATE_PREFILL_DECODE not in _levers(rep)


def test_per_gap_running_batches_are_read_from_otlp_spans(tmp_path: Path) -> None:
    from stagescope.analysis.ingest import load_dataset

    inc = W.generate("llm-short-prompts-large-batch", 900, seed=4, duration_s=72.0)
    traces = tmp_path / "t.jsonl"
    S.write_otlp(inc.data, traces)
    ds = load_dataset(traces=[traces])
    try:
        rep = analyze(ds, inc.slo)
    finally:
        ds.close()
    ev = rep["evidence"]
    assert ev["gap_running_per_gap"] is True and ev["slow_gap_prefill_excess"] < 0.2
    assert rep["verdict"] == {"stage": N.STAGE_DECODE, "lever": N.LEVER_REDUCE_BATCH_TOKENS}


def test_cascade_follows_a_rejected_quantize_with_the_measured_escalation_rate() -> None:
    inc, rep = _incident("predict-large-model")
    first, chosen = rep["levers"][0], rep["levers"][1]
    assert first["lever"] == N.LEVER_QUANTIZE and first["acceptable"] is False  # 3 points > the 1-point budget
    assert chosen["lever"] == N.LEVER_CASCADE_SMALL_MODEL and chosen["acceptable"] is True
    rate = float(np.mean(inc.parts["escalated"]))
    assert rep["evidence"]["escalation_rate"] == pytest.approx(rate, abs=1e-3)
    assert f"{rate:.1%} of requests escalate" in chosen["rationale"]
    # the plan composes it with the escalated requests' added time kept (they pay both models)
    assert rep["plan"][0]["lever"] == N.LEVER_CASCADE_SMALL_MODEL
    assert rep["plan"][0]["predicted_quantile_ms"] == pytest.approx(chosen["predicted_p99_ms"], rel=1e-3)
    # without the attribute the rate is unknown, and said so: no effect model
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    rep = analyze(con, inc.slo)
    chosen = next(x for x in rep["levers"] if x["lever"] == N.LEVER_CASCADE_SMALL_MODEL)
    assert chosen["predicted_p99_ms"] is None and "escalation rate is unknown" in chosen["rationale"]
    assert "measure" in chosen["rationale"]
    # no small model measured and no attribute: no cascade, the next lever after quantize
    data = dataclasses.replace(inc.data, metrics=[m for m in inc.data.metrics
                                                  if N.LEVER_CASCADE_SMALL_MODEL not in m[1].values()])  # fmt: skip
    S.to_tables(con, data)
    assert N.LEVER_CASCADE_SMALL_MODEL not in _levers(analyze(con, inc.slo))


def test_escalations_are_read_from_otlp_spans(tmp_path: Path) -> None:
    from stagescope.analysis.ingest import load_dataset

    inc = W.generate("predict-large-model", 800, seed=2)
    traces, metrics = tmp_path / "t.jsonl", tmp_path / "m.prom"
    S.write_otlp(inc.data, traces)
    S.write_metrics(inc.data, metrics)
    ds = load_dataset(traces=[traces], metrics=[metrics])
    try:
        rep = analyze(ds, inc.slo)
    finally:
        ds.close()
    assert rep["verdict"] == {"stage": N.STAGE_COMPUTE, "lever": N.LEVER_CASCADE_SMALL_MODEL}
    assert rep["evidence"]["escalation_rate"] == pytest.approx(float(np.mean(inc.parts["escalated"])), abs=1e-3)
    assert rep["evidence"]["escalation_known_share"] == 1.0


def test_cost_effects_have_their_signs() -> None:
    from stagescope.analysis import workload_levers as WL

    _, rep = _incident("predict-large-model")
    ev = rep["evidence"] | {"model": rep["model_quality"]}
    got = WL.cost_effect(duckdb.connect(), None, None, ev, N.LEVER_CASCADE_SMALL_MODEL)  # type: ignore[arg-type]
    assert got["work_factor"] == pytest.approx(0.2 + ev["escalation_rate"], abs=1e-3) and got["sign"] == "-"
    assert WL.cost_effect(duckdb.connect(), None, None, {}, N.LEVER_SEPARATE_PREFILL_DECODE)["sign"] == "+"  # type: ignore[arg-type]


# -- none of the existing scenarios fires a new lever ------------------------------------------------
@pytest.mark.parametrize("name", [*S.SCENARIOS, S.LLM_HEALTHY.name])
def test_no_new_lever_on_the_reference_scenarios(name: str) -> None:
    data = S.generate(name, 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert not _levers(rep) & NEW, name
    if data.scenario.lever is not None:
        assert rep["verdict"]["lever"] == data.scenario.lever
    if data.scenario.route == S.GENERATE:  # every SLI of a streaming route
        for slo in ("ttft:p95<500ms", "itl:p99<40ms", "p95<900ms"):
            assert not _levers(analyze(con, slo)) & NEW, (name, slo)


@pytest.mark.parametrize("name", list(MULTI))
def test_no_new_lever_on_the_multi_cause_incidents(name: str) -> None:
    inc = generate_multi(name, 1500, seed=2)
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    rep = analyze(con, inc.data.scenario.slo)
    assert not _levers(rep) & NEW  # (their plans' order is tests/test_analysis_plan.py's)


def _engine_fault_slos(tl: Any) -> list[str]:
    return ["ttft:p95<500ms", f"p95<{float(np.quantile(tl.e2e, 0.5)) * 1.6:.0f}ms"]


@pytest.mark.parametrize("layout", ["standalone", "fastapi-sibling", "fastapi-child", "gateway"])
def test_no_new_lever_on_the_engine_faults(tmp_path: Path, layout: str) -> None:
    from stagescope.analysis.ingest import load_dataset
    from stagescope.analysis.synth import write_otlp_lines
    from stagescope.analysis.synth_engines import FAULTS, timelines, vllm_spans

    for fault in FAULTS:
        outer = layout != "standalone"
        tl = timelines(600, fault, seed=1, pre_ms=8.0 if outer else 0.0, post_ms=3.0 if outer else 0.0)
        f = tmp_path / f"{fault}.jsonl"
        write_otlp_lines(f, vllm_spans(tl, layout=layout))
        ds = load_dataset(traces=[f])
        try:
            for slo in _engine_fault_slos(tl):
                rep = analyze(ds, slo)
                assert not _levers(rep) & NEW, (fault, layout, slo, _levers(rep))
                if fault == "prefill" and slo.startswith("ttft"):
                    # long prompts at the normal per-token cost, but no per-gap samples to see whether the
                    # engine interleaves them: chunked prefill (a flag) first, the budget named after it
                    assert rep["verdict"]["lever"] == N.LEVER_CHUNKED_PREFILL
                    assert f"set a prompt-length budget ({N.LEVER_CAP_PROMPT_TOKENS}" in rep["levers"][0]["rationale"]
        finally:
            ds.close()


def test_llm_long_prompts_keeps_chunked_prefill() -> None:
    """Short prompts waiting behind long ones: chunked prefill, not a prompt budget (the budget's
    evidence says why: most slow requests are short prompts)."""
    data = S.generate("llm-long-prompts", 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert rep["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_CHUNKED_PREFILL}
    assert rep["evidence"]["long_prompt_share_tail"] < 0.5


def test_llama_long_prompts_physics_keeps_chunked_prefill() -> None:
    """The llama.cpp scenario's workload (its table: rate, prompt sizes, one long prompt in
    ``long_prompt_every``, the SLO) on llama.cpp's physics as its module states them (0.8 ms per
    prompt token, a whole prompt of up to --batch-size tokens in one step, 8 slots), SIMULATED here
    without the server: first tokens of the requests arriving during a long prompt's step wait for it,
    and the verdict stays chunked prefill."""
    from stagescope.service.llama_cpp.scenarios import LLAMA_SCENARIOS

    sc = LLAMA_SCENARIOS["llama-long-prompts"]
    wl, rng, n = sc.workload, np.random.default_rng(4), 900
    t = np.cumsum(rng.exponential(1.0 / sc.rate_rps, n))
    prompt = np.full(n, wl.prompt_tokens)
    prompt[wl.long_prompt_every // 2 :: wl.long_prompt_every] = wl.long_prompt_tokens
    out = np.full(n, wl.max_tokens)
    own = 0.8 * prompt * np.exp(rng.normal(0, 0.05, n))  # one step: the whole prompt
    busy = np.zeros(n)  # ms a request's prompt step waits for a long step in progress
    for i in np.flatnonzero(prompt == wl.long_prompt_tokens):
        end = t[i] * 1000 + own[i]
        later = (t * 1000 > t[i] * 1000) & (t * 1000 < end)
        busy[later] = np.maximum(busy[later], end - t[later] * 1000)
    prefill = own + busy
    gaps = [2.0 * 8 * np.exp(rng.normal(0, 0.05, k - 1)) for k in out]
    scen = S.Scenario("llama-long-prompts-sim", S.GENERATE, sc.slo.spec, N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL)
    data = W._llm_data(scen, rng, 1_764_460_800 * 10**9, t, {"input_tokens": prompt, "output_tokens": out},
                       [(N.STAGE_QUEUE, rng.exponential(2, n)), (N.STAGE_PREFILL, prefill)], gaps, np.full(n, 8.0))  # fmt: skip
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, sc.slo.spec)
    assert rep["status"] == N.STATUS_BREACHED
    assert rep["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_CHUNKED_PREFILL}, rep["evidence"]
    assert not _levers(rep) & NEW


def test_long_batch_wait_on_the_predict_route_keeps_cap_batch_wait() -> None:
    data = S.generate("long-batch-wait", 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert rep["verdict"] == {"stage": N.STAGE_BATCH_WAIT, "lever": N.LEVER_CAP_BATCH_WAIT}
    assert rep["evidence"]["streaming_share"] == 0.0


def test_the_levers_have_their_names_and_phases() -> None:
    phases = {lever: name for name, levers in N.LEVER_PHASES for lever in levers}
    assert all(lv in N.LEVERS for lv in NEW)
    assert phases[N.LEVER_CAP_PROMPT_TOKENS] == phases[N.LEVER_CASCADE_SMALL_MODEL] == "per-request-cost"
    assert phases[N.LEVER_CONTINUOUS_BATCHING] == "batching"
    assert phases[N.LEVER_SEPARATE_PREFILL_DECODE] == "capacity"


@pytest.mark.parametrize("name", ["llm-static-batches", "llm-long-contexts"])
def test_json_and_text_reports_carry_the_lever_and_its_rationale(name: str) -> None:
    import json

    from stagescope.analysis.report import to_json, to_text

    inc, rep = _incident(name, seed=4)
    lever = inc.data.scenario.lever
    doc = json.loads(to_json(rep))
    first = doc["levers"][0]
    assert first["lever"] == lever and "Predicted:" in first["rationale"] and first["predicted_p99_ms"] is not None
    text = to_text(rep)
    assert lever in text and first["rationale"][:60] in text
