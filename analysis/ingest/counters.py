"""Per-request means from cumulative server counters in ``metric_samples``: Triton and vLLM.

Triton exports cumulative microsecond counters (``nv_inference_queue_duration_us``,
``..._compute_input/infer/output_duration_us``, ``..._request_duration_us``) and the request count
``nv_inference_request_success``. The mean time per request in a window is
``increase(counter) / increase(request_success)`` (``rate(queue_us) / rate(request_success)``); for a
single snapshot without timestamps it is the cumulative ratio since the server started. With the
response cache on, a cache hit counts in ``request_success`` and in the request and queue durations
but never reaches the backend, so the compute counters hold only the executed requests
(triton-inference-server/core src/infer_stats.cc, ``UpdateSuccessCacheHit`` against
``UpdateSuccessWithDuration``; server docs/user_guide/metrics.md "Response Cache Metrics"): compute
per request is divided by ``request_success - nv_cache_num_hits_per_model``. The first-response
histogram ``nv_inference_first_response_histogram_ms`` gives the mean time to first response
(its observations are whole milliseconds, rounded down: core src/infer_response.cc
``UpdateResponseMetrics``). vLLM's stage histograms give the same through ``_sum / _count`` (seconds),
summed over its engines and instances: :func:`~stagescope.analysis.ingest.engine_metrics.vllm_stage_means`
(re-exported here).

Increases are those of :func:`~stagescope.analysis.ingest.engine_metrics.increases`: a series is a
metric and its whole label set, whichever files its samples came from (a directory of timestamped
scrape files is one time series; an untimestamped ``before`` and ``after`` snapshot give their
difference), a counter reset counts as a restart from zero (as PromQL's ``increase`` does), and a
model's figure is the sum over its series (instances, pods, failure ``reason``s). Batch size per
execution is ``increase(nv_inference_count) / increase(nv_inference_exec_count)`` (server
docs/user_guide/metrics.md "Count": inferences over executions; a request of batch 8 is 8
inferences). Results are in **milliseconds**.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.ingest.engine_metrics import increases, vllm_stage_means

__all__ = ["increase", "trace_coverage", "triton_breakdown", "vllm_stage_means"]

_TRITON_PARTS = {
    "queue": N.TRITON_QUEUE_DURATION_US,
    "compute_input": N.TRITON_COMPUTE_INPUT_US,
    "compute_infer": N.TRITON_COMPUTE_INFER_US,
    "compute_output": N.TRITON_COMPUTE_OUTPUT_US,
    "request": N.TRITON_REQUEST_DURATION_US,
}


def increase(points: list[tuple[int | None, float | None]]) -> float | None:
    """A counter's increase over its points ``(ts_ms, value)`` (a reset counts as a restart from zero,
    as PromQL's ``increase`` does); for a snapshot without timestamps, its value."""
    vals = [(t, v) for t, v in points if v is not None]
    if not vals:
        return None
    timed = sorted((t, v) for t, v in vals if t is not None)
    if len(timed) < 2:
        return max(v for _, v in vals)  # a snapshot: cumulative since start
    inc = 0.0
    for (_, a), (_, b) in pairwise(timed):
        inc += b - a if b >= a else b
    return inc


def _sources(src: list[str]) -> str:
    """Where a model's figures came from: its file (or Prometheus), or the first and last of many."""
    src = sorted(src)
    return src[0] if len(src) == 1 else f"{len(src)} sources, {src[0]} .. {src[-1]}"


def _per_request(total: float | None, n: float | None, scale: float) -> float | None:
    if total is None or not n:
        return None
    return total / n * scale


