"""Effect models of the workload levers (issue 18), stated with their limits; analysis.counterfactual
dispatches to :func:`prediction`, analysis.cost_levers to :func:`cost_effect`, analysis.plan to
:func:`setting`.

* ``separate-prefill-decode`` (inter-token gaps): on a decode pool no prompt shares a step, so a gap
  is what the gaps that overlapped no other request's prefill were: the predicted quantile is the SLO
  quantile of those gaps (analysis.workload_evidence.gap_overlaps). It assumes the decode pool keeps the
  running batch it has now (as many decode GPUs as today's engine) and leaves TTFT out: the KV-cache
  transfer from the prefill pool is paid before the first token, not between tokens.
* ``chunked-prefill`` (inter-token gaps, a prompt run whole in one step): a gap that overlapped another
  request's prefill carries one chunk of it instead: at most the median gap plus
  ``CHUNK_TOKENS`` prompt tokens at that prefill's own ms per token (its duration over its prompt).
* ``cap-prompt-tokens`` (TTFT, end to end): prompts are capped at the baseline's SLO quantile of
  prompt tokens (``prompt_cap_tokens``); a request over it loses the prefill time of the tokens beyond
  it, at the ms per prompt token fitted (least squares, weighted) of the prefill stage on the prompt
  tokens. Queueing behind prefills is held fixed.
* ``continuous-batching`` (TTFT, end to end): a request joins the running batch at the next decode
  step, so its batch wait is at most one step (``decode_step_ms``, the median time per output token);
  the steps keep their measured time (a larger running batch would make each a little slower).
* ``cascade-small-model`` (compute or decode): every request runs on the small model first, for the
  batch time the service measured for the small model (variant ``cascade-small-model`` of
  ``stagescope_model_variant_batch_seconds``) at the request's batch size, linear between the measured
  sizes: a different, smaller model's time is not a share of this request's time on the large one (a
  hard input the large model is slow on is not slow in proportion on the small one); an escalated
  request then pays its large-model time too. Which requests escalate: their own
  ``stagescope.escalated`` where they carry it, else the measured rate applied by a deterministic rank.
  Without the measured batch times or the escalation rate there is no effect model ("measure after
  applying"). Queue time is held fixed.
"""

from __future__ import annotations

import itertools
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.breakdown import with_columns
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.keys import has_columns, trace_ref
from stagescope.analysis.llm_levers import CHUNK_TOKENS
from stagescope.analysis.weighting import weighted_slope
from stagescope.analysis.workload_evidence import GAP_OVERLAP, gap_overlaps

__all__ = ["ADDS_TIME", "WORKLOAD_LEVERS", "cost_effect", "prediction", "setting"]

WORKLOAD_LEVERS: frozenset[str] = frozenset({
    N.LEVER_SEPARATE_PREFILL_DECODE, N.LEVER_CAP_PROMPT_TOKENS, N.LEVER_CONTINUOUS_BATCHING,
    N.LEVER_CASCADE_SMALL_MODEL,
})  # fmt: skip

#: Levers whose model can make a request slower (escalated requests pay both models): analysis.plan
#: keeps that added time when it composes them.
ADDS_TIME: frozenset[str] = frozenset({N.LEVER_CASCADE_SMALL_MODEL})

Prediction = tuple[Any, str]


def _d(x: float) -> str:
    """A float literal as a DOUBLE (a bare literal is a DECIMAL in DuckDB, whose products overflow)."""
    return f"CAST({float(x)!r} AS DOUBLE)"


def _gaps_src(view: SLIView) -> tuple[str, str | None]:
    """The overlap table with each gap's stream weight (``w``) where the view is weighted."""
    if view.weight is None:
        return GAP_OVERLAP, None
    return (f"(SELECT o.*, v.w FROM {GAP_OVERLAP} o JOIN (SELECT trace_id, any_value(w) AS w FROM {view.name} "
            "GROUP BY 1) v USING (trace_id))"), "w"  # fmt: skip


