"""Sampling-aware analysis: samples weighted by 1 / sampling_p (Horvitz-Thompson), complete sources
(load-generator results, request-duration histograms) for the SLO quantile, unknown sampling.

The incidents are the synthetic ones with a known cause (analysis.synth_scenarios); their traces
are then sampled the way stagescope's default does (every request at or over 250 ms, every error,
and 1 % of the rest by OpenTelemetry's consistent rule on the trace id), and the analysis of the
kept traces is compared with the analysis of all of them.
"""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from stagescope import names
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest.results import RESULT_COLUMNS
from stagescope.slo import parse_slo

SLOW_MS = 250.0
RATIO = 0.01
THRESHOLD = round((1 - RATIO) * 2**56)
P_BASELINE = (2**56 - THRESHOLD) / 2**56


def incident(name: str, n: int = 8000, seed: int = 3) -> tuple[duckdb.DuckDBPyConnection, S.SynthData]:
    data = S.generate(name, n, seed=seed)
    con = duckdb.connect()
    S.to_tables(con, data)
    return con, data


def sample(con: duckdb.DuckDBPyConnection, *, with_p: bool = True, with_reason: bool = True) -> int:
    """Keep what stagescope's default sampling keeps; returns the number of requests kept."""
    keep = f"duration_ms >= {SLOW_MS} OR is_error OR (('0x' || substr(trace_id, 19, 14))::UBIGINT >= {THRESHOLD})"
    p = (
        f"CASE WHEN duration_ms >= {SLOW_MS} OR is_error THEN 1.0 ELSE {P_BASELINE!r} END"
        if with_p
        else "NULL"
    )
    reason = "CASE WHEN is_error THEN 'error' WHEN duration_ms >= 250 THEN 'slow' ELSE 'baseline' END"
    con.execute(
        f"""CREATE OR REPLACE TABLE requests AS SELECT *, {reason if with_reason else "NULL"}::VARCHAR
            AS sampled_reason, {p}::DOUBLE AS sampling_p FROM requests WHERE {keep}"""
    )
    for rel in ("stages", "token_gaps"):
        con.execute(
            f"CREATE OR REPLACE TABLE {rel} AS SELECT * FROM {rel} SEMI JOIN requests USING (trace_id)"
        )
    return int(con.execute("SELECT count(*) FROM requests").fetchall()[0][0])


def add_results(
    con: duckdb.DuckDBPyConnection, full: duckdb.DuckDBPyConnection, network_ms: float = 0.8
) -> None:
    """The load generator's results for every request of ``full`` (client-side: plus the network)."""
    rows = full.sql(
        "SELECT trace_id, route, start_unix_ns, duration_ms, status_code FROM requests"
    ).to_arrow_table()
    con.register("allreq", rows)
    ddl = ", ".join(f"{c} {t}" for c, t in RESULT_COLUMNS.items())
    con.execute(f"CREATE OR REPLACE TABLE client_results ({ddl}, source VARCHAR)")
    half = int(network_ms / 2 * 1e6)
    con.execute(
        f"""INSERT INTO client_results (request_id, trace_id, route, intended_unix_ns, sent_unix_ns,
                end_unix_ns, status, latency_ms, naive_latency_ms, source)
            SELECT row_number() OVER (), trace_id, route, start_unix_ns - {half} - 100000, start_unix_ns - {half},
                   start_unix_ns + CAST(duration_ms * 1e6 AS BIGINT) + {half}, status_code,
                   duration_ms + {network_ms} + 0.1, duration_ms + {network_ms}, 'results.parquet'
            FROM allreq"""
    )
    con.unregister("allreq")


def histogram_quantile(full: duckdb.DuckDBPyConnection, q: float) -> float:
    """Prometheus' ``histogram_quantile(q)`` (promql/quantile.go ``bucketQuantile``) of the buckets
    :func:`add_histogram` writes, computed here from the requests: rank ``q * W``, linear in the bucket."""
    bounds = [b * 1e3 for b in names.BUCKETS_REQUEST]
    cum = [
        float(full.execute(f"SELECT count(*) FROM requests WHERE duration_ms <= {b}").fetchall()[0][0])
        for b in bounds
    ]
    total = float(full.execute("SELECT count(*) FROM requests").fetchall()[0][0])
    rank = q * total
    i = next((k for k, c in enumerate(cum) if c >= rank), None)
    if i is None:
        return bounds[-1]
    start, below = (bounds[i - 1], cum[i - 1]) if i else (0.0, 0.0)
    return start + (bounds[i] - start) * (rank - below) / (cum[i] - below)


