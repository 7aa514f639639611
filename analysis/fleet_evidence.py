"""Evidence about the fleet for the fleet lever rules (analysis.fleet_rules): what the autoscaler
scales on, how much memory the engine could give its KV cache, and how prefix-cache hits differ
across replicas.

* **Autoscaler** (kube-state-metrics' HPA series, kubernetes/kube-state-metrics
  docs/horizontalpodautoscaler-metrics.md; else the SLO file's ``autoscaler_metric``):
  ``autoscaler_metrics`` (each target ``metric_name (metric_target_type)``), ``autoscaler_source``,
  ``autoscaler_on_resource`` (every target is a resource metric, ``cpu`` or ``memory``: it does not see
  a queue), ``hpa_max_replicas`` (``kube_horizontalpodautoscaler_spec_max_replicas``, summed over the
  HPAs scraped), ``hpa_replicas_tail`` / ``_baseline`` (``..._status_current_replicas`` summed over
  them, as of each tail / baseline request's arrival; from snapshots without timestamps, the mean
  over the snapshots), ``hpa_replicas_max``.
* **KV cache** (vLLM's ``vllm:cache_config_info``, one gauge whose labels are the cache settings):
  ``gpu_memory_utilization`` (the share of accelerator memory vLLM may take; the KV cache gets what the
  weights and activations leave), ``kv_cache_tokens`` (``num_gpu_blocks x block_size``: tokens one
  engine's cache holds), ``kv_fit_streams`` (that over the tail's prompt plus output tokens per
  request: the streams the cache holds at full length), ``running_max_per_engine`` (the most running
  requests seen, over the engine series that the summed gauge adds up).
* **Prefix hits per replica** (``vllm:prefix_cache_hits`` over ``_queries``, or SGLang's cached over
  prompt tokens, per replica: the series' ``instance``, ``pod``, ``engine`` or ``dp_rank``; the summed
  ``prefix_cache_hit_ratio`` of analysis.engine_evidence is unchanged): ``prefix_hit_ratio_by_replica``,
  ``prefix_hit_replicas``, ``prefix_hit_spread`` (highest minus lowest ratio).

Keys are absent where the data lacks them. Ratios are fractions (0..1).
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.attribution import Attribution
from stagescope.analysis.breach import SLIView, sql_str
from stagescope.analysis.ingest.engine_metrics import increases

__all__ = ["autoscaler_facts", "cache_config_facts", "gather", "prefix_hits_by_replica"]

_PREFIX_COUNTERS = (
    (N.VLLM_PREFIX_CACHE_QUERIES, N.VLLM_PREFIX_CACHE_HITS),
    (N.VLLM_GPU_PREFIX_CACHE_QUERIES, N.VLLM_GPU_PREFIX_CACHE_HITS),
    (N.SGLANG_PROMPT_TOKENS, N.SGLANG_CACHED_TOKENS),
)


def _r(x: Any, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _asof_sum(con: duckdb.DuckDBPyConnection, view: SLIView, cond: str, metric: str) -> float | None:
    """Mean of ``metric`` (summed over its series at each timestamp) as of each request in ``cond``."""
    gauge = (
        f"SELECT ts_ms, sum(value) AS value FROM metric_samples WHERE metric = {sql_str(metric)} "
        "AND ts_ms IS NOT NULL AND value IS NOT NULL GROUP BY ts_ms"
    )
    keys = (
        f"SELECT start_unix_ns FROM (SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, start_unix_ns "
        f"FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL) WHERE {cond}"
    )
    row = con.execute(
        f"SELECT avg(m.value) FROM ({keys}) k ASOF JOIN ({gauge}) m ON k.start_unix_ns // 1000000 >= m.ts_ms"
    ).fetchone()
    return _r(row[0]) if row else None


def autoscaler_facts(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution | None
) -> dict[str, Any]:
    """The autoscaler's targets and replicas (see the module docstring)."""
    rows = con.execute(
        "SELECT DISTINCT labels[?], labels[?], labels[?] FROM metric_samples WHERE metric = ?",
        [N.KSM_LABEL_HPA, N.KSM_LABEL_METRIC_NAME, N.KSM_LABEL_METRIC_TARGET_TYPE, N.KSM_HPA_SPEC_TARGET_METRIC],
    ).fetchall()
    out: dict[str, Any] = {}
    targets = sorted({(str(m), str(t or "")) for _, m, t in rows if m})
    if targets:
        out["autoscaler_metrics"] = [f"{m} ({t})" if t else m for m, t in targets]
        out["autoscaler_source"] = f"kube-state-metrics ({N.KSM_HPA_SPEC_TARGET_METRIC})"
        out["autoscaler_on_resource"] = all(m.lower() in N.AUTOSCALER_RESOURCE_METRICS for m, _ in targets)
        out["autoscalers"] = sorted({str(h) for h, _, _ in rows if h})
    elif view.slo.autoscaler_metric is not None:
        metric = view.slo.autoscaler_metric
        out["autoscaler_metrics"] = [metric]
        out["autoscaler_source"] = "the SLO file (autoscaler_metric)"
        out["autoscaler_on_resource"] = metric.lower() in N.AUTOSCALER_RESOURCE_METRICS
    mx = con.execute(
        "SELECT sum(v) FROM (SELECT labels[?] AS h, max(value) AS v FROM metric_samples WHERE metric = ? "
        "AND value IS NOT NULL GROUP BY 1)",
        [N.KSM_LABEL_HPA, N.KSM_HPA_SPEC_MAX_REPLICAS],
    ).fetchone()
    if mx and mx[0] is not None:
        out["hpa_max_replicas"] = _r(mx[0], 1)
    cur = con.execute(
        "SELECT max(v) FROM (SELECT ts_ms, sum(value) AS v FROM metric_samples WHERE metric = ? "
        "AND value IS NOT NULL GROUP BY ts_ms, CASE WHEN ts_ms IS NULL THEN source END)",
        [N.KSM_HPA_CURRENT_REPLICAS],
    ).fetchone()
    if cur and cur[0] is not None:
        out["hpa_replicas_max"] = _r(cur[0], 1)
        if attr is not None and view.per_request:
            out["hpa_replicas_tail"] = _asof_sum(con, view, attr.tail_condition, N.KSM_HPA_CURRENT_REPLICAS)
            out["hpa_replicas_baseline"] = _asof_sum(con, view, attr.baseline_condition, N.KSM_HPA_CURRENT_REPLICAS)
        if out.get("hpa_replicas_tail") is None:  # snapshots without timestamps: the replicas they show
            snap = con.execute(
                "SELECT avg(v) FROM (SELECT source, sum(value) AS v FROM metric_samples WHERE metric = ? "
                "AND value IS NOT NULL GROUP BY source)",
                [N.KSM_HPA_CURRENT_REPLICAS],
            ).fetchone()
            out["hpa_replicas_tail"] = out["hpa_replicas_baseline"] = _r(snap[0], 1) if snap else None
    return out


