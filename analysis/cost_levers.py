"""Each lever's effect on accelerator work and capacity, for its cost change (analysis.cost).

:func:`lever_effect` returns ``work_factor`` (accelerator work per request, new over current) and
``capacity_factor`` (accelerators a lever adds on purpose, new over current), the statement of the
model and the sign; analysis.cost.lever_cost_delta turns it into money. The models are stated in
analysis.cost's docstring and in each lever's ``model`` line.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import counterfactual as C
from stagescope.analysis import fleet_levers as FL
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis import workload_levers as WL
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.counterfactual import batch_wait_cap_ms, weighted_slope
from stagescope.analysis.event_rules import EVENT_LEVERS, capacity_effect
from stagescope.analysis.keys import input_ref

__all__ = ["lever_effect"]

#: Levers that change no accelerator time.
_OFF_ACCELERATOR = {
    N.LEVER_CACHE_FEATURES: "feature reads move to a cache: accelerator time unchanged",
    N.LEVER_OFFLOAD_PREPROCESSING: "preprocessing moves to a CPU worker pool: accelerator time unchanged "
    "(the pool's CPU is not priced)",
    N.LEVER_SHRINK_RESPONSE: "a smaller response: accelerator time unchanged",
    N.LEVER_CHUNKED_PREFILL: "the same prompt tokens, scheduled in chunks: accelerator time unchanged",
    N.LEVER_PREWARM: "the model loads before the pod reports ready: the same accelerator time, earlier",
}


def _factor(work: float | None, capacity: float | None, model: str, sign: str) -> dict[str, Any]:
    return {"work_factor": work, "capacity_factor": capacity, "model": model, "sign": sign}


def _batch_effect(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any]
) -> dict[str, Any]:
    """cap-batch-wait: per-request work ``a / B + b`` at the current mean batch ``B`` and the capped
    one ``B'``, ``a`` and ``b`` fitted on compute against batch size."""
    comp = attr.columns.get(N.STAGE_COMPUTE)
    row = con.execute(f"SELECT avg(batch_size) FROM {view.name}").fetchone()
    b_now = float(row[0]) if row and row[0] else None
    if comp is None or b_now is None:
        return _factor(
            None, 1.0, "smaller batches amortize less compute: no compute or batch size in the trace", "+"
        )
    cap = batch_wait_cap_ms(ev)
    b_new = min(b_now, 1.0 + Q.arrivals(con, view.arrivals).rate_per_s * cap / 1000.0)
    src = f"(SELECT *, batch_size AS batch FROM {BREAKDOWN})"
    slope = weighted_slope(con, src, f"coalesce({comp}, 0)", "batch", attr.weight)
    mrow = con.execute(f"SELECT avg(coalesce({comp}, 0)), avg(batch_size) FROM {BREAKDOWN}").fetchone()
    if slope is None or not mrow or mrow[0] is None or mrow[1] is None:
        return _factor(
            None, 1.0, "smaller batches amortize less compute: no fit of compute on batch size", "+"
        )
    b = max(0.0, float(slope))
    a = max(0.0, float(mrow[0]) - b * float(mrow[1]))
    before, after = a / b_now + b, a / b_new + b
    factor = after / before if before > 0 else 1.0
    return _factor(factor, 1.0, (
        f"batches shrink from {b_now:.1f} to {b_new:.1f} items; a batch costs {a:.1f} ms + {b:.2f} ms per item, so "
        f"accelerator time per request goes {before:.2f} -> {after:.2f} ms"
    ), "+" if factor > 1.0 else "0")  # fmt: skip


