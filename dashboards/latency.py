"""Dashboard 1, "Inference latency: where the time goes".

Request rate and errors; p50/p95/p99 against the SLO threshold, with exemplars linking slow points
to traces; per-stage p99 and per-stage time per request stacked, so queue, batch wait and GPU
compute sit side by side; a heatmap of queue wait; queue depth and requests in flight; batch size;
shed (429) rate.

Stage panels list no stage names: they read every stage the ``$stage`` variable selects (label
values of the stage histogram, so a team's own ``rerank`` or ``retrieve`` appears by itself), and
the waiting-vs-working panels select stages by their ``kind`` label (queue, batch_wait, compute),
so a team's own stage of one of those kinds lands beside the batcher's.
"""

from __future__ import annotations

from typing import Any

from stagescope import names
from stagescope.dashboards import defaults as d
from stagescope.dashboards import panels as p
from stagescope.dashboards.common import job_model_variables, slo_threshold, stage_scope, stage_variable
from stagescope.promql import eq, histogram_quantile, rate, rx, sel, sum_by

__all__ = ["dashboard"]

REQ = names.METRIC_REQUEST_DURATION
STAGE = names.METRIC_STAGE_DURATION
#: The kinds of stage the waiting-vs-working panel sets side by side.
WAIT_VS_WORK = (names.KIND_QUEUE, names.KIND_BATCH_WAIT, names.KIND_COMPUTE)
BY_STAGE = (names.LABEL_STAGE, names.LABEL_KIND)


def _traffic() -> list[Any]:
    count = sel(REQ, d.scope(), "_count")
    errors = sel(REQ, d.scope(rx(names.LABEL_STATUS_CLASS, "5xx")), "_count")
    shed = sel(names.METRIC_REQUESTS_SHED, d.scope())
    return [
        p.timeseries(
            "Requests per second by route and status",
            "Server-side request rate (requests/s), from the count of the request-duration histogram.",
            [p.target(sum_by(rate(count, d.RATE), (names.LABEL_ROUTE, names.LABEL_STATUS_CLASS)),
                      "{{route}} {{status_class}}")],
            "reqps",
        ),
        p.timeseries(
            "Error ratio (5xx share)",
            "Share of requests answered 5xx. 0 when no 5xx was ever counted.",
            [p.target(f"({sum_by(rate(errors, d.RATE))} or vector(0))\n/\n{sum_by(rate(count, d.RATE))}",
                      "5xx share")],
            "percentunit",
        ),
        p.timeseries(
            "Shed requests (429) per second",
            "Requests refused with 429 + Retry-After because the batcher queue was full "
            "(stagescope counts every 429 the middleware sees). No series until the first shed.",
            [p.target(sum_by(rate(shed, d.RATE), (names.LABEL_ROUTE,)), "{{route}}")],
            "reqps",
        ),
    ]  # fmt: skip


def _latency() -> list[Any]:
    quantiles = [
        p.target(histogram_quantile(q, REQ, d.scope(), d.RATE, (names.LABEL_ROUTE,)), f"p{q * 100:g} {{{{route}}}}",
                 exemplar=q == 0.99)
        for q in (0.5, 0.95, 0.99)
    ]  # fmt: skip
    buckets = sel(REQ, d.scope(), "_bucket")
    return [
        p.timeseries(
            "Request latency p50 / p95 / p99 against the SLO threshold",
            "Server e2e latency (arrival to last byte written), seconds, from the request-duration "
            "histogram; dashed: the e2e SLO thresholds of `alerts/slo.yaml` (recording rule). Dots on p99 "
            "are exemplars: click one to open that request's trace (Grafana's Prometheus datasource needs "
            "exemplarTraceIdDestinations trace_id -> Tempo).",
            [*quantiles, slo_threshold(names.SLI_E2E)],
            "s",
            dashed=["SLO threshold.*"],
        ),
        p.heatmap(
            "Request latency distribution (with exemplars)",
            "Requests per second in each latency bucket; exemplars (trace links) drawn on top.",
            p.target(sum_by(rate(buckets, d.RATE), ("le",)), exemplar=True),
            "s",
        ),
    ]


def _stages() -> list[Any]:
    stage_sum = sel(STAGE, stage_scope(), "_sum")
    requests = sum_by(rate(sel(REQ, d.scope(), "_count"), d.RATE))
    mean_req = f"{sum_by(rate(sel(REQ, d.scope(), '_sum'), d.RATE))}\n/\n{requests}"
    return [
        p.timeseries(
            "Per-stage p99",
            f"99th percentile of each stage interval, seconds ({names.METRIC_STAGE_DURATION}), for the "
            "stages $stage selects, each with its kind. Waiting stages: batch_wait (enqueue -> batch closed), "
            "queue (batch closed -> executor start), cold_start; working stages: compute (GPU execution), "
            "preprocess, a team's own stages (kind in brackets) ... p99s do not add up.",
            [p.target(histogram_quantile(0.99, STAGE, stage_scope(), d.RATE, BY_STAGE), "{{stage}} [{{kind}}]",
                      exemplar=True)],
            "s",
        ),
        p.timeseries(
            "Time per request by stage (stacked = mean request time)",
            "Seconds each stage adds to the average request: sum of stage time / number of requests. "
            "With every stage selected ($stage = All) the stack adds up to the mean server latency (dashed) "
            "minus time in no stage.",
            [
                p.target(f"{sum_by(rate(stage_sum, d.RATE), BY_STAGE)}\n/ ignoring ({', '.join(BY_STAGE)}) "
                         f"group_left ()\n{requests}", "{{stage}} [{{kind}}]"),
                p.target(mean_req, "mean request latency"),
            ],
            "s",
            stack=True,
            dashed=["mean request latency"],
        ),
    ]  # fmt: skip


