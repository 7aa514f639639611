"""The fleet levers' conditions and rationales, as the rule table (analysis.levers.RULES) reads them.

Evidence from :mod:`~stagescope.analysis.fleet_evidence` and :mod:`~stagescope.analysis.engine_evidence`:

* ``scale-on-queue-depth``: a queue tail while every target of the autoscaler is a resource metric
  (CPU, memory), read from kube-state-metrics' HPA series or the SLO file's ``autoscaler_metric``, and
  the autoscaler is not already at its max replicas for the tail's requests (then a different signal
  adds nothing: scale-out, i.e. more capacity or a higher max, is the lever). Without that evidence a
  queue tail keeps ``scale-out``.
* ``concurrency-limit`` before ``kv-cache-headroom``: the engine preempts under KV pressure
  (analysis.engine_rules.kv_pressure) and either has no memory left to give its KV cache
  (``gpu_memory_utilization`` at least :data:`NO_MEMORY_UTILIZATION`) or admits more streams than its
  cache holds at their full length (the most running requests per engine above ``kv_fit_streams``):
  cap what it admits (vLLM ``--max-num-seqs``). With memory to give and no overcommit seen, the cache
  gets the memory (kv-cache-headroom). vLLM's docs (docs/configuration/optimization.md, "Preemption")
  name both remedies: raise ``gpu_memory_utilization``, or lower ``max_num_seqs`` /
  ``max_num_batched_tokens``.
* ``kv-cache-aware-routing`` before ``prefix-caching``: the tail's prompts repeat, the prefix cache is
  on, and its hit ratio differs across replicas by at least :data:`HIT_SPREAD` (a replica holding the
  prefix hits, the others prefill it again): route by prefix. A cache that is off, or low everywhere,
  keeps prefix-caching.
"""

from __future__ import annotations

from typing import Any

from stagescope import names as N
from stagescope.analysis import engine_rules as ER

__all__ = [
    "HIT_SPREAD", "NO_MEMORY_UTILIZATION", "autoscaler_on_resource", "autoscaler_why", "concurrency_why",
    "overcommitted", "routing_why", "uneven_prefix_hits",
]  # fmt: skip

Evidence = dict[str, Any]

#: vLLM's ``gpu_memory_utilization`` at or above which the engine has no memory left to give its KV
#: cache (the default is 0.9; past ~0.95 the activations and CUDA graphs run out of room).
NO_MEMORY_UTILIZATION = 0.95
#: Highest minus lowest per-replica prefix-cache hit ratio that counts as "hits differ across replicas".
HIT_SPREAD = 0.3


def _n(x: Any, unit: str = "", nd: int = 1) -> str:
    return "n/a" if x is None else f"{float(x):.{nd}f}{unit}"


def _at_max(ev: Evidence) -> bool:
    mx, cur = ev.get("hpa_max_replicas"), ev.get("hpa_replicas_tail")
    return mx is not None and cur is not None and float(cur) >= float(mx)


def autoscaler_on_resource(ev: Evidence) -> bool:
    """Every autoscaler target is CPU or memory, and the tail's requests found it below its max."""
    return ev.get("autoscaler_on_resource") is True and not _at_max(ev)


def _replicas_line(ev: Evidence) -> str:
    if ev.get("hpa_replicas_tail") is None and ev.get("hpa_max_replicas") is None:
        return "replicas not scraped"
    return (
        f"{_n(ev.get('hpa_replicas_tail'))} replicas as of the slow requests vs {_n(ev.get('hpa_replicas_baseline'))} "
        f"for normal ones, max replicas {_n(ev.get('hpa_max_replicas'), nd=0)}"
    )


