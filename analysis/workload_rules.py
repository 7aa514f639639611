"""The workload levers' rule conditions and rationales (issue 18): separate prefill and decode pools, a
prompt-length budget, continuous batching, cascade routing to a smaller model.

:mod:`~stagescope.analysis.levers` holds the rule rows (ONE table); this module holds the conditions
they test and the measured lines of their rationales, over the evidence keys that
:mod:`~stagescope.analysis.workload_evidence` computes (its docstring lists them; :func:`gather`,
:func:`gap_overlaps` and :data:`GAP_OVERLAP` are re-exported from it here).
"""

from __future__ import annotations

from typing import Any

from stagescope import names as N
from stagescope.analysis.llm_levers import CHUNK_TOKENS
from stagescope.analysis.workload_evidence import (
    GAP_OVERLAP,
    LONG_PROMPT_RATIO,
    LONG_PROMPT_SHARE,
    SAME_PREFILL_COST,
    gap_overlaps,
    gather,
    long_at_normal_cost,
)

__all__ = [
    "GAP_OVERLAP",
    "LONG_PROMPT_RATIO",
    "LONG_PROMPT_SHARE",
    "SAME_PREFILL_COST",
    "budget_not_proven",
    "cascade_line",
    "cascade_measured",
    "cascade_why",
    "chunked_budget_note",
    "chunked_why",
    "continuous_why",
    "gap_overlaps",
    "gather",
    "interference_line",
    "long_prompts_at_normal_cost",
    "prefill_driven",
    "prefill_interference",
    "prompt_line",
    "prompt_why",
    "separate_why",
    "static_batches_on_stream",
    "stream_line",
    "unchunked_interference",
]  # fmt: skip

Evidence = dict[str, Any]

#: Share of slow gaps overlapping another request's prefill that counts as prefill interference...
INTERFERENCE_SHARE = 0.6
#: ... at least this many times the share of normal gaps that do (else prefills just run all the time).
INTERFERENCE_LIFT = 2.0
#: A slow gap at least this share of the prefill it overlaps held the whole prompt: chunked prefill off.
WHOLE_PREFILL = 0.5
#: Share of the slow overlapping gaps beside a prompt longer than one chunk for chunked prefill to be the
#: lever: a prompt of at most one chunk is one step either way (no chunk budget splits it).
CHUNKABLE_SHARE = 0.5
#: Share of the slow overlapping gaps' time that the prefills add over same-batch gaps beside no prefill
#: (``slow_gap_prefill_excess``) for the prefills to be a material part of the slow steps: at least half,
#: so taking them off (or chunking them) at least halves those gaps (the batch's bar, BATCH_DRIVEN_SHARE,
#: is the same half); below it the steps are slow for the batch they carry, with or without a prompt.
PREFILL_DRIVEN_SHARE = 0.5
#: Share of the slow overlapping gaps matched to same-batch gaps beside no prefill for that share to
#: speak for them (an unmatched gap is at a batch size that rarely ran without a prefill).
MATCHED_SHARE = 0.5
#: Gaps beside a long prefill at most this many times the gaps beside none: the engine interleaved it.
INTERLEAVED_GAP_RATIO = 3.0
#: Gaps beside long prefills needed to judge that.
MIN_OVERLAP_GAPS = 20
#: Share of the SLO's requests that stream tokens for a "generate" route.
STREAMING_SHARE = 0.5
#: Share of batch-wait rows ending with another request's for batches that close together.
CLOSE_TOGETHER = 0.5


def _n(x: Any, unit: str = "", nd: int = 1) -> str:
    return "n/a" if x is None else f"{float(x):.{nd}f}{unit}"


# -- conditions ------------------------------------------------------------------------------------
def _interfered(ev: Evidence) -> bool:
    """Slow gaps coincide with other requests' prefills (INTERFERENCE_SHARE of them, INTERFERENCE_LIFT
    times the normal gaps' share) **and** the prefills are a material part of those gaps: against the
    gaps at the same running batch that overlap none, the prefills add at least PREFILL_DRIVEN_SHARE of
    the slow gaps' time (``slow_gap_prefill_excess``, MATCHED_SHARE of them matched). Coinciding alone is
    what short prompts arriving all the time beside a large running batch do; without a running batch
    to match on (excess unknown) no interference is claimed: the batch's rules decide."""
    slow, normal = ev.get("slow_gap_prefill_overlap"), ev.get("normal_gap_prefill_overlap")
    if slow is None or float(slow) < INTERFERENCE_SHARE:
        return False
    if normal is not None and float(slow) < INTERFERENCE_LIFT * float(normal):
        return False
    return prefill_driven(ev)


def prefill_driven(ev: Evidence) -> bool:
    """The prefills the slow gaps overlap are a material part of them (see :func:`_interfered`)."""
    excess, matched = ev.get("slow_gap_prefill_excess"), ev.get("slow_gap_matched_share")
    return (
        excess is not None and matched is not None
        and float(matched) >= MATCHED_SHARE and float(excess) >= PREFILL_DRIVEN_SHARE
    )  # fmt: skip


