"""Evidence the lever rules read: measured facts about the tail against the baseline.

All values are plain numbers (``None`` when the data lacks them), computed in DuckDB over
``ss_breakdown`` (per-request SLIs) or the SLI view (inter-token gaps), ``requests`` and
``metric_samples``:

* ``repeated_hash_share_tail`` / ``_baseline``: share of requests whose ``input_hash`` occurs more than
  once in the analysed traffic (identical inputs recomputed);
* ``cold_start_share_tail``: share of tail requests flagged ``cold_start``;
* ``batch_size_tail`` / ``_baseline`` / ``batch_size_max``: mean batch size (for streams: the running
  decode batch) of tail and baseline requests, and the largest seen (a proxy for the configured max);
* ``queue_depth_tail`` / ``_baseline``: mean queue depth seen by requests on arrival;
* ``inflight_mean``: mean of ``stagescope_inflight_requests`` samples, when scraped;
* ``utilization_pct``: mean accelerator utilization (dcgm-exporter ``DCGM_FI_DEV_GPU_UTIL`` or
  Triton ``nv_gpu_utilization``) over the samples, ``utilization_pct_tail`` the value last sampled
  before each tail request (as-of join);
* ``running_tail`` / ``running_baseline``: vLLM ``num_requests_running`` as of each request, when scraped;
* ``batch_slope_ms`` / ``batch_intercept_ms`` / ``batch_r2``: least-squares fit of the SLI sample on
  its request's batch size (for streams the running decode batch): how much each extra item in the
  batch adds, and how well batch size explains the samples;
* ``stage_quantiles``: per stage, baseline p50 and the SLO quantile of that stage among baseline
  requests (ms), the reference for "behaved like its baseline";
* ``model`` (when the service exported them, see :mod:`~stagescope.analysis.quality`): the served
  model's and its lever variants' eval-set accuracy and measured batch times;
  ``quality_budget_points``: the SLO's accuracy budget for model-changing levers;
* LLM engines' evidence (output tokens and time per token of tail and baseline, vLLM's and SGLang's
  own metrics): :mod:`~stagescope.analysis.engine_evidence`; the fleet's (autoscaler targets and
  replicas, KV-cache settings, prefix hits per replica): :mod:`~stagescope.analysis.fleet_evidence`.

Sampled traces: shares, means and quantiles count each request ``1 / sampling_p`` times
(analysis.weighting); whether an input repeats is judged on the inputs the kept traces show, so
the repeated-input shares are lower bounds when most traces were not kept.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb

from stagescope.analysis import engine_evidence, fleet_evidence, workload_evidence
from stagescope.analysis import quality as QL
from stagescope.analysis.attribution import BATCH_FIT, BREAKDOWN, Attribution
from stagescope.analysis.breach import UTIL_METRICS, SLIView, sql_str, util_pct_sql
from stagescope.analysis.keys import input_ref
from stagescope.analysis.weighting import mean_sql, weighted_quantiles
from stagescope.names import METRIC_INFLIGHT, VLLM_NUM_RUNNING

__all__ = ["gather"]

#: The request-level evidence, in the order :func:`gather` reads it.
_FACT_KEYS = (
    "repeated_hash_share_tail", "repeated_hash_share_baseline", "cold_start_share_tail",
    "cold_start_share_baseline", "batch_size_tail", "batch_size_baseline", "batch_size_max",
    "queue_depth_tail", "queue_depth_baseline", "requests",
)  # fmt: skip


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    return None if row is None else row[0]


def _f(x: Any, nd: int = 3) -> float | None:
    """A rounded number, or None where there is none (NULL, or NaN: a fit on a constant batch size)."""
    if x is None or math.isnan(float(x)):
        return None
    return round(float(x), nd)


def _asof_mean(con: duckdb.DuckDBPyConnection, metric_sql: str, keys: str) -> float | None:
    """Mean metric value as of each request in ``keys`` (a query with ``start_unix_ns``)."""
    return _f(
        _one(
            con,
            f"""SELECT avg(m.value) FROM ({keys}) k ASOF JOIN ({metric_sql}) m
                ON k.start_unix_ns // 1000000 >= m.ts_ms""",
        )
    )


