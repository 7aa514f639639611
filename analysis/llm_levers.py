"""The LLM levers' effect models: inter-token gaps (decode) and time to first token (prefill).

* ``reduce-batch-tokens`` (inter-token): the running decode batch is capped where the fitted step
  time (gap = a + b * running, fitted to the median gap at each running batch size,
  attribution.step_fit; ``running`` = the gap's own running batch where the server counted it, else
  its stream's mean) reaches half the threshold; the predicted quantile is the fitted step at the cap
  plus the quantile of the gaps' scatter around the fit among the gaps that already ran at the cap or
  below (interference from prefills joining a step, stalls, which the cap does not remove); the cap
  is ``evidence.running_cap``; ``speculative-decoding``: gaps halved;
* ``reduce-batch-tokens`` (TTFT, end to end: a stage whose time grows with the batch a request ran
  in): the stage's time is fitted on the request's batch size (``batch_size``: tokens or sequences,
  as the engine counts its batch budget); the batch cap is halved from the largest batch seen (one
  step of ``max_num_batched_tokens`` / ``max_num_seqs``, at a little throughput) and each request
  over the cap loses the fitted time of the batch beyond it;
* ``chunked-prefill`` (TTFT): a long prompt's own prefill is unchanged, the others wait at most for
  the step in progress and their own step, each carrying one chunk (:data:`CHUNK_TOKENS`).

Gaps of sampled streams count ``w`` times (the SLI view's weights), breakdown rows by the
attribution's weights (analysis.weighting). analysis.counterfactual dispatches to these.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis import intervals as I
from stagescope.analysis.attribution import Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.breakdown import with_columns
from stagescope.analysis.interval_sql import breakdown_estimate as _q
from stagescope.analysis.weighting import weighted_quantile, weighted_quantile_sql, weighted_slope

__all__ = ["CHUNK_TOKENS", "batch_cap", "chunked_prefill", "gap_prediction"]

#: Prompt tokens per sequence per step assumed for chunked prefill (vLLM-style chunk budget).
CHUNK_TOKENS = 256


def gap_prediction(
    con: duckdb.DuckDBPyConnection, view: SLIView, ev: dict[str, Any], lever: str
) -> tuple[float | None, str]:
    q = view.slo.quantile
    w = view.weight
    # each gap's running decode batch: its own where the server counted it, else its stream's mean
    # (the view's batch_size, see breach.sli_view)
    src = f"(SELECT *, batch_size AS running FROM {view.name})"
    if lever == N.LEVER_SPECULATIVE_DECODING:
        return _q(
            con, view.name, "value_ms * 0.5", q, weight=w
        ), "decode gaps halved (speculative decoding, typical 2x)"
    # the step fit of the evidence (median gap per running batch size, attribution.step_fit), else a
    # least-squares fit over every gap
    slope_v, icpt_v = ev.get("batch_slope_ms"), ev.get("batch_intercept_ms")
    if slope_v is None or icpt_v is None:
        if w is None:
            row = con.execute(f"SELECT regr_slope(value_ms, running), regr_intercept(value_ms, running) FROM {src}").fetchone()
            slope_v, icpt_v = (None, None) if row is None else row
        else:
            slope_v = weighted_slope(con, src, "value_ms", "running", w)
            got = con.execute(
                f"""SELECT sum(w * value_ms) / sum(w), sum(w * running) / sum(w)
                    FROM {src} WHERE running IS NOT NULL AND value_ms IS NOT NULL"""
            ).fetchone()
            icpt_v = None if got is None or slope_v is None or got[0] is None else float(got[0]) - slope_v * float(got[1])
    if slope_v is not None and icpt_v is not None and float(slope_v) > 0:
        slope, icpt = float(slope_v), float(icpt_v)
        cap = max(1.0, float(int((view.slo.threshold_ms / 2.0 - icpt) / slope)))
        ev["running_cap"] = int(cap)  # the setting this prediction is for (the demo's lever check applies it)
        # scatter around the fit among the gaps that already ran at a batch no larger than the cap (else
        # the lowest decile of running batches): the interference (another stream's prompt in the step,
        # a stall) that remains once the batch is pinned at the cap; its quantile carries the
        # prediction's interval (the fit held fixed)
        res = None
        for cond in (f"running <= {cap!r}", f"running <= (SELECT quantile_cont(running, 0.1) FROM {src})"):
            low = f"(SELECT * FROM {src} WHERE {cond})"
            n = con.execute(f"SELECT count(*) FROM {low}").fetchone()
            res = _q(con, low, f"value_ms - ({icpt!r} + {slope!r} * running)", q, weight=w)
            if n is not None and n[0] and n[0] >= 1.0 / max(1e-9, 1.0 - q):
                break
        scatter = max(0.0, float(res)) if res is not None else 0.0
        before = _q(con, view.name, "value_ms", q, weight=w)
        step = icpt + slope * cap
        pred = step + scatter
        lo, hi = res.interval if res is not None else (None, None)
        ends = [None if x is None else step + max(0.0, x) for x in (lo, hi)]
        if before is not None and pred > before:  # capping never makes gaps slower than they were
            pred, ends = float(before), list(before.interval)
        return (
            I.estimate(pred, (ends[0], ends[1]), res.method if res is not None else I.METHOD_ORDER,
                       res.samples if res is not None else 0.0),
            f"running decode batch capped at {cap:.0f} streams, where the fitted step "
            f"({icpt:.1f} ms + {slope:.2f} ms per running stream) is half the threshold, plus the "
            f"{scatter:.1f} ms scatter of the gaps that already ran at {cap:.0f} streams or fewer",
        )
    base = _q(con, view.name, "value_ms", 0.5, weight=w)
    if base is None:
        return None, "no gaps"
    return _q(
        con, view.name, f"least(value_ms, {base * 1.5!r})", q, weight=w
    ), "slow gaps capped at 1.5x the median gap"


def chunked_prefill(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, col: str
) -> tuple[float | None, str] | None:
    """Chunked prefill: a prompt's own prefill is intrinsic (it is not made faster), but nobody waits
    behind a long prefill for more than the step in progress plus its own step, each of which now
    carries one chunk of the long prompt. Intrinsic prefill of a request = the p10 of
    the prefill stage among requests of similar prompt length (power-of-two buckets); the per-token
    cost is fitted across buckets; one step = the median inter-token gap plus one chunk's prefill."""
    # on a sampled breakdown (which over-represents the tail) every statistic is weighted by stratum
    w = attr.weight or "1.0"
    src = with_columns(f"input_tokens AS tokens, itl_mean_ms AS itl, {w} AS w")
    bucketed = f"(SELECT *, floor(log2(greatest(tokens, 1))) AS k FROM {src})"  # power-of-two buckets
    kq = f"(SELECT * FROM {bucketed} WHERE tokens IS NOT NULL)"
    intrinsic = (
        f"(SELECT g AS k, value AS intrinsic FROM ({weighted_quantile_sql(kq, col, 0.1, 'w', by='k')}))"
    )
    row = con.execute(
        f"""WITH t AS (SELECT k, sum(w * tokens) / sum(w) AS t FROM {kq} WHERE w > 0 GROUP BY k)
            SELECT regr_slope(i.intrinsic, t.t), count(*) FROM {intrinsic} i JOIN t USING (k)"""
    ).fetchone()
    if row is None or row[1] is None or row[1] < 2 or row[0] is None or row[0] <= 0:
        return None
    per_token, gap = float(row[0]), weighted_quantile(con, src, "itl", 0.5, "w") or 0.0
    step = gap + CHUNK_TOKENS * per_token
    pred = _q(
        con,
        f"{bucketed} LEFT JOIN {intrinsic} USING (k)",
        f"value_ms - {col} + least({col}, coalesce(intrinsic, {col}) + 2 * {step!r})",
        view.slo.quantile,
        attr,
    )
    return pred, (
        f"a prompt waits at most for the step in progress and its own step, each carrying one chunk "
        f"({step:.1f} ms: a {gap:.1f} ms decode step plus {CHUNK_TOKENS} prompt tokens at "
        f"{per_token:.3f} ms each); a long prompt's own prefill unchanged"
    )


