"""The workload levers' evidence (issue 18): prefill interference, long prompts, streaming routes,
cascade escalations.

:func:`gather` computes the evidence keys of one analysed SLO (merged into the evidence by
analysis.evidence); :mod:`~stagescope.analysis.workload_rules` holds the conditions and rationale
lines that read them, and :mod:`~stagescope.analysis.levers` the rule rows. Evidence keys (None where
the data lacks them):

* **prefill interference** (inter-token SLIs, per-gap samples): each gap's end is placed on the
  clock (its stream's first decode instant plus the gaps before it, in the order the span listed
  them); a gap *overlaps a prefill* when another request's prefill stage on the same engine (service
  and model) runs during it (by more than 1 µs: a prefill that starts as the step ends is the next
  step's). ``slow_gap_prefill_overlap`` / ``normal_gap_prefill_overlap``: share of
  the gaps over the SLO's threshold / at or under the median gap that overlap one;
  ``slow_gap_to_prefill``: median of a slow overlapping gap over the longest prefill it overlaps (near
  1: the whole prompt ran in one step, chunked prefill is off; a small fraction: each step carried a
  chunk); ``overlap_prompt_tokens``: mean prompt of the prefills the slow gaps overlap;
  ``slow_gap_chunkable_share``: share of the slow overlapping gaps whose largest overlapped prompt is
  longer than one chunk (analysis.llm_levers.CHUNK_TOKENS): a prompt of at most one chunk runs in one
  step whether chunked prefill is on or off, so only these gaps can be what chunking shortens;
  ``slow_gap_prefill_excess``: what the prefill adds to a slow gap, against the batch: each slow
  overlapping gap is matched to the median gap *at the same running decode batch* (rounded to a whole
  stream; per gap, ``stagescope.itl.running``, where the server counted it, else its stream's mean
  ``batch_size``) among the gaps that overlap no prefill (at least MATCH_MIN_GAPS of them), and the
  evidence is the share of those gaps' time over their matches, ``sum(max(0, gap - matched)) /
  sum(gap)``: the time the prefills add to the slow steps, what taking them off would remove (0: steps
  that slow without any prefill, the batch's; 0.9: nine tenths of it is the prefills'). A share of
  time, not a median over gaps: when a long prompt's step leaves a backlog, the slow gaps are a few
  very long ones beside it and many batch-sized ones after it, and a median would sit between the two
  kinds. Overlapping a prefill is what happens whenever requests arrive beside a large running batch,
  so the overlap shares alone do not tell the prefill's cost from the batch's; this does.
  ``slow_gap_matched_share``: share of the slow overlapping gaps that found such a match;
  ``gap_running_per_gap``: the running batch was counted per gap (else per stream). Without a running
  batch for the gaps (neither), all three are None;
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
from stagescope.analysis.llm_levers import CHUNK_TOKENS
from stagescope.analysis.weighting import mean_sql, weighted_quantile

__all__ = [
    "GAP_OVERLAP",
    "LONG_PROMPT_RATIO",
    "LONG_PROMPT_SHARE",
    "MATCH_MIN_GAPS",
    "SAME_PREFILL_COST",
    "gap_overlaps",
    "gather",
    "long_at_normal_cost",
]

Evidence = dict[str, Any]

#: Share of tail requests over the prompt cap for "the slow requests are the long prompts" (a tail that
#: also holds many short prompts waiting behind long ones is chunked prefill's: see llm-long-prompts).
LONG_PROMPT_SHARE = 0.75
#: Tail prompts at least this many times the baseline's (mean tokens) count as long.
LONG_PROMPT_RATIO = 1.5
#: Per-token prefill cost of the long tail prompts at most this many times the baseline's: normal cost.
SAME_PREFILL_COST = 1.25


def _r(x: Any, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _kind_cond(con: duckdb.DuckDBPyConnection, kind: str, alias: str = "") -> str:
    """Stage rows of ``kind``: the ``kind`` column where the stages carry one, else the built-in names."""
    if has_columns(con, "stages", "kind"):
        return f"{alias}kind = {sql_str(kind)}"
    names = [s for s, k in N.STAGE_KINDS.items() if k == kind] or [kind]
    return f"{alias}stage IN ({', '.join(sql_str(s) for s in names)})"


#: Fewest gaps that overlap no prefill at one running batch size for their median to be the match of the
#: slow overlapping gaps at that size (``slow_gap_prefill_excess``; as analysis.batch_fit.STEP_FIT_MIN_GAPS).
MATCH_MIN_GAPS = 5

#: Temp table of the SLI's gaps with their prefill overlap (:func:`gap_overlaps`).
GAP_OVERLAP = "ss_gap_overlap"


def gap_overlaps(con: duckdb.DuckDBPyConnection, view: SLIView) -> bool:
    """Create :data:`GAP_OVERLAP`: one row per gap of the SLI's streams (``trace_id``, ``gap_ms``;
    ``pf_ms`` and ``tokens``: the longest prefill of another request on the same engine (service and
    model) that ran during it and the largest prompt among them; ``over``: one did; ``running``: the
    running decode batch of the gap's step, per gap where the server counted it, else the stream's mean
    ``batch_size``, ``per_gap`` whether it was per gap). False where it cannot be built: no per-gap
    samples, token_gaps a view (no row ids to keep the span's order of the gaps), or no decode and
    prefill stages with times."""
    eng = "coalesce(r.service, '') || '|' || coalesce(r.model, '')"
    bcol = "max(batch_size)" if has_columns(con, "requests", "batch_size") else "NULL::DOUBLE"
    reqs = (
        "(SELECT trace_id, any_value(service) AS service, any_value(model) AS model, "
        f"max(input_tokens) AS input_tokens, {bcol} AS batch_size FROM requests GROUP BY 1)"
    )
    grun = "g.running" if has_columns(con, "token_gaps", "running") else "NULL::DOUBLE"
    try:
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {GAP_OVERLAP} AS
            WITH g AS (SELECT g.rowid AS gid, g.trace_id, g.gap_ms, CAST({grun} AS DOUBLE) AS grun FROM token_gaps g
                       WHERE g.gap_ms IS NOT NULL
                       AND g.trace_id IN (SELECT trace_id FROM requests WHERE {view.request_filter})),
                d AS (SELECT trace_id, min(start_unix_ns) AS d0 FROM stages WHERE {_kind_cond(con, N.KIND_DECODE)}
                      GROUP BY 1),
                e AS (SELECT g.gid, g.trace_id, g.gap_ms, {eng} AS eng,
                             coalesce(g.grun, CAST(r.batch_size AS DOUBLE)) AS running, g.grun IS NOT NULL AS per_gap,
                             d.d0 + CAST(sum(g.gap_ms) OVER (PARTITION BY g.trace_id ORDER BY g.gid) * 1e6 AS BIGINT) AS t1
                      FROM g JOIN d USING (trace_id) JOIN {reqs} r USING (trace_id)),
                p AS (SELECT s.trace_id AS pt, s.start_unix_ns AS a, s.end_unix_ns AS b, {eng} AS eng,
                             r.input_tokens AS tokens
                      FROM stages s JOIN {reqs} r USING (trace_id)
                      WHERE {_kind_cond(con, N.KIND_PREFILL, "s.")} AND s.end_unix_ns > s.start_unix_ns)
            SELECT e.gid, any_value(e.trace_id) AS trace_id, any_value(e.gap_ms) AS gap_ms,
                   max(p.b - p.a) / 1e6 AS pf_ms, max(p.tokens) AS tokens, count(p.pt) > 0 AS over,
                   any_value(e.running) AS running, any_value(e.per_gap) AS per_gap
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
                   count(*) FILTER (WHERE gap_ms > {thr!r}),
                   avg((tokens > {CHUNK_TOKENS})::INT) FILTER (WHERE gap_ms > {thr!r} AND over)
            FROM {GAP_OVERLAP}"""
    ).fetchone()
    if row is None or not row[4]:
        return {}
    return {
        "slow_gap_prefill_overlap": _r(row[0]), "normal_gap_prefill_overlap": _r(row[1]),
        "slow_gap_to_prefill": _r(row[2]), "overlap_prompt_tokens": _r(row[3], 1), "slow_gaps": int(row[4]),
        "slow_gap_chunkable_share": _r(row[5]),
    } | _matched_excess(con, thr)  # fmt: skip


