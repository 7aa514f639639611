"""The LLM engines' evidence as the lever rules read it: conditions and the measured lines they cite.

The evidence keys come from :mod:`~stagescope.analysis.engine_evidence` (engine metrics: vLLM's
preemptions, KV-cache usage, waiting/running gauges, prefix-cache and spec-decode counters, SGLang's
gauges) and from the requests (output tokens and time per token, prompt tokens): a queue the KV cache
causes (preemptions rising with the running batch) gets KV-cache headroom before replicas; prefill of
prompts that repeat with the prefix cache off or missing gets prefix caching before chunked prefill;
a decode tail of long outputs at the baseline's time per token gets an output budget, not faster
decoding. :mod:`~stagescope.analysis.levers` holds the rules that use them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "batches_line", "kv_line", "kv_pressure", "long_outputs", "long_prompts_in_tail", "prefill_is_waiting", "queue_depth_line",
    "shared_prompts_uncached", "tokens_line",
]  # fmt: skip

Evidence = dict[str, Any]

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


def long_outputs(ev: Evidence) -> bool:
    """The tail generated much more (output tokens) at about the baseline's time per token."""
    ot, ob = ev.get("output_tokens_tail"), ev.get("output_tokens_baseline")
    pt, pb = ev.get("per_token_ms_tail"), ev.get("per_token_ms_baseline")
    if ot is None or pt is None or not ob or not pb:
        return False
    return float(ot) >= LONG_OUTPUT_RATIO * float(ob) and float(pt) <= SAME_PER_TOKEN * float(pb)


def tokens_line(ev: Evidence) -> str:
    return (
        f"the tail generated {_n(ev.get('output_tokens_tail'), nd=0)} output tokens per request vs "
        f"{_n(ev.get('output_tokens_baseline'), nd=0)} in the baseline, at {_n(ev.get('per_token_ms_tail'), ' ms', 1)} "
        f"vs {_n(ev.get('per_token_ms_baseline'), ' ms', 1)} per token"
    )


def kv_pressure(ev: Evidence) -> bool:
    """The engine preempts (evicts and later recomputes) requests, more as the running batch grows or
    with the KV cache full: KV-cache pressure (vLLM ``vllm:num_preemptions``, SGLang retractions)."""
    rate = ev.get("preemptions_per_request")
    if rate is None or float(rate) < PREEMPTION_RATE:
        return False
    corr, kv = ev.get("preemptions_running_corr"), ev.get("kv_cache_usage_max")
    return (corr is not None and float(corr) >= PREEMPTION_RUNNING_CORR) or (
        kv is not None and float(kv) >= KV_FULL
    )


def kv_line(ev: Evidence) -> str:
    return (
        f"the engine preempted {_n(ev.get('preemptions'), nd=0)} times "
        f"({_n((ev.get('preemptions_per_request') or 0) * 100, '%', 1)} of requests), correlation with the "
        f"running batch {_n(ev.get('preemptions_running_corr'), '', 2)}, KV cache up to "
        f"{_n((ev.get('kv_cache_usage_max') or 0) * 100 if ev.get('kv_cache_usage_max') is not None else None, '%', 0)} full"
    )


def shared_prompts_uncached(ev: Evidence, repeated_share: float) -> bool:
    """Prompts repeat (input hashes seen before) while the prefix cache is off or rarely hits."""
    shared = float(ev.get("repeated_hash_share_tail") or 0.0) >= repeated_share
    hit, on = ev.get("prefix_cache_hit_ratio"), ev.get("prefix_caching_enabled")
    return shared and (on is False or (hit is not None and float(hit) < LOW_PREFIX_HIT))


def prefill_is_waiting(ev: Evidence) -> bool:
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


def long_prompts_in_tail(ev: Evidence) -> bool:
    """The tail's prompts are much longer than the baseline's (LONG_PROMPT_RATIO): a slow prefill is
    long prompts, or requests stuck behind them, which chunked prefill fixes, not a smaller batch."""
    it, ib = ev.get("input_tokens_tail"), ev.get("input_tokens_baseline")
    return it is not None and ib is not None and float(ib) > 0 and float(it) > LONG_PROMPT_RATIO * float(ib)


def queue_depth_line(ev: Evidence) -> str:
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


def batches_line(ev: Evidence) -> str:
    """The batches the tail ran in: the executed batch size, else an engine's running requests."""
    if ev.get("batch_size_tail") is not None:
        return f"batches {_n(ev.get('batch_size_tail'))} (largest {_n(ev.get('batch_size_max'), nd=0)})"
    if ev.get("running_tail") is not None or ev.get("running_mean") is not None:
        t, m = ev.get("running_tail"), ev.get("running_mean")
        return (f"running requests {_n(t)} around slow requests" if t is not None else
                f"running requests {_n(m)} on average")  # fmt: skip
    return "batch size not recorded"
