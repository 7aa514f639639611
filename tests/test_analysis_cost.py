"""Cost (analysis.cost, analysis.cost_levers): accelerator-seconds per request from executor busy time
or utilization x time, priced with the SLO file's accelerator_price_per_hour per 1,000 requests and
per million output tokens; each lever's cost change (scale-out adds accelerators: positive); the
figures in JSON, text and HTML; a bad price is one line and exit 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import numpy as np
import pytest

from stagescope import names as N
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.report import to_html, to_json, to_text
from stagescope.cli import main
from stagescope.errors import UserError
from stagescope.slo import load_slo_file, parse_slo

PRICE = 2.5  # per accelerator-hour


def _incident(name: str, price: float | None = PRICE, n: int = 1200) -> tuple[dict, S.SynthData, duckdb.DuckDBPyConnection]:  # type: ignore[type-arg]
    data = S.generate(name, n, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    slos = [dataclasses.replace(s, accelerator_price_per_hour=price) for s in parse_slo(data.scenario.slo)]
    return analyze(con, slos), data, con


def _span_and_util(data: S.SynthData) -> tuple[float, float, int]:
    """Independently of analysis.cost: arrivals' span (s), mean GPU utilization (0-1) over the
    samples in it, requests in it."""
    t = np.asarray(data.requests["start_unix_ns"], dtype=np.int64) // 1_000_000
    t0, t1 = int(t.min()), int(t.max())
    util = [v for m, _, v, ts in data.metrics if m == N.DCGM_GPU_UTIL and ts is not None and t0 <= ts <= t1]
    return (t1 - t0) / 1000.0, float(np.mean(util)) / 100.0, len(t)


def test_scale_out_costs_more_and_the_figures_follow_from_utilization_and_price() -> None:
    rep, data, _ = _incident("saturated")
    c = rep["cost"]
    span_s, util, n = _span_and_util(data)
    assert c["basis"] == "utilization" and c["utilization"] == pytest.approx(util, abs=1e-4)
    acc = util * span_s / n  # accelerator-seconds per request (one GPU)
    assert c["accelerator_seconds_per_request"] == pytest.approx(acc, rel=1e-3)
    assert c["cost_per_1k_requests"] == pytest.approx(PRICE / 3600 * acc * 1000, rel=1e-3)
    # what the fleet costs per 1,000 requests, idle time included: one GPU for the whole span
    assert c["fleet_cost_per_1k_requests"] == pytest.approx(PRICE / 3600 * span_s / n * 1000, rel=1e-3)
    lever = rep["levers"][0]
    assert lever["lever"] == N.LEVER_SCALE_OUT
    cd = lever["cost_delta"]
    assert cd["sign"] == "+" and cd["relative"] == pytest.approx(1.0)  # executors doubled
    assert cd["per_1k_requests"] == pytest.approx(c["fleet_cost_per_1k_requests"], rel=1e-3) and cd["per_1k_requests"] > 0


def test_levers_that_save_accelerator_time_cost_less() -> None:
    rep, _, _ = _incident("slow-compute")
    cd = rep["levers"][0]["cost_delta"]
    assert rep["levers"][0]["lever"] == N.LEVER_QUANTIZE and cd["sign"] == "-" and cd["relative"] < 0
    rep, data, _ = _incident("repeated-inputs")
    cd = rep["levers"][0]["cost_delta"]
    hashes = list(data.requests["input_hash"])
    repeat_share = (len(hashes) - len(set(hashes))) / len(hashes)
    assert cd["relative"] == pytest.approx(-repeat_share, abs=1e-3) and cd["sign"] == "-"


def test_cost_per_million_output_tokens_on_a_generate_route() -> None:
    rep, data, _ = _incident("llm-decode-heavy")
    c = rep["cost"]
    tokens = float(np.mean(np.asarray(data.requests["output_tokens"], dtype=float)))
    assert c["output_tokens_per_request"] == pytest.approx(tokens, rel=1e-3)
    assert c["cost_per_million_output_tokens"] == pytest.approx(
        c["cost_per_1k_requests"] / 1000 / tokens * 1e6, rel=1e-3
    )


def test_executor_busy_time_is_preferred_over_utilization() -> None:
    _, data, con = _incident("saturated")
    t = np.asarray(data.requests["start_unix_ns"], dtype=np.int64) // 1_000_000
    t0, t1 = int(t.min()) - 1000, int(t.max()) + 1000
    con.execute(
        "INSERT INTO metric_samples VALUES (?, MAP {'model': 'ranker'}, 10.0, ?, 'synthetic'), "
        "(?, MAP {'model': 'ranker'}, 70.0, ?, 'synthetic')",
        [N.METRIC_EXECUTOR_BUSY, t0, N.METRIC_EXECUTOR_BUSY, t1],
    )
    slos = [dataclasses.replace(s, accelerator_price_per_hour=PRICE) for s in parse_slo(data.scenario.slo)]
    c = analyze(con, slos)["cost"]
    assert c["basis"] == "executor-busy"
    in_range = int(((t >= t0) & (t <= t1)).sum())
    assert c["accelerator_seconds_per_request"] == pytest.approx(60.0 / in_range, rel=1e-3)


def test_cost_is_in_json_text_and_html() -> None:
    rep, _, _ = _incident("saturated")
    c = rep["cost"]
    assert '"cost_per_1k_requests"' in to_json(rep)
    for page in (to_text(rep), to_html(rep)):
        assert f"{c['cost_per_1k_requests']:.4f} per 1,000 requests" in page
        assert "cost +100%" in page  # the scale-out lever's cost change


def test_without_a_price_the_report_gives_accelerator_seconds_only() -> None:
    rep, _, _ = _incident("saturated", price=None)
    assert rep["cost"]["accelerator_seconds_per_request"] > 0 and rep["cost"]["cost_per_1k_requests"] is None
    assert rep["levers"][0]["cost_delta"]["sign"] == "+" and rep["levers"][0]["cost_delta"]["per_1k_requests"] is None
    assert "no cost in money" in to_text(rep)


def _slo_file(tmp_path: Path, price: str) -> Path:
    p = tmp_path / "slo.yaml"
    p.write_text(
        "slos:\n  - name: score\n    service: ranker\n    sli: e2e\n    threshold_ms: 300\n    objective: 0.99\n"
        f"    accelerator_price_per_hour: {price}\n",
        encoding="utf-8",
    )
    return p


def test_the_slo_file_takes_a_price(tmp_path: Path) -> None:
    (slo,) = load_slo_file(_slo_file(tmp_path, "2.5"))
    assert slo.accelerator_price_per_hour == 2.5 and slo.to_dict()["accelerator_price_per_hour"] == 2.5


@pytest.mark.parametrize("price", ["0", "-1", "two", "true", ".inf", ".nan", "[1]"])
def test_a_bad_price_is_one_line_and_exit_2(tmp_path: Path, capsys, price: str) -> None:  # type: ignore[no-untyped-def]
    path = _slo_file(tmp_path, price)
    with pytest.raises(UserError, match="accelerator_price_per_hour"):
        load_slo_file(path)
    trace = tmp_path / "t.jsonl"
    trace.write_text("", encoding="utf-8")
    assert main(["analyze", "--traces", str(trace), "--slo", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "accelerator_price_per_hour" in err
