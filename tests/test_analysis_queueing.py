"""Queueing formulas behind the scale-out and worker-pool predictions."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest

from stagescope.analysis import queueing as Q


def test_erlang_c_known_values() -> None:
    assert Q.erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = rho
    assert Q.erlang_c(2, 1.2) == pytest.approx(0.45)
    assert Q.erlang_c(3, 3.5) == 1.0  # unstable
    assert Q.servers_for(0.8, 0.01, start=2) == 4  # C(3, 0.8) = 0.052, C(4, 0.8) = 0.0096


def test_wait_quantiles_match_mm1() -> None:
    # M/M/1 (ca2 = cs2 = 1): P(W > t) = rho * exp(-(mu - lam) t)
    model = Q.QueueModel(1, mu_per_s=10.0, lam_per_s=8.0)
    con = duckdb.connect()
    u = np.linspace(0, 0.999999, 200_001)
    con.register("u", {"u": u})
    got = con.execute(f"SELECT quantile_cont({model.wait_ms_sql('u')}, [0.1, 0.9, 0.99]) FROM u").fetchone()
    assert got is not None
    assert got[0][0] == 0.0
    for q, v in zip((0.9, 0.99), got[0][1:], strict=True):
        assert v == pytest.approx(math.log(0.8 / (1 - q)) / 2.0 * 1000.0, rel=1e-3)
    assert Q.QueueModel(1, 10.0, 10.0).wait_ms_sql("u") == "NULL::DOUBLE"


def test_arrival_variability_of_poisson_arrivals_is_about_one() -> None:
    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.exponential(1e9 / 50, 20_000)).astype(np.int64)
    con = duckdb.connect()
    con.register("a", {"trace_id": np.arange(len(starts)).astype(str), "start_unix_ns": starts})
    arr = Q.arrivals(con, "a")
    assert arr.rate_per_s == pytest.approx(50, rel=0.03) and arr.ca2 == pytest.approx(1.0, abs=0.05)
    assert Q.arrivals(con, "a", scale_ms=40.0).ca2 == pytest.approx(1.0, abs=0.1)