def triton_breakdown(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per Triton model/version (summed over its series and files): requests in the window and mean
    ms per request of queue, compute_input, compute_infer, compute_output, the whole request, and the
    overhead (request minus the four parts); ``queue_share`` = queue / request; ``failures``;
    ``executions`` and ``batch_size`` (inferences per execution). The compute parts are per *executed*
    request (``executed``: requests minus response-cache hits); with the cache on also ``cache_hits``,
    ``cache_hit_ratio`` and ``cache_hit_ms`` (mean lookup time of a hit); with the first-response
    histogram ``first_response_ms`` (mean, whole-millisecond observations) and ``first_responses``.
    ``source``: the files (or Prometheus) the figures came from."""
    first = N.TRITON_FIRST_RESPONSE_MS
    metrics = [N.TRITON_REQUEST_SUCCESS, N.TRITON_REQUEST_FAILURE, N.TRITON_INFERENCE_COUNT, N.TRITON_EXEC_COUNT,
               N.TRITON_CACHE_HITS, N.TRITON_CACHE_HIT_US, f"{first}_sum", f"{first}_count",
               *_TRITON_PARTS.values()]  # fmt: skip
    keys = (N.TRITON_LABEL_MODEL, N.TRITON_LABEL_VERSION)
    sources: dict[tuple[Any, ...], str] = {
        (m, v): _sources(src)
        for m, v, src in con.execute(
            "SELECT labels[?], labels[?], list(DISTINCT source) FROM metric_samples WHERE list_contains(?, metric) "
            "GROUP BY 1, 2",
            [*keys, metrics],
        ).fetchall()
    }
    out = []
    for (model, version), inc in sorted(increases(con, metrics, keys).items(), key=str):
        if model is None:
            continue  # not a per-model family (no model label)
        n = inc.get(N.TRITON_REQUEST_SUCCESS)
        hits = inc.get(N.TRITON_CACHE_HITS)
        executed = None if n is None else n - (hits or 0.0)
        row: dict[str, Any] = {"model": model, "version": version, "source": sources.get((model, version)),
                               "requests": n, "executed": executed}  # fmt: skip
        for part, metric in _TRITON_PARTS.items():
            denom = executed if part.startswith("compute_") else n
            row[f"{part}_ms"] = _per_request(inc.get(metric), denom, 1e-3)
        totals = [inc.get(m) for m in _TRITON_PARTS.values()]
        known = [t for t in totals if t is not None]
        row["overhead_ms"] = (known[4] - sum(known[:4])) / n * 1e-3 if n and len(known) == 5 else None
        req = row["request_ms"]
        row["queue_share"] = row["queue_ms"] / req if req and row["queue_ms"] is not None else None
        row["failures"] = inc.get(N.TRITON_REQUEST_FAILURE)
        execs, infers = inc.get(N.TRITON_EXEC_COUNT), inc.get(N.TRITON_INFERENCE_COUNT)
        row["executions"] = execs
        row["batch_size"] = _per_request(infers, execs, 1.0)
        if hits is not None:
            row["cache_hits"] = hits
            row["cache_hit_ratio"] = hits / n if n else None
            row["cache_hit_ms"] = _per_request(inc.get(N.TRITON_CACHE_HIT_US), hits, 1e-3)
        if inc.get(f"{first}_count"):
            row["first_responses"] = inc[f"{first}_count"]
            row["first_response_ms"] = _per_request(inc.get(f"{first}_sum"), inc[f"{first}_count"], 1.0)
        out.append(row)
    return out


#: Share of the counted requests the traces must hold before rates read from traces are trusted.
COVERAGE = 0.9


def trace_coverage(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> list[str]:
    """Add ``traced_requests`` (Triton requests of that model in ``requests``) to Triton counter rows
    and say where the traces hold much fewer requests than the counters count: Triton traces every
    N-th request (``--trace-config rate=N``, 1,000 by default), so rates read from the traces (the
    scale-out model's arrival rate) are N times too low; per-request means are not affected."""
    try:
        traced = dict(
            con.execute(
                f"SELECT model, count(*) FROM requests WHERE name = '{N.TRITON_SPAN_ROOT}' GROUP BY model"
            ).fetchall()
        )
    except duckdb.Error:
        return []
    out = []
    for r in rows:
        got = traced.get(r["model"])
        r["traced_requests"] = got
        n = r.get("requests")
        if got and n and got < COVERAGE * n:
            out.append(
                f"Triton {r['model']}: the traces hold {got:,} of the {n:,.0f} requests its counters count "
                f"({got / n:.0%}: Triton's trace rate, or traces covering less time than the counters); rates "
                f"read from the traces, such as the scale-out model's arrivals, are {n / got:.1f}x too low"
            )
    return out
