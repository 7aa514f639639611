"""Confidence intervals (analysis.intervals, analysis.interval_sql): the order-statistic ranks are
exact, the intervals cover the true quantile as often as they claim (on samples from known
distributions, through the same DuckDB SQL the analysis runs), weighted samples get Woodruff's
interval, and every quantile the report prints carries its interval in JSON, text and HTML."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from stagescope.analysis import intervals as I
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.interval_sql import quantile_estimates, window_intervals
from stagescope.analysis.report import to_html, to_text

REPS = 200


@pytest.mark.parametrize(("n", "q"), [(50, 0.5), (500, 0.99), (1000, 0.95), (368, 0.99), (10_000, 0.999)])
def test_rank_bounds_are_the_exact_binomial_ranks(n: int, q: float) -> None:
    lo, hi = I.rank_bounds(n, q)
    a = (1 - I.CONFIDENCE) / 2
    b = stats.binom(n, q)
    assert lo is not None and hi is not None
    # each tail at most a, and the ranks as tight as that allows
    assert b.cdf(lo - 1) <= a < b.cdf(lo)
    assert b.cdf(hi - 1) >= 1 - a > b.cdf(hi - 2)
    assert b.cdf(hi - 1) - b.cdf(lo - 1) >= I.CONFIDENCE


def test_too_few_samples_leave_the_upper_end_unbounded() -> None:
    assert I.min_samples(0.99) == 368
    assert I.rank_bounds(367, 0.99)[1] is None
    assert I.rank_bounds(368, 0.99)[1] == 368


def _table(x: np.ndarray, w: np.ndarray | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh connection with table ``s`` (value_ms, w, start_unix_ns: one sample per ms)."""
    con = duckdb.connect()
    frame = pa.table(
        {
            "value_ms": np.asarray(x, dtype=np.float64),
            "w": np.ones(len(x)) if w is None else np.asarray(w, dtype=np.float64),
            "start_unix_ns": (np.arange(len(x)) * 1_000_000).astype(np.int64),
        }
    )
    con.register("frame", frame)
    con.execute("CREATE TABLE s AS SELECT * FROM frame")
    return con


@pytest.mark.parametrize(
    ("dist", "n", "q"),
    [
        (stats.lognorm(s=0.8, scale=100.0), 500, 0.99),
        (stats.expon(scale=40.0), 300, 0.95),
        (stats.pareto(b=2.5, scale=10.0), 1000, 0.5),
    ],
)
def test_order_statistic_interval_covers_the_true_quantile(dist, n: int, q: float) -> None:  # type: ignore[no-untyped-def]
    """Deliverable 3's coverage test: on samples from a known distribution, the 95 % interval covers
    the true quantile in at least 93 % of 200 repetitions (the exact interval covers >= 95 %)."""
    rng = np.random.default_rng(18)
    true_q = float(dist.ppf(q))
    hits = 0
    for _ in range(REPS):
        con = _table(dist.rvs(size=n, random_state=rng))
        est = quantile_estimates(con, "s", "value_ms", {"q": q}, n)["q"]
        assert est is not None and est.method == I.METHOD_ORDER
        lo, hi = est.interval
        assert lo is not None and hi is not None and lo <= est <= hi
        hits += lo <= true_q <= hi
    assert hits >= 0.93 * REPS, f"coverage {hits}/{REPS}"
    assert hits < REPS  # an interval that always covers is too wide to mean anything


def test_weighted_interval_covers_under_poisson_sampling() -> None:
    """Samples kept with probability 0.25 and weighted 4 (Horvitz-Thompson): Woodruff's interval on the
    weighted sample covers the true p95 at the claimed rate, with an effective sample near the rows
    kept (not the 4x as many requests they stand for: the interval is not 2x too narrow)."""
    rng = np.random.default_rng(7)
    dist = stats.lognorm(s=0.6, scale=80.0)
    q, true_q, hits = 0.95, float(dist.ppf(0.95)), 0
    for _ in range(REPS):
        pop = dist.rvs(size=2400, random_state=rng)
        kept = pop[rng.random(len(pop)) < 0.25]
        con = _table(kept, np.full(len(kept), 4.0))
        est = quantile_estimates(con, "s", "value_ms", {"q": q}, len(kept), "w")["q"]
        assert est is not None and est.method == I.METHOD_WEIGHTED
        assert 0.8 * len(kept) < est.samples < 1.2 * len(kept)  # q(1-q)/V with V from both variances
        lo, hi = est.interval
        assert lo is not None and hi is not None
        hits += lo <= true_q <= hi
    assert hits >= 0.93 * REPS, f"coverage {hits}/{REPS}"


def test_unit_weights_give_the_order_statistic_interval() -> None:
    rng = np.random.default_rng(3)
    x = rng.lognormal(4.0, 0.7, 800)
    con = _table(x)
    plain = quantile_estimates(con, "s", "value_ms", {"q": 0.99}, len(x))["q"]
    unit = quantile_estimates(con, "s", "value_ms", {"q": 0.99}, len(x), "w")["q"]
    assert plain is not None and unit is not None
    assert unit.samples == pytest.approx(len(x))
    assert unit.interval == pytest.approx(plain.interval)
    lo, hi = I.rank_bounds(len(x), 0.99)
    srt = np.sort(x)
    assert plain.interval == pytest.approx((srt[lo - 1], srt[hi - 1]))  # type: ignore[operator]


