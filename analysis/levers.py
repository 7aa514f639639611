"""The lever rules: ONE table from (stage kind, evidence) to a no-retrain lever, with a rationale
that names the stage and cites the measured numbers.

Rules are chosen by the stage's **kind** (``names.KINDS``), not its name: a team's own ``rerank``
stage of kind ``compute`` gets the compute rules, a ``retrieve`` of kind ``fetch`` the cache rule,
each with its own name in the rationale. A stage of kind ``unknown`` (a custom name nobody gave a
kind) gets no lever: its rule says so and asks for the kind to be named. Time in no stage
(``unattributed``) has a rule of its own.

Order of practice: measure first (time in no stage -> add stage spans, no lever), then cut the
per-request cost (cache, quantize, compile, batch settings), and scale out only when the queue, not
per-request cost, owns the tail. For LLM engines (the evidence in
:mod:`~stagescope.analysis.engine_rules`): a queue the KV cache causes gets KV-cache headroom before
replicas; prefill of prompts that repeat with the prefix cache off gets prefix caching before chunked
prefill; a decode tail of long outputs at the baseline's time per token gets an output budget, not
faster decoding; the engine's front end (its API server, kind ``cpu``) gets more API-server
processes, and a gateway in front of it (kind ``network``) is measured first. The fleet's rules
(conditions and texts in :mod:`~stagescope.analysis.fleet_rules`): a queue while the autoscaler scales
on CPU gets queue-depth scaling before scale-out; KV pressure with no memory to give (or more streams
admitted than the cache holds) gets a concurrency limit before KV-cache headroom; shared prompts whose
prefix hits differ across replicas get KV-cache-aware routing before prefix caching. A rule may name the
processes, and a gateway in front of it (kind ``network``) is measured first. Workload levers
(:mod:`~stagescope.analysis.workload_rules`): inter-token gaps that spike beside other requests'
prefills, where the prefills add at least half of those gaps' time over gaps at the same running
batch beside none, get chunked prefill (a flag) when a whole prompt longer than a chunk ran in one
step, else separate prefill and decode pools (more GPUs), both before a smaller batch; long prompts at the normal per-token cost on
an engine seen interleaving them get a prompt budget before chunked prefill; a static batcher on a
streaming route gets continuous batching before a shorter batch wait; a measured cascade (small
model, escalation rate) follows a rejected quantize. A rule may name the
one stage it is for (``Rule.stage``); it then applies to that stage only, ahead of its kind's
general rules. Low accelerator utilization with a slow CPU stage points to the pipeline, not the
model. Rules are tried top to bottom; the first whose kind matches and whose
condition holds gives the lever. A lever that changes the model (``quantize``, ``compile-runtime``)
must also pass the quality gate: when the service exported the accuracy its variant measured on the
model's eval set and the SLO sets a ``quality_budget``, a lever that costs more accuracy than the
budget is not acceptable (:func:`rejected` lists it) and the next rule gives the lever. Rows keyed by
an event kind (``names.EVENT_KINDS``) are for breaches that follow a deploy, scale event or model swap
(analysis.event_rules, analysis.event_attribution).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stagescope import names as N
from stagescope.analysis import engine_rules as ER
from stagescope.analysis import event_rules as EV
from stagescope.analysis import fleet_rules as FR
from stagescope.analysis import rule_lines as RL
from stagescope.analysis import workload_rules as WR
from stagescope.analysis.rule_lines import Evidence, kind_share, quality

__all__ = ["RULES", "Rule", "choose", "kind_share", "quality", "rejected"]

@dataclass(frozen=True)
class Rule:
    """``kind`` + ``when(evidence)`` -> ``lever``; ``why(evidence, stage)`` is the rationale for the
    stage (of that kind) it is applied to. ``kind`` is one of ``names.KINDS``, ``names.KIND_UNKNOWN``
    or ``names.UNATTRIBUTED`` (time in no stage). ``gated``: the lever changes the model, so it must
    also pass the quality gate. ``stage``: the one stage name the rule is for (an LLM engine's
    ``front_end``, a ``gateway``); None: every stage of the kind."""

    kind: str
    lever: str | None
    when: Callable[[Evidence], bool]
    why: Callable[[Evidence, str], str]
    gated: bool = False
    stage: str | None = None

    def matches(self, stage: str, key: str) -> bool:
        """The rule is for this stage (``key``: its kind, or ``unattributed``)."""
        return self.kind == key and (self.stage is None or self.stage == stage)

    def acceptable(self, ev: Evidence) -> bool:
        """False only when the gate applies and the measured accuracy drop exceeds the budget."""
        q = RL.quality(ev, self.lever) if self.gated else None
        return q is None or q["acceptable"] is not False


def _always(ev: Evidence) -> bool:
    return True


def _compute_feeds_queue(ev: Evidence) -> bool:
    return RL.kind_share(ev, N.KIND_COMPUTE) >= RL.COMPUTE_SHARE_FOR_QUEUE


def _repeats(ev: Evidence) -> bool:
    return float(ev.get("repeated_hash_share_tail") or 0.0) >= RL.REPEATED_SHARE


RULES: tuple[Rule, ...] = (
    Rule(N.UNATTRIBUTED, None, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}: time in no stage span. Measure first: add stage spans "
        "(stagescope.stage) around the uninstrumented work before choosing a lever.")),
    Rule(N.KIND_UNKNOWN, None, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}, but its kind is unknown: it is not a built-in stage and its spans carry "
        f"no {N.ATTR_STAGE_KIND}, so no lever is guessed. Name its kind, e.g. "
        f"stagescope.stage({st!r}, kind=...) with one of {', '.join(N.KINDS)}, and analyse again.")),
    Rule(N.KIND_FETCH, N.LEVER_CACHE_FEATURES, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}. Slow reads from another store or service: serve "
        f"{'hot features' if st == N.STAGE_FEATURE_FETCH else 'what ' + st + ' reads for hot keys'} from a "
        "local cache (per-request cost, no retraining).")),
    # an LLM engine's front end (analysis/ingest/engines.py): CPU work, but in the engine's API server
    Rule(N.KIND_CPU, N.LEVER_MORE_API_SERVERS, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}. The engine's front end (its API server: request parsing, chat "
        "template, tokenization, the hand-off to the engine core) holds requests before they reach the "
        "engine's queue, so the GPU is not what they wait for. Run more API-server processes in front of "
        "the engine (vLLM --api-server-count N; SGLang --tokenizer-worker-num N)."), stage=N.STAGE_FRONT_END),
    Rule(N.KIND_CPU, N.LEVER_OFFLOAD_PREPROCESSING, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.util(ev)}"
        + (": the accelerator starves while the CPU works, so the pipeline, not the model, is the bottleneck"
           if RL.low_util(ev) else "")
        + f". CPU work on the request path ({st}): move it to a worker pool (or the client) so it runs "
        "in parallel.")),
    Rule(N.KIND_COLD_START, N.LEVER_PREWARM, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.pct(ev, 'cold_start_share_tail')} of tail requests waited for a model "
        "load. Load the model before the instance reports ready.")),
    Rule(N.KIND_POD_PENDING, N.LEVER_PREWARMED_PODS, _always, EV.pod_pending_why),
    Rule(N.KIND_BATCH_WAIT, N.LEVER_CONTINUOUS_BATCHING, WR.static_batches_on_stream,
         lambda ev, st: WR.continuous_why(ev, RL.stage_line(ev, st))),
    Rule(N.KIND_BATCH_WAIT, N.LEVER_CAP_BATCH_WAIT, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; batches hold {RL.num(ev.get('batch_size_tail'))} items on "
        f"average (largest seen {RL.num(ev.get('batch_size_max'), nd=0)}); {RL.util(ev)}. Batches close on the "
        f"timer, not when full: cap the max batch wait at {RL.num(ev.get('batch_wait_cap_ms'), ' ms')}.")),
    Rule(N.KIND_QUEUE, N.LEVER_CONCURRENCY_LIMIT, FR.overcommitted,
         lambda ev, st: f"{RL.stage_line(ev, st)}; {FR.concurrency_why(ev)}"),
    Rule(N.KIND_QUEUE, N.LEVER_KV_CACHE_HEADROOM, ER.kv_pressure, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {ER.kv_line(ev)}: requests wait because the KV cache is full, and "
        "preempted ones are recomputed. Give the KV cache room before adding replicas (vLLM "
        "--gpu-memory-utilization up, --kv-cache-dtype fp8, --max-num-seqs down; SGLang "
        "--mem-fraction-static).")),
    Rule(N.KIND_QUEUE, N.LEVER_QUANTIZE, _compute_feeds_queue, lambda ev, st: (
        f"{RL.stage_line(ev, st)}, but compute ({RL.of_kind(ev, N.KIND_COMPUTE)}) also explains "
        f"{RL.kind_share(ev, N.KIND_COMPUTE):.0%}: per-request cost feeds the queue. Cut per-request cost "
        "(quantize) before scaling out." + RL.quality_line(ev, N.LEVER_QUANTIZE)), gated=True),
    Rule(N.KIND_QUEUE, N.LEVER_SCALE_ON_QUEUE_DEPTH, FR.autoscaler_on_resource,
         lambda ev, st: f"{RL.stage_line(ev, st)}; {FR.autoscaler_why(ev)}"),
    Rule(N.KIND_QUEUE, N.LEVER_SCALE_OUT, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {ER.queue_depth_line(ev)}; {ER.batches_line(ev)}; {RL.util(ev)}; compute explains only "
        f"{RL.kind_share(ev, N.KIND_COMPUTE):.0%}. The queue, not per-request cost, owns the tail: add executors "
        "(scale out, autoscale on queue depth).")),
    Rule(N.KIND_COMPUTE, N.LEVER_CACHE_RESULTS, _repeats, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.pct(ev, 'repeated_hash_share_tail')} of slow requests repeat an input "
        f"already seen (baseline {RL.pct(ev, 'repeated_hash_share_baseline')}). Cache results by input hash "
        "instead of recomputing them.")),
    Rule(N.KIND_COMPUTE, N.LEVER_QUANTIZE, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.util(ev)}; repeated inputs in the tail {RL.pct(ev, 'repeated_hash_share_tail')}. "
        f"Cut the model's per-request cost{RL.in_stage(st)}: quantize (int8) or compile the runtime."
        + RL.quality_line(ev, N.LEVER_QUANTIZE)), gated=True),
    Rule(N.KIND_COMPUTE, N.LEVER_CASCADE_SMALL_MODEL, WR.cascade_measured,
         lambda ev, st: WR.cascade_why(ev, RL.stage_line(ev, st)) + RL.quality_line(ev, N.LEVER_CASCADE_SMALL_MODEL), gated=True),
    Rule(N.KIND_COMPUTE, N.LEVER_COMPILE_RUNTIME, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.util(ev)}. Cut the model's per-request cost{RL.in_stage(st)} without changing "
        "its weights: compile the runtime (graph optimizations, operator fusion)."
        + RL.quality_line(ev, N.LEVER_COMPILE_RUNTIME)), gated=True),
    Rule(N.KIND_PREFILL, N.LEVER_KV_CACHE_AWARE_ROUTING, lambda ev: FR.uneven_prefix_hits(ev, RL.REPEATED_SHARE),
         lambda ev, st: f"{RL.stage_line(ev, st)}; {FR.routing_why(ev)}"),
    Rule(N.KIND_PREFILL, N.LEVER_PREFIX_CACHING, lambda ev: ER.shared_prompts_uncached(ev, RL.REPEATED_SHARE),
         lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {RL.pct(ev, 'repeated_hash_share_tail')} of slow requests repeat a prompt "
        "already seen, and the prefix cache "
        + ("is off (enable_prefix_caching=False)" if ev.get("prefix_caching_enabled") is False else
           f"hits {RL.pct(ev, 'prefix_cache_hit_ratio')} of prompt tokens")
        + ": shared prompts are prefilled again and again. Enable prefix caching (vLLM "
        "--enable-prefix-caching; route requests that share a prefix to the same replica).")),
    Rule(N.KIND_PREFILL, N.LEVER_SCALE_ON_QUEUE_DEPTH, lambda ev: ER.prefill_is_waiting(ev) and FR.autoscaler_on_resource(ev),
         lambda ev, st: f"{RL.stage_line(ev, st)}; SGLang's prefill holds its wait queue; {FR.autoscaler_why(ev)}"),
    Rule(N.KIND_PREFILL, N.LEVER_SCALE_OUT, ER.prefill_is_waiting, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; SGLang's prefill (time_in_model_prefill) runs from the dispatch "
        "to the scheduler, so it holds the wait queue, and the tail's prompts are no longer than the "
        f"baseline's ({RL.num(ev.get('input_tokens_tail'), nd=0)} vs {RL.num(ev.get('input_tokens_baseline'), nd=0)} "
        f"tokens); {ER.queue_depth_line(ev)}: the requests waited, they did not prefill longer. Add replicas "
        "(scale out); SGLang's stage slices (--enable-trace, trace level 1 or more) would split the queue off.")),
    Rule(N.KIND_PREFILL, N.LEVER_REDUCE_BATCH_TOKENS,
         lambda ev: RL.large_running(ev) and not ER.long_prompts_in_tail(ev), lambda ev, st: (
        f"{RL.stage_line(ev, st)}; the slow requests ran in batches of {RL.num(RL.running(ev)[0])} vs "
        f"{RL.num(RL.running(ev)[1])} for normal ones, and each unit of batch adds {RL.num(ev.get('batch_slope_ms'), ' ms', 2)} "
        f"(fit r² {RL.num(ev.get('batch_r2'), '', 2)}): the batch, not the prompt, is slow. Lower the batch budget "
        "(max_num_batched_tokens / max_num_seqs) at a little throughput.")),
    Rule(N.KIND_PREFILL, N.LEVER_CAP_PROMPT_TOKENS, WR.long_prompts_at_normal_cost,
         lambda ev, st: WR.prompt_why(ev, RL.stage_line(ev, st))),
    Rule(N.KIND_PREFILL, N.LEVER_CHUNKED_PREFILL, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}. Long prompts hold the scheduler in prefill: enable chunked "
        "prefill so prompt processing is interleaved with other requests." + WR.chunked_budget_note(ev))),
    Rule(N.KIND_DECODE, N.LEVER_CAP_OUTPUT_TOKENS, ER.long_outputs, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {ER.tokens_line(ev)}: the slow requests are long outputs, not slow "
        "steps (faster decoding would not make them short). Cap what a request may generate (a max_tokens "
        "budget per route or client, or stop sequences).")),
    Rule(N.KIND_DECODE, N.LEVER_CONCURRENCY_LIMIT, FR.overcommitted,
         lambda ev, st: f"{RL.stage_line(ev, st)}; {FR.concurrency_why(ev)}"),
    Rule(N.KIND_DECODE, N.LEVER_KV_CACHE_HEADROOM, ER.kv_pressure, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; {ER.kv_line(ev)}: decoding requests are preempted and recomputed. "
        "Give the KV cache room (vLLM --gpu-memory-utilization up, --kv-cache-dtype fp8, --max-num-seqs "
        "down; SGLang --mem-fraction-static).")),
    # slow gaps that coincide with other requests' prefills: a step fit on the batch does not remove them;
    # chunked prefill (a flag) before a separate prefill pool (more GPUs)
    Rule(N.KIND_DECODE, N.LEVER_CHUNKED_PREFILL, WR.unchunked_interference, lambda ev, st: WR.chunked_why(ev, RL.stage_line(ev, st))),
    Rule(N.KIND_DECODE, N.LEVER_SEPARATE_PREFILL_DECODE, WR.prefill_interference,
         lambda ev, st: WR.separate_why(ev, RL.stage_line(ev, st))),
    Rule(N.KIND_DECODE, N.LEVER_REDUCE_BATCH_TOKENS, lambda ev: RL.large_running(ev), lambda ev, st: (
        f"{RL.stage_line(ev, st)}; the running decode batch is {RL.num(RL.running(ev)[0])} streams "
        f"around slow gaps vs {RL.num(RL.running(ev)[1])} around normal ones; each sequence in the batch adds "
        f"{RL.num(ev.get('batch_slope_ms'), ' ms', 2)} to a step (fit r² {RL.num(ev.get('batch_r2'), '', 2)}), "
        f"{RL.num((RL.batch_driven_share(ev) or 0) * 100, '%', 0)} of a slow gap. Cap the running batch "
        "(max_num_seqs / max_num_batched_tokens).")),
    Rule(N.KIND_DECODE, N.LEVER_CASCADE_SMALL_MODEL, WR.cascade_measured,
         lambda ev, st: WR.cascade_why(ev, RL.stage_line(ev, st)) + RL.quality_line(ev, N.LEVER_CASCADE_SMALL_MODEL), gated=True),
    Rule(N.KIND_DECODE, N.LEVER_SPECULATIVE_DECODING, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}; the running batch is not larger around slow gaps "
        f"({RL.num(RL.running(ev)[0])} vs {RL.num(RL.running(ev)[1])})"
        + (f"; {ER.tokens_line(ev)}" if ev.get("per_token_ms_tail") is not None else "")
        + ": each decode step itself is slow. Speculative decoding cuts the steps per token"
        + (f" (it is on, accepting {RL.pct(ev, 'spec_decode_acceptance')} of draft tokens: a better-matched "
           "draft model or fewer speculative tokens)" if ev.get("spec_decode_acceptance") is not None else "")
        + ".")),
    Rule(N.KIND_EGRESS, N.LEVER_SHRINK_RESPONSE, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}. " + RL.EGRESS_ADVICE.get(st, "Serializing and writing large responses: shrink "
                                                           "the payload (fewer fields, compact encoding, compression).")
    )),
    # a gateway or router in front of an LLM engine (analysis/ingest/engines.py): measured first
    Rule(N.KIND_NETWORK, None, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}: time in the gateway or router in front of the engine, outside "
        "the engine's own span (its routing, its connections to the engine, the network). Measure it first: "
        "add stage spans in the gateway before choosing a lever."), stage=N.STAGE_GATEWAY),
    Rule(N.KIND_NETWORK, N.LEVER_SHRINK_RESPONSE, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}{' (client minus server time)' if st == N.STAGE_NETWORK else ''}. "
        "Transfer time: shrink the response.")),
    # receiving and decoding requests (Triton's frontend and input copies, see analysis/ingest/triton.py)
    Rule(N.KIND_INGRESS, N.LEVER_SHRINK_REQUEST, _always, lambda ev, st: (
        f"{RL.stage_line(ev, st)}. " + RL.INGRESS_ADVICE.get(st, (
            f"The server spends this time taking requests in ({st}): send smaller inputs (binary tensor "
            "data instead of JSON, fewer and smaller tensors)."))
    )),
    # events (analysis.event_attribution, keyed by the event's kind): the breach follows a rollout,
    # a scale event, a model swap or a config change
    Rule(N.EVENT_DEPLOY, N.LEVER_SURGE_READINESS, _always, EV.deploy_why),
    Rule(N.EVENT_SCALE, None, EV.scaled_down, EV.scale_down_why),
    Rule(N.EVENT_SCALE, N.LEVER_PREWARMED_PODS, _always, EV.scale_up_why),
    Rule(N.EVENT_MODEL_SWAP, N.LEVER_PREWARM, EV.swap_in_place, EV.swap_in_place_why),
    Rule(N.EVENT_MODEL_SWAP, N.LEVER_SCALE_AHEAD, _always, EV.model_swap_why),
    Rule(N.EVENT_CONFIG, None, _always, EV.config_why),
)  # fmt: skip


def _key(stage: str, kind: str | None) -> str:
    return N.UNATTRIBUTED if stage == N.UNATTRIBUTED else (kind or N.KIND_UNKNOWN)


def choose(stage: str, kind: str | None, ev: Evidence) -> tuple[str | None, str] | None:
    """The first rule matching the stage's ``kind`` (``unattributed`` for time in no stage; None:
    unknown) and the evidence whose lever is acceptable: ``(lever, rationale)``; None if no rule."""
    key = _key(stage, kind)
    for rule in RULES:
        if rule.matches(stage, key) and rule.when(ev) and rule.acceptable(ev):
            return rule.lever, rule.why(ev, stage)
    return None


def rejected(stage: str, kind: str | None, ev: Evidence) -> list[tuple[str, str]]:
    """The levers that matched the stage's kind and the evidence ahead of the chosen one but failed the
    quality gate: ``(lever, rationale)`` each, the rationale saying why it is not acceptable."""
    key = _key(stage, kind)
    out: list[tuple[str, str]] = []
    for rule in RULES:
        if not rule.matches(stage, key) or not rule.when(ev):
            continue
        if rule.acceptable(ev):
            break
        assert rule.lever is not None
        out.append((rule.lever, f"{RL.not_acceptable(ev, rule.lever)} {rule.why(ev, stage)}"))
    return out
