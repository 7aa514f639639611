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
from stagescope.analysis import queue_levers as QV
from stagescope.analysis import queueing as Q
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.breakdown import with_columns
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import input_ref, trace_ref
from stagescope.analysis.llm_levers import (
    CHUNK_TOKENS,
    batch_cap,
    chunked_prefill,
    gap_prediction,
)
from stagescope.analysis.queue_levers import executor_model, scale_out  # their importers read them here
from stagescope.analysis.weighting import weighted_quantile, weighted_quantile_sql, weighted_slope
from stagescope.analysis.workload_levers import prediction as workload_prediction

__all__ = [
    "CHUNK_TOKENS",
    "MODEL_LEVERS",
    "batch_wait_cap_ms",
    "executor_model",
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


def _cap_batch_wait(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str
) -> tuple[float | None, str]:
    cap = batch_wait_cap_ms(ev)
    comp = QV.kind_col(attr, N.KIND_COMPUTE)
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
        got = QV.scale_out(con, view, attr, col)
        if got is not None:
            return got
    if lever in FLEET_LEVERS or (lever == N.LEVER_PREFIX_CACHING and col is not None):
        from stagescope.analysis.fleet_levers import predict  # it builds on this module

        return predict(con, view, attr, ev, lever, stage, col)
    kind = attr.kinds.get(stage)
    if lever == N.LEVER_OFFLOAD_PREPROCESSING and col is not None and kind == N.KIND_CPU:
        got = QV.offload(con, view, attr, col, stage)
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
        comp = QV.kind_col(attr, N.KIND_COMPUTE) or "0"  # compute- and queue-kind time (analysis.kinds)
        queue = QV.kind_col(attr, N.KIND_QUEUE) or "0"
        ratio = QL.ratio_sql(curve, f"coalesce({comp}, 0)")
        new_compute = f"value_ms - {comp} * (1 - {ratio})"
        m = QV.executor_model(con, view, attr) if QV.kind_col(attr, N.KIND_QUEUE) is not None else None
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
        rho = QV.rho(ev)
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
                c for c in (QV.kind_col(attr, k) for k in (N.KIND_BATCH_WAIT, N.KIND_QUEUE, N.KIND_COMPUTE)) if c
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