def test_window_intervals_are_each_windows_order_statistics() -> None:
    rng = np.random.default_rng(5)
    x = rng.exponential(30.0, 3000)
    con = _table(x)
    bucket = "(start_unix_ns // 1000000000)"  # 1000 samples per window
    got = window_intervals(con, "s", bucket, 0.99, {})
    assert sorted(got) == [0, 1, 2]
    lo, hi = I.rank_bounds(1000, 0.99)
    for w in range(3):
        srt = np.sort(x[w * 1000 : (w + 1) * 1000])
        assert got[w] == pytest.approx((srt[lo - 1], srt[hi - 1]))  # type: ignore[operator]
    # weighted, every weight 1: the same intervals (to the interpolation between ranks)
    qhat = {w: float(np.quantile(x[w * 1000 : (w + 1) * 1000], 0.99)) for w in range(3)}
    wgot = window_intervals(con, "s", bucket, 0.99, qhat, "w")
    for w in range(3):
        assert wgot[w] == pytest.approx(got[w])


def test_judge_reads_a_measurement_against_the_predicted_interval() -> None:
    assert I.judge(105.0, [95.0, 118.0], 100.0, [90.0, 110.0]).verdict == "within"
    out = I.judge(130.0, [121.0, 140.0], 100.0, [90.0, 110.0])
    assert out.verdict == "outside" and out.outside_by_ms == 20.0 and "by 20 ms (above)" in out.words
    assert I.judge(130.0, [121.0, None], 100.0, [90.0, 110.0]).verdict == "too_short"
    ok, why = I.conclusive(480.0, [450.0, 520.0], 500.0, 0.95, 400)
    assert not ok and why is not None and "too short" in why


def test_report_prints_an_interval_beside_every_quantile() -> None:
    data = S.generate("slow-feature-store", 1200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    lo, hi = rep["quantile_interval_ms"]
    assert lo < rep["quantile_ms"] < hi
    assert rep["quantile_interval"]["method"] == I.METHOD_ORDER and rep["quantile_interval"]["samples"] == 1200
    assert rep["quantile_interval"]["conclusive"] is True  # a clear breach: the interval is above the threshold
    assert lo > rep["slo"]["threshold_ms"]
    for k in ("p50", "p95", "p99"):
        a, b = rep["latency_interval_ms"][k]
        assert a <= rep["latency_ms"][k] <= b
    for w in rep["windows"]:
        a, b = w["quantile_interval_ms"]
        assert a is None or a <= w["quantile_ms"]
        assert b is None or w["quantile_ms"] <= b
    first = rep["levers"][0]
    a, b = first["interval_ms"]
    assert a <= first["predicted_p99_ms"] <= b and b - a > 0
    text, page = to_text(rep), to_html(rep)
    assert f"[{lo:.1f}, {hi:.1f}] ms" in text and f"[{lo:.1f}, {hi:.1f}] ms" in page
    assert f"[{a:.1f}, {b:.1f}] ms" in text and f"[{a:.1f}, {b:.1f}] ms" in page
    assert "95% interval" in page


def test_a_short_run_is_called_inconclusive() -> None:
    """Too few samples for a bounded p99 interval: the report says the run is too short to tell."""
    data = S.generate("slow-feature-store", 200, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, data.scenario.slo)
    assert rep["quantile_interval_ms"][1] is None
    assert rep["quantile_interval"]["conclusive"] is False
    assert "too few samples" in rep["quantile_interval"]["why"]
    assert "inconclusive" in to_text(rep)


def test_sampled_traces_get_intervals_that_account_for_the_sampling() -> None:
    """stagescope's default sampling (every slow request, 1 % of the rest: tests/test_analysis_sampling):
    the report's intervals are Woodruff's on the Horvitz-Thompson weights; they hold the quantiles
    of all the traces, and the p50's (where 1 % of the requests were kept) is much wider than the
    interval of all the traces' p50: the weights are not taken as that many samples."""
    from test_analysis_sampling import incident, sample

    con, data = incident("slow-feature-store", n=8000)
    truth = analyze(con, data.scenario.slo)
    sample(con)
    rep = analyze(con, data.scenario.slo)
    assert rep["sampling"]["weighted"]
    qi = rep["quantile_interval"]
    assert qi["method"] == I.METHOD_WEIGHTED and 0 < qi["samples"] < 8000
    lo, hi = rep["quantile_interval_ms"]
    assert lo <= truth["quantile_ms"] <= hi
    a, b = rep["latency_interval_ms"]["p50"]
    assert a <= truth["latency_ms"]["p50"] <= b
    ta, tb = truth["latency_interval_ms"]["p50"]
    assert truth["quantile_interval"]["method"] == I.METHOD_ORDER
    assert (b - a) > 3 * (tb - ta), ((a, b), (ta, tb))


def test_a_single_sample_verdict_is_called_inconclusive(capsys: pytest.CaptureFixture[str]) -> None:
    """One request (OpenTelemetry's own OTLP/JSON example: one 1 s server span): its p99 has no
    bounded interval at either end, and the text and HTML still say the verdict is inconclusive
    (before, the interval line was left out whole, so one sample read as a plain BREACHED)."""
    from pathlib import Path

    from stagescope.cli import main

    example = Path(__file__).resolve().parents[1] / "external" / "otlp" / "opentelemetry-proto" / "trace.json"
    assert main(["analyze", "--traces", str(example), "--slo", "p99<300ms", "--format", "json"]) == 0
    rep = __import__("json").loads(capsys.readouterr().out)
    assert rep["samples"] == 1 and rep["breached"]
    assert rep["quantile_interval_ms"] == [None, None]
    assert rep["quantile_interval"]["conclusive"] is False
    text = to_text(rep)
    line = next(x for x in text.splitlines() if x.startswith("95% interval of the quantile"))
    assert "unbounded" in line and "inconclusive: too few samples" in line, text
    assert "inconclusive: too few samples" in to_html(rep)