def gather(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution) -> dict[str, Any]:
    """Collect the evidence for one analysed SLO (see the module docstring)."""
    tail, base = attr.tail_condition, attr.baseline_condition
    src = BREAKDOWN if view.per_request else view.name
    # arrivals of the tail and baseline requests (gaps map to their stream's arrival)
    if view.per_request:
        tail_keys = f"SELECT start_unix_ns FROM {src} WHERE {tail}"
        base_keys = f"SELECT start_unix_ns FROM {src} WHERE {base}"
    else:
        tail_keys = f"SELECT DISTINCT trace_id, start_unix_ns FROM {src} WHERE {tail}"
        base_keys = f"SELECT DISTINCT trace_id, start_unix_ns FROM {src} WHERE {base}"
    ev: dict[str, Any] = {}
    row: tuple[Any, ...] | None
    if view.per_request:
        row = _per_request_facts(con, view, attr)
    else:
        flags = (
            f"SELECT trace_id, bool_or({tail}) AS is_tail, bool_or({base}) AS is_base FROM {src} GROUP BY 1"
        )
        w = "w" if view.weighted else None
        means = ", ".join(
            mean_sql(e, c, w)
            for e, c in (
                ("repeated::INT", "is_tail AND input_hash IS NOT NULL"),
                ("repeated::INT", "is_base AND input_hash IS NOT NULL"),
                ("cold_start::INT", "is_tail"), ("cold_start::INT", "is_base"),
                ("batch_size", "is_tail"), ("batch_size", "is_base"),
            )
        )  # fmt: skip
        row = con.execute(
            f"""WITH r AS (SELECT q.input_hash, q.cold_start, q.batch_size, q.queue_depth, f.is_tail, f.is_base,
                                  {view.request_weight(con, "q.")} AS w
                           FROM requests q JOIN ({flags}) f USING (trace_id)
                           WHERE {view.request_filter.replace("status_code", "q.status_code")}),
                h AS (SELECT hash(input_hash) AS hh, count(*) AS c FROM requests
                      WHERE {view.request_filter} AND hash(input_hash) IN (SELECT hash(input_hash) FROM r) GROUP BY 1),
                rr AS (SELECT r.*, coalesce(h.c, 0) >= 2 AS repeated FROM r LEFT JOIN h ON h.hh = hash(r.input_hash))
            SELECT {means}, (SELECT max(batch_size) FROM {view.name}),
                   {mean_sql("queue_depth", "is_tail", w)}, {mean_sql("queue_depth", "is_base", w)},
                   (SELECT sum({view.request_weight(con)}) FROM requests WHERE {view.request_filter})
            FROM rr"""
        ).fetchone()
    assert row is not None
    for k, v in zip(_FACT_KEYS, row, strict=True):
        ev[k] = _f(v)
    for metric in UTIL_METRICS:
        pct = util_pct_sql(metric)
        msql = f"SELECT ts_ms, {pct} AS value FROM metric_samples WHERE metric = {sql_str(metric)} AND ts_ms IS NOT NULL"
        mean = _one(con, f"SELECT avg({pct}) FROM metric_samples WHERE metric = {sql_str(metric)}")
        if mean is not None:
            ev["utilization_pct"] = _f(mean)
            ev["utilization_metric"] = metric
            ev["utilization_pct_tail"] = _asof_mean(con, msql, tail_keys)
            ev["utilization_pct_baseline"] = _asof_mean(con, msql, base_keys)
            break
    inflight = _one(con, f"SELECT avg(value) FROM metric_samples WHERE metric = {sql_str(METRIC_INFLIGHT)}")
    ev["inflight_mean"] = _f(inflight)
    msql = f"SELECT ts_ms, sum(value) AS value FROM metric_samples WHERE metric = {sql_str(VLLM_NUM_RUNNING)} AND ts_ms IS NOT NULL GROUP BY ts_ms"
    if _one(con, f"SELECT count(*) FROM ({msql})"):
        ev["running_tail"] = _asof_mean(con, msql, tail_keys)
        ev["running_baseline"] = _asof_mean(con, msql, base_keys)
    for k in BATCH_FIT:  # fitted by attribution in its pass over the samples
        ev[k] = _f(attr.facts.get(k))
    ev["stage_quantiles"] = _stage_quantiles(con, view, attr)
    facts = QL.model_facts(con)
    if facts:
        ev["model"] = facts
    ev["quality_budget_points"] = view.slo.quality_budget
    ev.update(engine_evidence.gather(con, view, attr, ev))  # output lengths, the engines' own metrics
    ev.update(fleet_evidence.gather(con, view, attr, ev))  # autoscaler, KV-cache config, hits per replica
    ev.update(
        workload_evidence.gather(con, view, attr, ev)
    )  # prefill interference, prompts, streams, cascade
    return ev


