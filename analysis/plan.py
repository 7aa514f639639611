"""An ordered plan when no single lever meets the SLO: levers composed, each on the previous one's
counterfactual.

When the report's levers (analysis.levers, one per stage that owns part of the excess) each leave
the SLO quantile above the threshold, :func:`build_plan` applies them one after another in the order
of ``names.LEVER_PHASES`` (measure, the autoscaler's signal, per-request cost, batching, caching,
capacity; within a phase the stage with the larger share first):

* every step runs the lever's own effect model (analysis.counterfactual.lever_prediction) on the
  per-request breakdown **as the previous steps left it**: the model's per-request new SLI value
  (the expression it computed its quantile from, noted by analysis.weighting.recording) replaces
  ``value_ms``, and the time it removed is taken from the lever's stage column (what exceeds that
  stage's time from the request's other stages, in column order), so the next lever's model reads
  the transformed stage times, never the original ones plus independent savings;
* the plan stops at the first step whose predicted quantile meets the threshold (``plan_status``
  ``met``) or when the levers run out (``not_met``; ``plan_left`` gives the remaining gap in ms and
  the stage holding most of the excess of the requests still over the threshold).

Each step carries ``interval_ms``, the 95 % interval of its predicted quantile on the composed
breakdown (analysis.interval_sql.breakdown_estimate, the estimator the levers' own intervals use),
and, where the SLO sets ``accelerator_price_per_hour``, ``cost_delta``: the step lever's cost change
(analysis.cost.lever_cost_delta of analysis.cost_levers.lever_effect) on the state the previous
steps left, its money relative to that state's cost (the report's cost times the earlier steps'
factors); None without a price. **The cheaper lever between two that meet the SLO**: when a step's
lever would meet the SLO, every later lever is predicted from the same state; among those that also
meet it the one with the smallest relative cost change goes instead (ties and unknown changes keep
the seeds' order), and the step's ``cheaper_than`` names the levers it beat.

A lever whose model is not a per-request transformation (``prewarm``: the quantile of the unaffected
requests) or has no prediction is left out of the plan, and said so in ``plan_left["skipped"]``.
Per-gap SLIs (inter-token) have no per-request breakdown to compose on: their plan is empty and
``plan_left`` says so. Units: milliseconds.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import cost as CO
from stagescope.analysis import counterfactual as C
from stagescope.analysis import fleet_levers as FL
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.engine_levers import output_cap
from stagescope.analysis.interval_sql import breakdown_estimate
from stagescope.analysis.llm_levers import batch_cap
from stagescope.analysis.weighting import breakdown_quantile, recording
from stagescope.analysis.workload_levers import ADDS_TIME
from stagescope.analysis.workload_levers import setting as workload_setting

__all__ = ["build_plan", "phase_of"]

_SAVED = "ss_breakdown_before_plan"


def phase_of(lever: str) -> int:
    """Index of ``lever``'s phase in ``names.LEVER_PHASES`` (a lever in no phase: after the last)."""
    for i, (_, levers) in enumerate(N.LEVER_PHASES):
        if lever in levers:
            return i
    return len(N.LEVER_PHASES)


def _setting(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    lever: str,
    stage: str,
) -> str | None:
    """What the lever changes, where its effect model has a setting; None otherwise."""
    col = attr.columns.get(stage)
    if lever == N.LEVER_REDUCE_BATCH_TOKENS and col is not None and view.per_request:
        got = batch_cap(con, view, attr, f"coalesce({col}, 0)", stage)
        return None if got is None else got[2]
    if lever == N.LEVER_SCALE_OUT:
        m = C.executor_model(con, view, attr)
        if m is not None:
            return f"executors {m['executors']:.0f} -> {2 * m['executors']:.0f}"
        return "autoscale on queue depth (the queue's tail at its baseline's)"
    if lever == N.LEVER_CAP_OUTPUT_TOKENS and view.per_request:
        cap = output_cap(con, view, attr)
        return None if cap is None else f"max output tokens -> {cap:.0f}"
    if lever == N.LEVER_CAP_BATCH_WAIT:
        return f"max batch wait -> {C.batch_wait_cap_ms(ev):g} ms"
    if lever in C.FLEET_LEVERS:
        return FL.setting(con, view, attr, ev, lever)
    return workload_setting(ev, lever)


