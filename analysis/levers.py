"""The lever rules: ONE table from (stage, evidence) to a no-retrain lever, with a rationale that
cites the measured numbers.

Order of practice: measure first (time in no stage -> add stage spans, no lever), then cut the
per-request cost (cache, quantize, compile, batch settings), and scale out only when the queue, not
per-request cost, owns the tail. Low accelerator utilization with a slow CPU stage points to the
pipeline, not the model. Rules are tried top to bottom; the first whose stage matches and whose
condition holds gives the lever. A lever that changes the model (``quantize``, ``compile-runtime``)
must also pass the quality gate: when the service exported the accuracy its variant measured on the
model's eval set and the SLO sets a ``quality_budget``, a lever that costs more accuracy than the
budget is not acceptable (:func:`rejected` lists it) and the next rule gives the lever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stagescope import names as N
from stagescope.analysis import quality as QL

__all__ = ["RULES", "Rule", "choose", "quality", "rejected"]

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


def _n(x: Any, unit: str = "", nd: int = 1) -> str:
    return "n/a" if x is None else f"{float(x):.{nd}f}{unit}"


def _share(ev: Evidence, stage: str) -> float:
    return float(ev.get("shares", {}).get(stage, 0.0))


def _util(ev: Evidence) -> str:
    if ev.get("utilization_pct") is None:
        return "accelerator utilization not scraped"
    return f"accelerator utilization {_n(ev['utilization_pct'], '%')} ({ev.get('utilization_metric')})"


def _low_util(ev: Evidence) -> bool:
    return ev.get("utilization_pct") is not None and float(ev["utilization_pct"]) < LOW_UTIL


def _running(ev: Evidence) -> tuple[float | None, float | None]:
    t, b = ev.get("running_tail"), ev.get("running_baseline")
    if t is None or b is None:
        t, b = ev.get("batch_size_tail"), ev.get("batch_size_baseline")
    return t, b


def _batch_driven_share(ev: Evidence) -> float | None:
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


def _large_running(ev: Evidence) -> bool:
    """The running batch drives the slow gaps: it is much larger around them than around normal ones, or
    the gap grows with the batch so that most of a tail gap is per-sequence cost (a step slower because
    the batch is big, which capping the batch fixes; speculative decoding would not)."""
    t, b = _running(ev)
    if t is not None and b is not None and float(b) > 0 and float(t) >= RUNNING_RATIO * float(b):
        return True
    share = _batch_driven_share(ev)
    return share is not None and share >= BATCH_DRIVEN_SHARE


def _stage_line(ev: Evidence, stage: str) -> str:
    sq = ev.get("stage_quantiles", {}).get(stage) or {}
    ex = ev.get("excess", {}).get(stage)
    txt = f"{stage} explains {_share(ev, stage):.0%} of the tail's excess latency ({_n(ex, ' ms')} per slow request)"
    if sq:
        txt += f"; tail p50 {_n(sq.get('tail_p50_ms'), ' ms')} vs baseline p50 {_n(sq.get('baseline_p50_ms'), ' ms')}"
    return txt


def quality(ev: Evidence, lever: str | None) -> dict[str, Any] | None:
    """The quality gate of ``lever`` on this evidence (see analysis.quality.gate), or None."""
    if lever is None:
        return None
    return QL.gate(ev.get("model") or {}, lever, ev.get("quality_budget_points"))


def _quality_line(ev: Evidence, lever: str) -> str:
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


def _not_acceptable(ev: Evidence, lever: str) -> str:
    q = quality(ev, lever)
    assert q is not None
    return (
        f"not acceptable: {lever} costs {q['drop_points']:.2f} points of accuracy on the model's eval set "
        f"({q['eval_samples'] or 'n/a'} samples: {q['accuracy_before']:.2%} -> {q['accuracy_after']:.2%}), more "
        f"than the SLO's quality budget of {q['budget_points']:g} points; the next lever is recommended instead."
    )


@dataclass(frozen=True)
class Rule:
    """``stage`` + ``when(evidence)`` -> ``lever``; ``why(evidence)`` is the rationale. ``gated``: the
    lever changes the model, so it must also pass the quality gate."""

    stage: str
    lever: str | None
    when: Callable[[Evidence], bool]
    why: Callable[[Evidence], str]
    gated: bool = False

    def acceptable(self, ev: Evidence) -> bool:
        """False only when the gate applies and the measured accuracy drop exceeds the budget."""
        q = quality(ev, self.lever) if self.gated else None
        return q is None or q["acceptable"] is not False


def _always(ev: Evidence) -> bool:
    return True


RULES: tuple[Rule, ...] = (
    Rule(N.UNATTRIBUTED, None, _always, lambda ev: (
        f"{_stage_line(ev, N.UNATTRIBUTED)}: time in no stage span. Measure first: add stage spans "
        "(stagescope.stage) around the uninstrumented work before choosing a lever.")),
    Rule(N.STAGE_FEATURE_FETCH, N.LEVER_CACHE_FEATURES, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_FEATURE_FETCH)}. Slow feature-store reads: serve hot features from a "
        "local cache (per-request cost, no retraining).")),
    Rule(N.STAGE_PREPROCESS, N.LEVER_OFFLOAD_PREPROCESSING, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_PREPROCESS)}; {_util(ev)}"
        + (": the accelerator starves while the CPU works, so the pipeline, not the model, is the bottleneck"
           if _low_util(ev) else "")
        + ". Move preprocessing to a worker pool (or the client) so it runs in parallel.")),
    Rule(N.STAGE_POSTPROCESS, N.LEVER_OFFLOAD_PREPROCESSING, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_POSTPROCESS)}; {_util(ev)}. CPU postprocessing on the request path: "
        "move it to a worker pool.")),
    Rule(N.STAGE_COLD_START, N.LEVER_PREWARM, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COLD_START)}; {_n((ev.get('cold_start_share_tail') or 0) * 100, '%', 0)} of "
        "tail requests waited for a model load. Load the model before the instance reports ready.")),
    Rule(N.STAGE_BATCH_WAIT, N.LEVER_CAP_BATCH_WAIT, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_BATCH_WAIT)}; batches hold {_n(ev.get('batch_size_tail'))} items on "
        f"average (largest seen {_n(ev.get('batch_size_max'), nd=0)}); {_util(ev)}. Batches close on the "
        f"timer, not when full: cap the max batch wait at {_n(ev.get('batch_wait_cap_ms'), ' ms')}.")),
    Rule(N.STAGE_QUEUE, N.LEVER_QUANTIZE, lambda ev: _share(ev, N.STAGE_COMPUTE) >= COMPUTE_SHARE_FOR_QUEUE,
         lambda ev: (
        f"{_stage_line(ev, N.STAGE_QUEUE)}, but compute also explains {_share(ev, N.STAGE_COMPUTE):.0%}: "
        "per-request cost feeds the queue. Cut per-request cost (quantize) before scaling out."
        + _quality_line(ev, N.LEVER_QUANTIZE)), gated=True),
    Rule(N.STAGE_QUEUE, N.LEVER_SCALE_OUT, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_QUEUE)}; queue depth {_n(ev.get('queue_depth_tail'))} in the tail vs "
        f"{_n(ev.get('queue_depth_baseline'))} in the baseline; batches {_n(ev.get('batch_size_tail'))} "
        f"(largest {_n(ev.get('batch_size_max'), nd=0)}); {_util(ev)}; compute explains only "
        f"{_share(ev, N.STAGE_COMPUTE):.0%}. The queue, not per-request cost, owns the tail: add executors "
        "(scale out, autoscale on queue depth).")),
    Rule(N.STAGE_COMPUTE, N.LEVER_CACHE_RESULTS,
         lambda ev: float(ev.get("repeated_hash_share_tail") or 0.0) >= REPEATED_SHARE, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COMPUTE)}; {_n((ev.get('repeated_hash_share_tail') or 0) * 100, '%', 0)} of "
        f"slow requests repeat an input already seen (baseline "
        f"{_n((ev.get('repeated_hash_share_baseline') or 0) * 100, '%', 0)}). Cache results by input hash "
        "instead of recomputing them.")),
    Rule(N.STAGE_COMPUTE, N.LEVER_QUANTIZE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COMPUTE)}; {_util(ev)}; repeated inputs in the tail "
        f"{_n((ev.get('repeated_hash_share_tail') or 0) * 100, '%', 0)}. Cut the model's per-request cost: "
        "quantize (int8) or compile the runtime." + _quality_line(ev, N.LEVER_QUANTIZE)), gated=True),
    Rule(N.STAGE_COMPUTE, N.LEVER_COMPILE_RUNTIME, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COMPUTE)}; {_util(ev)}. Cut the model's per-request cost without changing "
        "its weights: compile the runtime (graph optimizations, operator fusion)."
        + _quality_line(ev, N.LEVER_COMPILE_RUNTIME)), gated=True),
    Rule(N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_PREFILL)}. Long prompts hold the scheduler in prefill: enable chunked "
        "prefill so prompt processing is interleaved with other requests.")),
    Rule(N.STAGE_DECODE, N.LEVER_REDUCE_BATCH_TOKENS, _large_running, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; the running decode batch is {_n(_running(ev)[0])} streams "
        f"around slow gaps vs {_n(_running(ev)[1])} around normal ones; each sequence in the batch adds "
        f"{_n(ev.get('batch_slope_ms'), ' ms', 2)} to a step (fit r² {_n(ev.get('batch_r2'), '', 2)}), "
        f"{_n((_batch_driven_share(ev) or 0) * 100, '%', 0)} of a slow gap. Cap the running batch "
        "(max_num_seqs / max_num_batched_tokens).")),
    Rule(N.STAGE_DECODE, N.LEVER_SPECULATIVE_DECODING, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; the running batch is not larger around slow gaps "
        f"({_n(_running(ev)[0])} vs {_n(_running(ev)[1])}): each decode step itself is slow. "
        "Speculative decoding cuts the steps per token.")),
    Rule(N.STAGE_EGRESS, N.LEVER_SHRINK_RESPONSE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_EGRESS)}. Serializing and writing large responses: shrink the payload "
        "(fewer fields, compact encoding, compression).")),
    Rule(N.STAGE_NETWORK, N.LEVER_SHRINK_RESPONSE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_NETWORK)} (client minus server time). Transfer time: shrink the response.")),
    # Stages other servers measure (Triton's frontend and tensor copies, see analysis/ingest/triton.py).
    Rule(N.STAGE_RECEIVE, N.LEVER_SHRINK_REQUEST, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_RECEIVE)}. The server is reading large requests off the network: send "
        "smaller inputs (binary tensor data instead of JSON; shared memory for a client on the same host).")),
    Rule(N.STAGE_DESERIALIZE, N.LEVER_SHRINK_REQUEST, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DESERIALIZE)}. Parsing requests into tensors costs CPU per element: send "
        "inputs as binary tensor data (Triton's binary tensor extension) or gRPC, not JSON numbers.")),
    Rule(N.STAGE_COMPUTE_INPUT, N.LEVER_SHRINK_REQUEST, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COMPUTE_INPUT)}. Copying input tensors to the model (host to GPU): pass "
        "them in CUDA shared memory, or send fewer and smaller tensors.")),
    Rule(N.STAGE_COMPUTE_OUTPUT, N.LEVER_SHRINK_RESPONSE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_COMPUTE_OUTPUT)}. Copying output tensors from the model (GPU to host): "
        "request only the outputs the client uses, make them smaller, or return them in CUDA shared memory.")),
)  # fmt: skip


def choose(stage: str, ev: Evidence) -> tuple[str | None, str] | None:
    """The first rule matching ``stage`` and the evidence whose lever is acceptable:
    ``(lever, rationale)``; None if no rule."""
    for rule in RULES:
        if rule.stage == stage and rule.when(ev) and rule.acceptable(ev):
            return rule.lever, rule.why(ev)
    return None


def rejected(stage: str, ev: Evidence) -> list[tuple[str, str]]:
    """The levers that matched ``stage`` and the evidence ahead of the chosen one but failed the quality
    gate: ``(lever, rationale)`` each, the rationale saying why it is not acceptable."""
    out: list[tuple[str, str]] = []
    for rule in RULES:
        if rule.stage != stage or not rule.when(ev):
            continue
        if rule.acceptable(ev):
            break
        assert rule.lever is not None
        out.append((rule.lever, f"{_not_acceptable(ev, rule.lever)} {rule.why(ev)}"))
    return out
