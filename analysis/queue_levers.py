"""The queueing levers' models (analysis.counterfactual dispatches to them): the executors' queue as
measured (arrivals, executor time per request, how many serve at once), ``scale-out`` (more executors,
a G/G/c queue or, for an LLM engine's slots, the measured arrivals replayed) and
``offload-preprocessing`` (a worker pool for a CPU stage). Milliseconds throughout; the stated models
and their limits are in analysis.counterfactual's docstring.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView, sql_str
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import trace_ref
from stagescope.analysis.llm_levers import slot_scale_out

__all__ = ["executor_model", "kind_col", "offload", "rho", "scale_out", "served_condition"]


def kind_col(attr: Attribution, kind: str) -> str | None:
    """SQL for a request's time in the stages of ``kind`` (their columns summed), or None."""
    cols = [f"coalesce({attr.columns[s]}, 0)" for s in attr.of_kind(kind)]
    if not cols:
        return None
    return cols[0] if len(cols) == 1 else "(" + " + ".join(cols) + ")"


def rho(ev: dict[str, Any]) -> float:
    util = ev.get("utilization_pct")
    if util is not None:
        return min(0.95, max(0.05, float(util) / 100.0))
    return 0.5


def served_condition(attr: Attribution) -> tuple[str, bool] | None:
    """``(condition on stages s, per_batch)`` selecting the executor's work: the stages of kind compute
    (a batch is one interval however many requests it carries); for token streams without them (an
    LLM engine) the stages of kind prefill and decode, one interval per request: its time holding a
    slot, first prefill start to last decode end. None when the breakdown has neither."""
    compute = attr.of_kind(N.KIND_COMPUTE)
    if compute:
        return "s.stage IN (" + ", ".join(sql_str(x) for x in compute) + ")", True
    stream = attr.of_kind(N.KIND_PREFILL) + attr.of_kind(N.KIND_DECODE)
    if stream:
        return "s.stage IN (" + ", ".join(sql_str(x) for x in stream) + ")", False
    return None


def executor_model(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution
) -> dict[str, float] | None:
    """The executor as a queue: current executors (most service intervals at once: batches computing,
    or streams holding an engine slot), service time per request (busy ms / requests), service-time
    variability, arrival rate and variability."""
    served = served_condition(attr)
    if served is None:
        return None
    cond, per_batch = served
    # every one of the SLO's requests, not the breakdown's (on large inputs a sample, which would see
    # few of each batch's members and overstate the executor time per request)
    ref = trace_ref(con)
    reqs = f"(SELECT {ref} FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL)"
    intervals = (
        f"SELECT DISTINCT s.start_unix_ns AS a, s.end_unix_ns AS e FROM stages s SEMI JOIN {reqs} r USING ({ref}) "
        f"WHERE {cond}"
        if per_batch
        else f"SELECT min(s.start_unix_ns) AS a, max(s.end_unix_ns) AS e FROM stages s SEMI JOIN {reqs} r "
        f"USING ({ref}) WHERE {cond} GROUP BY s.{ref}"
    )
    row = con.execute(
        f"""WITH b AS ({intervals}),
             ev AS (SELECT a AS t, 1 AS d FROM b UNION ALL SELECT e, -1 FROM b),
             conc AS (SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS k FROM ev)
        SELECT (SELECT sum(e - a) / 1e6 FROM b), (SELECT avg(e - a) FROM b), (SELECT var_pop(e - a) FROM b),
               (SELECT max(k) FROM conc), (SELECT count(*) FROM {reqs} WHERE {ref} IN
                                           (SELECT {ref} FROM stages s WHERE {cond}))"""
    ).fetchone()
    if row is None or not row[0] or not row[4]:
        return None
    busy_ms, mean_b, var_b, conc, n_served = row
    if attr.weighted and attr.weight is not None:
        # sampled traces: the kept requests' batches are not the executor's batches; per request, its
        # batch's time over the batch size is its share of the executor (a stream: its own time holding
        # a slot, prefill and decode), counted 1 / p times
        w = attr.weight
        if per_batch:
            held = str(kind_col(attr, N.KIND_COMPUTE))
            share = f"{held} / greatest(coalesce(batch_size, 1), 1)"
        else:
            cols = [c for c in (kind_col(attr, k) for k in (N.KIND_PREFILL, N.KIND_DECODE)) if c]
            held = share = "(" + " + ".join(f"coalesce({c}, 0)" for c in cols) + ")"
        got = con.execute(
            f"""SELECT sum({w} * {share}) / sum({w}), sum({w} * {held}) / sum({w}), sum({w} * {held} * {held}) / sum({w})
                FROM {BREAKDOWN} WHERE {held} > 0"""
        ).fetchone()
        if got is None or not got[0]:
            return None
        per_req, m1, m2 = (float(v) for v in got)
        busy_ms, n_served = per_req, 1.0
        mean_b, var_b = m1 * 1e6, max(0.0, m2 - m1 * m1) * 1e12  # ns, as the interval rows above
    arr = Q.arrivals(con, view.arrivals, scale_ms=float(busy_ms) / float(n_served))
    return {
        "executors": float(max(1, int(conc or 1))),
        "service_ms": float(busy_ms) / float(n_served),
        "cs2": float(var_b) / float(mean_b) ** 2 if mean_b else 1.0,
        "lam_per_s": arr.rate_per_s,
        "ca2": arr.ca2,
    }


