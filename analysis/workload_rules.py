"""The workload levers' evidence and rule conditions (issue 18): separate prefill and decode pools, a
prompt-length budget, continuous batching, cascade routing to a smaller model.

:mod:`~stagescope.analysis.levers` holds the rule rows (ONE table); this module computes the evidence
keys they read (:func:`gather`, merged into the evidence by analysis.evidence) and the conditions and
measured lines of their rationales. Evidence keys (None where the data lacks them):

* **prefill interference** (inter-token SLIs, per-gap samples): each gap's end is placed on the
  clock (its stream's first decode instant plus the gaps before it, in the order the span listed
  them); a gap *overlaps a prefill* when another request's prefill stage on the same engine (service
  and model) runs during it (by more than 1 µs: a prefill that starts as the step ends is the next
  step's). ``slow_gap_prefill_overlap`` / ``normal_gap_prefill_overlap``: share of
  the gaps over the SLO's threshold / at or under the median gap that overlap one;
  ``slow_gap_to_prefill``: median of a slow overlapping gap over the longest prefill it overlaps (near
  1: the whole prompt ran in one step, chunked prefill is off; a small fraction: each step carried a
  chunk); ``overlap_prompt_tokens``: mean prompt of the prefills the slow gaps overlap;
* **long prompts** (per-request SLIs with a prefill stage and prompt tokens): ``prompt_cap_tokens``,
  the baseline requests' SLO quantile of prompt tokens; ``long_prompt_share_tail``, the share of tail
  requests whose prompt is over it; ``prefill_ms_per_token_long`` / ``_baseline``: median prefill ms
  per prompt token of those long tail requests and of the baseline; where those point to long prompts
  at the normal cost, ``long_prefill_gap_ratio`` (median gap of other streams beside a prefill over the
  cap, over the median gap beside none) and ``long_prefill_gaps`` (how many such gaps);
* **streaming route** (any SLI): ``streaming_share``, the share of the SLO's requests that stream tokens
  (a first-token time or more than one output token); ``batch_close_together``: the share of batch-wait
  stage rows that end at the same instant (within 1 ms) as another request's, a batch closing;
  ``decode_step_ms``: the median time per output token;
* **cascade** (any SLI): ``escalation_rate`` (weighted share of ``stagescope.escalated`` true among the
  requests that carry it), ``escalation_known_share`` (share of the requests that carry it); None
  without the attribute: the rate is unknown.

Sampled traces: shares over requests count each request ``1 / sampling_p`` times; the gap shares
count gaps as the SLI view keeps them (every gap of a kept stream once).
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import quality as QL
from stagescope.analysis.attribution import Attribution
from stagescope.analysis.breach import SLIView, sql_str
from stagescope.analysis.breakdown import with_columns
from stagescope.analysis.keys import has_columns
from stagescope.analysis.weighting import mean_sql, weighted_quantile

__all__ = [
    "GAP_OVERLAP",
    "cascade_line",
    "cascade_measured",
    "cascade_why",
    "chunked_why",
    "continuous_why",
    "gap_overlaps",
    "gather",
    "interference_line",
    "long_prompts_at_normal_cost",
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
#: Share of tail requests over the prompt cap for "the slow requests are the long prompts" (a tail that
#: also holds many short prompts waiting behind long ones is chunked prefill's: see llm-long-prompts).
LONG_PROMPT_SHARE = 0.75
#: Tail prompts at least this many times the baseline's (mean tokens) count as long.
LONG_PROMPT_RATIO = 1.5
#: Per-token prefill cost of the long tail prompts at most this many times the baseline's: normal cost.
SAME_PREFILL_COST = 1.25
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


def _r(x: Any, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _kind_cond(con: duckdb.DuckDBPyConnection, kind: str, alias: str = "") -> str:
    """Stage rows of ``kind``: the ``kind`` column where the stages carry one, else the built-in names."""
    if has_columns(con, "stages", "kind"):
        return f"{alias}kind = {sql_str(kind)}"
    names = [s for s, k in N.STAGE_KINDS.items() if k == kind] or [kind]
    return f"{alias}stage IN ({', '.join(sql_str(s) for s in names)})"


#: Temp table of the SLI's gaps with their prefill overlap (:func:`gap_overlaps`).
GAP_OVERLAP = "ss_gap_overlap"


def gap_overlaps(con: duckdb.DuckDBPyConnection, view: SLIView) -> bool:
    """Create :data:`GAP_OVERLAP`: one row per gap of the SLI's streams (``trace_id``, ``gap_ms``;
    ``pf_ms`` and ``tokens``: the longest prefill of another request on the same engine (service and
    model) that ran during it and the largest prompt among them; ``over``: one did). False where it
    cannot be built: no per-gap samples, token_gaps a view (no row ids to keep the span's order of the
    gaps), or no decode and prefill stages with times."""
    eng = "coalesce(r.service, '') || '|' || coalesce(r.model, '')"
    reqs = (
        "(SELECT trace_id, any_value(service) AS service, any_value(model) AS model, "
        "max(input_tokens) AS input_tokens FROM requests GROUP BY 1)"
    )
    try:
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {GAP_OVERLAP} AS
            WITH g AS (SELECT g.rowid AS gid, g.trace_id, g.gap_ms FROM token_gaps g
                       WHERE g.gap_ms IS NOT NULL
                       AND g.trace_id IN (SELECT trace_id FROM requests WHERE {view.request_filter})),
                d AS (SELECT trace_id, min(start_unix_ns) AS d0 FROM stages WHERE {_kind_cond(con, N.KIND_DECODE)}
                      GROUP BY 1),
                e AS (SELECT g.gid, g.trace_id, g.gap_ms, {eng} AS eng,
                             d.d0 + CAST(sum(g.gap_ms) OVER (PARTITION BY g.trace_id ORDER BY g.gid) * 1e6 AS BIGINT) AS t1
                      FROM g JOIN d USING (trace_id) JOIN {reqs} r USING (trace_id)),
                p AS (SELECT s.trace_id AS pt, s.start_unix_ns AS a, s.end_unix_ns AS b, {eng} AS eng,
                             r.input_tokens AS tokens
                      FROM stages s JOIN {reqs} r USING (trace_id)
                      WHERE {_kind_cond(con, N.KIND_PREFILL, "s.")} AND s.end_unix_ns > s.start_unix_ns)
            SELECT e.gid, any_value(e.trace_id) AS trace_id, any_value(e.gap_ms) AS gap_ms,
                   max(p.b - p.a) / 1e6 AS pf_ms, max(p.tokens) AS tokens, count(p.pt) > 0 AS over
            FROM e LEFT JOIN p ON p.eng = e.eng AND p.pt <> e.trace_id AND p.a < e.t1 - 1000
                                AND p.b > e.t1 - CAST(e.gap_ms * 1e6 AS BIGINT) + 1000
            GROUP BY e.gid"""
        )
    except duckdb.Error:  # token_gaps a view (no row ids), or stages without times
        return False
    return True