def _separate(con: duckdb.DuckDBPyConnection, view: SLIView) -> Prediction | None:
    if not gap_overlaps(con, view):
        return None
    src, w = _gaps_src(view)
    row = con.execute(f"SELECT count(*) FILTER (WHERE NOT over), count(*) FROM {GAP_OVERLAP}").fetchone()
    if not row or not row[0]:
        return (
            None,
            "no effect model: every gap overlapped a prefill, nothing to compare with; measure after applying",
        )
    # each stream's gaps stand for as many as it had: its clean gaps weighted by gaps / clean gaps, so
    # streams that decoded mostly beside prefills (when the running batch was larger) keep their weight
    base = "1.0" if w is None else "w"
    clean = f"""(SELECT *, {base} * n_all / n_clean AS wc FROM (
                  SELECT *, count(*) OVER (PARTITION BY trace_id) AS n_all,
                         count(*) FILTER (WHERE NOT over) OVER (PARTITION BY trace_id) AS n_clean FROM {src})
                WHERE NOT over)"""
    return _q(con, clean, "gap_ms", view.slo.quantile, weight="wc"), (
        f"decode steps without prompts: the p{view.slo.quantile * 100:g} of the {row[0]} of {row[1]} gaps that "
        "overlapped no other request's prefill, each stream's counted as often as it had gaps (the decode pool "
        "keeps today's running batch; the KV transfer is paid before the first token)"
    )


def _chunked(con: duckdb.DuckDBPyConnection, view: SLIView) -> Prediction | None:
    if not gap_overlaps(con, view):
        return None
    src, w = _gaps_src(view)
    row = con.execute(
        f"SELECT quantile_cont(gap_ms, 0.5) FILTER (WHERE NOT over) FROM {GAP_OVERLAP}"
    ).fetchone()
    if not row or row[0] is None:
        return None
    med = float(row[0])
    expr = (f"CASE WHEN over AND tokens > 0 THEN least(gap_ms, {_d(med)} + {CHUNK_TOKENS} * pf_ms / tokens) "
            "ELSE gap_ms END")  # fmt: skip
    return _q(con, src, expr, view.slo.quantile, weight=w), (
        f"a gap beside another request's prefill carries one {CHUNK_TOKENS}-token chunk of it: at most the "
        f"{med:.1f} ms median gap plus the chunk at that prefill's own ms per prompt token"
    )


def _prompt_cap(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str
) -> Prediction | None:
    cap = ev.get("prompt_cap_tokens")
    w = attr.weight or "1.0"
    src = with_columns(f"input_tokens AS tokens, {w} AS w")
    slope = weighted_slope(con, src, col, "tokens", attr.weight)
    row = con.execute(
        f"SELECT sum(w * {col}) / sum(w), sum(w * tokens) / sum(w) FROM {src} WHERE tokens > 0"
    ).fetchone()
    if cap is None or slope is None or slope <= 0 or not row or row[0] is None:
        return None
    b = float(slope)
    a = max(0.0, float(row[0]) - b * float(row[1]))
    # a request over the cap keeps its own speed: its prefill scaled by the fitted time at the cap over
    # the fitted time at its prompt
    scale = f"({_d(a)} + {_d(b)} * {_d(cap)}) / ({_d(a)} + {_d(b)} * tokens)"
    pred = _q(con, src, f"value_ms - CASE WHEN tokens > {_d(cap)} THEN {col} * (1 - {scale}) ELSE 0 END",
              view.slo.quantile, attr)  # fmt: skip
    return pred, (
        f"prompts capped at {float(cap):.0f} tokens (the baseline's p{view.slo.quantile * 100:g}); a longer one's "
        f"prefill scaled by the fitted prefill time ({a:.1f} ms + {b:.3f} ms per prompt token) at the cap over "
        "that at its own prompt"
    )