def _why_not_chunking(ev: Evidence) -> str:
    """Why chunked prefill is not the lever where :func:`prefill_interference` holds, as measured."""
    chunkable, ratio = ev.get("slow_gap_chunkable_share"), ev.get("slow_gap_to_prefill")
    if chunkable is not None and float(chunkable) < CHUNKABLE_SHARE:
        return (
            f"only {float(chunkable):.0%} of the slow gaps beside a prompt longer than one {CHUNK_TOKENS}-token chunk, "
            "and a shorter prompt is one step with chunking on or off"
        )
    if ratio is None or float(ratio) < WHOLE_PREFILL:
        return "already chunked: a slow gap is a fraction of the prefill"
    return "prompt lengths unknown: if chunked prefill is off, enable it first"


def unchunked_interference(ev: Evidence) -> bool:
    """Slow gaps spike while other requests' prefills run, each as long as a whole prefill: the
    prompt ran in one step (chunked prefill off), so chunked prefill, a flag, comes first; only where
    most of those prefills are of prompts longer than one chunk (a shorter prompt is one step whether
    chunking is on or off: a slow gap as long as its prefill is then just a step, and chunking would
    change nothing)."""
    ratio, chunkable = ev.get("slow_gap_to_prefill"), ev.get("slow_gap_chunkable_share")
    return (
        _interfered(ev) and ratio is not None and float(ratio) >= WHOLE_PREFILL
        and chunkable is not None and float(chunkable) >= CHUNKABLE_SHARE
    )  # fmt: skip


def prefill_interference(ev: Evidence) -> bool:
    """Slow gaps spike while other requests' prefills run beside the decodes and those prefills are most
    of the slow gaps (:func:`_interfered`), and chunking cannot split them: each slow gap is a fraction
    of the prefill (it is already chunked), or the prompts are no longer than one chunk (one step with
    chunking on or off). Only a separate prefill pool then takes the prefills off the decode steps."""
    return _interfered(ev) and not unchunked_interference(ev)


def interference_line(ev: Evidence) -> str:
    per = "per gap" if ev.get("gap_running_per_gap") else "per stream"
    return (
        f"{_n((ev.get('slow_gap_prefill_overlap') or 0) * 100, '%', 0)} of the {ev.get('slow_gaps', 'n/a')} gaps over "
        f"the threshold ended while another request's prefill ran on the same engine (prompts of "
        f"{_n(ev.get('overlap_prompt_tokens'), nd=0)} tokens on average), vs "
        f"{_n((ev.get('normal_gap_prefill_overlap') or 0) * 100, '%', 0)} of the gaps at or under the median; a slow "
        f"gap is {_n((ev.get('slow_gap_to_prefill') or 0) * 100, '%', 0)} of the prefill it overlaps, and the "
        f"prefills add {_n((ev.get('slow_gap_prefill_excess') or 0) * 100, '%', 0)} of the slow gaps' time over the "
        f"gaps at the same running batch ({per}) beside no prefill "
        f"({_n((ev.get('slow_gap_matched_share') or 0) * 100, '%', 0)} of the slow gaps matched): the prefills, not "
        "the batch, make these steps slow"
    )


def long_prompts_at_normal_cost(ev: Evidence) -> bool:
    """The slow requests are themselves the long prompts (most of the tail is over the baseline's
    prompt quantile, the tail's mean prompt LONG_PROMPT_RATIO times the baseline's) at the baseline's
    per-token prefill cost, on an engine seen to keep decoding other streams while they prefill (their
    prompts are already interleaved: chunked prefill would change nothing): a budget, not scheduling,
    shortens them. Without that sight (no per-gap samples) chunked prefill, a flag, is tried first."""
    ratio, n = ev.get("long_prefill_gap_ratio"), ev.get("long_prefill_gaps")
    if ratio is None or n is None or int(n) < MIN_OVERLAP_GAPS or float(ratio) > INTERLEAVED_GAP_RATIO:
        return False
    return long_at_normal_cost(ev)


def budget_not_proven(ev: Evidence) -> bool:
    """The long-prompt evidence holds but the engine was not seen interleaving them (see above)."""
    return long_at_normal_cost(ev) and not long_prompts_at_normal_cost(ev)


def prompt_line(ev: Evidence) -> str:
    return (
        f"{_n((ev.get('long_prompt_share_tail') or 0) * 100, '%', 0)} of the slow requests carry prompts over "
        f"{_n(ev.get('prompt_cap_tokens'), ' tokens', 0)} (the baseline's quantile); the tail's prompts average "
        f"{_n(ev.get('input_tokens_tail'), nd=0)} tokens vs {_n(ev.get('input_tokens_baseline'), nd=0)}, prefilled at "
        f"{_n(ev.get('prefill_ms_per_token_long'), ' ms', 3)} vs {_n(ev.get('prefill_ms_per_token_baseline'), ' ms', 3)} "
        "per token"
        + (
            f"; gaps of other streams beside those prefills are x{float(ev['long_prefill_gap_ratio']):.1f} the "
            "gaps beside none (the engine interleaves the prompts)"
            if ev.get("long_prefill_gap_ratio") is not None
            else ""
        )
    )