def _interference(con: duckdb.DuckDBPyConnection, view: SLIView) -> Evidence:
    """Prefill interference of the gaps (see the module docstring); {} without :func:`gap_overlaps`."""
    if view.per_request or not gap_overlaps(con, view):
        return {}
    thr = float(view.slo.threshold_ms)
    row = con.execute(
        f"""SELECT avg(over::INT) FILTER (WHERE gap_ms > {thr!r}),
                   avg(over::INT) FILTER (WHERE gap_ms <= (SELECT quantile_cont(gap_ms, 0.5) FROM {GAP_OVERLAP})),
                   median(gap_ms / nullif(pf_ms, 0)) FILTER (WHERE gap_ms > {thr!r} AND over),
                   avg(tokens) FILTER (WHERE gap_ms > {thr!r} AND over),
                   count(*) FILTER (WHERE gap_ms > {thr!r})
            FROM {GAP_OVERLAP}"""
    ).fetchone()
    if row is None or not row[4]:
        return {}
    return {
        "slow_gap_prefill_overlap": _r(row[0]), "normal_gap_prefill_overlap": _r(row[1]),
        "slow_gap_to_prefill": _r(row[2]), "overlap_prompt_tokens": _r(row[3], 1), "slow_gaps": int(row[4]),
    }  # fmt: skip


