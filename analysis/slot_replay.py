"""The scale-out model of an LLM engine's slots (token streams, no compute spans): the SLO's own
arrivals replayed, first come, first served, through the lever's slots.

Each request holds a slot for its measured time (first prefill start to last token), at the speed the
service measured for the scaled-out servers at each occupancy of the machine where it measured that
(:func:`occupancy_table`, rescaled by analysis.cpu_budget to the cores the run leaves the servers;
queueing.replay_shared), else times their measured speed with every slot busy (queueing.replay_waits).
The prediction's interval also carries the slot times' own uncertainty: the replay is repeated with
slot times ``1 -/+ drift``, the drift being how far the same work's hold moved within the baseline
(queueing.speed_drift); near the queue's knee that moves the quantile several times as much, and the
model line says by how much. Split from analysis.llm_levers, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import cpu_budget as CB
from stagescope.analysis import intervals as I
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import NOT_SHED, SLIView, scope_filter, sql_str
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import trace_ref

__all__ = ["MAX_DRIFT", "REPLAY_TOLERANCE", "occupancy_slowdown", "occupancy_table", "slot_scale_out"]

#: The slot replay (:func:`slot_scale_out`) is used where, replayed with today's slots, it gives the
#: measured queue's SLO quantile within this share (on a llama.cpp run: 14,870 ms replayed, 14,971 ms
#: measured).
REPLAY_TOLERANCE = 0.25
#: The slot times' drift the interval's replays use is at most this share (slot times 0.5-1.5x).
MAX_DRIFT = 0.5


def occupancy_table(con: duckdb.DuckDBPyConnection, lever: str) -> dict[tuple[int, int], float]:
    """``{(own, others): ms}``: one request's time holding a slot of ``lever``'s servers with ``own``
    busy slots on its server and ``others`` on the other servers, as the service measured it
    (``stagescope_executor_occupancy_service_seconds``, the latest scrape of each); {} without it."""
    try:
        rows = con.execute(
            """SELECT labels[?], labels[?], arg_max(value, coalesce(ts_ms, 0)) FROM metric_samples
                WHERE metric = ? AND labels[?] = ? AND value IS NOT NULL GROUP BY 1, 2""",
            [N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS, N.METRIC_EXECUTOR_OCCUPANCY, N.LABEL_VARIANT, lever],
        ).fetchall()
    except duckdb.Error:
        return {}
    out: dict[tuple[int, int], float] = {}
    for own, others, v in rows:
        if str(own).isdigit() and str(others).isdigit() and v is not None and 0 < float(v) < float("inf"):
            out[(int(own), int(others))] = float(v) * 1000.0
    return out


def occupancy_slowdown(table: dict[tuple[int, int], float], served_ms: float) -> Callable[[int, int], float]:
    """``slowdown(own, others)``: ``table``'s time at that occupancy over ``served_ms`` (the time the
    run's slot holds were measured at: every slot of today's servers busy); an occupancy not measured
    takes the nearest measured one with as many busy slots on its own server, else the nearest."""
    if not table or served_ms <= 0:
        raise ValueError("an occupancy slowdown needs a measured table and a positive served time")

    def slowdown(own: int, others: int) -> float:
        same = [k for k in table if k[0] == own]
        key = (own, others) if (own, others) in table else min(
            same or table, key=lambda k: (abs(k[1] - others) + abs(k[0] - own), k))  # fmt: skip
        return table[key] / served_ms

    return slowdown


def _in_full(values: list[float], kept: list[bool]) -> list[float]:
    """With the lever each request is served in full: one without a sample (closed by its client,
    failed) holds at least the median of the kept ones' ``values`` (hold or work, ms)."""
    ks = sorted(v for v, k in zip(values, kept, strict=True) if k)
    typical = ks[len(ks) // 2]
    return [v if k else max(v, typical) for v, k in zip(values, kept, strict=True)]


def slot_scale_out(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, col: str, *, executors: int, ratio: float,
    to_executors: int | None = None,
) -> tuple[Any, str] | None:
    """scale-out of an LLM engine's slots (token streams, no compute spans), replayed: every one of the
    SLO's requests arrives when it did and holds an executor (a slot) for its measured time, first
    prefill start to last decode end, through ``to_executors`` (default ``2 x executors``) first-come
    first-served executors: at the speed the service measured for each occupancy of the scaled-out
    servers (:func:`occupancy_table`, queueing.replay_shared) where it measured that, else times
    ``ratio`` (the added servers' measured speed with every slot busy, 1 without it;
    queueing.replay_waits). Requests of the SLO's scope without a sample (closed by their client, failed)
    arrived too: they hold their slot as they did, and with the lever at least the median time; its
    ``col`` (queue) time becomes the replayed wait. The same replay with today's ``executors`` is the
    model's check: where its queue quantile is not within REPLAY_TOLERANCE of the measured one, the
    slots' hold times do not explain the queue, and this returns None (the caller's steady-state queue
    model answers). None too on sampled traces (the kept requests are not every arrival) or without
    streams."""
    import pyarrow as pa  # the analysis extra's; imported here, as the replay is the only user

    stream = attr.of_kind(N.KIND_PREFILL) + attr.of_kind(N.KIND_DECODE)
    if attr.weighted or attr.of_kind(N.KIND_COMPUTE) or not stream or executors < 1:
        return None
    ref = trace_ref(con)
    # every arrival of the SLO's scope, the ones its client gave up on too (closed: no sample, but they
    # took their place in the queue; in one llama.cpp run 35 of 81 waited past the client's 30 s)
    rows = con.execute(
        f"""WITH r AS (SELECT {ref} AS ref, start_unix_ns AS t,
                              coalesce({view.request_filter} AND {view.value_expr} IS NOT NULL, false) AS kept
                       FROM requests WHERE {NOT_SHED} AND {scope_filter(view.slo)} AND start_unix_ns IS NOT NULL),
                 h AS (SELECT {ref} AS ref, min(start_unix_ns) / 1e6 AS hs, max(end_unix_ns) / 1e6 AS he FROM stages
                       WHERE stage IN ({", ".join(sql_str(x) for x in stream)}) AND {ref} IN (SELECT ref FROM r)
                       GROUP BY 1)
            SELECT CAST(r.ref AS VARCHAR), r.t, coalesce(h.he - h.hs, 0.0), r.kept, coalesce(h.hs, 0.0),
                   coalesce(h.he, 0.0) FROM r LEFT JOIN h USING (ref) ORDER BY r.t"""
    ).fetchall()
    spans = [(float(a), float(b)) for *_, a, b in rows]
    rows = [(r, t, h, k) for r, t, h, k, _, _ in rows]
    kept_holds = sorted(float(h) for _, _, h, k in rows if k)
    if len(kept_holds) < 2:
        return None
    t0 = rows[0][1]
    arr = [(t - t0) / 1e6 for _, t, _, _ in rows]
    hold = [float(h) for _, _, h, _ in rows]  # as it happened: a closed request held its slot until it left
    kept = [k for *_, k in rows]
    full = _in_full(hold, kept)
    c2 = to_executors or 2 * executors
    now = Q.replay_waits(arr, hold, executors)
    # the scaled-out servers' measured speed at each occupancy, relative to the speed the holds were
    # measured at (every slot of today's servers busy): where the service measured both
    table, served = occupancy_table(con, N.LEVER_SCALE_OUT), QL.service_ratio(con, N.LEVER_SCALE_OUT)
    served_ms = served[1] if served is not None else 0.0
    shared = bool(table) and served_ms > 0 and c2 % executors == 0 and max(k[0] for k in table) == executors
    budget = None
    if shared:  # the probe's times, from the cores its servers got to what this run's gateway and client leave them
        table, served_ms, budget = CB.for_run(con, table, served_ms, stream, N.LEVER_SCALE_OUT, replicas=c2 // executors)
        slow = occupancy_slowdown(table, served_ms)
        # the holds as work with every slot busy, which the table's speeds are relative to: a hold that
        # ran while some of today's slots were free ran at the lever's server's speed alone at that occupancy
        work = Q.work_at_full(spans, lambda busy: slow(busy, 0) if busy < executors else 1.0)
        full = _in_full(work, kept)

        def replay(k: float) -> list[float]:  # slot times x k
            return Q.replay_shared(arr, full, replicas=c2 // executors, slots=executors,
                                   slowdown=lambda own, others: k * slow(own, others))  # fmt: skip
    else:

        def replay(k: float) -> list[float]:
            return Q.replay_waits(arr, [h * ratio * k for h in full], c2)

    after = replay(1.0)
    # the machine's speed moved this much within the baseline: the lever run may see its slots that much
    # slower or faster, and near the queue's knee the quantile moves several times as much (the interval)
    # (at most MAX_DRIFT: the replay needs a positive speed)
    kept_full = [w for w, k in zip(full, kept, strict=True) if k]
    drift = min(MAX_DRIFT, Q.speed_drift(kept_full))
    lo_w, hi_w = (replay(1.0 - drift), replay(1.0 + drift)) if drift > 0 else (after, after)
    q = view.slo.quantile
    con.register("ss_replay_src", pa.table({"ref": [r for r, _, _, _ in rows], "t0": [t for _, t, _, _ in rows],
                                            "now_ms": now, "wait_ms": after, "lo_ms": lo_w, "hi_ms": hi_w}))  # fmt: skip
    con.execute("CREATE OR REPLACE TEMP TABLE ss_replay AS SELECT * FROM ss_replay_src")
    con.unregister("ss_replay_src")
    src = (
        f"(SELECT b.*, w.now_ms, coalesce(w.wait_ms, {col}) AS replay_wait, coalesce(w.lo_ms, {col}) AS replay_lo, "
        f"coalesce(w.hi_ms, {col}) AS replay_hi FROM {BREAKDOWN} b LEFT JOIN ss_replay w "
        "ON CAST(b.trace_ref AS VARCHAR) = w.ref AND b.start_unix_ns = w.t0)"
    )
    check_replay = _q(con, src, "now_ms", q, attr)
    check_measured = _q(con, src, col, q, attr)
    if check_replay is None or check_measured is None:
        return None
    replayed, measured = float(check_replay), float(check_measured)
    if abs(replayed - measured) > REPLAY_TOLERANCE * max(measured, 1.0):
        return None  # the slots' hold times do not explain the measured queue: not this model's queue
    band = [_q(con, src, f"value_ms - {col} + {c}", q, attr) for c in ("replay_lo", "replay_hi")]
    # last: the plan (analysis.plan) composes on the last expression a lever model's quantile read
    pred = _q(con, src, f"value_ms - {col} + replay_wait", q, attr)
    if pred is None:
        return None
    b_lo, b_hi = (float(b) if b is not None else float(pred) for b in band)
    lo, hi = pred.interval
    pred = I.Estimate(float(pred), (None if lo is None else min(lo, b_lo), None if hi is None else max(hi, b_hi)),
                      pred.method, pred.samples)  # fmt: skip
    seen = f"; replayed with today's {executors} the queue's p{q * 100:g} is {replayed:,.0f} ms (measured {measured:,.0f} ms)"
    held = sum(kept_holds) / len(kept_holds)
    closed = sum(1 for *_, k in rows if not k)
    if shared:
        occ = ", ".join(f"{o}+{x} busy x{ms / served_ms:.2f}" for (o, x), ms in sorted(table.items()))
        speed = (f"; {sum(kept_full) / len(kept_full):,.0f} ms as work with all {executors} of today's slots busy "
                 f"(a hold with free slots ran faster); at the measured speed of its server's occupancy: {occ} "
                 "(own + other servers' busy slots)")  # fmt: skip
        if budget is not None:
            speed += (
                f", rescaled from the cores the probe's servers got to what {budget.cores:g} cores leave them "
                f"beside the gateway and the client ({budget.path_s_per_token * 1000:.2f} ms CPU per streamed "
                f"token, {budget.path_cores:.2f} cores in the baseline; one server used {budget.engine_cores:.2f}; "
                f"work outside the run took {budget.outside_cores:.2f} cores beside it, its fair share kept)"
            )
    else:
        speed = "" if ratio == 1.0 else f", x{ratio:.2f}"
    if drift > 0:
        knee = (b_hi - b_lo) / max(float(pred), 1e-9) / (2 * drift)
        seen += (f"; the baseline's slot times moved {drift:.0%} within it (medians of its thirds): {drift:.0%} "
                 f"faster or slower slots give {b_lo:,.0f} to {b_hi:,.0f} ms (in the interval; the p{q * 100:g} "
                 f"moves {knee:.1f}x as much as the slot times{', near the knee' if knee > 2 else ''})")  # fmt: skip
    return pred, (
        f"executors {executors} -> {c2}: the {len(rows)} arrivals"
        f"{f' ({closed} without a sample: closed by their client or failed; each then held at least the median time)' if closed else ''} replayed first come, first served "
        f"through {c2} executors, each request holding one for its measured time (mean "
        f"{held:,.0f} ms{speed}){seen}"
    )
