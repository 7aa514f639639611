"""The building blocks of the lever rules' rationales and conditions (analysis.levers holds the table):
the evidence thresholds, the one-line statements of what was measured (a stage's share of the excess,
accelerator utilization, the running batch, the quality gate's accuracy figures) and the advice per
ingress/egress stage. Split from analysis.levers so the table stays readable; no rule lives here.
"""

from __future__ import annotations

from typing import Any

from stagescope import names as N
from stagescope.analysis import quality as QL

__all__ = [
    "BATCH_DRIVEN_SHARE",
    "BATCH_R2",
    "COMPUTE_SHARE_FOR_QUEUE",
    "EGRESS_ADVICE",
    "INGRESS_ADVICE",
    "LOW_UTIL",
    "REPEATED_SHARE",
    "RUNNING_RATIO",
    "Evidence",
    "batch_driven_share",
    "in_stage",
    "kind_share",
    "large_running",
    "low_util",
    "not_acceptable",
    "num",
    "of_kind",
    "pct",
    "quality",
    "quality_line",
    "running",
    "share",
    "stage_line",
    "util",
]

Evidence = dict[str, Any]

#: Share of tail requests with a repeated input hash above which results caching beats faster compute.
REPEATED_SHARE = 0.3
#: Compute excess (share of the tail's excess) above which queueing is blamed on per-request cost.
COMPUTE_SHARE_FOR_QUEUE = 0.25
#: Running decode batch in the tail at least this many times the baseline's counts as "large".
RUNNING_RATIO = 1.5
#: Share of a tail gap explained by the running batch (fit of gap on batch size) that counts as batch-driven.
BATCH_DRIVEN_SHARE = 0.5
#: Minimum r² of that fit for it to count as evidence.
BATCH_R2 = 0.3
#: Accelerator utilization (percent) under which the accelerator is "starving".
LOW_UTIL = 50.0


def num(x: Any, unit: str = "", nd: int = 1) -> str:
    return "n/a" if x is None else f"{float(x):.{nd}f}{unit}"


def share(ev: Evidence, stage: str) -> float:
    return float(ev.get("shares", {}).get(stage, 0.0))


def kind_share(ev: Evidence, kind: str) -> float:
    """Summed share of the excess of every stage of ``kind`` (``ev["kinds"]``: stage -> kind)."""
    kinds = ev.get("kinds", {})
    return sum(float(v) for s, v in ev.get("shares", {}).items() if kinds.get(s) == kind)


def of_kind(ev: Evidence, kind: str) -> str:
    """The stages of ``kind`` that explain part of the excess, named for a rationale."""
    kinds = ev.get("kinds", {})
    found = [s for s, v in ev.get("shares", {}).items() if kinds.get(s) == kind and float(v) > 0]
    return "/".join(found) or kind


def util(ev: Evidence) -> str:
    if ev.get("utilization_pct") is None:
        return "accelerator utilization not scraped"
    return f"accelerator utilization {num(ev['utilization_pct'], '%')} ({ev.get('utilization_metric')})"


def low_util(ev: Evidence) -> bool:
    return ev.get("utilization_pct") is not None and float(ev["utilization_pct"]) < LOW_UTIL


def running(ev: Evidence) -> tuple[float | None, float | None]:
    t, b = ev.get("running_tail"), ev.get("running_baseline")
    if t is None or b is None:
        t, b = ev.get("batch_size_tail"), ev.get("batch_size_baseline")
    return t, b


def batch_driven_share(ev: Evidence) -> float | None:
    """Share of a tail sample that the batch-size fit puts on the batch (slope x tail batch / fitted value),
    or None without a convincing fit (positive slope, r² at least BATCH_R2)."""
    raw = [ev.get(k) for k in ("batch_slope_ms", "batch_intercept_ms", "batch_r2", "batch_size_tail")]
    vals = [float(v) for v in raw if v is not None]
    if len(vals) < len(raw):
        return None
    slope, icept, r2, t = vals
    if slope <= 0 or r2 < BATCH_R2:
        return None
    fitted = icept + slope * t
    return slope * t / fitted if fitted > 0 else None


