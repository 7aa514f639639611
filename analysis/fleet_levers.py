"""Effect models, plan settings and cost effects of the fleet levers (rules in analysis.fleet_rules).

* ``scale-on-queue-depth``: the queue at the capacity a queue-depth autoscaler would reach:
  scale-out's model (analysis.counterfactual.scale_out: each request's queue time replaced by the wait
  of a G/G/c queue, Allen-Cunneen, at the measured arrivals and executor time) with the executors
  multiplied by ``min(2, max replicas / replicas as of the tail)`` where kube-state-metrics gives
  both (the autoscaler cannot go past its max), else doubled as scale-out assumes.
* ``concurrency-limit``: **no effect model**: a cap on the streams admitted trades preemptions and
  their recomputation for waiting in the queue, and the trace does not say how much of the tail's
  time each is (vLLM counts preemptions, not the time they cost); measure after applying. The setting
  the rationale gives is the streams the KV cache holds at the tail's length (``kv_fit_streams``).
* ``kv-cache-aware-routing``: every repeat of a prompt (each occurrence of an input hash after its
  first: the request's own, else the one the load generator sent for its trace) is routed to the
  replica that holds its prefix, and prefills like the repeats that already found it there: the
  median prefill of the baseline's repeats (a repeat in the baseline hit the cache); without such
  repeats, its prefill is capped at the stage's baseline quantile. First occurrences and other
  prompts are unchanged. It assumes the replica holding a prefix has room for the requests sent to
  it (no queueing from the skew).
* ``prefix-caching`` (an existing lever, its model here since it is the same): every repeat served
  from the prefix cache, the same way. Before, the stage's tail was capped at its baseline quantile
  for every request, long unshared prompts too (30 % low on ``fleet-prefix-off``).

Units: milliseconds.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import counterfactual as C
from stagescope.analysis import fleet_rules as FR
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import has_columns, input_ref, trace_ref

__all__ = ["cost_effect", "predict", "replica_factor", "setting"]

#: What a queue-depth autoscaler may add at most, where its max replicas are not known (scale-out's).
DEFAULT_FACTOR = 2.0


def replica_factor(ev: dict[str, Any]) -> tuple[float, str]:
    """The executors' factor a queue-depth autoscaler reaches, and why (see the module docstring)."""
    mx, cur = ev.get("hpa_max_replicas"), ev.get("hpa_replicas_tail")
    if mx is not None and cur is not None and float(cur) > 0:
        f = min(DEFAULT_FACTOR, float(mx) / float(cur))
        return f, f"replicas {float(cur):g} -> {float(cur) * f:g} (max replicas {float(mx):g})"
    return DEFAULT_FACTOR, "replicas doubled (max replicas not scraped)"


def _cap(ev: dict[str, Any], stage: str) -> float:
    return float((ev.get("stage_quantiles", {}).get(stage) or {}).get("baseline_q_ms") or 0.0)