def _matched_excess(con: duckdb.DuckDBPyConnection, thr: float) -> Evidence:
    """``slow_gap_prefill_excess``, ``slow_gap_matched_share`` and ``gap_running_per_gap`` (the module
    docstring): each slow overlapping gap against the median gap at the same running batch that
    overlaps no prefill; None where the gaps carry no running batch."""
    row = con.execute(
        f"""WITH m AS (SELECT round(running) AS b, quantile_cont(gap_ms, 0.5) AS m0 FROM {GAP_OVERLAP}
                       WHERE NOT over AND running IS NOT NULL GROUP BY 1 HAVING count(*) >= {MATCH_MIN_GAPS}),
                 s AS (SELECT o.gap_ms, o.running, o.per_gap, m.m0 FROM {GAP_OVERLAP} o
                       LEFT JOIN m ON m.b = round(o.running) WHERE o.over AND o.gap_ms > {thr!r})
            SELECT sum(greatest(0.0, gap_ms - m0)) / nullif(sum(gap_ms) FILTER (WHERE m0 IS NOT NULL), 0),
                   avg((m0 IS NOT NULL)::INT), count(running), avg(per_gap::INT)
            FROM s"""
    ).fetchone()
    if row is None or not row[2]:  # no running batch for the slow overlapping gaps: unknown
        return {"slow_gap_prefill_excess": None, "slow_gap_matched_share": None, "gap_running_per_gap": None}
    return {
        "slow_gap_prefill_excess": _r(row[0]), "slow_gap_matched_share": _r(row[1]),
        "gap_running_per_gap": bool(row[3] is not None and float(row[3]) >= 0.5),
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
    if long_at_normal_cost(out | {k: ev.get(k) for k in ("input_tokens_tail", "input_tokens_baseline")}):
        out.update(_interleaved(con, view, float(out["prompt_cap_tokens"])))  # only where it can decide
    out.update(_streams(con, view))
    out.update(_escalation(con, view))
    out["small_model_measured"] = bool(QL.speed_curve(ev.get("model") or {}, N.LEVER_CASCADE_SMALL_MODEL))
    return out


def long_at_normal_cost(ev: Evidence) -> bool:
    """The long-prompt evidence holds: most of the tail's prompts are over the baseline's quantile
    (LONG_PROMPT_SHARE), the tail's mean prompt LONG_PROMPT_RATIO times the baseline's, prefilled at
    most SAME_PREFILL_COST times the baseline's per-token cost. :func:`gather` measures the
    interleaving of those prompts only then (the cap-prompt-tokens rule needs both)."""
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