def cache_config_facts(con: duckdb.DuckDBPyConnection, ev: dict[str, Any]) -> dict[str, Any]:
    """vLLM's cache settings and the streams its KV cache holds (see the module docstring)."""
    row = con.execute(
        "SELECT max(TRY_CAST(labels[?] AS DOUBLE)), min(TRY_CAST(labels[?] AS DOUBLE)), "
        "min(TRY_CAST(labels[?] AS DOUBLE)) FROM metric_samples WHERE metric = ?",
        [N.VLLM_LABEL_GPU_MEMORY_UTILIZATION, N.VLLM_LABEL_NUM_GPU_BLOCKS, N.VLLM_LABEL_BLOCK_SIZE,
         N.VLLM_CACHE_CONFIG_INFO],
    ).fetchone()  # fmt: skip
    out: dict[str, Any] = {}
    if not row:
        return out
    util, blocks, block = row
    if util is not None:
        out["gpu_memory_utilization"] = _r(util, 3)
    if blocks is not None and block is not None and blocks > 0 and block > 0:
        out["kv_cache_tokens"] = float(blocks) * float(block)
        per_req = float(ev.get("input_tokens_tail") or 0) + float(ev.get("output_tokens_tail") or 0)
        if per_req > 0:
            out["kv_fit_streams"] = _r(out["kv_cache_tokens"] / per_req, 1)
    if ev.get("running_max") is not None:
        out["running_max_per_engine"] = _r(float(ev["running_max"]) / max(1, int(ev.get("engine_series") or 1)), 1)
    return out


def prefix_hits_by_replica(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The prefix-cache hit ratio of each replica (see the module docstring); {} with fewer than two."""
    for queries, hits in _PREFIX_COUNTERS:
        got = increases(con, [queries, hits], N.REPLICA_LABELS)
        ratios: dict[str, float] = {}
        for key, inc in got.items():
            q, h = inc.get(queries), inc.get(hits)
            if q and h is not None and float(q) > 0:
                name = ",".join(f"{k}={v}" for k, v in zip(N.REPLICA_LABELS, key, strict=True) if v is not None)
                ratios[name or "all"] = round(float(h) / float(q), 4)
        if ratios:
            if len(ratios) < 2:
                return {}
            return {
                "prefix_hit_ratio_by_replica": dict(sorted(ratios.items())),
                "prefix_hit_replicas": len(ratios),
                "prefix_hit_spread": round(max(ratios.values()) - min(ratios.values()), 4),
            }
    return {}


def gather(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution | None, ev: dict[str, Any]
) -> dict[str, Any]:
    """The fleet evidence of one analysed SLO, to merge into ``ev`` (the evidence gathered so far)."""
    out = autoscaler_facts(con, view, attr)
    out.update(cache_config_facts(con, ev))
    out.update(prefix_hits_by_replica(con))
    return out
