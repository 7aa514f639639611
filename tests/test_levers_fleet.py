"""The fleet levers (issue 18, deliverable 1): scale on queue depth instead of CPU, concurrency
limits, KV-cache-aware routing, and the existing prefix-caching, cap-output-tokens and
kv-cache-headroom levers. Each fires alone on its own SYNTHETIC incident (analysis/synth_fleet.py)
with its prediction within 10 % of the generator's truth where it has a model, and the new ones
fire on none of the existing scenarios."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
from results_support import write_shared_prompt_run

from stagescope import names as N
from stagescope.analysis import synth_fleet as F
from stagescope.analysis import synth_multi as M
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.report import to_text
from stagescope.analysis.synth import write_otlp_lines
from stagescope.analysis.synth_engine_metrics import vllm_scrape
from stagescope.analysis.synth_engines import FAULTS, LAYOUTS, sglang_spans, timelines, vllm_spans
from stagescope.slo import load_slo_file, parse_slo

NEW = (N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_CONCURRENCY_LIMIT, N.LEVER_KV_CACHE_AWARE_ROUTING)
_KSM = (N.KSM_HPA_SPEC_TARGET_METRIC, N.KSM_HPA_SPEC_MAX_REPLICAS, N.KSM_HPA_SPEC_MIN_REPLICAS,
        N.KSM_HPA_CURRENT_REPLICAS, N.KSM_HPA_DESIRED_REPLICAS)  # fmt: skip


def _run(data: S.SynthData, slo: Any = None) -> dict[str, Any]:
    con = duckdb.connect()
    S.to_tables(con, data)
    return analyze(con, slo or data.scenario.slo)


def _fired(rep: dict[str, Any]) -> set[str]:
    return {lv["lever"] for lv in rep["levers"] if lv["lever"] is not None}


def _without(data: S.SynthData, metrics: tuple[str, ...]) -> S.SynthData:
    return dataclasses.replace(data, metrics=[m for m in data.metrics if m[0] not in metrics])


@pytest.mark.parametrize("name", list(F.FLEET))
def test_each_fleet_incident_fires_its_lever_alone_near_the_truth(name: str) -> None:
    inc = F.generate_fleet(name, seed=3)
    sc = inc.data.scenario
    rep = _run(inc.data)
    assert rep["status"] == N.STATUS_BREACHED
    assert rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}
    assert _fired(rep) == {sc.lever}  # no other lever on any stage
    (lv,) = [lv for lv in rep["levers"] if lv["lever"] == sc.lever]
    pred = lv["predicted_p99_ms"]
    if sc.lever == N.LEVER_CONCURRENCY_LIMIT:
        assert pred is None and "no effect model" in lv["rationale"] and "measure after applying" in lv["rationale"]
        return
    setting = None
    if sc.lever == N.LEVER_CAP_OUTPUT_TOKENS:
        got = re.search(r"output tokens capped at (\d+)", lv["rationale"])
        assert got is not None
        setting = float(got.group(1))
    truth = inc.true_quantile(setting)
    assert pred == pytest.approx(truth, rel=0.10), (pred, truth)
    assert rep["quantile_ms"] > rep["slo"]["threshold_ms"] >= truth


def test_rationales_cite_the_measured_numbers_in_json_and_text() -> None:
    checks = {
        "fleet-hpa-on-cpu": ("cpu (utilization)", "kube_horizontalpodautoscaler_spec_target_metric",
                             "max replicas 6", "replicas 2 -> 4"),
        "fleet-overcommitted": ("gpu_memory_utilization is already 0.95", "40000 tokens", "preempted 160 times",
                                "up to 96.0 running requests per engine"),
        "fleet-prefix-spread": ("instance=10.0.0.1:8000,engine=0 63%", "instance=10.0.0.2:8000,engine=0 0%",
                                "spread 0.63", "routingLogic kvaware", "--policy cache_aware"),
    }  # fmt: skip
    for name, needles in checks.items():
        rep = _run(F.generate_fleet(name, seed=3).data)
        why = rep["levers"][0]["rationale"]
        for needle in needles:
            assert needle in why, (name, needle, why)
        assert why in json.loads(json.dumps(rep, default=str))["levers"][0]["rationale"]
        if name == "fleet-overcommitted":  # the cap: the streams 2,500 blocks of 16 tokens hold at the tail's length
            ev = rep["evidence"]
            fit = 40000 / (ev["input_tokens_tail"] + ev["output_tokens_tail"])
            assert ev["kv_fit_streams"] == pytest.approx(fit, abs=0.1)
            assert f"vLLM --max-num-seqs {int(fit)} (the streams the cache holds)" in why
        text = to_text(rep)
        assert rep["levers"][0]["lever"] in text and needles[0] in text


def test_prefix_models_read_the_load_generators_prompts_where_the_spans_carry_none(tmp_path: Path) -> None:
    """vLLM's spans carry no input hash: the repeats are the prompts the load generator sent again
    (results.parquet), as the evidence reads them; the long shared prompts then prefill like a hit."""
    tl = timelines(600, "prefill", seed=1)
    traces, results = write_shared_prompt_run(tl, tmp_path)
    (tmp_path / "m.prom").write_text(vllm_scrape(tl, prefix_caching=False))
    ds = load_dataset(traces=[traces], metrics=[tmp_path / "m.prom"], results=[results])
    rep = analyze(ds, "ttft:p95<500ms")
    ds.close()
    (lv,) = rep["levers"]
    assert lv["lever"] == N.LEVER_PREFIX_CACHING and "every repeated prompt served from the prefix cache" in lv["rationale"]
    # every repeat of the shared document (all but its first) at most the baseline's prefill: the tail is gone
    assert lv["predicted_p99_ms"] < 0.5 * rep["quantile_ms"] and lv["predicted_p99_ms"] < 500


def test_per_replica_prefix_hits_leave_the_summed_ratio_as_it_was() -> None:
    inc = F.generate_fleet("fleet-prefix-spread", seed=3)
    ev = _run(inc.data)["evidence"]
    q = sum(v for m, _, v, ts in inc.data.metrics if m == N.VLLM_PREFIX_CACHE_QUERIES and ts > inc.data.metrics[0][3])
    h = sum(v for m, _, v, ts in inc.data.metrics if m == N.VLLM_PREFIX_CACHE_HITS and ts > inc.data.metrics[0][3])
    assert ev["prefix_cache_hit_ratio"] == pytest.approx(h / q, abs=1e-4)  # summed over the three replicas
    by = ev["prefix_hit_ratio_by_replica"]
    assert ev["prefix_hit_replicas"] == 3 and len(by) == 3
    assert by["instance=10.0.0.1:8000,engine=0"] > 0.5 and by["instance=10.0.0.2:8000,engine=0"] == 0.0
    # one replica: no per-replica view, and with the cache off prefix caching, not routing
    off = _run(F.generate_fleet("fleet-prefix-off", seed=3).data)
    assert "prefix_hit_ratio_by_replica" not in off["evidence"] and off["verdict"]["lever"] == N.LEVER_PREFIX_CACHING


def test_seed_001_without_the_hpa_series_keeps_scale_out() -> None:
    """The seed's incident says the HPA scales on CPU: queue-depth scaling (test_analysis_plan). The same
    traffic without that evidence: scale-out, with the same prediction and the same plan after it."""
    inc = M.generate_multi("llm-seed-001", 1500, seed=3)
    with_hpa = _run(inc.data)
    bare = _run(_without(inc.data, _KSM))
    assert [s["lever"] for s in bare["plan"]] == [N.LEVER_SCALE_OUT, N.LEVER_REDUCE_BATCH_TOKENS]
    assert [s["lever"] for s in with_hpa["plan"]] == [N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_REDUCE_BATCH_TOKENS]
    for a, b in zip(bare["plan"], with_hpa["plan"], strict=True):
        assert a["predicted_quantile_ms"] == pytest.approx(b["predicted_quantile_ms"], abs=0.01)
    assert abs(with_hpa["plan"][-1]["predicted_quantile_ms"] - 370) <= 0.10 * 370
    assert with_hpa["plan"][0]["setting"].startswith(f"autoscaler metric cpu (utilization) -> {N.METRIC_QUEUE_DEPTH}")


def test_the_slo_file_says_what_the_autoscaler_scales_on(tmp_path: Path) -> None:
    data = _without(F.generate_fleet("fleet-hpa-on-cpu", seed=3).data, _KSM)
    slo = parse_slo("ttft:p95<200ms")[0]
    assert _run(data, slo)["verdict"]["lever"] == N.LEVER_SCALE_OUT  # nothing says what it scales on
    on_cpu = _run(data, dataclasses.replace(slo, autoscaler_metric="cpu"))
    assert on_cpu["verdict"]["lever"] == N.LEVER_SCALE_ON_QUEUE_DEPTH
    assert on_cpu["evidence"]["autoscaler_source"] == "the SLO file (autoscaler_metric)"
    assert "replicas doubled (max replicas not scraped)" in on_cpu["levers"][0]["rationale"]
    on_queue = _run(data, dataclasses.replace(slo, autoscaler_metric=N.VLLM_NUM_WAITING))
    assert on_queue["verdict"]["lever"] == N.LEVER_SCALE_OUT
    f = tmp_path / "slo.yaml"
    f.write_text("slos:\n  - {name: gen, service: llm, sli: ttft, threshold_ms: 200, objective: 0.95,\n"
                 "     autoscaler_metric: memory}\n")  # fmt: skip
    (loaded,) = load_slo_file(f)
    assert loaded.autoscaler_metric == "memory" and loaded.to_dict()["autoscaler_metric"] == "memory"
    assert _run(data, loaded)["verdict"]["lever"] == N.LEVER_SCALE_ON_QUEUE_DEPTH


def test_an_hpa_at_its_max_or_on_a_queue_metric_gets_scale_out() -> None:
    inc = F.generate_fleet("fleet-hpa-on-cpu", seed=3)
    t0, dur = int(inc.data.requests["start_unix_ns"][0] // 10**6), 120.0
    base = _without(inc.data, _KSM)
    at_max = dataclasses.replace(base, metrics=base.metrics + F.hpa_series(t0, dur, current=6.0, max_replicas=6.0))
    assert _run(at_max)["verdict"]["lever"] == N.LEVER_SCALE_OUT
    queue = F.hpa_series(t0, dur, metric=N.VLLM_NUM_WAITING, target_type="average", target=5.0)
    assert _run(dataclasses.replace(base, metrics=base.metrics + queue))["verdict"]["lever"] == N.LEVER_SCALE_OUT
    # CPU and a queue metric together: it already sees the queue
    both = F.hpa_series(t0, dur) + queue
    assert _run(dataclasses.replace(base, metrics=base.metrics + both))["verdict"]["lever"] == N.LEVER_SCALE_OUT


def test_the_hpa_max_bounds_the_queue_depth_prediction() -> None:
    """2 replicas of at most 3: the autoscaler reaches x1.5, not x2; the prediction says so and is no
    better than doubling."""
    inc = F.generate_fleet("fleet-hpa-on-cpu", seed=3)
    t0 = int(inc.data.requests["start_unix_ns"][0] // 10**6)
    base = _without(inc.data, _KSM)
    capped = _run(dataclasses.replace(base, metrics=base.metrics + F.hpa_series(t0, 120.0, max_replicas=3.0)))
    free = _run(inc.data)
    (lc,), (lf,) = capped["levers"], free["levers"]
    assert "replicas 2 -> 3 (max replicas 3)" in lc["rationale"] and "replicas 2 -> 4" in lf["rationale"]
    assert lc["predicted_p99_ms"] >= lf["predicted_p99_ms"]
    m = re.search(r"executors (\d+) -> (\d+)", lc["rationale"])
    assert m is not None and int(m.group(2)) == int(1.5 * int(m.group(1)))


def test_memory_to_give_gets_kv_headroom_unless_the_streams_overcommit_the_cache() -> None:
    """KV pressure: with memory to give and no block count, KV headroom; the same with more streams
    admitted than the cache holds (num_gpu_blocks x block_size), a concurrency limit."""
    inc = F.generate_fleet("fleet-kv-headroom", seed=3)
    assert _run(inc.data)["verdict"]["lever"] == N.LEVER_KV_CACHE_HEADROOM

    def info(blocks: str) -> S.SynthData:
        m = [(k, {**lab, "num_gpu_blocks": blocks} if k == N.VLLM_CACHE_CONFIG_INFO else lab, v, ts)
             for k, lab, v, ts in inc.data.metrics]  # fmt: skip
        return dataclasses.replace(inc.data, metrics=m)

    assert _run(info("2500"))["verdict"]["lever"] == N.LEVER_CONCURRENCY_LIMIT  # 96 streams, ~55 fit
    roomy = _run(info("100000"))  # ~2,300 streams fit: the cache is not overcommitted
    assert roomy["verdict"]["lever"] == N.LEVER_KV_CACHE_HEADROOM and roomy["evidence"]["kv_fit_streams"] > 96


def test_a_lever_without_an_effect_model_is_said_so_in_the_plan() -> None:
    rep = _run(F.generate_fleet("fleet-overcommitted", seed=3).data)
    assert rep["plan"] == [] and rep["plan_status"] == N.PLAN_NOT_MET
    assert any("concurrency-limit" in s and "no effect model" in s for s in rep["plan_left"]["skipped"])


def _existing_reports(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name in [*S.SCENARIOS, S.LLM_HEALTHY.name]:
        data = S.generate(name, 1200, seed=3)
        out.append((name, _run(data)))
    for name in M.MULTI:
        out.append((name, _run(M.generate_multi(name, 1500, seed=3).data)))
    for fault in FAULTS:
        for layout in LAYOUTS:
            outer = layout != "standalone"
            tl = timelines(600, fault, seed=1, pre_ms=8.0 if outer else 0.0, post_ms=3.0 if outer else 0.0)
            f, prom = tmp_path / f"{fault}-{layout}.jsonl", tmp_path / f"{fault}-{layout}.prom"
            write_otlp_lines(f, vllm_spans(tl, layout=layout))
            prom.write_text(vllm_scrape(tl))
            ds = load_dataset(traces=[f], metrics=[prom])
            slo = "ttft:p95<500ms" if fault not in ("long-outputs", "slow-steps") else "p95<4000ms"
            out.append((f"vllm {fault} {layout}", analyze(ds, slo, route=None if layout == "standalone" else "/v1/chat/completions")))
            ds.close()
        tl = timelines(600, fault, seed=7)
        f = tmp_path / f"sglang-{fault}.jsonl"
        write_otlp_lines(f, sglang_spans(tl))
        ds = load_dataset(traces=[f])
        out.append((f"sglang {fault}", analyze(ds, "ttft:p95<500ms")))
        ds.close()
    return out


def test_the_new_levers_fire_on_none_of_the_existing_scenarios(tmp_path: Path) -> None:
    """Every synth_scenarios scenario, every synth_engines fault x layout (vLLM with its scrape; SGLang),
    every synth_multi incident: no new lever, except llm-seed-001's plan, whose first step the seed names
    (its HPA scales on CPU), and the other fleet incidents fire only their own."""
    seen = 0
    for name, rep in _existing_reports(tmp_path):
        fired = _fired(rep)
        if name == "llm-seed-001":
            assert fired & set(NEW) == {N.LEVER_SCALE_ON_QUEUE_DEPTH}
            continue
        assert not fired & set(NEW), (name, fired)
        seen += rep["status"] == N.STATUS_BREACHED
    assert seen >= 30
    for name in F.FLEET:
        lever = F.FLEET[name].lever
        assert _fired(_run(F.generate_fleet(name, seed=5).data)) == {lever}  # another seed: still alone


def test_sglangs_waiting_prefill_with_an_autoscaler_on_cpu_gets_queue_depth_scaling(tmp_path: Path) -> None:
    """SGLang without its stage slices: its prefill holds the wait queue (scale-out today); with the SLO
    file saying the autoscaler scales on CPU, queue-depth scaling instead."""
    tl = timelines(600, "queue", seed=7)
    f = tmp_path / "sglang.jsonl"
    write_otlp_lines(f, sglang_spans(tl, slices=False))
    ds = load_dataset(traces=[f])
    slo = parse_slo("ttft:p95<500ms")[0]
    assert analyze(ds, slo)["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_SCALE_OUT}
    rep = analyze(ds, dataclasses.replace(slo, autoscaler_metric="cpu"))
    ds.close()
    assert rep["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_SCALE_ON_QUEUE_DEPTH}
    assert "holds its wait queue" in rep["levers"][0]["rationale"] and rep["levers"][0]["predicted_p99_ms"] is not None
