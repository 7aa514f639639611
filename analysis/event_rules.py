"""The evidence, rationales and cost models of the event levers (rows in analysis.levers.RULES).

An event rule is keyed by the event's kind (``names.EVENT_KINDS``, disjoint from the stage kinds) and
reads the evidence analysis.event_attribution adds: ``event`` (the event, analysis.events),
``episode`` (the breached windows after it: ``after_event_s``, ``aftermath_share``, ``bad_samples``)
and ``fleet`` (analysis.events.fleet_facts: ``replicas``, ``scale_step``, ``surge``, ``event_share``).

* ``deploy`` -> ``surge-with-readiness``: a rollout took serving capacity away while new pods loaded.
* ``scale`` up -> ``prewarmed-pods``: the new capacity came late (HPA cold start: scheduling, image
  pull, model load); ``scale`` down -> no lever: capacity was removed, slow the scale-down instead.
* ``model_swap`` whose slow requests waited for the load in ``cold_start`` (the model reloaded in
  place, in the serving process: stagescope's model-load counter) -> ``prewarm`` (load the new weights
  beside the live model, then swap); any other ``model_swap`` -> ``scale-ahead-of-swap``.
* ``config`` -> no lever: compare the settings first.
* A stage of kind ``pod_pending`` (time requests were held while new pods were Pending, when the
  traces carry it) -> ``prewarmed-pods``.

Cost (:func:`capacity_effect`): each of these levers adds pods on purpose, so its cost change is
positive: warm spares beside the replicas all the time; surge pods during rollouts; scale-ahead pods
around swaps (for the event's share of the time).
"""

from __future__ import annotations

from typing import Any

from stagescope import names as N
from stagescope.analysis.events import when

__all__ = [
    "EVENT_LEVERS",
    "capacity_effect",
    "config_why",
    "deploy_why",
    "model_swap_why",
    "pod_pending_why",
    "scale_down_why",
    "scale_up_why",
    "scaled_down",
    "swap_in_place",
    "swap_in_place_why",
]

#: Share of the tail's excess in cold-start-kind stages above which a model swap was an in-place reload.
IN_PLACE_SHARE = 0.5

Evidence = dict[str, Any]

#: The levers whose cost model is :func:`capacity_effect`.
EVENT_LEVERS: frozenset[str] = frozenset(
    {N.LEVER_SURGE_READINESS, N.LEVER_PREWARMED_PODS, N.LEVER_SCALE_AHEAD}
)


def _n(x: Any, unit: str = "", nd: int = 0) -> str:
    return "n/a" if x is None else f"{float(x):.{nd}f}{unit}"


def _event_line(ev: Evidence) -> str:
    """The event and the breach that followed it."""
    e, ep = ev.get("event") or {}, ev.get("episode") or {}
    if not e:
        return "an event"
    return (
        f"{e['description']} {when(e)} ({e['source']}); the breached windows' first sample "
        f"over the threshold came {_n(ep.get('after_event_s'), ' s')} after it and "
        f"{float(ep.get('aftermath_share') or 0.0):.0%} of their {_n(ep.get('bad_samples'))} samples over the "
        "threshold came in its aftermath"
    )


def _pending_line(ev: Evidence) -> str:
    pods = ((ev.get("event") or {}).get("detail") or {}).get("pods_pending") or []
    if not pods:
        return ""
    longest = max((p.get("pending_s") or 0.0) for p in pods)
    sched = [p["scheduled_s"] for p in pods if p.get("scheduled_s") is not None]
    return f"; {len(pods)} pod(s) were Pending ({N.KSM_POD_PHASE}), the longest {longest:.0f} s" + (
        f", scheduled up to {max(sched):.0f} s after creation ({N.KSM_POD_SCHEDULED_TIME})" if sched else ""
    )


def scaled_down(ev: Evidence) -> bool:
    """The scale event removed replicas (from the events file or kube_deployment_spec_replicas)."""
    d = (ev.get("event") or {}).get("detail") or {}
    a, b = d.get("replicas_from"), d.get("replicas_to")
    return a is not None and b is not None and int(b) < int(a)


