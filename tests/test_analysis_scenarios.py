"""Every reference-service scenario, synthesized independently of the service with a known root cause,
in our span format and (LLM scenarios) in vLLM's: the analysis must name the true stage and lever."""

from __future__ import annotations

import duckdb
import pytest

from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze

N = 1200


def _check(rep: dict, sc: S.Scenario) -> None:  # type: ignore[type-arg]
    if sc.stage is None:
        assert not rep["breached"] and rep["verdict"] is None and rep["levers"] == []
        return
    assert rep["breached"], rep["quantile_ms"]
    assert rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}, rep["attribution"][:3]
    assert rep["attribution"][0]["stage"] == sc.stage and rep["attribution"][0]["share"] > 0.5
    first = rep["levers"][0]
    assert first["lever"] == sc.lever
    # the lever is predicted to bring the SLO quantile back under the threshold
    assert first["predicted_p99_ms"] < rep["slo"]["threshold_ms"] < rep["quantile_ms"]


@pytest.mark.parametrize("name", list(S.SCENARIOS))
def test_scenario_on_tables(name: str) -> None:
    data = S.generate(name, N, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    _check(analyze(con, data.scenario.slo), data.scenario)


FLAVORS = [(n, "stagescope") for n in S.SCENARIOS] + [
    (n, "vllm") for n, sc in S.SCENARIOS.items() if sc.route == S.GENERATE
]


@pytest.mark.parametrize(("name", "flavor"), FLAVORS)
def test_scenario_from_otlp_files(tmp_path, name: str, flavor: str) -> None:  # type: ignore[no-untyped-def]
    from stagescope.analysis.ingest import load_dataset

    data = S.generate(name, 600, seed=5)
    traces = tmp_path / f"{name}.jsonl"
    metrics = tmp_path / f"{name}.prom"
    S.write_otlp(data, traces, flavor=flavor)
    S.write_metrics(data, metrics)
    ds = load_dataset(traces=[traces], metrics=[metrics])
    try:
        rep = analyze(ds, data.scenario.slo)
    finally:
        ds.close()
    assert rep["requests"] == 600
    _check(rep, data.scenario)


def test_long_prompts_on_an_engine_that_falls_behind_queue_up_linearly() -> None:
    """At 50 requests/s the long prefills overlap: a request waits for the last one holding the engine
    at its arrival, once (the waits used to add up, and the prefills grew to 1e45 ms, past int64 ns)."""
    import numpy as np

    data = S.generate("llm-long-prompts", 6000, seed=5)
    ttft = np.asarray(data.requests["ttft_ms"], dtype=float)
    assert np.isfinite(ttft).all()
    # a queue that grows linearly: no request waits longer than the run (120 s) plus all the long
    # prefills back to back (150 of them, at most 15 + 0.12 ms x 9,000 tokens x e^(4 sigma) each)
    assert ttft.max() < 120_000 + 150 * (15 + 0.12 * 9000 * np.exp(4 * 0.05))
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert rep["verdict"] == {"stage": "prefill", "lever": "chunked-prefill"}