def static_batches_on_stream(ev: Evidence) -> bool:
    """The requests stream tokens (a generate route) and their batch waits end together (a batch
    closing; unknown counts as together): a static batcher in front of a token stream."""
    share, closed = ev.get("streaming_share"), ev.get("batch_close_together")
    return (
        share is not None
        and float(share) >= STREAMING_SHARE
        and (closed is None or float(closed) >= CLOSE_TOGETHER)
    )


def stream_line(ev: Evidence) -> str:
    return (
        f"{_n((ev.get('streaming_share') or 0) * 100, '%', 0)} of the route's requests stream tokens "
        f"({_n(ev.get('decode_step_ms'), ' ms', 1)} per token); "
        f"{_n((ev.get('batch_close_together') or 0) * 100, '%', 0)} of the batch waits end with another request's "
        "(the batch closes)"
    )


def cascade_measured(ev: Evidence) -> bool:
    """A smaller model is there to route to: the service marks escalations (``stagescope.escalated``)
    or exported the small model's measured batch times (variant ``cascade-small-model``)."""
    return ev.get("escalation_rate") is not None or bool(ev.get("small_model_measured"))


def cascade_line(ev: Evidence) -> str:
    rate = ev.get("escalation_rate")
    esc = (
        f"{float(rate):.1%} of requests escalate to the large model ({N.ATTR_ESCALATED}, carried by "
        f"{_n((ev.get('escalation_known_share') or 0) * 100, '%', 0)} of them)"
        if rate is not None
        else f"the escalation rate is unknown (no request carries {N.ATTR_ESCALATED})"
    )
    small = (
        "the service measured the small model's batch times" if ev.get("small_model_measured")
        else f"no measured batch time for the small model ({N.METRIC_MODEL_VARIANT_BATCH}, variant "
        f"{N.LEVER_CASCADE_SMALL_MODEL})"
    )  # fmt: skip
    return f"{esc}; {small}"


# -- rationales (``stage_line``: levers' line naming the stage and its share of the excess) ----------
def chunked_budget_note(ev: Evidence) -> str:
    """For the prefill rule of chunked prefill: where the tail is long prompts at the normal per-token
    cost but the engine was not seen interleaving them, what to do after it."""
    if not budget_not_proven(ev):
        return ""
    return (
        f" The slow requests are also long prompts at the normal per-token cost ({prompt_line(ev)}): if chunked "
        f"prefill is already on, set a prompt-length budget ({N.LEVER_CAP_PROMPT_TOKENS}; per-gap samples, "
        f"{N.ATTR_TOKEN_GAPS}, would tell)."
    )


def chunked_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; {interference_line(ev)}, {_n((ev.get('slow_gap_chunkable_share') or 0) * 100, '%', 0)} of "
        f"those beside a prompt longer than one {CHUNK_TOKENS}-token chunk: whole prompts run in one engine step "
        "beside the decodes, so "
        "every stream decoding then waits for them. Enable chunked prefill first (vLLM "
        "--enable-chunked-prefill with --max-num-batched-tokens as the chunk budget, on by default in V1; SGLang "
        "--chunked-prefill-size): one flag on the same GPUs caps a spike at one chunk's prefill. Separate "
        "prefill and decode pools only if the chunked spikes still break the SLO."
    )


def separate_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; {interference_line(ev)}. Prefills of other requests ({_why_not_chunking(ev)}) still "
        "share the decode steps (vLLM's docs: prefill jobs inserted during a request's decoding raise tail ITL). "
        "Serve prefill and decode on separate pools (disaggregated serving: vLLM --kv-transfer-config with a "
        "KV connector; SGLang --disaggregation-mode prefill|decode): decode steps then carry no prompt. It "
        "costs a second pool and a KV-cache transfer per request (TTFT pays it), and does not add throughput: "
        "try a smaller chunk budget (--max-num-batched-tokens) first where it meets the SLO."
    )


def prompt_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; {prompt_line(ev)}: the slow requests are the long prompts themselves, prefilled at "
        "the normal per-token cost (not short prompts waiting behind them, which chunked prefill fixes). Set a "
        "prompt-length budget per route or client: truncate or trim the context (vLLM truncate_prompt_tokens; "
        "fewer retrieved chunks, a shorter history), and check the answers on the truncated prompts."
    )


def continuous_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; batches hold {_n(ev.get('batch_size_tail'))} requests on average; {stream_line(ev)}: a "
        "static batcher holds streaming requests until its batch closes, and a batch runs until its longest "
        "output. Serve the route with an engine's continuous (iteration-level) batching (vLLM, SGLang, TGI: a "
        "request joins the running batch at the next decode step; --max-num-seqs bounds it)."
    )


def cascade_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; {cascade_line(ev)}. The large model's per-request cost owns the tail: route requests "
        "to a smaller model first and escalate the ones it is not confident on (a cascade); escalated requests "
        "pay both models."
    )
