"""A live Prometheus -> ``metric_samples``: range queries over the incident window (HTTP API, httpx).

What is queried (names from :mod:`stagescope.names`): queue depth and in-flight gauges (stagescope,
vLLM waiting/running, Triton pending), accelerator utilization (dcgm-exporter, Triton), vLLM KV-cache
usage (and the engines' other evidence: preemptions, prefix-cache and speculative-decoding counters,
SGLang's gauges), the mean executed batch size (``rate(_sum)/rate(_count)`` of ``stagescope_batch_size``, stored
as ``stagescope_batch_size:mean``), and the raw cumulative counters the per-request breakdown helpers
of :mod:`~stagescope.analysis.ingest.counters` turn into rates (Triton queue/compute microseconds and
request counts, vLLM's and SGLang's stage-histogram ``_sum``/``_count``), and the ``_bucket`` series of the
request-latency histograms the analysis reads as a complete source (:data:`BUCKET_METRICS`, the families of
histogram_source.HISTOGRAMS, as from scrape files). Each series becomes rows with its labels
(``__name__`` dropped), ``ts_ms`` in Unix milliseconds and ``source`` the Prometheus URL.

Window: ``window`` (Unix ns) if given, else the span of the ingested requests, else the last hour. The
bucket series are read to the first step at or after its end, so that their counts span it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stagescope import names as N
from stagescope.analysis.histogram_source import HISTOGRAMS
from stagescope.analysis.ingest.prom import Sample, insert_samples
from stagescope.analysis.ingest.traces import FileSummary
from stagescope.errors import UserError
from stagescope.promql import sel

if TYPE_CHECKING:
    from stagescope.analysis.ingest import Dataset

__all__ = [
    "BATCH_SIZE_MEAN",
    "BUCKET_METRICS",
    "RAW_METRICS",
    "default_step_s",
    "ksm_pod_queries",
    "load_prometheus",
    "name_query",
    "query_range",
]

#: Gauges and cumulative counters read as they are.
RAW_METRICS: tuple[str, ...] = (
    N.METRIC_QUEUE_DEPTH,
    N.METRIC_INFLIGHT,
    N.VLLM_NUM_WAITING,
    N.VLLM_NUM_RUNNING,
    N.VLLM_KV_CACHE_USAGE,
    N.TRITON_PENDING,
    N.DCGM_GPU_UTIL,
    N.TRITON_GPU_UTILIZATION,
    N.TRITON_REQUEST_SUCCESS,
    N.TRITON_REQUEST_DURATION_US,
    N.TRITON_QUEUE_DURATION_US,
    N.TRITON_COMPUTE_INPUT_US,
    N.TRITON_COMPUTE_INFER_US,
    N.TRITON_COMPUTE_OUTPUT_US,
    *(
        f"{h}_{part}"
        for h in (
            N.VLLM_QUEUE_TIME,
            N.VLLM_PREFILL_TIME,
            N.VLLM_DECODE_TIME,
            N.VLLM_INFERENCE_TIME,
            N.VLLM_TTFT,
            N.VLLM_E2E,
            N.VLLM_ITERATION_TOKENS,
            N.SGLANG_PER_STAGE_LATENCY,
            N.SGLANG_QUEUE_TIME,
            N.SGLANG_TTFT,
            N.SGLANG_E2E,
        )
        for part in ("sum", "count")
    ),
    # the engines' evidence (analysis/ingest/engine_metrics.py): counters and gauges per series
    N.VLLM_GPU_CACHE_USAGE,
    N.VLLM_NUM_PREEMPTIONS,
    N.VLLM_PREFIX_CACHE_QUERIES,
    N.VLLM_PREFIX_CACHE_HITS,
    N.VLLM_GPU_PREFIX_CACHE_QUERIES,
    N.VLLM_GPU_PREFIX_CACHE_HITS,
    N.VLLM_SPEC_DRAFT_TOKENS,
    N.VLLM_SPEC_ACCEPTED_TOKENS,
    N.VLLM_CACHE_CONFIG_INFO,
    N.SGLANG_NUM_QUEUE_REQS,
    N.SGLANG_NUM_RUNNING_REQS,
    N.SGLANG_TOKEN_USAGE,
    N.SGLANG_CACHE_HIT_RATE,
    N.SGLANG_RETRACTED,
    N.SGLANG_SPEC_ACCEPT_RATE,
    N.SGLANG_PROMPT_TOKENS,
    N.SGLANG_CACHED_TOKENS,
    # deploys and scale events (analysis/events.py): kube-state-metrics deployment series (the pod
    # series: ksm_pod_queries)
    *(m for m in N.KSM_METRICS if m.startswith("kube_deployment_")),
)
BATCH_SIZE_MEAN = f"{N.METRIC_BATCH_SIZE}:mean"
#: The bucket series of every histogram read as a complete source (histogram_source.HISTOGRAMS), one
#: range query each, and stagescope's shed counter (its latency histogram's 4xx are then 429s, left out).
BUCKET_METRICS: tuple[str, ...] = (
    *dict.fromkeys(f"{family}_bucket" for families in HISTOGRAMS.values() for family, _, _ in families),
    N.METRIC_REQUESTS_SHED,
)


def ksm_pod_queries(span_s: float) -> list[str]:
    """kube-state-metrics' pod series for the pods that were Pending only (a cluster has thousands of
    pods; the events need those): ``kube_pod_status_phase{phase="Pending"}``, ``kube_pod_created`` and
    ``kube_pod_status_scheduled_time``, each ``and`` the pods whose Pending phase was 1 at some time in
    the ``span_s`` seconds before the step (set operators keep the metric name and labels)."""
    pending = f'{N.KSM_POD_PHASE}{{{N.KSM_LABEL_PHASE}="{N.KSM_PHASE_PENDING}"}}'
    was = f"on({N.KSM_LABEL_NAMESPACE}, {N.KSM_LABEL_POD}) (max_over_time({pending}[{max(1, math.ceil(span_s))}s]) > 0)"
    return [f"{m} and {was}" for m in (pending, N.KSM_POD_CREATED, N.KSM_POD_SCHEDULED_TIME)]


def name_query(metric: str) -> str:
    """The selector of ``metric`` under either spelling a Prometheus may have stored: vLLM's and
    SGLang's names have colons, which a scrape negotiated as OpenMetrics from prometheus_client 0.26
    escapes to underscores (``vllm_num_requests_waiting``); names without a colon as they are. The same
    selector the dashboards use (:func:`stagescope.promql.sel`)."""
    return sel(metric, any_spelling=True)


def default_step_s(start_s: float, end_s: float) -> float:
    """At most ~1,000 points per series, at least one per second."""
    return max(1.0, math.ceil((end_s - start_s) / 1000))


def query_range(
    url: str, query: str, start_s: float, end_s: float, step_s: float, *, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """``/api/v1/query_range`` -> the ``result`` list (matrix); raises UserError on any failure."""
    import httpx

    endpoint = url.rstrip("/") + "/api/v1/query_range"
    params = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
    try:
        resp = httpx.get(endpoint, params=params, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UserError(f"{url}: cannot query Prometheus ({type(exc).__name__}: {exc})") from None
    try:
        body = resp.json()
    except ValueError:
        raise UserError(f"{url}: HTTP {resp.status_code}, not a Prometheus API answer") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", f"HTTP {resp.status_code}") if isinstance(body, dict) else "bad answer"
        raise UserError(f"{url}: query {query!r} failed: {err}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise UserError(f"{url}: query {query!r}: expected a matrix result, got {data.get('resultType')!r}")
    return list(data["result"])


def _samples(result: list[dict[str, Any]], metric: str | None) -> list[Sample]:
    out: list[Sample] = []
    for series in result:
        labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
        name = metric or labels.get("__name__", "")
        labels.pop("__name__", None)
        for ts, raw in series.get("values") or []:
            v = float(raw)
            out.append((name, labels, None if math.isnan(v) else v, round(float(ts) * 1000)))
    return out


def _window_s(ds: Dataset, window: tuple[int, int] | None) -> tuple[float, float]:
    if window is not None:
        return window[0] / 1e9, window[1] / 1e9
    row = ds.con.execute(
        "SELECT min(start_unix_ns), max(start_unix_ns + CAST(duration_ms * 1e6 AS BIGINT)) FROM requests"
    ).fetchall()
    if row and row[0][0] is not None:
        return row[0][0] / 1e9, row[0][1] / 1e9
    now = time.time()
    return now - 3600, now


def load_prometheus(
    ds: Dataset,
    url: str,
    window: tuple[int, int] | None,
    *,
    step_s: float | None = None,
    metrics: Sequence[str] = RAW_METRICS,
    buckets: Sequence[str] = BUCKET_METRICS,
) -> int:
    """Range-query ``url`` and append to ``metric_samples``; returns the number of samples."""
    start, end = _window_s(ds, window)
    if end <= start:
        raise UserError(f"{url}: empty time window ({start} .. {end})")
    step = step_s or default_step_s(start, end)
    total = 0
    # the counters of a complete source must reach the end of the window: to the next step past it
    end_buckets = start + math.ceil((end - start) / step - 1e-9) * step
    for metric, until in (*((m, end) for m in metrics), *((m, end_buckets) for m in buckets)):
        name = metric if ":" in metric else None  # read back under the name the analysis knows
        got = query_range(url, name_query(metric), start, until, step)
        total += insert_samples(ds, _samples(got, name), url)
    for pods in ksm_pod_queries(end - start + step):
        total += insert_samples(ds, _samples(query_range(url, pods, start, end, step), None), url)
    w = "5m" if step < 300 else f"{int(step)}s"
    bs = (
        f"sum by (model) (rate({N.METRIC_BATCH_SIZE}_sum[{w}])) / "
        f"sum by (model) (rate({N.METRIC_BATCH_SIZE}_count[{w}]))"
    )
    total += insert_samples(ds, _samples(query_range(url, bs, start, end, step), BATCH_SIZE_MEAN), url)
    ds.files.append(FileSummary(url, "prometheus", samples=total))
    if total == 0:
        ds.warnings.append(
            f"{url}: no samples of the queried metrics between {start:.0f} and {end:.0f} (Unix s): no "
            "accelerator utilization, queue depth or server counters in the evidence"
        )
    return total
