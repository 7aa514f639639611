"""Breach detection, critical-path attribution and counterfactuals on hand-built analysis tables."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from stagescope.analysis import attribution as A
from stagescope.analysis import breach as B
from stagescope.analysis.api import analyze, frames
from stagescope.analysis.keys import trace_ref
from stagescope.analysis.report import to_json
from stagescope.analysis.synth_scenarios import SCENARIOS as S_SCENARIOS
from stagescope.analysis.synth_scenarios import Scenario, SynthData, to_tables
from stagescope.analysis.synth_scenarios import generate as S_generate
from stagescope.slo import parse_slo

T0 = 1_764_460_800 * 10**9
MS = 1_000_000


def _con(
    reqs: list[dict], stages: list[tuple[str, str, float, float]], gaps=None
) -> duckdb.DuckDBPyConnection:  # type: ignore[no-untyped-def]
    """``reqs``: trace_id, start_ms, duration_ms (+ optional columns); ``stages``: (trace, stage, a_ms, b_ms)."""
    cols = {k: np.array([r.get(k) for r in reqs]) for k in reqs[0]}
    cols["start_unix_ns"] = np.array([T0 + int(r["start_ms"] * MS) for r in reqs], dtype=np.int64)
    del cols["start_ms"]
    cols.setdefault("route", np.array(["/v1/predict"] * len(reqs)))
    cols.setdefault("status_code", np.array([200] * len(reqs)))
    start = {r["trace_id"]: T0 + int(r["start_ms"] * MS) for r in reqs}
    st = {
        "trace_id": np.array([s[0] for s in stages]),
        "stage": np.array([s[1] for s in stages]),
        "start_unix_ns": np.array([start[s[0]] + int(s[2] * MS) for s in stages], dtype=np.int64),
        "end_unix_ns": np.array([start[s[0]] + int(s[3] * MS) for s in stages], dtype=np.int64),
    }
    con = duckdb.connect()
    to_tables(con, SynthData(Scenario("t", "/v1/predict", "p99<300ms", None, None), cols, st, gaps or {}))
    return con


def _breakdown(con: duckdb.DuckDBPyConnection, spec: str = "p99<300ms") -> dict[str, dict[str, float]]:
    view = B.sli_view(con, parse_slo(spec)[0])
    cols = A.build_breakdown(con, view)
    frame = frames(con)[A.BREAKDOWN]  # stage names as columns, and each row's trace id
    keep = {*cols, "unattributed", "network"}
    return {d["trace_id"]: {k: v for k, v in d.items() if k in keep} for d in frame.to_dicts()}


def test_critical_path_handles_parallel_and_overlapping_stages() -> None:
    con = _con(
        [
            {"trace_id": "a", "start_ms": 0, "duration_ms": 100.0, "client_duration_ms": 104.0},
            {"trace_id": "b", "start_ms": 10, "duration_ms": 100.0, "client_duration_ms": None},
            {"trace_id": "c", "start_ms": 20, "duration_ms": 50.0, "client_duration_ms": None},
        ],
        [
            # a: two parallel feature reads (10-40 and 10-60) then compute 60-90: fetch counts 50, not 80
            ("a", "feature_fetch", 10, 40), ("a", "feature_fetch", 10, 60), ("a", "compute", 60, 90),
            # b: queue 0-50 overlaps compute 40-100; the segment 40-50 goes to the stage ending last (compute)
            ("b", "queue", 0, 50), ("b", "compute", 40, 100),
            # c: disjoint stages (fast path), a stage span running past the server span is clipped
            ("c", "preprocess", 0, 10), ("c", "egress", 40, 70),
        ],
    )  # fmt: skip
    bd = _breakdown(con)
    assert bd["a"]["feature_fetch"] == pytest.approx(50)
    assert bd["a"]["compute"] == pytest.approx(30)
    assert bd["a"]["unattributed"] == pytest.approx(20)
    assert bd["a"]["network"] == pytest.approx(4)
    assert bd["b"]["queue"] == pytest.approx(40) and bd["b"]["compute"] == pytest.approx(60)
    assert bd["b"]["unattributed"] == pytest.approx(0)
    assert bd["c"]["preprocess"] == pytest.approx(10) and bd["c"]["egress"] == pytest.approx(10)
    for t, row in bd.items():  # stages never sum above the request
        total = sum(v or 0 for k, v in row.items() if k != "network")
        assert total == pytest.approx({"a": 100, "b": 100, "c": 50}[t])


def test_ttft_attributes_only_time_before_the_first_token() -> None:
    con = _con(
        [{"trace_id": "x", "start_ms": 0, "duration_ms": 500.0, "ttft_ms": 120.0, "route": "/v1/generate"}],
        [("x", "queue", 0, 20), ("x", "prefill", 20, 120), ("x", "decode", 120, 500)],
    )
    bd = _breakdown(con, "ttft:p95<500ms")
    assert bd["x"]["queue"] == pytest.approx(20) and bd["x"]["prefill"] == pytest.approx(100)
    assert not bd["x"].get("decode")  # after the first token: not part of TTFT


def test_requests_of_one_trace_one_after_the_other_are_broken_down_apart() -> None:
    """A client retry keeps its trace: the slow first attempt and the fast retry are two samples,
    each with its own stages (stage offsets below are relative to the last request of the trace)."""
    con = _con(
        [
            {"trace_id": "r", "start_ms": 0, "duration_ms": 400.0},
            {"trace_id": "r", "start_ms": 500, "duration_ms": 50.0},
        ],
        [
            ("r", "feature_fetch", -500, -120), ("r", "compute", -120, -100),  # first attempt: 0-400 ms
            ("r", "feature_fetch", 0, 5), ("r", "compute", 5, 45),  # the retry: 500-550 ms
        ],
    )  # fmt: skip
    view = B.sli_view(con, parse_slo("p99<300ms")[0])
    cols = A.build_breakdown(con, view)
    rows = con.execute(
        f"SELECT value_ms, {cols['feature_fetch']}, {cols['compute']}, unattributed FROM {A.BREAKDOWN} ORDER BY 1"
    ).fetchall()
    assert rows == [
        pytest.approx((50.0, 5.0, 40.0, 5.0)),
        pytest.approx((400.0, 380.0, 20.0, 0.0)),
    ]


def _minutes(con: duckdb.DuckDBPyConnection) -> list[dict]:  # type: ignore[type-arg]
    view = B.sli_view(con, parse_slo("p99<300ms")[0])
    return B.windows(con, view, "1m")


def test_breach_detected_in_the_bad_minute_only_and_attributed() -> None:
    reqs, stages = [], []
    rng = np.random.default_rng(1)
    for i in range(600):  # three minutes; minute 1 has a slow feature store for 20% of requests
        t = i * 300.0
        slow = 60_000 <= t < 120_000 and i % 5 == 0
        fetch = 400.0 if slow else 5.0 + rng.random()
        tid = f"t{i:04d}"
        reqs.append({"trace_id": tid, "start_ms": t, "duration_ms": fetch + 30.0})
        stages += [(tid, "feature_fetch", 0, fetch), (tid, "compute", fetch, fetch + 30)]
    con = _con(reqs, stages)
    wins = _minutes(con)
    assert [w["breached"] for w in wins] == [False, True, False]
    assert wins[1]["over_threshold_share"] == pytest.approx(0.2, abs=0.01)
    rep = analyze(con, "p99<300ms")
    assert rep["breached"] and rep["verdict"] == {"stage": "feature_fetch", "lever": "cache-features"}
    top = rep["attribution"][0]
    assert top["stage"] == "feature_fetch" and top["share"] > 0.95
    assert top["excess_ms"] == pytest.approx(400 - 5.5, abs=1.0)
    lever = rep["levers"][0]
    assert lever["predicted_p99_ms"] < 300 and "feature_fetch" in lever["rationale"]


def test_unattributed_time_means_measure_first() -> None:
    reqs = [
        {"trace_id": f"r{i}", "start_ms": i * 10.0, "duration_ms": 500.0 if i % 10 == 0 else 40.0}
        for i in range(300)
    ]
    stages = [(r["trace_id"], "compute", 0, 30) for r in reqs]
    rep = analyze(_con(reqs, stages), "p95<300ms")
    assert rep["attribution"][0]["stage"] == "unattributed"
    assert rep["verdict"] == {"stage": "unattributed", "lever": None}
    assert "Measure first" in rep["levers"][0]["rationale"]


def test_slo_file_checks_each_slo_and_leads_with_the_worst(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each SLO of a file is an entry of ``routes``; one whose route is absent is no data (never met),
    and the top level is the breached one."""
    reqs = [{"trace_id": f"r{i}", "start_ms": i * 10.0, "duration_ms": 20.0 + (i % 50)} for i in range(200)]
    con = _con(reqs, [(r["trace_id"], "compute", 0, 20) for r in reqs])
    slo = tmp_path / "slo.yaml"
    slo.write_text(
        "slos:\n"
        "  - {name: gen, service: s, sli: ttft, route: /v1/generate, threshold_ms: 500, objective: 0.95}\n"
        "  - {name: predict, service: s, sli: e2e, route: /v1/predict, threshold_ms: 50, objective: 0.99}\n"
    )
    rep = analyze(con, str(slo))
    assert rep["slo"]["name"] == "predict" and rep["breached"] and rep["route"] == "/v1/predict"
    assert [(r["slo"]["name"], r["status"]) for r in rep["routes"]] == [("predict", "breached"), ("gen", "no_data")]
    gen = rep["routes"][1]
    assert gen["breached"] is None
    assert gen["no_data_reason"].startswith("route /v1/generate not in the data: routes seen are /v1/predict")