def _cold_share(ev: Evidence) -> float:
    kinds = ev.get("kinds") or {}
    return sum(float(v) for s, v in (ev.get("shares") or {}).items() if kinds.get(s) == N.KIND_COLD_START)


def swap_in_place(ev: Evidence) -> bool:
    """The slow requests waited for the model load itself (cold-start stages own the excess)."""
    return _cold_share(ev) >= IN_PLACE_SHARE


def swap_in_place_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}; cold-start stages explain {_cold_share(ev):.0%} of the tail's excess: the model "
        "reloaded in place and requests waited for it. Load the new weights beside the live model and swap "
        "them in (prewarm), so no request waits for a load."
    )


def deploy_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}{_pending_line(ev)}. A rollout took serving capacity away while the new pods "
        "loaded the model: roll out with maxSurge (new pods before old ones stop, maxUnavailable 0) and a "
        "readiness probe that passes only once the model is loaded and warm."
    )


def scale_up_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}{_pending_line(ev)}. The new capacity came late (HPA cold start: scheduling, image "
        "pull, model load): keep warm spare pods (low-priority placeholders, or a higher minReplicas) so a "
        "scale-up serves at once."
    )


def scale_down_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}. Replicas were removed and the rest could not carry the traffic: slow the "
        "scale-down (HPA behavior.scaleDown.stabilizationWindowSeconds) or raise minReplicas; no lever is "
        "predicted."
    )


def model_swap_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}. Pods reloading the model served nothing meanwhile: scale out ahead of the swap "
        "(and swap pods a few at a time behind readiness), then scale back."
    )


def config_why(ev: Evidence, _: str) -> str:
    return (
        f"{_event_line(ev)}. A configuration change preceded the breach: compare the settings before and "
        "after it (roll it back to confirm) before choosing a lever."
    )


def pod_pending_why(ev: Evidence, st: str) -> str:
    share = float((ev.get("shares") or {}).get(st, 0.0))
    sq = (ev.get("stage_quantiles") or {}).get(st) or {}
    return (
        f"{st} explains {share:.0%} of the tail's excess latency (tail p50 {_n(sq.get('tail_p50_ms'), ' ms', 1)} "
        f"vs baseline {_n(sq.get('baseline_p50_ms'), ' ms', 1)}): requests were held while new pods were "
        "Pending (scheduling, image pull, model load). Keep warm spare pods (low-priority placeholders, or a "
        "higher minReplicas) so a scale-up does not wait for them."
    )


def _factor(capacity: float | None, model: str) -> dict[str, Any]:
    return {"work_factor": 1.0, "capacity_factor": capacity, "model": model, "sign": "+"}


def capacity_effect(lever: str, fleet: dict[str, Any] | None) -> dict[str, Any]:
    """The cost model of an event lever (the shape of analysis.cost_levers.lever_effect): pods added on
    purpose, sized from kube-state-metrics' replica counts or the events file where they are known."""
    fleet = fleet or {}
    replicas = fleet.get("replicas")
    if lever == N.LEVER_PREWARMED_PODS:
        spare = fleet.get("scale_step") or 1
        if not replicas:
            return _factor(None, f"{spare} warm spare pod(s) kept ready; the replica count is not known "
                           f"({N.KSM_DEPLOYMENT_SPEC_REPLICAS} not scraped), so their share is unknown")  # fmt: skip
        return _factor(
            1.0 + spare / replicas, f"{spare} warm spare pod(s) beside {replicas:g} replicas, all the time"
        )
    share = fleet.get("event_share")  # the rollout's (swap's) aftermath over the incident's span
    extra = fleet.get("surge") or 1
    what = "during rollouts (maxSurge)" if lever == N.LEVER_SURGE_READINESS else "around model swaps"
    if not replicas or share is None:
        return _factor(
            None, f"{extra} extra pod(s) {what}; the replica count or the event's length is unknown"
        )
    return _factor(
        1.0 + extra * share / replicas,
        f"{extra} extra pod(s) {what} for {share:.0%} of the time, beside {replicas:g} replicas",
    )