def _cascade(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str
) -> Prediction:
    curve = QL.speed_curve(ev.get("model") or {}, N.LEVER_CASCADE_SMALL_MODEL)
    rate = ev.get("escalation_rate")
    if not curve:
        return None, (
            f"no effect model: the service exported no measured batch time for the small model "
            f"({N.METRIC_MODEL_VARIANT_BATCH}, variant {N.LEVER_CASCADE_SMALL_MODEL}); measure after applying"
        )
    if rate is None:
        return None, (
            f"no effect model: the escalation rate is unknown (no request carries {N.ATTR_ESCALATED}); "
            "measure it (shadow the small model) or after applying"
        )
    own = "r.escalated" if has_columns(con, "requests", "escalated") else "NULL"
    src = f"""(SELECT b.*, coalesce(b.batch_size, 1) AS rows_n,
                      coalesce(e.esc, {Q.uniform_rank_sql("b.trace_ref")} < {_d(rate)}) AS esc FROM {BREAKDOWN} b
               LEFT JOIN (SELECT r.{trace_ref(con)} AS trace_ref, start_unix_ns, bool_or({own}) AS esc
                          FROM requests r WHERE {view.request_filter} GROUP BY ALL) e USING (trace_ref, start_unix_ns))"""
    small = _batch_ms_sql(curve, "rows_n")
    expr = f"value_ms - {col} + {small} + CASE WHEN esc THEN {col} ELSE 0 END"
    pts = ", ".join(f"{ms * r:.1f} ms at {rows} rows" for ms, r, rows in curve)
    return _q(con, src, expr, view.slo.quantile, attr), (
        f"every request first on the small model, at the batch time the service measured for it at the request's "
        f"batch size ({pts}; linear between), not a share of this request's own time on the large model; "
        f"{float(rate):.1%} of requests escalate (their own escalation where marked) and pay the large model's "
        "time too; queue held fixed"
    )


def _batch_ms_sql(curve: list[tuple[float, float, int]], rows: str) -> str:
    """SQL: the small model's measured batch ms at ``rows`` rows, linear between the measured sizes,
    the nearest one's beyond them."""
    pts = sorted((float(r), ms * ratio) for ms, ratio, r in curve)
    if len(pts) == 1:
        return _d(pts[0][1])
    parts = [f"WHEN {rows} <= {_d(pts[0][0])} THEN {_d(pts[0][1])}"]
    for (r0, m0), (r1, m1) in itertools.pairwise(pts):
        slope = (m1 - m0) / (r1 - r0)
        parts.append(f"WHEN {rows} <= {_d(r1)} THEN {_d(m0)} + {_d(slope)} * ({rows} - {_d(r0)})")
    return f"(CASE {' '.join(parts)} ELSE {_d(pts[-1][1])} END)"


def prediction(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    attr: Attribution,
    ev: dict[str, Any],
    lever: str,
    stage: str,
    col: str | None,
) -> Prediction | None:
    """``(predicted SLO quantile, model line)`` of a workload lever (and chunked prefill on inter-token
    gaps), or None where these models do not apply (the caller's generic model then does)."""
    if not view.per_request:
        if lever == N.LEVER_SEPARATE_PREFILL_DECODE:
            return _separate(con, view) or (None, "no effect model: no per-gap samples in the span's order")
        if lever == N.LEVER_CHUNKED_PREFILL:
            return _chunked(con, view)
        if lever in WORKLOAD_LEVERS:
            return None, "no effect model for inter-token gaps; measure after applying"
        return None
    if col is None:
        return None
    if lever == N.LEVER_CAP_PROMPT_TOKENS:
        return _prompt_cap(con, view, attr, ev, col)
    if lever == N.LEVER_CONTINUOUS_BATCHING:
        step = ev.get("decode_step_ms")
        if step is None:
            return (
                None,
                "no effect model: no time per output token to size one decode step; measure after applying",
            )
        return _q(con, with_columns("1 AS one"), f"value_ms - {col} + least({col}, {_d(step)})",
                  view.slo.quantile, attr), (
            f"a request joins the running batch at the next decode step: its batch wait at most one step "
            f"({float(step):.1f} ms, the median time per output token), the steps at their measured time"
        )  # fmt: skip
    if lever == N.LEVER_CASCADE_SMALL_MODEL:
        return _cascade(con, view, attr, ev, col)
    if lever == N.LEVER_SEPARATE_PREFILL_DECODE:
        return (
            None,
            "no effect model on a per-request SLI (it acts on inter-token gaps); measure after applying",
        )
    return None


