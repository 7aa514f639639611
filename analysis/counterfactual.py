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

  - ``cache-features``, ``shrink-response``: the stage's tail is capped at its baseline quantile
    (a feature cache or a smaller payload make the slow cases behave like the normal ones);
  - ``scale-out``: executors doubled; each request's queue time is replaced by the wait of a G/G/2c
    queue (Allen-Cunneen, :mod:`~stagescope.analysis.queueing`) with the measured arrival rate, the
    arrivals' variability at the scale of one service time (index of dispersion of counts) and the
    executor time per request (busy time of distinct compute spans / requests; for token streams
    without compute spans, an LLM engine's slots: each stream's prefill start to decode end, ``c`` the
    most streams in service at once). It assumes the added executors are as fast as the measured
    ones (a second engine on a core of its own) unless the service measured the scaled-out fleet's
    service time (``stagescope_executor_service_seconds{variant}``, :func:`quality.service_ratio`):
    then the executor time per request is scaled by the measured ratio;
  - ``offload-preprocessing``: the stage's p5 is its CPU cost; the waiting inside the stage is replaced
    by the wait for a worker of a G/G/k pool (Erlang C with an exponential tail), k the smallest pool
    whose predicted quantile meets the SLO (the cheapest fix; else the smallest with fewer than
    ``1 - objective`` of requests waiting); assumes the pool's threads find free CPU cores;
  - ``prewarm``: the requests that waited for a model load (and ran in the backlog's big batches)
    are served like the others: the quantile of the unaffected requests;
  - ``cap-batch-wait``: batch wait capped at the recommended maximum (see :func:`batch_wait_cap_ms`);
    batches shrink to ``1 + rate * cap`` items and compute by the fitted ms per batch item;
  - ``quantize`` (int8) and ``compile-runtime``: compute time scaled by the ratio of the batch times
    the service measured for the lever's variant and for the model as served (exported metrics, see
    :mod:`~stagescope.analysis.quality`; at the measured batch size nearest the tail's compute), and
    each request's queue time replaced by the wait of the executors' G/G/c queue (as for
    ``scale-out``) with the executor time per request scaled by the compute-weighted ratio (where the
    trace has no compute spans to fit that on: queue time scaled by the change in
    ``rho / (1 - rho)`` of an M/M/1 queue, ``rho`` from the accelerator utilization, else 0.5). Without
    that measurement there is no effect model: no prediction, "measure after applying";
  - ``cache-results``: requests whose input hash was already seen (every repeat after the first)
    skip batch wait, queue and compute; the others are unchanged;
  - ``reduce-batch-tokens`` (inter-token): the predicted quantile at a running-batch cap is the
    fitted step time at the cap (gap = a + b * running, fitted to the median gap at each running
    batch size; ``running`` = the gap's own running batch where the server counted it, else its
    stream's mean) plus the quantile of the gaps' scatter around the fit among the gaps that already
    ran at the cap or below (interference from prefills joining a step, stalls, which the cap does
    not remove); the cap is the largest whose prediction stays within 80 % of the threshold
    (``evidence.running_cap``); ``speculative-decoding``: gaps halved;
  - ``reduce-batch-tokens`` (per-request SLIs): the stage's time fitted on the batch size, the cap
    halved from the largest batch; requests over it lose the fitted time beyond it;
  - ``chunked-prefill`` (TTFT): a long prompt's own prefill is unchanged, the others wait at most for
    the step in progress and their own step, each carrying one 256-token chunk (these two LLM
    models live in analysis.llm_levers);
  - ``cap-output-tokens``: output tokens capped at the baseline's quantile at the same time per token
    (:mod:`~stagescope.analysis.engine_levers`); ``more-api-servers`` and ``kv-cache-headroom``: their
    stage's tail capped at its baseline quantile; ``prefix-caching``: every repeated prompt prefills
    like the baseline's repeats (analysis.fleet_levers);
  - the fleet levers (``scale-on-queue-depth``, ``concurrency-limit``, ``kv-cache-aware-routing``):
    :mod:`~stagescope.analysis.fleet_levers`.
  - ``separate-prefill-decode``, ``cap-prompt-tokens``, ``continuous-batching``,
    ``cascade-small-model``, and ``chunked-prefill`` on inter-token gaps: analysis.workload_levers.

Sampled traces: every quantile and fit counts each breakdown row by the attribution's weight
(``1 / sampling_p`` times its stratum's factor, analysis.weighting), and the arrivals and executor
time the queueing models read are estimated from the weighted requests.

Every model reads the stages by **kind** (analysis.kinds), not by name: "compute" is the time in
the stages of kind compute (the batcher's ``compute``, a team's ``rerank``), "queue" that of kind
queue, and so on; the stage a lever is predicted for is the one whose excess it answers.

Limits: the model moves time within a request and keeps arrivals fixed; it cannot see effects the
trace does not show (a cache's hit ratio on future traffic, a second executor's own warm-up), and for
gap SLIs without per-gap data it works on per-request gap statistics.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView, sql_str
from stagescope.analysis.breakdown import with_columns
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import input_ref, trace_ref
from stagescope.analysis.llm_levers import (
    CHUNK_TOKENS,
    batch_cap,
    chunked_prefill,
    gap_prediction,
    slot_scale_out,
)
from stagescope.analysis.weighting import weighted_quantile, weighted_quantile_sql, weighted_slope
from stagescope.analysis.workload_levers import prediction as workload_prediction

__all__ = [
    "CHUNK_TOKENS",
    "MODEL_LEVERS",
    "batch_wait_cap_ms",
    "lever_prediction",
    "scale_out",
    "stage_counterfactuals",
    "weighted_quantile",
    "weighted_quantile_sql",
    "weighted_slope",
]

#: Levers that swap the model for a faster variant: their compute factor is the service's measurement.
MODEL_LEVERS: frozenset[str] = frozenset({N.LEVER_QUANTIZE, N.LEVER_COMPILE_RUNTIME})
#: The fleet levers, whose models live in analysis.fleet_levers.
FLEET_LEVERS: frozenset[str] = frozenset(
    {N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_CONCURRENCY_LIMIT, N.LEVER_KV_CACHE_AWARE_ROUTING}
)
#: Levers whose fallback model caps the stage's tail at its baseline quantile, with the kind of stage
#: each is for.
_CAP_TO_BASELINE: dict[str, str] = {
    N.LEVER_CACHE_FEATURES: N.KIND_FETCH,
    N.LEVER_OFFLOAD_PREPROCESSING: N.KIND_CPU,
    N.LEVER_SHRINK_RESPONSE: N.KIND_EGRESS,
    N.LEVER_SCALE_OUT: N.KIND_QUEUE,
    N.LEVER_CHUNKED_PREFILL: N.KIND_PREFILL,
    N.LEVER_SHRINK_REQUEST: N.KIND_INGRESS,
    N.LEVER_PREWARMED_PODS: N.KIND_POD_PENDING,  # warm spares: no request waits for a pod beyond the baseline
}


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


def _kind_col(attr: Attribution, kind: str) -> str | None:
    """SQL for a request's time in the stages of ``kind`` (their columns summed), or None."""
    cols = [f"coalesce({attr.columns[s]}, 0)" for s in attr.of_kind(kind)]
    if not cols:
        return None
    return cols[0] if len(cols) == 1 else "(" + " + ".join(cols) + ")"


def stage_counterfactuals(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any]
) -> dict[str, float | None]:
    """Stage -> SLO quantile (ms) with that stage capped at its baseline quantile (one SQL pass)."""
    if not view.per_request:
        return {}
    q = view.slo.quantile
    out: dict[str, float | None] = {}
    for row in attr.rows:
        col = _col(attr, row["stage"])
        if col is None or row["stage"] == N.UNATTRIBUTED:
            continue
        cap = _base_q(ev, row["stage"])
        out[row["stage"]] = _q(con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q, attr)
    return out


def batch_wait_cap_ms(ev: dict[str, Any]) -> float:
    """Recommended maximum batch wait (ms): a quarter of the baseline's typical compute time (the
    baseline p50s of the compute-kind stages, summed), between 1 and 10 ms. Waiting longer for a
    batch than a fraction of one batch's compute costs more latency than the larger batch saves; 5 ms
    when the trace has no compute stage."""
    kinds = ev.get("kinds") or {N.STAGE_COMPUTE: N.KIND_COMPUTE}
    quantiles = ev.get("stage_quantiles", {})
    comp = sum(
        float((quantiles.get(s) or {}).get("baseline_p50_ms") or 0.0)
        for s, k in kinds.items()
        if k == N.KIND_COMPUTE
    )
    if not comp:
        return 5.0
    return round(min(10.0, max(1.0, 0.25 * float(comp))), 1)


def _rho(ev: dict[str, Any]) -> float:
    util = ev.get("utilization_pct")
    if util is not None:
        return min(0.95, max(0.05, float(util) / 100.0))
    return 0.5


def _served_condition(attr: Attribution) -> tuple[str, bool] | None:
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
    served = _served_condition(attr)
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
            held = str(_kind_col(attr, N.KIND_COMPUTE))
            share = f"{held} / greatest(coalesce(batch_size, 1), 1)"
        else:
            cols = [c for c in (_kind_col(attr, k) for k in (N.KIND_PREFILL, N.KIND_DECODE)) if c]
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


def _offload(
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


def _cap_batch_wait(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str
) -> tuple[float | None, str]:
    cap = batch_wait_cap_ms(ev)
    comp = _kind_col(attr, N.KIND_COMPUTE)
    arr = Q.arrivals(con, view.arrivals)
    slope = None
    if comp is not None:
        got = weighted_slope(con, with_columns("batch_size AS batch"), comp, "batch", attr.weight)
        slope = got if got is not None and got > 0 else None
    new_batch = 1.0 + arr.rate_per_s * cap / 1000.0
    shrink = "0"
    note = ""
    if slope is not None and comp is not None:
        shrink = f"least({comp}, {float(slope)!r} * greatest(coalesce(batch, 0) - {new_batch!r}, 0))"
        note = f"; batches shrink to ~{new_batch:.1f} items, saving {float(slope):.2f} ms of compute per item"
    pred = _q(
        con,
        with_columns("batch_size AS batch"),
        f"value_ms - greatest({col} - {cap!r}, 0) - {shrink}",
        view.slo.quantile,
        attr,
    )
    return pred, f"batch wait capped at {cap:g} ms{note}"


def _prewarm(
    con: duckdb.DuckDBPyConnection, attr: Attribution, col: str, q: float
) -> tuple[float | None, str]:
    """Prewarm: the requests that waited for a model load (and ran in the oversized batches of the
    backlog behind it) are served like the requests that did not, so the quantile after the lever is
    the quantile of the unaffected requests."""
    src = (
        f"(SELECT * FROM {with_columns('cold_start AS cold')} WHERE {col} <= 0 AND NOT coalesce(cold, false))"
    )
    row = con.execute(f"SELECT count(*) FROM {src}").fetchone()
    if not row or not row[0]:
        return None, "every request waited for a model load: nothing to compare with"
    return (
        _q(con, src, "value_ms", q, attr, part=True),
        "requests that waited for a model load served like those that did not",
    )


def lever_prediction(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    lever: str,
    stage: str,
) -> tuple[float | None, str]:
    """Predicted SLO quantile (ms) after ``lever`` and a one-line statement of the model used."""
    q = view.slo.quantile
    col = _col(attr, stage) if view.per_request else None
    if (got := workload_prediction(con, view, attr, ev, lever, stage, col)) is not None:
        return got  # analysis.workload_levers: the workload levers, chunked prefill on gaps
    if not view.per_request:  # inter-token gaps
        return gap_prediction(con, view, ev, lever)
    if lever == N.LEVER_SCALE_OUT and col is not None:
        got = scale_out(con, view, attr, col)
        if got is not None:
            return got
    if lever in FLEET_LEVERS or (lever == N.LEVER_PREFIX_CACHING and col is not None):
        from stagescope.analysis.fleet_levers import predict  # it builds on this module

        return predict(con, view, attr, ev, lever, stage, col)
    kind = attr.kinds.get(stage)
    if lever == N.LEVER_OFFLOAD_PREPROCESSING and col is not None and kind == N.KIND_CPU:
        got = _offload(con, view, attr, col, stage)
        if got is not None:
            return got
    if lever == N.LEVER_REDUCE_BATCH_TOKENS and col is not None:
        capped = batch_cap(con, view, attr, col, stage)
        if capped is not None:
            return capped[0], capped[1]
    if lever == N.LEVER_CHUNKED_PREFILL and col is not None:
        got = chunked_prefill(con, view, attr, col)
        if got is not None:
            return got
    if lever in _CAP_TO_BASELINE and col is not None:
        cap = _base_q(ev, stage)
        return (
            _q(con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q, attr),
            f"{stage} capped at its baseline p{q * 100:g} ({cap:.1f} ms)",
        )
    if lever == N.LEVER_PREWARM and col is not None:
        return _prewarm(con, attr, col, q)
    if lever == N.LEVER_CAP_BATCH_WAIT and col is not None:
        return _cap_batch_wait(con, view, attr, ev, col)
    if lever in MODEL_LEVERS:
        curve = QL.speed_curve(ev.get("model") or {}, lever)
        if not curve:
            return None, (
                f"no effect model: the service exported no measured batch time for {lever} "
                f"({N.METRIC_MODEL_VARIANT_BATCH}); measure after applying"
            )
        comp = _kind_col(attr, N.KIND_COMPUTE) or "0"  # compute- and queue-kind time (analysis.kinds)
        queue = _kind_col(attr, N.KIND_QUEUE) or "0"
        ratio = QL.ratio_sql(curve, f"coalesce({comp}, 0)")
        new_compute = f"value_ms - {comp} * (1 - {ratio})"
        m = executor_model(con, view, attr) if _kind_col(attr, N.KIND_QUEUE) is not None else None
        if m is not None:
            # the executors as a G/G/c queue (as for scale-out) whose service time shrinks by the
            # compute-weighted measured ratio; each request's queue time becomes that queue's wait
            row = con.execute(
                f"SELECT sum(coalesce({comp}, 0) * {ratio}) / nullif(sum(coalesce({comp}, 0)), 0) FROM {BREAKDOWN}"
            ).fetchone()
            fw = float(row[0]) if row and row[0] is not None else QL.nearest_ratio(curve, None)[0]
            c = int(m["executors"])
            model = Q.QueueModel(c, 1000.0 / (m["service_ms"] * fw), m["lam_per_s"], m["ca2"], m["cs2"])
            if model.utilization < 0.999:
                wait = model.wait_ms_sql(Q.uniform_rank_sql("trace_ref"))
                return (
                    _q(con, BREAKDOWN, f"{new_compute} - {queue} + {wait}", q, attr),
                    f"{QL.describe_curve(curve, lever)}; queue: the wait of a G/G/{c} queue (Allen-Cunneen) at "
                    f"{m['lam_per_s']:.1f} req/s with the executor time per request {m['service_ms']:.1f} -> "
                    f"{m['service_ms'] * fw:.1f} ms (utilization {model.utilization:.0%}, {model.p_wait:.1%} of "
                    "requests wait)",
                )
        # no executor model (no compute spans to fit it on): M/M/1 relief at the measured utilization
        tails = [(ev.get("stage_quantiles", {}).get(st) or {}).get("tail_q_ms") for st in attr.of_kind(N.KIND_COMPUTE)]
        tail_compute = sum(float(t) for t in tails if t is not None) if any(t is not None for t in tails) else None
        f, rows = QL.nearest_ratio(curve, tail_compute)
        rho = _rho(ev)
        rho2 = rho * f
        qf = (rho2 / (1 - rho2)) / (rho / (1 - rho))
        return (
            _q(con, BREAKDOWN, f"{new_compute} - {queue} * {1 - qf!r}", q, attr),
            f"{QL.describe_curve(curve, lever)}; queue x{qf:.2f} (M/M/1 at utilization {rho:.0%} -> {rho2:.0%}, "
            f"scaled by the ratio at {rows} rows)",
        )
    if lever == N.LEVER_CACHE_RESULTS:
        saved = (
            " + ".join(
                c for c in (_kind_col(attr, k) for k in (N.KIND_BATCH_WAIT, N.KIND_QUEUE, N.KIND_COMPUTE)) if c
            )
            or "0"
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE ss_hits AS SELECT trace_ref, start_unix_ns FROM (
                SELECT {trace_ref(con)} AS trace_ref, start_unix_ns,
                       row_number() OVER (PARTITION BY hh ORDER BY start_unix_ns) AS k
                FROM (SELECT *, {input_ref(con)} AS hh FROM requests WHERE {view.request_filter}) WHERE hh IS NOT NULL)
            WHERE k > 1"""
        )
        return (
            _q(
                con,
                f"{BREAKDOWN} LEFT JOIN (SELECT DISTINCT trace_ref, start_unix_ns, true AS hit FROM ss_hits) "
                "USING (trace_ref, start_unix_ns)",
                f"value_ms - CASE WHEN hit THEN {saved} ELSE 0 END",
                q,
                attr,
            ),
            "repeated inputs (every repeat of an input hash) served from the cache: no batch wait, queue, compute",
        )
    if lever == N.LEVER_CAP_OUTPUT_TOKENS and col is not None:
        from stagescope.analysis.engine_levers import cap_output_tokens

        got = cap_output_tokens(con, view, attr, ev, col)
        if got is not None:
            return got
    if col is not None:
        cap = _base_q(ev, stage)
        return _q(
            con, BREAKDOWN, f"value_ms - greatest({col} - {cap!r}, 0)", q, attr
        ), f"{stage} capped at its baseline"
    return None, "no model for this stage"