def _apply(
    con: duckdb.DuckDBPyConnection, attr: Attribution, src: str, expr: str, stage: str, adds: bool = False
) -> None:
    """Replace the breakdown with the lever's per-request outcome: ``value_ms`` = ``expr``; the time
    removed comes off ``stage``'s column, the rest (if the lever removed more than that stage's time)
    off the other stage columns in order; ``unattributed`` keeps the time in no stage. ``adds``: the
    lever may also add time to a request (a cascade's escalations pay two models), kept in ``value_ms``;
    otherwise a request never gets slower."""
    cols = [c for c in attr.columns.values() if c != N.UNATTRIBUTED]
    first = attr.columns.get(stage)
    order = ([first] if first in cols else []) + [c for c in cols if c != first]
    parts = [f"value_ms - ({expr}) AS ss_cut" if adds else f"greatest(value_ms - ({expr}), 0) AS ss_cut"]
    new = []
    taken = "0"
    for c in order:
        new.append(f"greatest(coalesce({c}, 0) - greatest(ss_cut - ({taken}), 0), 0) AS {c}")
        taken = f"{taken} + coalesce({c}, 0)"
    keep = ", ".join(["trace_ref", "start_unix_ns"])
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_plan_step AS
        SELECT b.* REPLACE ({", ".join([*new, "b.value_ms - ss_cut AS value_ms"])})
        FROM (SELECT {BREAKDOWN}.*, n.ss_cut FROM {BREAKDOWN} JOIN (
                  SELECT {keep}, {parts[0]} FROM {src}) n USING ({keep})) b"""
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE {BREAKDOWN} AS SELECT * EXCLUDE (ss_cut) FROM ss_plan_step")
    con.execute("DROP TABLE ss_plan_step")


def _left(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], pred: float | None
) -> dict[str, Any]:
    """The gap the plan leaves (ms over the threshold) and the stage holding most of the excess of
    the requests still over the threshold (their mean time in it above its baseline median; with no
    baseline request at all, every sample over the threshold, their mean time in it, and
    ``baseline`` False says so)."""
    thr = view.slo.threshold_ms
    stage, excess = None, None
    quantiles = ev.get("stage_quantiles", {})
    has_baseline = attr.baseline_n > 0
    for st, c in attr.columns.items():
        base = float((quantiles.get(st) or {}).get("baseline_p50_ms") or 0.0) if has_baseline else 0.0
        row = con.execute(
            f"SELECT avg(coalesce({c}, 0)) - {base!r} FROM {BREAKDOWN} WHERE value_ms > {thr!r}"
        ).fetchone()
        if row and row[0] is not None and (excess is None or float(row[0]) > excess):
            stage, excess = st, float(row[0])
    return {
        "gap_ms": None if pred is None else round(max(0.0, pred - thr), 3),
        "stage": stage,
        "stage_excess_ms": None if excess is None else round(excess, 3),
        "baseline": has_baseline,
    }


def _state_cost(cost: dict[str, Any] | None, factor: float | None) -> dict[str, Any] | None:
    """The cost block of the state the previous steps left: money scaled by their cost factors
    (unknown once a step's change is unknown)."""
    if cost is None:
        return None
    keys = ("cost_per_1k_requests", "fleet_cost_per_1k_requests")
    return {**cost, **{k: None if factor is None or cost.get(k) is None else cost[k] * factor for k in keys}}


def _meets(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    lv: dict[str, Any],
) -> tuple[float | None, str, list[tuple[str, str]]]:
    """The lever's prediction from the current state, its model line and the expressions it noted."""
    with recording() as seen:
        got, model = C.lever_prediction(con, view, attr, ev, lv["lever"], lv["stage"])
    return got, model, list(seen)


def _cheaper(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    first: tuple[dict[str, Any], float, str, list[tuple[str, str]]],
    rest: list[dict[str, Any]],
) -> tuple[tuple[dict[str, Any], float, str, list[tuple[str, str]]], list[dict[str, Any]]]:
    """Among ``first`` (a lever that meets the SLO from the current state) and the later levers that
    also meet it from there, the one with the smallest relative cost change (a tie or an unknown
    change keeps the earlier); and the levers it beat (lever, stage, predicted, relative change)."""
    thr = view.slo.threshold_ms

    def rel(lv: dict[str, Any]) -> float | None:
        return CO.lever_cost_delta(None, CO.lever_effect(con, view, attr, ev, lv["lever"]))["relative"]

    best, best_rel = first, rel(first[0])
    met = [(first, best_rel)]
    for lv in rest:
        got, model, seen = _meets(con, view, attr, ev, lv)
        if got is None or not seen or got > thr:
            continue
        r = rel(lv)
        met.append(((lv, got, model, seen), r))
        if r is not None and best_rel is not None and r < best_rel - 1e-9:
            best, best_rel = (lv, got, model, seen), r
    beaten = [
        {"lever": c[0]["lever"], "stage": c[0]["stage"], "predicted_quantile_ms": round(float(c[1]), 3),
         "relative_cost_change": r}
        for c, r in met if c[0] is not best[0]
    ]  # fmt: skip
    return best, beaten if best[0] is not first[0] else []


def build_plan(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    levers: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None, dict[str, Any] | None]:
    """``(plan, plan_status, plan_left)`` for a breached report whose lever entries are ``levers``
    (see the module docstring); ``([], None, None)`` when one lever already meets the SLO. The
    breakdown is restored before returning."""
    thr = view.slo.threshold_ms
    price = view.slo.accelerator_price_per_hour
    cost = None if price is None else CO.cost_report(con, view, attr, price)
    priced = cost is not None and cost.get("cost_per_1k_requests") is not None
    factor: float | None = 1.0
    usable = [lv for lv in levers if lv.get("lever") is not None and lv.get("acceptable") is not False]
    if any(lv.get("predicted_p99_ms") is not None and lv["predicted_p99_ms"] <= thr for lv in usable):
        return [], None, None
    if not view.per_request:
        return [], N.PLAN_NOT_MET, {
            "gap_ms": None, "stage": None, "stage_excess_ms": None,
            "skipped": [], "reason": "per-gap SLI: no per-request breakdown to compose levers on",
        }  # fmt: skip
    share = {r["stage"]: float(r.get("share") or 0.0) for r in attr.rows}
    ordered = sorted(usable, key=lambda lv: (phase_of(lv["lever"]), -share.get(lv["stage"], 0.0)))
    steps: list[dict[str, Any]] = []
    skipped: list[str] = []
    pred: float | None = None
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_SAVED} AS SELECT * FROM {BREAKDOWN}")
    try:
        remaining = list(ordered)
        while remaining:
            lv = remaining.pop(0)
            got, model, seen = _meets(con, view, attr, ev, lv)
            if got is None or not seen:
                skipped.append(f"{lv['lever']} ({lv['stage']}): {model}" if got is None else
                               f"{lv['lever']} ({lv['stage']}): its model is not a per-request change")  # fmt: skip
                continue
            beaten: list[dict[str, Any]] = []
            if priced and got <= thr:  # the cheaper of the levers that meet the SLO from here
                (lv, got, model, seen), beaten = _cheaper(con, view, attr, ev, (lv, got, model, seen), remaining)
            lever, stage = lv["lever"], lv["stage"]
            setting = _setting(con, view, attr, ev, lever, stage)
            delta = None
            if priced:  # on the state the previous steps left, before this step changes it
                delta = CO.lever_cost_delta(_state_cost(cost, factor), CO.lever_effect(con, view, attr, ev, lever))
                rel = delta["relative"]
                factor = None if factor is None or rel is None else factor * (1.0 + rel)
            src, expr = seen[-1]
            _apply(con, attr, src, expr, stage, adds=lever in ADDS_TIME)
            est = breakdown_estimate(con, BREAKDOWN, "value_ms", view.slo.quantile, attr)
            pred = None if est is None else float(est)
            iv = getattr(est, "interval", None)
            step = {
                "lever": lever, "stage": stage, "setting": setting, "predicted_quantile_ms": pred,
                "interval_ms": None if iv is None else [None if x is None else round(float(x), 3) for x in iv],
                "cost_delta": delta, "model": model,
            }  # fmt: skip
            if beaten:
                step["cheaper_than"] = beaten
            steps.append(step)
            if pred is not None and pred <= thr:
                return steps, N.PLAN_MET, None
        if pred is None:  # no step: the gap is the SLO quantile's own
            pred = breakdown_quantile(con, BREAKDOWN, "value_ms", view.slo.quantile, attr)
        left = _left(con, view, attr, ev, pred)
        left["skipped"] = skipped
        return steps, N.PLAN_NOT_MET, left
    finally:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {BREAKDOWN} AS SELECT * FROM {_SAVED}")
        con.execute(f"DROP TABLE {_SAVED}")
