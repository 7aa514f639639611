"""The lever rules: ONE table from (stage, evidence) to a no-retrain lever, with a rationale that
cites the measured numbers.

Order of practice: measure first (time in no stage -> add stage spans, no lever), then cut the
per-request cost (cache, quantize, compile, batch settings), and scale out only when the queue, not
per-request cost, owns the tail. For LLM engines: a queue the KV cache causes (preemptions rising
with the running batch) gets KV-cache headroom before replicas; prefill of prompts that repeat with
the prefix cache off or missing gets prefix caching before chunked prefill; a decode tail of long
outputs at the baseline's time per token gets an output budget, not faster decoding; the engine's
front end (its API server) gets more API-server processes. Low accelerator utilization with a slow
CPU stage points to the pipeline, not the model. Rules are tried top to bottom; the first whose stage
matches and whose condition holds gives the lever. A lever that changes the model (``quantize``,
``compile-runtime``) must also pass the quality gate: when the service exported the accuracy its
variant measured on the model's eval set and the SLO sets a ``quality_budget``, a lever that costs
more accuracy than the budget is not acceptable (:func:`rejected` lists it) and the next rule gives
the lever.
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
#: Tail requests generating at least this many times the baseline's output tokens...
LONG_OUTPUT_RATIO = 1.5
#: ... at a time per token at most this many times the baseline's: long outputs, not slow steps.
SAME_PER_TOKEN = 1.25
#: SGLang's prefill (queue included) is waiting, not prompt processing, when the tail's prompts are at
#: most this many times the baseline's (the baseline is the faster half, so its prompts run short).
LONG_PROMPT_RATIO = 1.5
#: Preemptions per request above which preemption counts as evidence (with the two below).
PREEMPTION_RATE = 0.01
#: Correlation of preemptions with the running batch over the scrape intervals that counts as "rising
#: with the batch"; or a KV cache at least this full at some scrape.
PREEMPTION_RUNNING_CORR = 0.3
KV_FULL = 0.9
#: Prefix-cache hit ratio under which shared prompts are being recomputed.
LOW_PREFIX_HIT = 0.2


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


def _long_outputs(ev: Evidence) -> bool:
    """The tail generated much more (output tokens) at about the baseline's time per token."""
    ot, ob = ev.get("output_tokens_tail"), ev.get("output_tokens_baseline")
    pt, pb = ev.get("per_token_ms_tail"), ev.get("per_token_ms_baseline")
    if ot is None or pt is None or not ob or not pb:
        return False
    return float(ot) >= LONG_OUTPUT_RATIO * float(ob) and float(pt) <= SAME_PER_TOKEN * float(pb)


def _tokens_line(ev: Evidence) -> str:
    return (
        f"the tail generated {_n(ev.get('output_tokens_tail'), nd=0)} output tokens per request vs "
        f"{_n(ev.get('output_tokens_baseline'), nd=0)} in the baseline, at {_n(ev.get('per_token_ms_tail'), ' ms', 1)} "
        f"vs {_n(ev.get('per_token_ms_baseline'), ' ms', 1)} per token"
    )


def _kv_pressure(ev: Evidence) -> bool:
    """The engine preempts (evicts and later recomputes) requests, more as the running batch grows or
    with the KV cache full: KV-cache pressure (vLLM ``vllm:num_preemptions``, SGLang retractions)."""
    rate = ev.get("preemptions_per_request")
    if rate is None or float(rate) < PREEMPTION_RATE:
        return False
    corr, kv = ev.get("preemptions_running_corr"), ev.get("kv_cache_usage_max")
    return (corr is not None and float(corr) >= PREEMPTION_RUNNING_CORR) or (
        kv is not None and float(kv) >= KV_FULL
    )


def _kv_line(ev: Evidence) -> str:
    return (
        f"the engine preempted {_n(ev.get('preemptions'), nd=0)} times "
        f"({_n((ev.get('preemptions_per_request') or 0) * 100, '%', 1)} of requests), correlation with the "
        f"running batch {_n(ev.get('preemptions_running_corr'), '', 2)}, KV cache up to "
        f"{_n((ev.get('kv_cache_usage_max') or 0) * 100 if ev.get('kv_cache_usage_max') is not None else None, '%', 0)} full"
    )


