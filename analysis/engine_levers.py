"""Effect models of the LLM-engine levers that need more than "the stage behaves like its baseline".

* ``cap-output-tokens``: a request may generate at most ``cap`` tokens, the SLO quantile of the
  baseline requests' output tokens (what a normal request of the route needs); a request over the cap
  keeps its time per token and loses the decode time of the tokens beyond it
  (``decode * (1 - (cap - 1) / (tokens - 1))``); the SLO quantile is recomputed over all samples.
  It assumes the capped requests would have stopped at the cap (a budget, not a truncation the
  client retries). With sampled traces the baseline's quantile counts each request ``1 / sampling_p``
  times, and the predicted quantile counts the breakdown rows by their weights (analysis.weighting).

The other engine levers (``more-api-servers``, ``kv-cache-headroom``) use the generic model of
:func:`stagescope.analysis.counterfactual.lever_prediction`: the stage's tail capped at its baseline
quantile; ``prefix-caching``'s model (repeated prompts prefill like cache hits) is in
:mod:`stagescope.analysis.fleet_levers`.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.keys import trace_ref
from stagescope.analysis.weighting import breakdown_quantile, weighted_quantile

__all__ = ["cap_output_tokens", "output_cap"]


def cap_output_tokens(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any], col: str
) -> tuple[float | None, str] | None:
    """Predicted SLO quantile (ms) with output tokens capped (see the module docstring), and the
    model's one line; None without output-token counts."""
    cap = output_cap(con, view, attr)
    if cap is None:
        return None
    q = view.slo.quantile
    src = f"""(SELECT b.*, r.output_tokens AS out_tokens FROM {BREAKDOWN} b LEFT JOIN
               (SELECT {trace_ref(con)} AS trace_ref, start_unix_ns, any_value(output_tokens) AS output_tokens
                FROM requests WHERE {view.request_filter} GROUP BY ALL) r USING (trace_ref, start_unix_ns))"""
    expr = f"value_ms - CASE WHEN out_tokens > {cap!r} THEN {col} * (1 - ({cap!r} - 1) / (out_tokens - 1.0)) ELSE 0 END"
    return (
        breakdown_quantile(con, src, expr, q, attr),
        f"output tokens capped at {cap:.0f} (the baseline's p{q * 100:g}), each request keeping its time per token",
    )


def output_cap(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution) -> float | None:
    """The output-token budget: the SLO quantile of the baseline requests' output tokens (at least
    2); None without output-token counts."""
    q = view.slo.quantile
    base = f"""(SELECT * FROM (
              SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, output_tokens, {view.request_weight(con)} AS w
              FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL AND output_tokens IS NOT NULL)
            WHERE {attr.baseline_condition})"""
    if view.sampled_traces:
        got = weighted_quantile(con, base, "output_tokens", q, "w")
    else:
        row = con.execute(f"SELECT quantile_cont(output_tokens, {q}) FROM {base}").fetchone()
        got = None if row is None or row[0] is None else float(row[0])
    return None if got is None else max(2.0, float(round(got)))