def large_running(ev: Evidence) -> bool:
    """The running batch drives the slow gaps: it is much larger around them than around normal ones, or
    the gap grows with the batch so that most of a tail gap is per-sequence cost (a step slower because
    the batch is big, which capping the batch fixes; speculative decoding would not)."""
    t, b = running(ev)
    if t is not None and b is not None and float(b) > 0 and float(t) >= RUNNING_RATIO * float(b):
        return True
    share = batch_driven_share(ev)
    return share is not None and share >= BATCH_DRIVEN_SHARE


def stage_line(ev: Evidence, stage: str) -> str:
    sq = ev.get("stage_quantiles", {}).get(stage) or {}
    ex = ev.get("excess", {}).get(stage)
    kind = ev.get("kinds", {}).get(stage)
    named = stage if stage in N.STAGE_KINDS or stage == N.UNATTRIBUTED or not kind else f"{stage} (kind {kind})"
    txt = f"{named} explains {share(ev, stage):.0%} of the tail's excess latency ({num(ex, ' ms')} per slow request)"
    if sq:
        txt += f"; tail p50 {num(sq.get('tail_p50_ms'), ' ms')} vs baseline p50 {num(sq.get('baseline_p50_ms'), ' ms')}"
    if stage == N.STAGE_OVERFLOW:
        txt += (f" ({N.STAGE_OVERFLOW} holds stage names past a cap on distinct names: see the warnings; "
                "name fewer stages to see them apart)")
    return txt


def quality(ev: Evidence, lever: str | None) -> dict[str, Any] | None:
    """The quality gate of ``lever`` on this evidence (see analysis.quality.gate), or None."""
    if lever is None:
        return None
    return QL.gate(ev.get("model") or {}, lever, ev.get("quality_budget_points"))


def quality_line(ev: Evidence, lever: str) -> str:
    q = quality(ev, lever)
    if q is None:
        return (
            f" Accuracy: the service exported no eval-set accuracy for {lever}: validate it on your eval set "
            "before serving it."
        )
    budget = "no quality budget set" if q["budget_points"] is None else f"budget {q['budget_points']:g} points"
    return (
        f" Accuracy on the model's eval set ({q['eval_samples'] or 'n/a'} samples): {q['accuracy_before']:.2%} as "
        f"served, {q['accuracy_after']:.2%} with {lever} ({q['drop_points']:.2f} points lost; {budget})."
    )


def not_acceptable(ev: Evidence, lever: str) -> str:
    q = quality(ev, lever)
    assert q is not None
    return (
        f"not acceptable: {lever} costs {q['drop_points']:.2f} points of accuracy on the model's eval set "
        f"({q['eval_samples'] or 'n/a'} samples: {q['accuracy_before']:.2%} -> {q['accuracy_after']:.2%}), more "
        f"than the SLO's quality budget of {q['budget_points']:g} points; the next lever is recommended instead."
    )


def pct(ev: Evidence, key: str) -> str:
    return num((ev.get(key) or 0) * 100, "%", 0)


def in_stage(st: str) -> str:
    return "" if st == N.STAGE_COMPUTE else " in " + st


#: What receiving or sending the data costs, for the stages other servers measure (Triton's frontend
#: and tensor copies): the kind's lever with advice for that stage; other stages of the kind get the
#: kind's general advice.
INGRESS_ADVICE: dict[str, str] = {
    N.STAGE_RECEIVE: "The server is reading large requests off the network: send smaller inputs (binary "
    "tensor data instead of JSON; shared memory for a client on the same host).",
    N.STAGE_DESERIALIZE: "Parsing requests into tensors costs CPU per element: send inputs as binary tensor "
    "data (Triton's binary tensor extension) or gRPC, not JSON numbers.",
    N.STAGE_COMPUTE_INPUT: "Copying input tensors to the model (host to GPU): pass them in CUDA shared "
    "memory, or send fewer and smaller tensors.",
}
EGRESS_ADVICE: dict[str, str] = {
    N.STAGE_COMPUTE_OUTPUT: "Copying output tensors from the model (GPU to host): request only the outputs "
    "the client uses, make them smaller, or return them in CUDA shared memory.",
}
