"""Evidence about LLM engines (vLLM, SGLang) for the lever rules: what the tail's requests asked the
engine for, and what the engine's own metrics said while it served them.

Per-request facts (per-request SLIs, over every sample of the SLO, from ``requests``):

* ``output_tokens_tail`` / ``_baseline``: mean output tokens of tail and baseline requests;
* ``per_token_ms_tail`` / ``_baseline``: mean time per output token (``itl_mean_ms``: decode time
  over output tokens minus one), so that a tail of *long outputs* (more tokens at the same
  per-token time) is told from *slow steps* (the same tokens, each slower);
* ``input_tokens_tail`` / ``_baseline``: mean prompt tokens;
* ``prefill_includes_queue``: the requests are SGLang's without its stage slices, so their prefill
  holds the wait queue;
* ``repeated_hash_share_*`` from the load generator's results (prompts sent more than once) where
  the requests carry no input hash of their own (an engine's spans carry none).

Engine facts from ``metric_samples`` (:func:`~stagescope.analysis.ingest.engine_metrics.engine_metric_facts`:
preemptions, KV-cache use, waiting requests, prefix-cache hit ratio, tokens per step, speculative
decoding's acceptance, SGLang's per-stage latencies), and the waiting requests (``vllm:num_requests_waiting``
or ``sglang:num_queue_reqs``, summed over engines) as of each tail and baseline request's arrival,
where the scrapes have timestamps: ``waiting_tail`` / ``waiting_baseline``.

Sampled traces: every per-request mean and share here counts a request ``1 / sampling_p`` times
(``SLIView.request_weight``, as :mod:`~stagescope.analysis.evidence` does): an engine span's request
is weighted like any other. Where the requests carry
no queue depth of their own (``stagescope.queue_depth``), those also stand for ``queue_depth_*``
(``queue_depth_source`` names the gauge), so a report never says "queue depth n/a" with the waiting
gauge scraped.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.attribution import Attribution
from stagescope.analysis.breach import SLIView, sql_str
from stagescope.analysis.ingest.engine_metrics import engine_metric_facts
from stagescope.analysis.weighting import mean_sql

__all__ = ["gather"]

_WAITING = (N.VLLM_NUM_WAITING, N.SGLANG_NUM_QUEUE_REQS)


def _r(x: Any, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def _request_facts(con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution) -> dict[str, Any]:
    tail, base = attr.tail_condition, attr.baseline_condition
    cols = {
        "output_tokens": "output_tokens", "per_token_ms": "itl_mean_ms", "input_tokens": "input_tokens",
    }  # fmt: skip
    w = "w" if view.sampled_traces else None
    sel = ", ".join(f"{mean_sql(c, tail, w)}, {mean_sql(c, base, w)}" for c in cols.values())
    row = con.execute(
        f"""SELECT {sel} FROM (SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, output_tokens, itl_mean_ms,
                                     input_tokens, {view.request_weight(con)} AS w FROM requests
                              WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL)"""
    ).fetchone()
    out: dict[str, Any] = {}
    for i, k in enumerate(cols):
        out[f"{k}_tail"], out[f"{k}_baseline"] = (
            _r(row[2 * i]) if row else None,
            _r(row[2 * i + 1]) if row else None,
        )
    return out


def _client_repeats(con: duckdb.DuckDBPyConnection, view: SLIView, cond: str) -> float | None:
    """Share of the requests in ``cond`` whose prompt the load generator sent more than once (its
    ``client_results.input_hash``, matched by trace id): engines' spans carry no input hash."""
    try:
        row = con.execute(
            f"""WITH c AS (SELECT trace_id, input_hash FROM client_results WHERE input_hash IS NOT NULL),
                     n AS (SELECT input_hash, count(*) AS k FROM c GROUP BY 1),
                     r AS (SELECT trace_id, w FROM (SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, trace_id,
                                                    {view.request_weight(con)} AS w
                           FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL) WHERE {cond})
                SELECT sum(r.w * (n.k >= 2)::INT) / nullif(sum(r.w), 0)
                FROM r JOIN c USING (trace_id) JOIN n USING (input_hash)"""
        ).fetchone()
    except duckdb.Error:  # client_results without those columns (built by hand)
        return None
    return _r(row[0]) if row else None