def _shared_prompts_uncached(ev: Evidence) -> bool:
    """Prompts repeat (input hashes seen before) while the prefix cache is off or rarely hits."""
    shared = float(ev.get("repeated_hash_share_tail") or 0.0) >= REPEATED_SHARE
    hit, on = ev.get("prefix_cache_hit_ratio"), ev.get("prefix_caching_enabled")
    return shared and (on is False or (hit is not None and float(hit) < LOW_PREFIX_HIT))


def _prefill_is_waiting(ev: Evidence) -> bool:
    """SGLang's prefill (which holds its wait queue) is slow in the tail for prompts no longer than the
    baseline's: the excess is waiting, not prompt processing."""
    it, ib = ev.get("input_tokens_tail"), ev.get("input_tokens_baseline")
    return (
        bool(ev.get("prefill_includes_queue"))
        and it is not None
        and ib is not None
        and float(ib) > 0
        and float(it) <= LONG_PROMPT_RATIO * float(ib)
    )


def _queue_depth(ev: Evidence) -> str:
    """The queue depth in the tail vs the baseline, from the requests or the engine's waiting gauge;
    said as not measured (never "n/a") when neither was recorded."""
    t, b = ev.get("queue_depth_tail"), ev.get("queue_depth_baseline")
    if t is not None or b is not None:
        src = f" ({ev['queue_depth_source']})" if ev.get("queue_depth_source") else ""
        return f"queue depth {_n(t)} in the tail vs {_n(b)} in the baseline{src}"
    if ev.get("waiting_mean") is not None:
        return (
            f"waiting requests {_n(ev.get('waiting_mean'))} on average, at most {_n(ev.get('waiting_max'), nd=0)} "
            "(the engine's waiting gauge, scrapes without timestamps: not matched to requests)"
        )
    return "queue depth not recorded"