def add_histogram(
    con: duckdb.DuckDBPyConnection,
    full: duckdb.DuckDBPyConnection,
    route: str,
    *,
    late_first_scrape: bool = False,
) -> None:
    """Two scrapes of stagescope's request-duration histogram bracketing the incident (the first one
    after the first requests with ``late_first_scrape``)."""
    ((lo, hi),) = full.execute(
        "SELECT min(start_unix_ns), max(start_unix_ns + duration_ms * 1e6) FROM requests"
    ).fetchall()
    t0 = int(lo // 10**6) + (60_000 if late_first_scrape else -1000)
    t1 = int(hi // 10**6) + 1000
    bounds = [*names.BUCKETS_REQUEST, float("inf")]
    rows = []
    for b in bounds:
        le_ms = b * 1e3 if np.isfinite(b) else 1e18
        c = float(
            full.execute(f"SELECT count(*) FROM requests WHERE duration_ms <= {le_ms}").fetchall()[0][0]
        )
        first = 0.0
        if late_first_scrape:
            first = float(
                full.execute(
                    f"SELECT count(*) FROM requests WHERE duration_ms <= {le_ms} "
                    f"AND start_unix_ns + duration_ms * 1e6 <= {t0 * 10**6}"
                ).fetchall()[0][0]
            )
        le = "+Inf" if not np.isfinite(b) else repr(b)
        labels = {names.LABEL_ROUTE: route, names.LABEL_MODEL: "m", names.LABEL_STATUS_CLASS: "2xx", "le": le}
        rows += [(labels, first, t0), (labels, c, t1)]
    tbl = pa.table({
        "k": [list(r[0]) for r in rows], "v": [list(r[0].values()) for r in rows],
        "value": [r[1] for r in rows], "ts_ms": [r[2] for r in rows],
    })  # fmt: skip
    con.register("hist", tbl)
    con.execute(
        f"INSERT INTO metric_samples SELECT '{names.METRIC_REQUEST_DURATION}_bucket', map(k, v), value, ts_ms, "
        "'run/metrics/scrape.prom' FROM hist"
    )
    con.unregister("hist")


@pytest.mark.parametrize("name", ["slow-feature-store", "long-batch-wait", "cold-start"])
def test_weighted_analysis_of_default_sampling_matches_all_traces(name: str) -> None:
    # 20,000 requests: about 100 of the fast ones are kept, so the estimate of their number is within
    # about 10 % (one standard error of the Horvitz-Thompson count)
    con, data = incident(name, n=20_000)
    truth = analyze(con, data.scenario.slo)
    kept = sample(con)
    assert kept < 0.6 * len(data.requests["trace_id"])
    rep = analyze(con, data.scenario.slo)
    assert rep["samples"] == kept and rep["sources"]["latency_ms"] == names.SOURCE_TRACES
    assert rep["sampling"]["weighted"] and rep["sampling"]["kept_below_probability_1"] > 0
    assert rep["requests"] == pytest.approx(truth["requests"], rel=0.2)
    assert rep["latency_ms"]["p50"] == pytest.approx(truth["latency_ms"]["p50"], rel=0.1)
    assert rep["latency_ms"]["p99"] == pytest.approx(truth["latency_ms"]["p99"], rel=0.1)
    assert rep["over_threshold_share"] == pytest.approx(truth["over_threshold_share"], rel=0.25)
    assert rep["verdict"] == truth["verdict"]
    got, want = rep["levers"][0]["predicted_p99_ms"], truth["levers"][0]["predicted_p99_ms"]
    assert got == pytest.approx(want, rel=0.3), (got, want)
    assert not any("sampling probability" in w for w in rep["warnings"])
    # the same kept traces taken as the population (what the analysis did before) are far off
    con.execute("UPDATE requests SET sampling_p = NULL")
    naive = analyze(con, data.scenario.slo)
    assert naive["over_threshold_share"] > 1.5 * truth["over_threshold_share"]
    assert any("have no sampling probability" in w for w in naive["warnings"])  # sampled_reason says so


def test_load_generator_results_give_the_quantiles_server_side() -> None:
    con, data = incident("slow-feature-store")
    full = duckdb.connect()
    S.to_tables(full, data)
    truth = analyze(full, data.scenario.slo)
    sample(con)
    add_results(con, full, network_ms=0.8)
    rep = analyze(con, data.scenario.slo)
    src = rep["sources"]
    assert src["latency_ms"] == src["quantile_ms"] == src["windows"] == names.SOURCE_CLIENT_RESULTS
    assert src["attribution"] == names.SOURCE_TRACES
    assert rep["requests"] == truth["requests"] and rep["sampling"]["network_ms"] == pytest.approx(
        0.8, abs=1e-3
    )
    for k in ("p50", "p95", "p99"):  # server-side: the network taken out again
        assert rep["latency_ms"][k] == pytest.approx(truth["latency_ms"][k], abs=0.01)
        assert rep["client_latency_ms"][k] == pytest.approx(truth["latency_ms"][k] + 0.9, abs=0.01)
    assert rep["over_threshold_share"] == pytest.approx(truth["over_threshold_share"], abs=1e-4)
    assert rep["verdict"] == truth["verdict"]
    # results that hold few of the traced requests (another run's) are not used, and said so
    con.execute("UPDATE client_results SET trace_id = md5(trace_id) WHERE request_id % 3 <> 0")
    other = analyze(con, data.scenario.slo)
    assert other["sources"]["latency_ms"] == names.SOURCE_TRACES
    assert any("load-generator results hold" in w for w in other["warnings"])
    # results that hold none of them (another run's, to the same route): not used either, and said so
    # (before, nothing was said, and the sampling note even advised passing the results)
    con.execute("UPDATE client_results SET trace_id = md5(trace_id)")
    none = analyze(con, data.scenario.slo)
    assert none["sources"]["latency_ms"] == names.SOURCE_TRACES
    (w,) = [w for w in none["warnings"] if "load-generator results hold" in w]
    assert "but none of its" in w and "another run's results?" in w


def test_histograms_give_the_quantiles_and_cover_unknown_sampling() -> None:
    con, data = incident("slow-feature-store")
    full = duckdb.connect()
    S.to_tables(full, data)
    truth = analyze(full, data.scenario.slo)
    sample(con)
    add_histogram(con, full, data.scenario.route)
    rep = analyze(con, data.scenario.slo)
    assert rep["sources"]["quantile_ms"] == names.SOURCE_METRICS
    assert rep["sampling"]["histogram"] == names.METRIC_REQUEST_DURATION
    assert rep["requests"] == truth["requests"]
    # the p99 lies where every request was kept (at or over 250 ms): the traces' own values
    assert rep["latency_ms"]["p99"] == pytest.approx(truth["latency_ms"]["p99"], rel=0.02)
    # the p50's 25-50 ms bucket holds 65 traces kept at 1 % (known probability), a sample of its 7,335
    # requests: their weights place them (34.6 ms for all requests; histogram_quantile's even spread
    # says 38.5), and the interval is the sample's (Woodruff, 65 kept), covering the truth
    p50, (lo, hi) = rep["latency_ms"]["p50"], rep["latency_interval_ms"]["p50"]
    assert histogram_quantile(full, 0.5) > 1.1 * truth["latency_ms"]["p50"]  # Prometheus' figure is off
    assert p50 == pytest.approx(truth["latency_ms"]["p50"], rel=0.06)  # ~2 standard errors of 65 kept
    assert lo <= truth["latency_ms"]["p50"] <= hi and hi - lo < 0.15 * p50
    assert rep["over_threshold_share"] == pytest.approx(truth["over_threshold_share"], rel=0.02)
    # a collector's tail sampling: no probabilities at all; the histogram still corrects the figures
    con.execute("UPDATE requests SET sampling_p = NULL, sampled_reason = NULL")
    tail = analyze(con, data.scenario.slo)
    assert tail["sources"]["quantile_ms"] == names.SOURCE_METRICS
    assert tail["latency_ms"]["p99"] == pytest.approx(truth["latency_ms"]["p99"], rel=0.02)
    # kept at unknown probabilities, the bucket's traces are no sample of it: Prometheus' figure
    assert tail["latency_ms"]["p50"] == pytest.approx(histogram_quantile(full, 0.5), abs=1e-3)
    assert tail["over_threshold_share"] == pytest.approx(truth["over_threshold_share"], rel=0.02)
    assert any(
        "have no sampling probability" in w and "metrics gave the quantiles" in w for w in tail["warnings"]
    )
    assert tail["verdict"] == truth["verdict"]


def test_histogram_that_does_not_span_the_traces_is_not_used() -> None:
    con, data = incident("slow-feature-store")
    full = duckdb.connect()
    S.to_tables(full, data)
    sample(con)
    add_histogram(con, full, data.scenario.route, late_first_scrape=True)
    rep = analyze(con, data.scenario.slo)
    assert rep["sources"]["quantile_ms"] == names.SOURCE_TRACES
    assert any("do not span the traced requests" in w for w in rep["warnings"])


def test_complete_traces_stay_the_source_and_unsampled_data_is_unchanged() -> None:
    """Traces that kept everything (or carry no sampling information at all, as vLLM's spans and
    older Parquet) are analysed as before: unweighted, from the traces, without a sampling warning;
    a complete source counting the same requests does not replace them."""
    con, data = incident("long-batch-wait", n=3000)
    before = analyze(con, data.scenario.slo)
    assert before["sources"]["latency_ms"] == names.SOURCE_TRACES and not before["sampling"]["weighted"]
    full = duckdb.connect()
    S.to_tables(full, data)
    add_results(con, full)
    add_histogram(con, full, data.scenario.route)
    con.execute("ALTER TABLE requests ADD COLUMN sampled_reason VARCHAR")
    con.execute("ALTER TABLE requests ADD COLUMN sampling_p DOUBLE DEFAULT 1.0")
    con.execute("UPDATE requests SET sampling_p = 1.0")
    rep = analyze(con, data.scenario.slo)
    assert rep["sources"]["latency_ms"] == names.SOURCE_TRACES
    assert rep["latency_ms"] == before["latency_ms"] and rep["verdict"] == before["verdict"]
    assert not any("sampl" in w for w in rep["warnings"])


def test_no_trace_kept_the_complete_source_still_answers() -> None:
    """A healthy route at 1 %: sampling may keep no trace of it at all; the load generator's results
    (or the histograms) still give its quantiles, and the report says there is nothing to split."""
    con, data = incident("slow-feature-store", n=3000)
    full = duckdb.connect()
    S.to_tables(full, data)
    truth = analyze(full, data.scenario.slo)
    slo = dataclasses.replace(parse_slo(data.scenario.slo)[0], route=data.scenario.route)
    sample(con)
    for rel in ("requests", "stages", "token_gaps"):
        con.execute(f"DELETE FROM {rel}")
    add_results(con, full)
    rep = analyze(con, [slo])
    assert rep["sources"]["latency_ms"] == names.SOURCE_CLIENT_RESULTS and rep["samples"] == 3000
    assert rep["latency_ms"]["p99"] == pytest.approx(truth["latency_ms"]["p99"] + 0.8, abs=0.01)
    assert rep["attribution"] == [] and any("nothing to split into stages" in w for w in rep["warnings"])
    con.execute("DELETE FROM client_results")
    add_histogram(con, full, data.scenario.route)
    rep = analyze(con, [slo])
    assert rep["sources"]["latency_ms"] == names.SOURCE_METRICS and rep["requests"] == 3000
    assert rep["latency_ms"]["p99"] == pytest.approx(
        truth["latency_ms"]["p99"], rel=0.15
    )  # bucket interpolation
    for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):  # no trace: exactly Prometheus' figures
        assert rep["latency_ms"][k] == pytest.approx(histogram_quantile(full, q), abs=1e-3)
    assert rep["samples"] == 3000 and rep["quantile_interval"]["samples"] == 3000
