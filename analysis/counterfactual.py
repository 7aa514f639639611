"""Counterfactuals: what the SLO quantile would be if one stage's tail behaved like its baseline,
and what it would be after a given lever.

Model (stated, with its limits):

* **Stage counterfactual** (:func:`stage_counterfactuals`): every request's time in stage ``s`` is
  capped at the baseline's SLO quantile of ``s`` (the baseline is the normal requests, see
  attribution); the request loses the difference, and the SLO quantile is recomputed over all
  samples. Other stages are held fixed, so a knock-on effect (less queueing once a slow executor is
  fixed) is *not* in this number; it answers "how much of the tail is this stage's own excess".
* **Lever prediction** (:func:`lever_prediction`): each lever applies its own effect model to the
  per-request stage times, then the quantile is recomputed:

  - ``cache-features``, ``offload-preprocessing``, ``shrink-response``, ``scale-out``: the stage's
    tail is capped at its baseline quantile (a feature cache, a worker pool, a smaller payload or a
    second executor make the slow cases behave like the normal ones);
  - ``prewarm``: cold-start time removed;
  - ``cap-batch-wait``: batch wait capped at the recommended maximum (see :func:`batch_wait_cap_ms`);
  - ``quantize`` (int8) and ``compile-runtime``: compute time scaled by 0.5 and 0.7 (typical
    speed-ups; the real factor depends on the model), and queue time scaled by the change in
    ``rho / (1 - rho)`` of an M/M/1 queue whose utilization ``rho`` drops by the same factor
    (``rho`` from the accelerator utilization, else the compute stage's share of wall time);
  - ``cache-results``: requests whose input hash was already seen (every repeat after the first)
    skip batch wait, queue and compute; the others are unchanged;
  - ``reduce-batch-tokens`` (inter-token): each gap loses ``slope * (running - cap)`` where
    ``slope`` is the fitted ms-per-running-request of the gaps and ``cap`` the baseline's running
    batch; ``speculative-decoding``: gaps halved; ``chunked-prefill``: prefill tail capped at its
    baseline (long prompts stop holding the scheduler).

Limits: the model moves time within a request and keeps arrivals fixed; it cannot see effects the
trace does not show (a cache's hit ratio on future traffic, a second executor's own warm-up), and for
gap SLIs without per-gap data it works on per-request gap statistics.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView

__all__ = ["LEVER_SPEEDUP", "batch_wait_cap_ms", "lever_prediction", "stage_counterfactuals"]

#: Assumed compute speed-up factor of per-request-cost levers (new time = factor * old time).
LEVER_SPEEDUP: dict[str, float] = {N.LEVER_QUANTIZE: 0.5, N.LEVER_COMPILE_RUNTIME: 0.7}
_CAP_TO_BASELINE: dict[str, str] = {
    N.LEVER_CACHE_FEATURES: N.STAGE_FEATURE_FETCH,
    N.LEVER_OFFLOAD_PREPROCESSING: N.STAGE_PREPROCESS,
    N.LEVER_SHRINK_RESPONSE: N.STAGE_EGRESS,
    N.LEVER_SCALE_OUT: N.STAGE_QUEUE,
    N.LEVER_CHUNKED_PREFILL: N.STAGE_PREFILL,
}


def _q(con: duckdb.DuckDBPyConnection, src: str, expr: str, q: float) -> float | None:
    row = con.execute(f"SELECT quantile_cont({expr}, {q}) FROM {src}").fetchone()
    return None if row is None or row[0] is None else round(float(row[0]), 3)


def _base_q(ev: dict[str, Any], stage: str) -> float:
    sq = ev.get("stage_quantiles", {}).get(stage) or {}
    return float(sq.get("baseline_q_ms") or 0.0)


def _col(attr: Attribution, stage: str) -> str | None:
    if stage == N.UNATTRIBUTED:
        return N.UNATTRIBUTED
    if stage == N.STAGE_NETWORK:
        return None  # not part of the server-side SLI
    c = attr.columns.get(stage)
    return None if c is None else f"coalesce({c}, 0)"


def stage_counterfactuals(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any]
) -> dict[str, float | None]:
    """Stage -> SLO quantile (ms) with that stage capped at its baseline quantile (one SQL pass)."""
    if not view.per_request:
        return {}
    q = view.slo.quantile
    exprs = []
    stages = []
    for row in attr.rows:
        col = _col(attr, row["stage"])
        if col is None or row["stage"] == N.UNATTRIBUTED:
            continue
        cap = _base_q(ev, row["stage"])
        stages.append(row["stage"])
        exprs.append(f"quantile_cont(value_ms - greatest({col} - {cap!r}, 0), {q})")
    if not exprs:
        return {}
    vals = con.execute(f"SELECT {', '.join(exprs)} FROM {BREAKDOWN}").fetchone()
    assert vals is not None
    return {s: (None if v is None else round(float(v), 3)) for s, v in zip(stages, vals, strict=True)}


def batch_wait_cap_ms(ev: dict[str, Any]) -> float:
    """Recommended maximum batch wait (ms): a quarter of the baseline's typical compute time, between
    1 and 10 ms. Waiting longer for a batch than a fraction of one batch's compute costs more latency
    than the larger batch saves; 5 ms when the trace has no compute stage."""
    comp = (ev.get("stage_quantiles", {}).get(N.STAGE_COMPUTE) or {}).get("baseline_p50_ms")
    if not comp:
        return 5.0
    return round(min(10.0, max(1.0, 0.25 * float(comp))), 1)


def _rho(ev: dict[str, Any], attr: Attribution) -> float:
    util = ev.get("utilization_pct")
    if util is not None:
        return min(0.95, max(0.05, float(util) / 100.0))
    return 0.5


def lever_prediction(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], lever: str, stage: str
) -> tuple[float | None, str]:
    """Predicted SLO quantile (ms) after ``lever`` and a one-line statement of the model used."""
    q = view.slo.quantile
    if not view.per_request:  # inter-token gaps
        return _gap_prediction(con, view, ev, lever)
    col = _col(attr, stage)
    if lever in _CAP_TO_BASELINE and col is not None:
        cap = _base_q(ev, stage)
        return (
            _q(con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q),
            f"{stage} capped at its baseline p{q * 100:g} ({cap:.1f} ms)",
        )
    if lever == N.LEVER_PREWARM and col is not None:
        return _q(con, BREAKDOWN, f"value_ms - {col}", q), "cold-start time removed"
    if lever == N.LEVER_CAP_BATCH_WAIT and col is not None:
        cap = batch_wait_cap_ms(ev)
        return (
            _q(con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q),
            f"batch wait capped at {cap:g} ms",
        )
    if lever in LEVER_SPEEDUP:
        f = LEVER_SPEEDUP[lever]
        comp = _col(attr, N.STAGE_COMPUTE) or "0"
        queue = _col(attr, N.STAGE_QUEUE) or "0"
        rho = _rho(ev, attr)
        rho2 = rho * f
        qf = (rho2 / (1 - rho2)) / (rho / (1 - rho))
        return (
            _q(con, BREAKDOWN, f"value_ms - {comp} * {1 - f!r} - {queue} * {1 - qf!r}", q),
            f"compute x{f:g}; queue x{qf:.2f} (M/M/1 at utilization {rho:.0%} -> {rho2:.0%})",
        )
    if lever == N.LEVER_CACHE_RESULTS:
        saved = " + ".join(
            c for c in (_col(attr, s) for s in (N.STAGE_BATCH_WAIT, N.STAGE_QUEUE, N.STAGE_COMPUTE)) if c
        ) or "0"
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE ss_hits AS SELECT trace_id FROM (
                SELECT trace_id, row_number() OVER (PARTITION BY input_hash ORDER BY start_unix_ns) AS k
                FROM requests WHERE {view.request_filter} AND input_hash IS NOT NULL) WHERE k > 1"""
        )
        return (
            _q(
                con,
                f"{BREAKDOWN} LEFT JOIN (SELECT trace_id, true AS hit FROM ss_hits) USING (trace_id)",
                f"value_ms - CASE WHEN hit THEN {saved} ELSE 0 END",
                q,
            ),
            "repeated inputs (every repeat of an input hash) served from the cache: no batch wait, queue, compute",
        )
    if col is not None:
        cap = _base_q(ev, stage)
        return _q(con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q), f"{stage} capped at its baseline"
    return None, "no model for this stage"