def scale_out(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, col: str, factor: float = 2.0
) -> tuple[float | None, str] | None:
    """scale-out's model with the executors multiplied by ``factor`` (2: doubled; at least one more)."""
    m = executor_model(con, view, attr)
    if m is None or m["lam_per_s"] <= 0:
        return None
    c2 = max(int(m["executors"]) + 1, int(factor * m["executors"]))
    # the added executors' measured speed where the service measured it (a second server on a machine
    # without a free core is slower, and slows the first), else as fast as the measured ones
    measured = QL.service_ratio(con, N.LEVER_SCALE_OUT)
    ratio = measured[0] if measured is not None else 1.0
    speed = (
        "" if measured is None else
        f"; each request's executor time x{ratio:.2f} as the service measured the scaled-out fleet "
        f"({measured[1]:.0f} -> {measured[2]:.0f} ms with every executor busy)"
    )  # fmt: skip
    # an LLM engine's slots: the measured arrivals replayed through the added slots (the trace's own
    # bursts and length; a steady-state formula overstated a 20 s run's wait 5x at utilization 0.9)
    replayed = slot_scale_out(con, view, attr, col, executors=int(m["executors"]), ratio=ratio, to_executors=c2)
    if replayed is not None:
        return replayed[0], replayed[1] + speed
    service_ms = m["service_ms"] * ratio
    model = Q.QueueModel(c2, 1000.0 / service_ms, m["lam_per_s"], m["ca2"], m["cs2"])
    if model.utilization >= 0.999:
        return None
    wait = model.wait_ms_sql(Q.uniform_rank_sql("trace_ref"))
    pred = _q(con, BREAKDOWN, f"value_ms - {col} + {wait}", view.slo.quantile, attr)
    return pred, (
        f"executors {m['executors']:.0f} -> {c2}: queue wait of a G/G/{c2} queue (Allen-Cunneen) at "
        f"{m['lam_per_s']:.1f} req/s, {service_ms:.1f} ms of executor time per request "
        f"(utilization {model.utilization:.0%}, {model.p_wait:.1%} of requests wait){speed}"
    )


def offload(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, col: str, stage: str
) -> tuple[float | None, str] | None:
    p5 = _q(con, BREAKDOWN, col, 0.05, attr, part=True)
    if p5 is None:
        return None
    service_ms = max(p5, 1e-3)
    arr = Q.arrivals(con, view.arrivals, scale_ms=service_ms)
    if arr.rate_per_s <= 0:
        return None
    a = arr.rate_per_s * service_ms / 1000.0
    threshold = view.slo.threshold_ms
    # the cheapest pool that fixes the breach: the smallest k (from 2) whose predicted quantile meets
    # the SLO; failing that, the one where fewer than the error budget of requests wait at all
    fallback = Q.servers_for(a, view.slo.error_budget, start=2)
    pred: float | None = None
    model = Q.QueueModel(fallback, 1000.0 / service_ms, arr.rate_per_s, arr.ca2, 0.25)
    for k in range(max(2, int(a) + 1), fallback + 1):
        model = Q.QueueModel(k, 1000.0 / service_ms, arr.rate_per_s, arr.ca2, 0.25)
        wait = model.wait_ms_sql(Q.uniform_rank_sql("trace_ref"))
        pred = _q(
            con,
            BREAKDOWN,
            f"value_ms - {col} + least({col}, {service_ms!r} + {wait})",
            view.slo.quantile,
            attr,
        )
        if pred is not None and pred <= threshold:
            break
    how = (
        f"the smallest whose predicted p{view.slo.objective * 100:g} meets the {threshold:g} ms SLO"
        if pred is not None and pred <= threshold
        else f"the smallest with under {view.slo.error_budget:.1%} of requests waiting"
    )
    return pred, (
        f"{stage} ({service_ms:.1f} ms of CPU per request, the stage's p5) on a pool of {model.servers} "
        f"workers, {how} at {arr.rate_per_s:.1f} req/s ({model.p_wait:.0%} of requests wait for a worker)"
    )