def autoscaler_why(ev: Evidence) -> str:
    """The scale-on-queue-depth rationale after the stage line."""
    return (
        f"{ER.queue_depth_line(ev)}; the autoscaler scales on {', '.join(ev.get('autoscaler_metrics') or [])} "
        f"(from {ev.get('autoscaler_source')}); {_replicas_line(ev)}. Requests queue while the CPU looks "
        "idle: an accelerator's queue does not show in CPU. Scale on queue depth instead (KEDA's prometheus "
        f"trigger, or an HPA autoscaling/v2 External / Pods metric, on {N.VLLM_NUM_WAITING} or the "
        f"service's queue-depth gauge, {N.METRIC_QUEUE_DEPTH})."
    )


def _no_memory(ev: Evidence) -> bool:
    u = ev.get("gpu_memory_utilization")
    return u is not None and float(u) >= NO_MEMORY_UTILIZATION


def _over_fit(ev: Evidence) -> bool:
    fit, run = ev.get("kv_fit_streams"), ev.get("running_max_per_engine")
    return fit is not None and run is not None and float(run) > float(fit)


def overcommitted(ev: Evidence) -> bool:
    """KV pressure with no memory to give, or more streams admitted than the cache holds."""
    return ER.kv_pressure(ev) and (_no_memory(ev) or _over_fit(ev))


def concurrency_cap(ev: Evidence) -> int | None:
    """The streams per engine the KV cache holds at full length (a max-num-seqs to set), or None."""
    fit = ev.get("kv_fit_streams")
    return None if fit is None else max(1, int(float(fit)))


def concurrency_why(ev: Evidence) -> str:
    """The concurrency-limit rationale after the stage line."""
    why = []
    if _no_memory(ev):
        why.append(f"gpu_memory_utilization is already {_n(ev.get('gpu_memory_utilization'), nd=2)}: no memory "
                   "left to give the KV cache")  # fmt: skip
    if _over_fit(ev):
        why.append(
            f"up to {_n(ev.get('running_max_per_engine'))} running requests per engine while its KV cache "
            f"({_n(ev.get('kv_cache_tokens'), nd=0)} tokens) holds {_n(ev.get('kv_fit_streams'))} streams of the "
            "tail's length (prompt plus output)"
        )
    cap = concurrency_cap(ev)
    setting = f" {cap} (the streams the cache holds)" if cap is not None else ""
    return (
        f"{ER.kv_line(ev)}; {'; '.join(why)}: the engine admits more streams than its KV cache holds, so it "
        f"preempts and recomputes them. Cap the concurrent requests it admits: vLLM --max-num-seqs{setting}, "
        "SGLang --max-running-requests, or a gateway's max in-flight requests."
    )


def uneven_prefix_hits(ev: Evidence, repeated_share: float) -> bool:
    """Shared prompts in the tail, the prefix cache on, its hits differing across replicas."""
    shared = float(ev.get("repeated_hash_share_tail") or 0.0) >= repeated_share
    spread = ev.get("prefix_hit_spread")
    return (
        shared
        and ev.get("prefix_caching_enabled") is not False
        and int(ev.get("prefix_hit_replicas") or 0) >= 2
        and spread is not None
        and float(spread) >= HIT_SPREAD
    )


def routing_why(ev: Evidence) -> str:
    """The kv-cache-aware-routing rationale after the stage line."""
    by = ev.get("prefix_hit_ratio_by_replica") or {}
    hits = ", ".join(f"{k} {v:.0%}" for k, v in by.items())
    return (
        f"{(ev.get('repeated_hash_share_tail') or 0) * 100:.0f}% of slow requests repeat a prompt already seen, "
        f"and the prefix cache hits {hits} of prompt tokens per replica (spread {_n(ev.get('prefix_hit_spread'), '', 2)}; "
        f"{_n((ev.get('prefix_cache_hit_ratio') or 0) * 100, '%', 0)} over all): the replica that holds a "
        "prefix reuses it, the others prefill it again. Route each request to the replica holding its prefix "
        "(vLLM production-stack router routingLogic kvaware or prefixaware; SGLang router --policy "
        "cache_aware; llm-d's prefix-cache scorer)."
    )