def batch_cap(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, col: str, stage: str
) -> tuple[float | None, str, str] | None:
    """Per-request SLIs: the batch cap halved from the largest batch seen; a request in a batch over
    the cap loses ``slope * (batch - cap)`` of ``stage`` (the fitted ms per batch unit, never more
    than the stage's time). Returns (predicted quantile, model line, setting); None without a
    positive fit of the stage's time on the batch size."""
    w = attr.weight
    src = with_columns("batch_size AS batch")
    slope = weighted_slope(con, src, col, "batch", w)
    row = con.execute(f"SELECT max(batch) FROM {src} WHERE batch IS NOT NULL").fetchone()
    if slope is None or slope <= 0 or row is None or row[0] is None or float(row[0]) < 2:
        return None
    top = float(row[0])
    cap = float(max(1, int(top // 2)))
    pred = _q(
        con,
        src,
        f"value_ms - least({col}, {float(slope)!r} * greatest(coalesce(batch, 0) - {cap!r}, 0))",
        view.slo.quantile,
        attr,
    )
    return (
        pred,
        f"{stage} fitted at {float(slope):.3f} ms per unit of batch; batches capped at {cap:.0f} (half the "
        f"largest seen, {top:.0f}), each request over the cap losing the fitted time of the batch beyond it",
        f"max batch tokens {top:.0f} -> {cap:.0f}",
    )