def _waiting_vs_working() -> list[Any]:
    side = stage_scope(rx(names.LABEL_KIND, "|".join(WAIT_VS_WORK)))
    queue_buckets = sel(STAGE, stage_scope(eq(names.LABEL_KIND, names.KIND_QUEUE)), "_bucket")
    return [
        p.timeseries(
            "Queue vs batch wait vs GPU compute (p50 and p99)",
            "Every stage of kind queue, batch_wait or compute side by side (the batcher's three, and a "
            "team's own of those kinds), seconds. Queue long while compute is flat: not enough executors "
            "(scale out). Batch wait long: the batcher holds requests for a fuller batch (cap the wait). "
            "Compute long: the model or the accelerator got slower.",
            [p.target(histogram_quantile(q, STAGE, side, d.RATE, BY_STAGE), f"{{{{stage}}}} [{{{{kind}}}}] p{q * 100:g}")
             for q in (0.5, 0.99)],
            "s",
        ),
        p.heatmap(
            "Queue wait heatmap",
            "Distribution of the queue-kind stages (for the batcher: batch closed -> executor starts), "
            "requests/s per bucket.",
            p.target(sum_by(rate(queue_buckets, d.RATE), ("le",)), exemplar=True),
            "s",
        ),
    ]  # fmt: skip


def _load() -> list[Any]:
    batch = names.METRIC_BATCH_SIZE
    busy = sel(names.METRIC_EXECUTOR_BUSY, d.scope())
    return [
        p.timeseries(
            "Queue depth and requests in flight",
            "Requests waiting in the batcher (batch wait + queue) and requests being served. The series "
            "autoscalers use is the recording rule job_model:stagescope_queue_depth:avg1m.",
            [
                p.target(sum_by(sel(names.METRIC_QUEUE_DEPTH, d.scope()), (names.LABEL_MODEL,)), "waiting {{model}}"),
                p.target(sum_by(sel(names.METRIC_INFLIGHT, d.scope(model=False))), "in flight"),
            ],
            "short",
        ),
        p.timeseries(
            "Batch size",
            f"Items per executed batch: p50, p99 and mean ({names.METRIC_BATCH_SIZE}).",
            [
                p.target(histogram_quantile(0.5, batch, d.scope(), d.RATE), "p50"),
                p.target(histogram_quantile(0.99, batch, d.scope(), d.RATE), "p99"),
                p.target(f"{sum_by(rate(sel(batch, d.scope(), '_sum'), d.RATE))}\n/\n"
                         f"{sum_by(rate(sel(batch, d.scope(), '_count'), d.RATE))}", "mean"),
            ],
            "short",
        ),
        p.timeseries(
            "Busy executors",
            "Executor-seconds spent running batches per second: 1.0 = one executor busy all the time. "
            "Compare with the executor count: at the limit, requests queue.",
            [p.target(sum_by(rate(busy, d.RATE), (names.LABEL_MODEL,)), "{{model}}")],
            "short",
        ),
    ]  # fmt: skip


def _lifecycle() -> list[Any]:
    loads = sel(names.METRIC_MODEL_LOADS, d.scope())
    exported = sel(names.METRIC_SPANS_EXPORTED, d.scope(model=False))
    dropped = sel(names.METRIC_SPANS_DROPPED, d.scope(model=False))
    return [
        p.timeseries(
            "Model readiness and (re)loads",
            f"{names.METRIC_MODEL_READY} (1 = loaded and serving) and model loads in the window: a load on live "
            "traffic shows up as the cold_start stage.",
            [p.target(f"max by (model) ({sel(names.METRIC_MODEL_READY, d.scope())})", "ready {{model}}"),
             p.target(sum_by(rate(loads, d.RATE, "increase"), (names.LABEL_MODEL,)), "loads {{model}}")],
            "short",
        ),
        p.timeseries(
            "Telemetry: spans exported and dropped per second",
            "Spans handed to the exporter, and spans dropped (exporter down, buffer full) by reason. "
            "Telemetry never blocks a request: what it cannot send is dropped and counted here. "
            "No dropped series until the first drop.",
            [p.target(sum_by(rate(exported, d.RATE), (names.LABEL_EXPORTER,)), "exported {{exporter}}"),
             p.target(sum_by(rate(dropped, d.RATE), (names.LABEL_EXPORTER, names.LABEL_REASON)),
                      "dropped {{exporter}} {{reason}}")],
            "short",
        ),
    ]  # fmt: skip


def dashboard() -> Any:
    """The "where the time goes" dashboard (uid ``stagescope-latency``)."""
    panels = p.layout(
        [
            ("Traffic", [_traffic()]),
            ("Latency", [_latency()]),
            ("Where the time goes", [_stages(), _waiting_vs_working()]),
            ("Load and batching", [_load()]),
            ("Model and telemetry", [_lifecycle()]),
        ]
    )
    return p.dashboard(
        "latency",
        "stagescope / Inference latency: where the time goes",
        "Request latency against the SLO, and which stage (queue, batch wait, GPU compute, ...) holds it.",
        panels,
        [*job_model_variables(), stage_variable()],
    )
