"""Per-request means from cumulative server counters in ``metric_samples``: Triton and vLLM.

Triton exports cumulative microsecond counters (``nv_inference_queue_duration_us``,
``..._compute_input/infer/output_duration_us``, ``..._request_duration_us``) and the request count
``nv_inference_request_success``. The mean time per request in a window is
``increase(counter) / increase(request_success)`` (``rate(queue_us) / rate(request_success)``); for a
single snapshot without timestamps it is the cumulative ratio since the server started. vLLM's stage
histograms give the same through ``_sum / _count`` (seconds).

Increases are computed per series (labels, source) ordered by ``ts_ms``, counting a counter reset as
a restart from zero (as PromQL's ``increase`` does). Results are in **milliseconds**.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

import duckdb

from stagescope import names as N

__all__ = ["increase", "triton_breakdown", "vllm_stage_means"]

_TRITON_PARTS = {
    "queue": N.TRITON_QUEUE_DURATION_US,
    "compute_input": N.TRITON_COMPUTE_INPUT_US,
    "compute_infer": N.TRITON_COMPUTE_INFER_US,
    "compute_output": N.TRITON_COMPUTE_OUTPUT_US,
    "request": N.TRITON_REQUEST_DURATION_US,
}
_VLLM_PARTS = {
    "queue": N.VLLM_QUEUE_TIME,
    "prefill": N.VLLM_PREFILL_TIME,
    "decode": N.VLLM_DECODE_TIME,
    "inference": N.VLLM_INFERENCE_TIME,
    "ttft": N.VLLM_TTFT,
    "e2e": N.VLLM_E2E,
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


def _series(
    con: duckdb.DuckDBPyConnection, metrics: list[str], keys: tuple[str, ...]
) -> dict[tuple[Any, ...], dict[str, float | None]]:
    """(source, *label values) -> metric -> increase."""
    rows = con.execute(
        "SELECT metric, source, [labels[k] for k in ?], ts_ms, value FROM metric_samples WHERE list_contains(?, metric)",
        [list(keys), metrics],
    ).fetchall()
    pts: dict[tuple[Any, ...], dict[str, list[tuple[int | None, float | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for metric, source, labels, ts, value in rows:
        pts[(source, *labels)][metric].append((ts, value))
    return {k: {m: increase(p) for m, p in by_metric.items()} for k, by_metric in pts.items()}


def _per_request(total: float | None, n: float | None, scale: float) -> float | None:
    if total is None or not n:
        return None
    return total / n * scale


def triton_breakdown(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per Triton model/version/source: requests in the window and mean ms per request of queue,
    compute_input, compute_infer, compute_output, the whole request, and the overhead (request minus
    the four parts); ``queue_share`` = queue / request."""
    metrics = [N.TRITON_REQUEST_SUCCESS, *_TRITON_PARTS.values()]
    out = []
    for (source, model, version), inc in sorted(_series(con, metrics, ("model", "version")).items(), key=str):
        n = inc.get(N.TRITON_REQUEST_SUCCESS)
        row: dict[str, Any] = {"model": model, "version": version, "source": source, "requests": n}
        for part, metric in _TRITON_PARTS.items():
            row[f"{part}_ms"] = _per_request(inc.get(metric), n, 1e-3)
        parts = [row[f"{p}_ms"] for p in ("queue", "compute_input", "compute_infer", "compute_output")]
        req = row["request_ms"]
        row["overhead_ms"] = req - sum(parts) if req is not None and None not in parts else None
        row["queue_share"] = row["queue_ms"] / req if req and row["queue_ms"] is not None else None
        out.append(row)
    return out


def vllm_stage_means(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per vLLM model/source: requests (queue-histogram count) and mean ms per request of queue,
    prefill, decode, inference, ttft and e2e (``_sum / _count`` increases)."""
    metrics = [f"{h}_{s}" for h in _VLLM_PARTS.values() for s in ("sum", "count")]
    out = []
    for (source, model), inc in sorted(_series(con, metrics, (N.VLLM_LABEL_MODEL,)).items(), key=str):
        row: dict[str, Any] = {
            "model": model,
            "source": source,
            "requests": inc.get(f"{N.VLLM_QUEUE_TIME}_count"),
        }
        for part, h in _VLLM_PARTS.items():
            row[f"{part}_ms"] = _per_request(inc.get(f"{h}_sum"), inc.get(f"{h}_count"), 1e3)
        out.append(row)
    return out