def _prefill_includes_queue(con: duckdb.DuckDBPyConnection, view: SLIView) -> bool:
    """Most of the SLO's requests are SGLang's and none has a queue stage: their prefill is SGLang's
    ``time_in_model_prefill``, which runs from the dispatch to the scheduler and so holds the wait
    queue (req_time_stats.py @ 00ce49e0, ``convert_to_gen_ai_span_attrs``)."""
    row = con.execute(
        f"""SELECT count(*) FILTER (WHERE source = {sql_str(N.SOURCE_SGLANG)}), count(*),
                   count(*) FILTER (WHERE source = {sql_str(N.SOURCE_SGLANG)} AND trace_id IN
                                    (SELECT trace_id FROM stages WHERE stage = {sql_str(N.STAGE_QUEUE)}))
            FROM requests WHERE {view.request_filter}"""
    ).fetchone()
    return bool(row and row[1] and row[0] > 0.5 * row[1] and row[2] == 0)


def _waiting_asof(
    con: duckdb.DuckDBPyConnection, view: SLIView, cond: str
) -> tuple[float | None, str | None]:
    for metric in _WAITING:
        mine = (
            ""
            if view.slo.model is None
            else f" AND labels[{sql_str(N.VLLM_LABEL_MODEL)}] = {sql_str(view.slo.model)}"
        )  # the SLO's model's engines only: another model's queue is not in front of its requests
        gauge = (
            f"SELECT ts_ms, sum(value) AS value FROM metric_samples WHERE metric = {sql_str(metric)} "
            f"AND ts_ms IS NOT NULL AND value IS NOT NULL{mine} GROUP BY ts_ms"
        )
        if not con.execute(f"SELECT count(*) FROM ({gauge})").fetchall()[0][0]:
            continue
        keys = (
            f"SELECT start_unix_ns, w FROM (SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms, start_unix_ns, "
            f"{view.request_weight(con)} AS w "
            f"FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL) WHERE {cond}"
        )
        row = con.execute(
            f"SELECT sum(k.w * m.value) / nullif(sum(k.w), 0) FROM ({keys}) k ASOF JOIN ({gauge}) m "
            "ON k.start_unix_ns // 1000000 >= m.ts_ms"
        ).fetchone()
        return (_r(row[0]) if row else None), metric
    return None, None


def gather(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution, ev: dict[str, Any]
) -> dict[str, Any]:
    """The engine evidence of one analysed SLO (see the module docstring), to merge into ``ev`` (the
    evidence gathered so far, whose ``queue_depth_*`` are filled from the waiting gauge where empty)."""
    out: dict[str, Any] = {}
    if view.per_request:
        out.update(_request_facts(con, view, attr))
        out["prefill_includes_queue"] = _prefill_includes_queue(con, view)
        if ev.get("repeated_hash_share_tail") is None:
            shared = _client_repeats(con, view, attr.tail_condition)
            if shared is not None:
                out["repeated_hash_share_tail"] = shared
                out["repeated_hash_share_baseline"] = _client_repeats(con, view, attr.baseline_condition)
    facts = engine_metric_facts(con, view.slo.model)
    out.update({k: (_r(v, 4) if isinstance(v, float) else v) for k, v in facts.items()})
    if view.per_request:
        t, metric = _waiting_asof(con, view, attr.tail_condition)
        b, _ = _waiting_asof(con, view, attr.baseline_condition)
        if metric is not None:
            out["waiting_tail"], out["waiting_baseline"] = t, b
            if ev.get("queue_depth_tail") is None and ev.get("queue_depth_baseline") is None:
                out["queue_depth_tail"], out["queue_depth_baseline"] = t, b
                series = facts.get("engine_series") or 1
                out["queue_depth_source"] = f"{metric} as of each request" + (
                    f", summed over {series} engine series" if series > 1 else ""
                )
    return out