def _decode_effect(con: duckdb.DuckDBPyConnection, view: SLIView, cap: Any = None) -> dict[str, Any]:
    """reduce-batch-tokens: a decode step ``a + b r`` serves ``r`` streams, so a token costs
    ``a / r + b``; the cap is the one the prediction uses (``evidence.running_cap``, analysis.
    llm_levers.gap_prediction), else the fitted step at half the threshold."""
    src = (
        f"{view.name} g LEFT JOIN (SELECT trace_id, any_value(batch_size) AS running FROM requests GROUP BY 1) r "
        "USING (trace_id)"
    )
    try:
        row = con.execute(
            f"SELECT regr_slope(value_ms, running), regr_intercept(value_ms, running), avg(running) FROM {src}"
        ).fetchone()
    except duckdb.Error:  # per-request samples have no trace id to join on
        row = None
    if not row or row[0] is None or row[0] <= 0 or not row[2]:
        return _factor(
            None, 1.0, "a smaller running batch serves fewer tokens per step: no fit of the step on it", "+"
        )
    b, a, r_now = float(row[0]), max(0.0, float(row[1])), float(row[2])
    own = float(cap) if isinstance(cap, int | float) and cap >= 1 else float(int((view.slo.threshold_ms / 2.0 - a) / b))
    r_new = min(r_now, max(1.0, own))
    factor = (a / r_new + b) / (a / r_now + b)
    return _factor(factor, 1.0, (
        f"the running batch goes {r_now:.1f} -> {r_new:.0f} streams; a step costs {a:.1f} ms + {b:.2f} ms per "
        f"stream, so each token's accelerator time goes x{factor:.2f} (fewer tokens per step)"
    ), "+" if factor > 1.0 else "0")  # fmt: skip


def lever_effect(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution | None,
    ev: dict[str, Any],
    lever: str | None,
) -> dict[str, Any]:
    """What ``lever`` does to accelerator work and capacity (``work_factor``, ``capacity_factor``:
    new over current, None where unknown; ``model``: the statement; ``sign``), on this data."""
    if lever is None:
        return _factor(1.0, 1.0, "no lever", "0")
    if lever in WL.WORKLOAD_LEVERS:
        return WL.cost_effect(con, view, attr, ev, lever)
    if lever in _OFF_ACCELERATOR:
        return _factor(1.0, 1.0, _OFF_ACCELERATOR[lever], "0")
    if lever in C.FLEET_LEVERS:
        got = FL.cost_effect(ev, lever)
        if got is not None:
            return _factor(*got)
    if lever == N.LEVER_SCALE_OUT:
        return _factor(1.0, 2.0, "executors doubled (the prediction's model): twice the accelerators at the same "
                       "traffic, the same work per request", "+")  # fmt: skip
    if lever in (N.LEVER_QUANTIZE, N.LEVER_COMPILE_RUNTIME):
        curve = QL.speed_curve(ev.get("model") or {}, lever)
        if not curve:
            return _factor(
                None, 1.0, f"no measured batch time for {lever}: cheaper by its speed-up, unknown", "-"
            )
        comp = (ev.get("stage_quantiles", {}).get(N.STAGE_COMPUTE) or {}).get("baseline_p50_ms")
        f, rows = QL.nearest_ratio(curve, comp)
        return _factor(f, 1.0, f"the service measured {lever}'s batch at x{f:.2f} the time ({rows} rows): "
                       "that much accelerator time per request, the fleet sized to the same utilization", "-")  # fmt: skip
    if lever == N.LEVER_CACHE_RESULTS:
        row = con.execute(
            f"SELECT count(hh) - count(DISTINCT hh), count(*) FROM (SELECT {input_ref(con)} AS hh FROM requests "
            f"WHERE {view.request_filter})"
        ).fetchone()
        if not row or not row[1]:
            return _factor(None, 1.0, "repeats served from the cache skip compute: no requests", "-")
        share = float(row[0]) / float(row[1])
        return _factor(1.0 - share, 1.0, f"{share:.0%} of requests repeat an input already seen and skip the "
                       "accelerator", "-" if share > 0 else "0")  # fmt: skip
    if lever == N.LEVER_CAP_BATCH_WAIT and attr is not None and view.per_request:
        return _batch_effect(con, view, attr, ev)
    if lever == N.LEVER_REDUCE_BATCH_TOKENS:
        return _decode_effect(con, view, ev.get("running_cap"))
    if lever in EVENT_LEVERS:  # pods added on purpose (analysis.event_rules); ev["fleet"] from the events
        return capacity_effect(lever, ev.get("fleet"))
    if lever == N.LEVER_SPECULATIVE_DECODING:
        return _factor(None, 1.0, "a draft model's tokens cost accelerator time, fewer target steps save it: no "
                       "cost model; measure after applying", "0")  # fmt: skip
    return _factor(None, None, f"no cost model for {lever}", "0")