def setting(ev: dict[str, Any], lever: str) -> str | None:
    """What the lever changes, for the plan's step (None: no setting)."""
    if lever == N.LEVER_CAP_PROMPT_TOKENS and ev.get("prompt_cap_tokens") is not None:
        return f"max prompt tokens -> {float(ev['prompt_cap_tokens']):.0f}"
    if lever == N.LEVER_CASCADE_SMALL_MODEL and ev.get("escalation_rate") is not None:
        return f"small model first, {float(ev['escalation_rate']):.1%} escalated"
    if lever == N.LEVER_CONTINUOUS_BATCHING:
        return "iteration-level batching"
    if lever == N.LEVER_SEPARATE_PREFILL_DECODE:
        return "a prefill pool beside the decode pool"
    return None


def _f(work: float | None, capacity: float | None, model: str, sign: str) -> dict[str, Any]:
    return {"work_factor": work, "capacity_factor": capacity, "model": model, "sign": sign}


def cost_effect(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution | None, ev: dict[str, Any], lever: str
) -> dict[str, Any]:
    """The lever's accelerator work and capacity factors (analysis.cost_levers.lever_effect's shape)."""
    if lever == N.LEVER_SEPARATE_PREFILL_DECODE:
        return _f(1.0, None, "a prefill pool beside the decode pool: more accelerators (sized by the prefill "
                  "load, which the trace does not give) for the same work, plus a KV transfer per request", "+")  # fmt: skip
    if lever == N.LEVER_CONTINUOUS_BATCHING:
        return _f(None, 1.0, "iteration-level batching keeps slots busy that a static batch pads: fewer "
                  "accelerator-seconds per request by an amount the trace does not give", "-")  # fmt: skip
    if lever == N.LEVER_CAP_PROMPT_TOKENS:
        cap = ev.get("prompt_cap_tokens")
        row = con.execute(
            f"SELECT sum(least(input_tokens, {_d(cap)})) / nullif(sum(input_tokens), 0) FROM requests "
            f"WHERE {view.request_filter} AND input_tokens > 0"
        ).fetchone() if cap is not None else None  # fmt: skip
        if not row or row[0] is None:
            return _f(None, 1.0, "fewer prompt tokens prefilled: no prompt tokens in the trace", "-")
        return _f(None, 1.0, f"prompt tokens prefilled x{float(row[0]):.2f} (capped at {float(cap):.0f}); their "  # type: ignore[arg-type]
                  "share of accelerator time is not in the trace", "-")  # fmt: skip
    curve = QL.speed_curve(ev.get("model") or {}, N.LEVER_CASCADE_SMALL_MODEL)
    rate = ev.get("escalation_rate")
    if not curve or rate is None:
        return _f(None, 1.0, "small model first, escalations pay both: the small model's time or the escalation "
                  "rate is not measured", "-")  # fmt: skip
    comp = (ev.get("stage_quantiles", {}).get(N.STAGE_COMPUTE) or {}).get("baseline_p50_ms")
    ratio, rows = QL.nearest_ratio(curve, comp)
    work = ratio + float(rate)
    return _f(work, 1.0, f"every request on the small model (x{ratio:.2f} the time, {rows} rows) and {float(rate):.1%} "
              f"on the large one too: x{work:.2f} accelerator time per request", "-" if work < 1 else "+")  # fmt: skip