def _long_prompts(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution) -> Evidence:
    """The long-prompt evidence of a per-request SLI (see the module docstring); {} without a prefill
    stage or prompt tokens."""
    pcols = [f"coalesce({attr.columns[s]}, 0)" for s in attr.of_kind(N.KIND_PREFILL)]
    if not view.per_request or not pcols:
        return {}
    pre = "(" + " + ".join(pcols) + ")"
    w = attr.weight or "1.0"
    src = with_columns(f"input_tokens AS tokens, {w} AS w, {pre} AS pre")
    base = f"(SELECT * FROM {src} WHERE ({attr.baseline_condition}) AND tokens > 0)"
    cap = weighted_quantile(con, base, "tokens", view.slo.quantile, "w")
    if cap is None:
        return {}
    tail = f"(SELECT * FROM {src} WHERE ({attr.tail_condition}) AND tokens IS NOT NULL)"
    row = con.execute(f"SELECT sum(w * (tokens > {cap!r})::INT) / nullif(sum(w), 0) FROM {tail}").fetchone()
    long_tail = f"(SELECT *, pre / tokens AS per_tok FROM {tail} WHERE tokens > {cap!r})"
    per_long = weighted_quantile(con, long_tail, "per_tok", 0.5, "w")
    per_base = weighted_quantile(con, f"(SELECT *, pre / tokens AS per_tok FROM {base})", "per_tok", 0.5, "w")
    return {
        "prompt_cap_tokens": float(round(cap)),
        "long_prompt_share_tail": _r(row[0]) if row else None,
        "prefill_ms_per_token_long": _r(per_long), "prefill_ms_per_token_baseline": _r(per_base),
    }  # fmt: skip


def _interleaved(con: duckdb.DuckDBPyConnection, view: SLIView, cap: float) -> Evidence:
    """Whether the engine kept decoding other streams while prompts over ``cap`` tokens prefilled:
    the median gap beside such a prefill over the median gap beside none (near 1: the prompt was
    interleaved with the decodes, chunked; the prefill's length: it held the engine)."""
    if not gap_overlaps(con, view):
        return {}
    row = con.execute(
        f"""SELECT median(gap_ms) FILTER (WHERE over AND tokens > {cap!r}), median(gap_ms) FILTER (WHERE NOT over),
                   count(*) FILTER (WHERE over AND tokens > {cap!r})
            FROM {GAP_OVERLAP}"""
    ).fetchone()
    if not row or row[0] is None or not row[1]:
        return {}
    return {"long_prefill_gap_ratio": _r(float(row[0]) / float(row[1]), 3), "long_prefill_gaps": int(row[2])}


def _streams(con: duckdb.DuckDBPyConnection, view: SLIView) -> Evidence:
    w = view.request_weight(con)
    row = con.execute(
        f"""SELECT sum({w} * (ttft_ms IS NOT NULL OR coalesce(output_tokens, 0) > 1)::INT) / nullif(sum({w}), 0),
                   quantile_cont(itl_mean_ms, 0.5)
            FROM requests WHERE {view.request_filter}"""
    ).fetchone()
    out: Evidence = {
        "streaming_share": _r(row[0]) if row else None,
        "decode_step_ms": _r(row[1]) if row else None,
    }
    closed = con.execute(
        f"""WITH b AS (SELECT trace_id, end_unix_ns // 1000000 AS t FROM stages
                       WHERE {_kind_cond(con, N.KIND_BATCH_WAIT)}
                       AND trace_id IN (SELECT trace_id FROM requests WHERE {view.request_filter})),
                c AS (SELECT t, count(*) AS k FROM b GROUP BY 1)
            SELECT avg((coalesce(c0.k, 0) + coalesce(c1.k, 0) + coalesce(c2.k, 0) > 1)::INT)
            FROM b LEFT JOIN c c0 ON c0.t = b.t LEFT JOIN c c1 ON c1.t = b.t - 1 LEFT JOIN c c2 ON c2.t = b.t + 1"""
    ).fetchone()
    out["batch_close_together"] = _r(closed[0]) if closed else None
    return out


def _escalation(con: duckdb.DuckDBPyConnection, view: SLIView) -> Evidence:
    if not has_columns(con, "requests", "escalated"):
        return {"escalation_rate": None, "escalation_known_share": None}
    w = view.request_weight(con)
    row = con.execute(
        f"""SELECT {mean_sql("escalated::INT", "escalated IS NOT NULL", "w")},
                   sum(w * (escalated IS NOT NULL)::INT) / nullif(sum(w), 0)
            FROM (SELECT escalated, {w} AS w FROM requests WHERE {view.request_filter})"""
    ).fetchone()
    return {
        "escalation_rate": _r(row[0]) if row else None,
        "escalation_known_share": _r(row[1]) if row else None,
    }