def _prompt_key(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """``(join, key)``: SQL joining ``requests q`` to the load generator's results and a request's prompt
    key: its own input hash, else the one the load generator sent for its trace (engines' spans carry
    none, as analysis.engine_evidence reads it)."""
    own = input_ref(con).replace("input_hash", "q.input_hash")
    if not has_columns(con, "client_results", "trace_id", "input_hash"):
        return "", own
    join = (
        "LEFT JOIN (SELECT trace_id, any_value(input_hash) AS c_hash FROM client_results "
        "WHERE input_hash IS NOT NULL GROUP BY 1) c ON c.trace_id = q.trace_id"
    )
    return join, f"coalesce({own}, CASE WHEN c.c_hash IS NOT NULL THEN hash(c.c_hash) END)"


def _repeats(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str, stage: str,
    what: str,
) -> tuple[float | None, str]:  # fmt: skip
    """Every repeat of a prompt prefills like the baseline's repeats (``what``: how it gets there)."""
    join, key = _prompt_key(con)
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_prefix_repeats AS SELECT DISTINCT trace_ref, start_unix_ns FROM (
            SELECT trace_ref, start_unix_ns, row_number() OVER (PARTITION BY hh ORDER BY start_unix_ns) AS k
            FROM (SELECT q.{trace_ref(con)} AS trace_ref, q.start_unix_ns, {key} AS hh FROM requests q {join}
                  WHERE {view.request_filter.replace("status_code", "q.status_code")}) WHERE hh IS NOT NULL)
        WHERE k > 1"""
    )
    src = (
        f"(SELECT b.*, r.trace_ref IS NOT NULL AS ss_repeat FROM {BREAKDOWN} b LEFT JOIN ss_prefix_repeats r "
        "USING (trace_ref, start_unix_ns))"
    )
    row = con.execute(
        f"SELECT median({col}), count(*) FROM {src} WHERE ss_repeat AND ({attr.baseline_condition})"
    ).fetchone()
    if row and row[0] is not None and row[1]:
        hit, how = float(row[0]), f"the median prefill of the {int(row[1])} repeats in the baseline (cache hits)"
    else:
        hit, how = _cap(ev, stage), f"{stage}'s baseline p{view.slo.quantile * 100:g} (no repeat in the baseline)"
    pred = _q(con, src, f"value_ms - CASE WHEN ss_repeat THEN greatest({col} - {hit!r}, 0) ELSE 0 END",
              view.slo.quantile, attr)  # fmt: skip
    return pred, f"every repeated prompt {what}: its {stage} at most {hit:.1f} ms, {how}; first occurrences unchanged"


def predict(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    lever: str,
    stage: str,
    col: str | None,
) -> tuple[float | None, str]:
    """Predicted SLO quantile (ms) after the fleet ``lever`` and the one line of its model."""
    if lever == N.LEVER_CONCURRENCY_LIMIT:
        cap = FR.concurrency_cap(ev)
        at = f" of {cap} streams per engine" if cap is not None else ""
        return None, (
            f"no effect model: a cap{at} trades preemptions and their recomputation for waiting in the queue, and "
            "the trace does not say how much of the tail each is; measure after applying"
        )
    if col is None:
        return None, "no model for this stage"
    if lever == N.LEVER_SCALE_ON_QUEUE_DEPTH:
        f, why = replica_factor(ev)
        got = C.scale_out(con, view, attr, col, f)
        if got is not None:
            return got[0], f"a queue-depth autoscaler adds replicas, {why}: {got[1]}"
        base = _cap(ev, stage)
        return (
            _q(con, BREAKDOWN, f"value_ms - greatest({col} - {base!r}, 0)", view.slo.quantile, attr),
            f"{stage} capped at its baseline p{view.slo.quantile * 100:g} ({base:.1f} ms): no executor time to "
            f"model the queue on ({why})",
        )
    if lever == N.LEVER_KV_CACHE_AWARE_ROUTING:
        return _repeats(con, view, attr, ev, col, stage, "routed to the replica holding its prefix")
    if lever == N.LEVER_PREFIX_CACHING:
        return _repeats(con, view, attr, ev, col, stage, "served from the prefix cache")
    return None, "no model for this stage"


def setting(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], lever: str) -> str | None:
    """What the fleet lever changes, for a plan step; None where it has no setting."""
    if lever == N.LEVER_SCALE_ON_QUEUE_DEPTH:
        f, why = replica_factor(ev)
        m = C.executor_model(con, view, attr)
        metric = N.VLLM_NUM_WAITING if ev.get("engine") else N.METRIC_QUEUE_DEPTH
        base = f"autoscaler metric {', '.join(ev.get('autoscaler_metrics') or ['cpu'])} -> {metric}; {why}"
        if m is None:
            return base
        c2 = max(int(m["executors"]) + 1, int(f * m["executors"]))
        return f"{base}; executors {m['executors']:.0f} -> {c2}"
    if lever == N.LEVER_CONCURRENCY_LIMIT:
        cap = FR.concurrency_cap(ev)
        return None if cap is None else f"max-num-seqs -> {cap}"
    if lever == N.LEVER_KV_CACHE_AWARE_ROUTING:
        return "routing policy -> by prefix (KV-cache aware)"
    return None


def cost_effect(ev: dict[str, Any], lever: str) -> tuple[float | None, float | None, str, str] | None:
    """``(work_factor, capacity_factor, model, sign)`` of a fleet lever (analysis.cost_levers), or None."""
    if lever == N.LEVER_SCALE_ON_QUEUE_DEPTH:
        f, why = replica_factor(ev)
        return 1.0, f, f"a queue-depth autoscaler adds replicas ({why}): x{f:g} the accelerators, the same work per request", "+"
    if lever == N.LEVER_CONCURRENCY_LIMIT:
        return 1.0, 1.0, "the same accelerators; fewer preempted requests recomputed (no model of how many)", "0"
    if lever == N.LEVER_KV_CACHE_AWARE_ROUTING:
        return None, 1.0, "repeated prompts reuse their prefix instead of prefilling it: cheaper by the hits gained, unknown", "-"
    return None