def _per_request_facts(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution) -> tuple[Any, ...]:
    """The request-level evidence of a per-request SLI over every sample (not the breakdown's sample),
    in the order :func:`gather` reads it: the repeated inputs here, the rest gathered by attribution
    in its pass over the samples (``attr.facts``)."""
    tail, base = attr.tail_condition, attr.baseline_condition
    repeated = con.execute(
        f"""WITH r AS (SELECT hh, w, ({tail}) AS is_tail, ({base}) AS is_base
                       FROM (SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, {input_ref(con)} AS hh,
                                    {view.request_weight(con)} AS w FROM requests
                             WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL)
                       WHERE hh IS NOT NULL),
                h AS (SELECT count(*) AS c, sum(w) FILTER (WHERE is_tail) AS t, sum(w) FILTER (WHERE is_base) AS b
                      FROM r GROUP BY hh)
            SELECT coalesce(sum(t) FILTER (WHERE c >= 2), 0) / nullif(sum(t), 0),
                   coalesce(sum(b) FILTER (WHERE c >= 2), 0) / nullif(sum(b), 0)
            FROM h"""
    ).fetchone()
    assert repeated is not None
    # a share of no tail request with an input hash is unknown, not zero
    shares = tuple(None if v is None else float(v) for v in repeated)
    return (*shares, *(attr.facts[k] for k in _FACT_KEYS[2:]))


def _stage_quantiles(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution
) -> dict[str, dict[str, Any]]:
    if not view.per_request or not attr.columns:
        return {}
    q = view.slo.quantile
    cols = list(attr.columns.items())
    if attr.weighted and attr.weight is not None:
        w = attr.weight
        out_w: dict[str, dict[str, Any]] = {}
        for stage, c in cols:
            b = weighted_quantiles(con, BREAKDOWN, f"coalesce({c}, 0)", [0.5, q], w, attr.baseline_condition)
            t = weighted_quantiles(con, BREAKDOWN, f"coalesce({c}, 0)", [0.5, q], w, attr.tail_condition)
            out_w[stage] = {
                "baseline_p50_ms": _f(b[0]), "baseline_q_ms": _f(b[1]),
                "tail_p50_ms": _f(t[0]), "tail_q_ms": _f(t[1]),
            }  # fmt: skip
        return out_w
    sel = ", ".join(
        f"quantile_cont(coalesce({c}, 0), [0.5, {q}]) FILTER (WHERE {attr.baseline_condition}), "
        f"quantile_cont(coalesce({c}, 0), [0.5, {q}]) FILTER (WHERE {attr.tail_condition})"
        for _, c in cols
    )
    row = con.execute(f"SELECT {sel} FROM {BREAKDOWN}").fetchone()
    out: dict[str, dict[str, Any]] = {}
    assert row is not None
    for i, (stage, _) in enumerate(cols):
        b, t = row[2 * i], row[2 * i + 1]
        out[stage] = {
            "baseline_p50_ms": _f(b[0]) if b else None,
            "baseline_q_ms": _f(b[1]) if b else None,
            "tail_p50_ms": _f(t[0]) if t else None,
            "tail_q_ms": _f(t[1]) if t else None,
        }
    return out