SAMPLED = [n for n, sc in S_SCENARIOS.items() if sc.stage is not None and sc.route == "/v1/predict"]


@pytest.mark.parametrize("name", SAMPLED)
def test_large_input_subset_and_sample_agree_with_the_full_breakdown(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large inputs break down the tail candidates and a baseline sample (and, past a limit, a sample
    of the candidates): the verdict, the tail counts and the slowest traces must not change, and the
    predicted quantile only by the sample's error. Here the limits are lowered to reach those paths."""
    data = S_generate(name, 6000, seed=5)
    con = duckdb.connect()
    to_tables(con, data)
    full = analyze(con, data.scenario.slo)
    monkeypatch.setattr(A, "FULL_BREAKDOWN_LIMIT", 1000)
    monkeypatch.setattr(A, "BASELINE_SAMPLE", 800)
    monkeypatch.setattr(A, "MIDDLE_SAMPLE", 400)
    subset = analyze(con, data.scenario.slo)  # every candidate, a baseline sample
    monkeypatch.setattr(A, "CANDIDATE_SAMPLE", 400)
    sampled = analyze(con, data.scenario.slo)  # a sample of the candidates too
    for rep in (subset, sampled):
        assert rep["verdict"] == full["verdict"], (name, rep["attribution"][:2])
        assert rep["tail"]["tail_samples"] == full["tail"]["tail_samples"]
        assert rep["tail"]["baseline_samples"] == full["tail"]["baseline_samples"]
        assert [s["trace_id"] for s in rep["slowest"]] == [s["trace_id"] for s in full["slowest"]]
        top = full["attribution"][0]
        assert rep["attribution"][0]["stage"] == top["stage"]
        assert rep["attribution"][0]["share"] == pytest.approx(top["share"], abs=0.1)
    got, want = sampled["levers"][0]["predicted_p99_ms"], full["levers"][0]["predicted_p99_ms"]
    assert got == pytest.approx(want, rel=0.05), (name, got, want)
    # the sampled path was taken: fewer rows broken down than requests, the slowest kept apart
    ev = B.evaluate(con, parse_slo(data.scenario.slo)[0])
    qs = ev["quantiles"]
    attr = A.attribute(con, ev["view"], ev["breached"], qs)
    assert not attr.complete and attr.extra is not None and attr.candidates > 400
    rows = con.execute(f"SELECT count(*) FROM {A.BREAKDOWN}").fetchone()
    assert rows is not None and rows[0] < 400 + 800 + 400 + 100
    # each stratum weighs as many samples as it has, so the weights add up to every sample
    total = con.execute(f"SELECT sum({attr.weight}) FROM {A.BREAKDOWN}").fetchone()
    assert total is not None and total[0] == pytest.approx(6000)


def test_weighted_quantile_is_quantile_cont_with_unit_weights_and_counts_weights() -> None:
    from stagescope.analysis.counterfactual import weighted_quantile, weighted_quantile_sql

    con = duckdb.connect()
    rng = np.random.default_rng(3)
    con.execute("CREATE TABLE t (v DOUBLE, w DOUBLE)")
    vals = rng.lognormal(3, 1, 501)
    con.executemany("INSERT INTO t VALUES (?, 1.0)", [[float(v)] for v in vals])
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        want = con.execute(f"SELECT quantile_cont(v, {q}) FROM t").fetchone()[0]  # type: ignore[index]
        assert weighted_quantile(con, "t", "v", q, "w") == pytest.approx(want, abs=1e-3)
    # a row of weight 3 counts like three rows of weight 1
    con.execute("CREATE TABLE u AS SELECT v, 3.0 AS w FROM t UNION ALL SELECT v + 1000, 1.0 FROM t")
    con.execute("CREATE TABLE x AS SELECT v FROM t, range(3) UNION ALL SELECT v + 1000 FROM t")
    for q in (0.3, 0.75, 0.9):
        want = con.execute(f"SELECT quantile_cont(v, {q}) FROM x").fetchone()[0]  # type: ignore[index]
        assert weighted_quantile(con, "u", "v", q, "w") == pytest.approx(want, abs=1e-3)
    # per group: each group's own quantile
    sql = weighted_quantile_sql("(SELECT *, v > 1000 AS big FROM u)", "v", 0.25, "w", by="big")
    got = dict(con.execute(sql).fetchall())
    want_g = dict(con.execute("SELECT v > 1000, quantile_cont(v, 0.25) FROM x GROUP BY 1").fetchall())
    assert got == pytest.approx(want_g, abs=1e-9)


def test_weighted_slope_is_regr_slope_with_unit_weights_and_counts_weights() -> None:
    from stagescope.analysis.counterfactual import weighted_slope

    con = duckdb.connect()
    rng = np.random.default_rng(4)
    x = rng.integers(1, 17, 400).astype(float)
    y = 3.0 + 1.5 * x + rng.normal(0, 2, 400)
    con.execute("CREATE TABLE t (x DOUBLE, y DOUBLE, w DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, 1.0)", [[float(a), float(b)] for a, b in zip(x, y, strict=True)])
    con.execute("INSERT INTO t VALUES (NULL, 5.0, 1.0), (4.0, NULL, 1.0)")  # incomplete pairs are left out
    want = con.execute("SELECT regr_slope(y, x) FROM t").fetchone()[0]  # type: ignore[index]
    assert weighted_slope(con, "t", "y", "x", "w") == pytest.approx(want, rel=1e-9)
    assert weighted_slope(con, "t", "y", "x", None) == pytest.approx(want, rel=1e-9)
    # rows of weight 4 count like four rows each: the weights pull the fit to their line
    con.execute("CREATE TABLE u AS SELECT x, y, 1.0 AS w FROM t UNION ALL SELECT x, 10 * x, 4.0 FROM range(1, 9) r(x)")
    con.execute("CREATE TABLE v AS SELECT x, y FROM t UNION ALL SELECT x, 10 * x FROM range(1, 9) r(x), range(4)")
    want = con.execute("SELECT regr_slope(y, x) FROM v").fetchone()[0]  # type: ignore[index]
    assert weighted_slope(con, "u", "y", "x", "w") == pytest.approx(want, rel=1e-9)
    assert weighted_slope(con, "u", "y", "x", "w") != pytest.approx(weighted_slope(con, "u", "y", "x", None))


@pytest.mark.parametrize("name", ["slow-feature-store", "saturated", "repeated-inputs", "llm-long-prompts"])
def test_integer_keys_change_nothing_but_speed(name: str) -> None:
    """The ingest's integer keys (analysis.keys) and relations built without them give the same
    report; only the scale-out model's pseudo-random queue draws (ranked by the key) may move the
    prediction a little."""
    data = S_generate(name, 3000, seed=11)
    reps = []
    for keys in (True, False):
        con = duckdb.connect()
        to_tables(con, data, keys=keys)
        reps.append(analyze(con, data.scenario.slo))
        assert trace_ref(con) == ("trace_key" if keys else "trace_id")
    keyed, plain = reps
    assert keyed["verdict"] == plain["verdict"]
    assert keyed["attribution"] == plain["attribution"]
    assert keyed["evidence"] == plain["evidence"]
    assert "NaN" not in to_json(keyed)  # a fit on a constant batch size is None, not NaN
    # every request has an input hash: the share of repeated ones is a number, 0 where none repeat
    share = keyed["evidence"]["repeated_hash_share_tail"]
    assert share >= 0.3 if name == "repeated-inputs" else share == 0.0
    assert [s["trace_id"] for s in keyed["slowest"]] == [s["trace_id"] for s in plain["slowest"]]
    assert all(s["trace_id"] for s in keyed["slowest"])
    for a, b in zip(keyed["levers"], plain["levers"], strict=True):
        assert a["lever"] == b["lever"]
        assert a["predicted_p99_ms"] == pytest.approx(b["predicted_p99_ms"], rel=0.05)


def test_slowest_trace_without_stage_rows_keeps_its_trace_id() -> None:
    """The slowest list looks trace ids up by integer key in the stage rows, then in the requests."""
    reqs = [{"trace_id": f"t{i}", "start_ms": i * 10.0, "duration_ms": 20.0 + i} for i in range(50)]
    reqs.append({"trace_id": "no-stages", "start_ms": 600.0, "duration_ms": 900.0})
    con = _con(reqs, [(r["trace_id"], "compute", 0, 15) for r in reqs[:-1]])
    assert trace_ref(con) == "trace_key"
    slowest = analyze(con, "p99<300ms")["slowest"]
    assert [s["trace_id"] for s in slowest[:3]] == ["no-stages", "t49", "t48"]
    assert slowest[0]["stages"] == {"unattributed": 900.0}