def _batches(ev: Evidence) -> str:
    """The batches the tail ran in: the executed batch size, else an engine's running requests."""
    if ev.get("batch_size_tail") is not None:
        return f"batches {_n(ev.get('batch_size_tail'))} (largest {_n(ev.get('batch_size_max'), nd=0)})"
    if ev.get("running_tail") is not None or ev.get("running_mean") is not None:
        t, m = ev.get("running_tail"), ev.get("running_mean")
        return (f"running requests {_n(t)} around slow requests" if t is not None else
                f"running requests {_n(m)} on average")  # fmt: skip
    return "batch size not recorded"


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
    budget = (
        "no quality budget set" if q["budget_points"] is None else f"budget {q['budget_points']:g} points"
    )
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
    Rule(N.STAGE_QUEUE, N.LEVER_KV_CACHE_HEADROOM, _kv_pressure, lambda ev: (
        f"{_stage_line(ev, N.STAGE_QUEUE)}; {_kv_line(ev)}: requests wait because the KV cache is full, and "
        "preempted ones are recomputed. Give the KV cache room before adding replicas (vLLM "
        "--gpu-memory-utilization up, --kv-cache-dtype fp8, --max-num-seqs down; SGLang "
        "--mem-fraction-static).")),
    Rule(N.STAGE_QUEUE, N.LEVER_QUANTIZE, lambda ev: _share(ev, N.STAGE_COMPUTE) >= COMPUTE_SHARE_FOR_QUEUE,
         lambda ev: (
        f"{_stage_line(ev, N.STAGE_QUEUE)}, but compute also explains {_share(ev, N.STAGE_COMPUTE):.0%}: "
        "per-request cost feeds the queue. Cut per-request cost (quantize) before scaling out."
        + _quality_line(ev, N.LEVER_QUANTIZE)), gated=True),
    Rule(N.STAGE_QUEUE, N.LEVER_SCALE_OUT, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_QUEUE)}; {_queue_depth(ev)}; {_batches(ev)}; {_util(ev)}; compute explains only "
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
    Rule(N.STAGE_PREFILL, N.LEVER_PREFIX_CACHING, _shared_prompts_uncached, lambda ev: (
        f"{_stage_line(ev, N.STAGE_PREFILL)}; {_n((ev.get('repeated_hash_share_tail') or 0) * 100, '%', 0)} of slow "
        "requests repeat a prompt already seen, and the prefix cache "
        + ("is off (enable_prefix_caching=False)" if ev.get("prefix_caching_enabled") is False else
           f"hits {_n((ev.get('prefix_cache_hit_ratio') or 0) * 100, '%', 0)} of prompt tokens")
        + ": shared prompts are prefilled again and again. Enable prefix caching (vLLM "
        "--enable-prefix-caching; route requests that share a prefix to the same replica).")),
    Rule(N.STAGE_PREFILL, N.LEVER_SCALE_OUT, _prefill_is_waiting, lambda ev: (
        f"{_stage_line(ev, N.STAGE_PREFILL)}; SGLang's prefill (time_in_model_prefill) runs from the dispatch "
        "to the scheduler, so it holds the wait queue, and the tail's prompts are no longer than the "
        f"baseline's ({_n(ev.get('input_tokens_tail'), nd=0)} vs {_n(ev.get('input_tokens_baseline'), nd=0)} "
        f"tokens); {_queue_depth(ev)}: the requests waited, they did not prefill longer. Add replicas (scale "
        "out); SGLang's stage slices (--enable-trace, trace level 1 or more) would split the queue off.")),
    Rule(N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_PREFILL)}. Long prompts hold the scheduler in prefill: enable chunked "
        "prefill so prompt processing is interleaved with other requests.")),
    Rule(N.STAGE_DECODE, N.LEVER_CAP_OUTPUT_TOKENS, _long_outputs, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; {_tokens_line(ev)}: the slow requests are long outputs, not slow "
        "steps (faster decoding would not make them short). Cap what a request may generate (a max_tokens "
        "budget per route or client, or stop sequences).")),
    Rule(N.STAGE_DECODE, N.LEVER_KV_CACHE_HEADROOM, _kv_pressure, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; {_kv_line(ev)}: decoding requests are preempted and recomputed. "
        "Give the KV cache room (vLLM --gpu-memory-utilization up, --kv-cache-dtype fp8, --max-num-seqs "
        "down; SGLang --mem-fraction-static).")),
    Rule(N.STAGE_DECODE, N.LEVER_REDUCE_BATCH_TOKENS, _large_running, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; the running decode batch is {_n(_running(ev)[0])} streams "
        f"around slow gaps vs {_n(_running(ev)[1])} around normal ones; each sequence in the batch adds "
        f"{_n(ev.get('batch_slope_ms'), ' ms', 2)} to a step (fit r² {_n(ev.get('batch_r2'), '', 2)}), "
        f"{_n((_batch_driven_share(ev) or 0) * 100, '%', 0)} of a slow gap. Cap the running batch "
        "(max_num_seqs / max_num_batched_tokens).")),
    Rule(N.STAGE_DECODE, N.LEVER_SPECULATIVE_DECODING, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_DECODE)}; the running batch is not larger around slow gaps "
        f"({_n(_running(ev)[0])} vs {_n(_running(ev)[1])})"
        + (f"; {_tokens_line(ev)}" if ev.get("per_token_ms_tail") is not None else "")
        + ": each decode step itself is slow. Speculative decoding cuts the steps per token"
        + (f" (it is on, accepting {_n((ev.get('spec_decode_acceptance') or 0) * 100, '%', 0)} of draft tokens: "
           "a better-matched draft model or fewer speculative tokens)" if ev.get("spec_decode_acceptance") is not None
           else "") + ".")),
    Rule(N.STAGE_EGRESS, N.LEVER_SHRINK_RESPONSE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_EGRESS)}. Serializing and writing large responses: shrink the payload "
        "(fewer fields, compact encoding, compression).")),
    Rule(N.STAGE_NETWORK, N.LEVER_SHRINK_RESPONSE, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_NETWORK)} (client minus server time). Transfer time: shrink the response.")),
    # LLM engines' own stages (analysis/ingest/engines.py)
    Rule(N.STAGE_FRONT_END, N.LEVER_MORE_API_SERVERS, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_FRONT_END)}. The engine's front end (its API server: request parsing, chat "
        "template, tokenization, the hand-off to the engine core) holds requests before they reach the "
        "engine's queue, so the GPU is not what they wait for. Run more API-server processes in front of "
        "the engine (vLLM --api-server-count N; SGLang --tokenizer-worker-num N).")),
    Rule(N.STAGE_GATEWAY, None, _always, lambda ev: (
        f"{_stage_line(ev, N.STAGE_GATEWAY)}: time in the gateway or router in front of the engine, outside "
        "the engine's own span (its routing, its connections to the engine, the network). Measure it first: "
        "add stage spans in the gateway before choosing a lever.")),
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
