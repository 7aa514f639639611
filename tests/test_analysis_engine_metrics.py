"""vLLM's and SGLang's metrics summed right (issue 16, deliverable 3, acceptance item 3): per-request
means and counts from two data-parallel engines, from several scrapes of one server (a time series,
restarts counted), from before/after snapshots and from two instances, within 2 % of the truth.
The scrapes are SIMULATED (analysis/synth_engine_metrics.py); the real DataDog-transcribed vLLM
scrape still reads the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stagescope import names as N
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.ingest.engine_metrics import (
    engine_metric_facts,
    sglang_stage_means,
    vllm_stage_means,
)
from stagescope.analysis.synth_engine_metrics import Window, sglang_scrape, vllm_scrape, window
from stagescope.analysis.synth_engines import timelines

REAL = (
    Path(__file__).resolve().parent.parent / "external" / "prometheus" / "vllm" / "datadog_vllm_metrics.txt"
)
TL = timelines(900, "queue", seed=3, duration_s=300)
T0 = int(TL.t0_ns.min() // 10**6)


def _means(tmp_path: Path, texts: list[str]) -> dict[str, Any]:
    files = []
    for i, t in enumerate(texts):
        f = tmp_path / f"scrape{i}.prom"
        f.write_text(t)
        files.append(f)
    ds = load_dataset(metrics=files)
    try:
        (row,) = vllm_stage_means(ds.con)
        return row
    finally:
        ds.close()


def _close(row: dict[str, Any], truth: Window, n_series: int) -> None:
    assert row["requests"] == pytest.approx(truth.requests, rel=0.02) and row["engines"] == n_series
    for part in ("queue", "prefill", "decode", "ttft", "e2e"):
        assert row[f"{part}_ms"] == pytest.approx(getattr(truth, f"{part}_ms"), rel=0.02), part


def test_two_data_parallel_engines_are_summed(tmp_path: Path) -> None:
    row = _means(tmp_path, [vllm_scrape(TL, engines=2)])
    _close(row, window(TL), 2)
    # one engine's series alone (what the analysis read before) is not the truth
    one = _means(
        tmp_path, ["\n".join(x for x in vllm_scrape(TL, engines=2).splitlines() if 'engine="1"' not in x)]
    )
    assert one["requests"] < 0.6 * window(TL).requests


def test_two_timestamped_scrapes_of_one_server_are_a_time_series(tmp_path: Path) -> None:
    row = _means(tmp_path, [vllm_scrape(TL, until_s=100, ts_ms=T0 + 100_000),
                            vllm_scrape(TL, until_s=250, ts_ms=T0 + 250_000)])  # fmt: skip
    _close(row, window(TL, 100, 250), 2)


def test_a_restart_between_scrapes_counts_from_zero(tmp_path: Path) -> None:
    """The server restarts at 150 s: the scrape at 170 s reads less than the one at 100 s (a reset),
    so the increase counts from zero there, as PromQL's increase does (what finished between 100 s
    and the restart is lost with the counters)."""
    row = _means(tmp_path, [
        vllm_scrape(TL, until_s=100, ts_ms=T0 + 100_000),
        vllm_scrape(TL, since_s=150, until_s=170, ts_ms=T0 + 170_000),
        vllm_scrape(TL, since_s=150, until_s=250, ts_ms=T0 + 250_000),
    ])  # fmt: skip
    _close(row, window(TL, 150, 250), 2)


def test_before_and_after_snapshots_without_timestamps(tmp_path: Path) -> None:
    row = _means(tmp_path, [vllm_scrape(TL, until_s=60), vllm_scrape(TL, until_s=280)])
    _close(row, window(TL, 60, 280), 2)


def test_instances_of_a_prometheus_scrape_are_summed(tmp_path: Path) -> None:
    a = timelines(500, "none", seed=11, duration_s=300)
    b = timelines(700, "queue", seed=12, duration_s=300)
    row = _means(tmp_path, [vllm_scrape(a, engines=1, instance="10.0.0.1:8000"),
                            vllm_scrape(b, engines=2, instance="10.0.0.2:8000")])  # fmt: skip
    wa, wb = window(a), window(b)
    assert row["requests"] == wa.requests + wb.requests and row["engines"] == 3
    assert row["queue_ms"] == pytest.approx(
        (wa.queue_ms * wa.requests + wb.queue_ms * wb.requests) / (wa.requests + wb.requests), rel=1e-6
    )


def test_sglang_per_stage_latencies_and_ranks(tmp_path: Path) -> None:
    f = tmp_path / "sglang.prom"
    f.write_text(sglang_scrape(TL, dp_ranks=2, waiting=3.0, cache_hit_rate=0.25))
    ds = load_dataset(metrics=[f])
    (row,) = sglang_stage_means(ds.con)
    w = window(TL)
    assert row["requests"] == w.requests and row["series"] == 2
    assert row["queue_ms"] == pytest.approx(w.queue_ms, rel=0.02)
    assert row["stages"]["prefill_forward"] == pytest.approx(w.prefill_ms, rel=0.02)
    ev = engine_metric_facts(ds.con)
    assert ev["engine"] == N.SOURCE_SGLANG and ev["waiting_mean"] == 6.0  # 3 per rank, summed
    assert ev["prefix_cache_hit_ratio"] == pytest.approx(0.25)
    ds.close()


def test_real_vllm_scrape_reads_as_before() -> None:
    ds = load_dataset(metrics=[REAL])
    (row,) = vllm_stage_means(ds.con)
    assert row["requests"] == 6 and row["engines"] == 1
    assert row["prefill_ms"] == pytest.approx(35.6674, rel=1e-4) and row["decode_ms"] == pytest.approx(
        103.9565, rel=1e-4
    )
    ev = engine_metric_facts(ds.con)
    assert ev["prefix_caching_enabled"] is False and ev["preemptions"] == 0
    ds.close()


def test_vllm_before_the_queue_histogram_counts_requests_from_e2e(tmp_path: Path) -> None:
    """vLLM releases before ``vllm:request_queue_time_seconds`` (V0 < 0.6) export TTFT, the per-token
    histogram and e2e only: the model still has its requests (the e2e count) and means, and the
    engine evidence says vLLM, instead of the model being dropped as if nothing was scraped. Built
    from the real scrape with its queue, prefill, decode and inference families cut out."""
    dropped = (N.VLLM_QUEUE_TIME, N.VLLM_PREFILL_TIME, N.VLLM_DECODE_TIME, N.VLLM_INFERENCE_TIME)
    text = "\n".join(line for line in REAL.read_text().splitlines() if not any(d in line for d in dropped))
    f = tmp_path / "vllm-0.5.prom"
    f.write_text(text + "\n")
    ds = load_dataset(metrics=[f])
    (row,) = vllm_stage_means(ds.con)
    # independent: the file's vllm:e2e_request_latency_seconds_count 1.0, _sum 0.5034303665161133
    assert (
        row["requests"] == 1 and row["e2e_ms"] == pytest.approx(503.4303665161133) and row["queue_ms"] is None
    )
    assert engine_metric_facts(ds.con)["engine"] == N.SOURCE_VLLM
    ds.close()


def test_waiting_and_running_are_the_slo_models_own(tmp_path: Path) -> None:
    """Two models on one scrape (two vLLM servers behind one Prometheus job): the waiting and running
    gauges of an SLO for one model are that model's engines' (summed over its two DP ranks), not
    every model's; with no model they are every engine's."""
    ts = (1_764_000_000_000, 1_764_000_015_000)
    lines = [f"# TYPE {N.VLLM_NUM_WAITING} gauge", f"# TYPE {N.VLLM_NUM_RUNNING} gauge"]
    for model, waiting, running in (("a", (1, 3), (4, 4)), ("b", (10, 30), (40, 60))):
        for rank in ("0", "1"):
            lab = f'{N.VLLM_LABEL_MODEL}="{model}",engine="{rank}"'
            for t, w, r in zip(ts, waiting, running, strict=True):
                lines += [f"{N.VLLM_NUM_WAITING}{{{lab}}} {w}.0 {t}", f"{N.VLLM_NUM_RUNNING}{{{lab}}} {r}.0 {t}"]
    f = tmp_path / "two-models.prom"
    f.write_text("\n".join(lines) + "\n")
    ds = load_dataset(metrics=[f])
    a, b, every = engine_metric_facts(ds.con, "a"), engine_metric_facts(ds.con, "b"), engine_metric_facts(ds.con)
    # independent: per timestamp the model's two ranks summed, then the mean / max over the two scrapes
    assert (a["waiting_mean"], a["waiting_max"], a["running_mean"]) == (4.0, 6.0, 8.0)
    assert (b["waiting_mean"], b["waiting_max"], b["running_mean"]) == (40.0, 60.0, 100.0)
    assert (every["waiting_mean"], every["waiting_max"]) == (44.0, 66.0)
    ds.close()