def gather(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: Evidence) -> Evidence:
    """The workload evidence of one analysed SLO, to merge into ``ev`` (module docstring)."""
    out: Evidence = {}
    out.update(_interference(con, view))
    out.update(_long_prompts(con, view, attr))
    if _long_at_normal_cost(out | {k: ev.get(k) for k in ("input_tokens_tail", "input_tokens_baseline")}):
        out.update(_interleaved(con, view, float(out["prompt_cap_tokens"])))  # only where it can decide
    out.update(_streams(con, view))
    out.update(_escalation(con, view))
    out["small_model_measured"] = bool(QL.speed_curve(ev.get("model") or {}, N.LEVER_CASCADE_SMALL_MODEL))
    return out


# -- conditions ------------------------------------------------------------------------------------
def _interfered(ev: Evidence) -> bool:
    slow, normal = ev.get("slow_gap_prefill_overlap"), ev.get("normal_gap_prefill_overlap")
    if slow is None or float(slow) < INTERFERENCE_SHARE:
        return False
    return normal is None or float(slow) >= INTERFERENCE_LIFT * float(normal)


def unchunked_interference(ev: Evidence) -> bool:
    """Slow gaps spike while other requests' prefills run, each as long as a whole prefill: the
    prompt ran in one step (chunked prefill off), so chunked prefill, a flag, comes first."""
    ratio = ev.get("slow_gap_to_prefill")
    return _interfered(ev) and ratio is not None and float(ratio) >= WHOLE_PREFILL


def prefill_interference(ev: Evidence) -> bool:
    """Slow gaps spike while other requests' prefills run beside the decodes, each a fraction of the
    prefill (it is already chunked): only a separate prefill pool takes the prefills off the decode steps."""
    ratio = ev.get("slow_gap_to_prefill")
    return _interfered(ev) and (ratio is None or float(ratio) < WHOLE_PREFILL)


def interference_line(ev: Evidence) -> str:
    return (
        f"{_n((ev.get('slow_gap_prefill_overlap') or 0) * 100, '%', 0)} of the {ev.get('slow_gaps', 'n/a')} gaps over "
        f"the threshold ended while another request's prefill ran on the same engine (prompts of "
        f"{_n(ev.get('overlap_prompt_tokens'), nd=0)} tokens on average), vs "
        f"{_n((ev.get('normal_gap_prefill_overlap') or 0) * 100, '%', 0)} of the gaps at or under the median; a slow "
        f"gap is {_n((ev.get('slow_gap_to_prefill') or 0) * 100, '%', 0)} of the prefill it overlaps"
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
    return _long_at_normal_cost(ev)


def budget_not_proven(ev: Evidence) -> bool:
    """The long-prompt evidence holds but the engine was not seen interleaving them (see above)."""
    return _long_at_normal_cost(ev) and not long_prompts_at_normal_cost(ev)


def _long_at_normal_cost(ev: Evidence) -> bool:
    share, per_l, per_b = (ev.get(k) for k in ("long_prompt_share_tail", "prefill_ms_per_token_long",
                                               "prefill_ms_per_token_baseline"))  # fmt: skip
    it, ib = ev.get("input_tokens_tail"), ev.get("input_tokens_baseline")
    if share is None or per_l is None or not per_b or it is None or not ib:
        return False
    return (
        float(share) >= LONG_PROMPT_SHARE
        and float(it) >= LONG_PROMPT_RATIO * float(ib)
        and float(per_l) <= SAME_PREFILL_COST * float(per_b)
    )


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
        f"{stage_line}; {interference_line(ev)}: whole prompts run in one engine step beside the decodes, so "
        "every stream decoding then waits for them. Enable chunked prefill first (vLLM "
        "--enable-chunked-prefill with --max-num-batched-tokens as the chunk budget, on by default in V1; SGLang "
        "--chunked-prefill-size): one flag on the same GPUs caps a spike at one chunk's prefill. Separate "
        "prefill and decode pools only if the chunked spikes still break the SLO."
    )


def separate_why(ev: Evidence, stage_line: str) -> str:
    return (
        f"{stage_line}; {interference_line(ev)}: prefills of other requests, already chunked, still share "
        "the decode steps (vLLM's docs: prefill jobs inserted during a request's decoding raise tail ITL). "
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