def _gap_prediction(con: duckdb.DuckDBPyConnection, view: SLIView, ev: dict[str, Any], lever: str) -> tuple[float | None, str]:
    q = view.slo.quantile
    src = f"{view.name} g LEFT JOIN (SELECT trace_id, any_value(batch_size) AS running FROM requests GROUP BY 1) r USING (trace_id)"
    if lever == N.LEVER_SPECULATIVE_DECODING:
        return _q(con, view.name, "value_ms * 0.5", q), "decode gaps halved (speculative decoding, typical 2x)"
    row = con.execute(f"SELECT regr_slope(value_ms, running), count(running) FROM {src}").fetchone()
    slope = row[0] if row else None
    cap = ev.get("batch_size_baseline")
    if slope is not None and cap is not None and row is not None and row[1] > 0 and slope > 0:
        return (
            _q(con, src, f"value_ms - {float(slope)!r} * greatest(coalesce(running, 0) - {float(cap)!r}, 0)", q),
            f"running decode batch capped at {float(cap):.0f} (baseline mean); gaps fall by {float(slope):.2f} ms per stream removed",
        )
    base = _q(con, view.name, "value_ms", 0.5)
    return None if base is None else _q(con, view.name, f"least(value_ms, {base * 1.5!r})", q), "slow gaps capped at 1.5x the median gap"
