"""Dashboard 3, "GPU": dcgm-exporter's names (utilization, memory, power, SM clock, temperature, XID
errors), accelerator utilization beside queue depth, and Triton's queue-vs-compute counters.

Utilization beside queue depth tells two incidents apart: a saturated accelerator (utilization near
100%, queue growing) needs more capacity; an accelerator at 35% with high latency is starved (long
batch wait, a CPU stage in front of it, or too few executors feeding it), and more GPUs will not help.
On a machine without a GPU the reference service exports the same dcgm names for its simulated
accelerator (``modelName="simulated-accelerator"``); the legend shows ``modelName``.
"""

from __future__ import annotations

from typing import Any

from stagescope import names
from stagescope.dashboards import defaults as d
from stagescope.dashboards import panels as p
from stagescope.dashboards.common import job_model_variables
from stagescope.promql import Matcher, rate, rx, sel, sum_by

__all__ = ["dashboard"]

GPU_SCOPE: tuple[Matcher, ...] = (rx("instance", "$instance"), rx(names.LABEL_GPU, "$gpu"))
TRITON_SCOPE: tuple[Matcher, ...] = (rx("model", "$triton_model"),)
GPU_LEGEND = "{{modelName}} gpu {{gpu}} {{instance}}"


def _gauge(metric: str) -> p.PromTarget:
    return p.target(sel(metric, GPU_SCOPE), GPU_LEGEND)


def _dcgm() -> list[list[Any]]:
    return [
        [
            p.timeseries("GPU utilization", f"{names.DCGM_GPU_UTIL}: percent of time a kernel ran (0-100).",
                         [_gauge(names.DCGM_GPU_UTIL)], "percent"),
            p.timeseries("Framebuffer memory used / free", f"{names.DCGM_FB_USED} and {names.DCGM_FB_FREE}, MiB.",
                         [p.target(sel(names.DCGM_FB_USED, GPU_SCOPE), "used " + GPU_LEGEND),
                          p.target(sel(names.DCGM_FB_FREE, GPU_SCOPE), "free " + GPU_LEGEND)], "decmbytes"),
            p.timeseries("Power", f"{names.DCGM_POWER_USAGE}, watts.", [_gauge(names.DCGM_POWER_USAGE)], "watt"),
        ],
        [
            p.timeseries("SM clock", f"{names.DCGM_SM_CLOCK}, MHz (drops under thermal or power throttling).",
                         [_gauge(names.DCGM_SM_CLOCK)], "rotmhz"),
            p.timeseries("Temperature", f"{names.DCGM_GPU_TEMP}, degrees Celsius.", [_gauge(names.DCGM_GPU_TEMP)],
                         "celsius"),
            p.timeseries("XID errors (last XID code)", f"{names.DCGM_XID_ERRORS}: the code of the last XID error "
                         "(0 = none). Any non-zero value is worth a look (NVIDIA's XID catalogue).",
                         [_gauge(names.DCGM_XID_ERRORS)], "none"),
            _clock_events(),
        ],
    ]  # fmt: skip


#: Bits of the clock-event reasons bitmask worth a panel (dcgm-exporter internal/pkg/collector/
#: clock_events_collector.go, DCGM_CLOCKS_THROTTLE_REASON_*): the ones that slow a loaded GPU down.
CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = (
    (0x4, "power cap"), (0x8, "hw slowdown"), (0x20, "sw thermal"), (0x40, "hw thermal"), (0x80, "power brake"),
)  # fmt: skip


def _clock_events() -> Any:
    """Which reasons hold the clocks down, one 0/1 series per bit (PromQL has no bitwise operators:
    bit k of x is floor(x / k) % 2). dcgm-exporter HEAD's field name, else the one before DCGM 3.3."""
    mask = f"({sel(names.DCGM_CLOCKS_EVENT_REASONS, GPU_SCOPE)} or {sel(names.DCGM_CLOCK_THROTTLE_REASONS, GPU_SCOPE)})"
    return p.timeseries(
        "Clock event reasons (throttling)",
        f"{names.DCGM_CLOCKS_EVENT_REASONS} (before DCGM 3.3 {names.DCGM_CLOCK_THROTTLE_REASONS}), one series per "
        "reason: 1 while it holds the SM clock down. Thermal or power reasons during a latency spike mean the "
        "GPU, not the load, got slower.",
        [p.target(f"floor({mask} / {bit}) % 2", f"{label} {GPU_LEGEND}") for bit, label in CLOCK_EVENT_BITS],
        "short",
    )


def _beside_queue() -> list[Any]:
    busy = sel(names.METRIC_EXECUTOR_BUSY, d.scope())
    return [
        p.timeseries(
            "Accelerator utilization beside queue depth",
            "Left: GPU utilization (%). Right: requests waiting in the batcher. High utilization with a "
            "growing queue = saturated (scale out); low utilization with a queue or long latency = starved "
            "(batch wait, a CPU stage, too few executors).",
            [
                p.target(f"avg({sel(names.DCGM_GPU_UTIL, GPU_SCOPE)})", "GPU utilization %"),
                p.target(sum_by(sel(names.METRIC_QUEUE_DEPTH, d.scope())), "queue depth"),
            ],
            "percent",
            right_axis=("queue depth", "short"),
        ),
        p.timeseries(
            "Busy executors beside queue depth",
            "Executor-seconds per second spent running batches (1.0 = one executor always busy) against "
            "requests waiting: the service-side view of the same question.",
            [
                p.target(sum_by(rate(busy, d.RATE)), "busy executors"),
                p.target(sum_by(sel(names.METRIC_QUEUE_DEPTH, d.scope())), "queue depth"),
            ],
            "short",
            right_axis=("queue depth", "short"),
        ),
    ]


TRITON_COMPUTE = (
    names.TRITON_COMPUTE_INPUT_US,
    names.TRITON_COMPUTE_INFER_US,
    names.TRITON_COMPUTE_OUTPUT_US,
)


def _per_request(counters: tuple[str, ...], window: str | None) -> str:
    """Triton: seconds of ``counters`` (cumulative microseconds, summed) per request, per model; over
    ``window``, or over the server's lifetime when ``window`` is None. Queue time is per successful
    request; compute per *executed* one: response-cache hits count in the successes but never reach
    the backend (core src/infer_stats.cc, ``UpdateSuccessCacheHit``), so they are taken out of the
    count (where the model has no cache, ``nv_cache_num_hits_per_model`` is absent: 0)."""
    by = (names.TRITON_LABEL_MODEL,)

    def total(metric: str) -> str:
        series = sel(metric, TRITON_SCOPE)
        return sum_by(series if window is None else rate(series, window), by)

    num = "\n+\n".join(total(c) for c in counters)
    success = total(names.TRITON_REQUEST_SUCCESS)
    if all(c in TRITON_COMPUTE for c in counters):
        success = f"({success}\n- ({total(names.TRITON_CACHE_HITS)} or {success} * 0))"
    return f"(\n{num}\n)\n/\n{success}\n/ 1e6"


def _triton() -> list[Any]:
    queue_vs_compute = [((names.TRITON_QUEUE_DURATION_US,), "queue"), (TRITON_COMPUTE, "compute")]
    phases = [
        ((names.TRITON_QUEUE_DURATION_US,), "queue"),
        *(
            ((c,), label)
            for c, label in zip(
                TRITON_COMPUTE, ("compute input", "compute infer", "compute output"), strict=True
            )
        ),
    ]
    return [
        p.timeseries(
            "Triton: queue vs compute per request",
            f"Mean seconds per successful request over the window: rate({names.TRITON_QUEUE_DURATION_US}) / "
            f"rate({names.TRITON_REQUEST_SUCCESS}), and compute (compute_input + compute_infer + compute_output) "
            f"per executed request (successes minus {names.TRITON_CACHE_HITS}: response-cache hits skip the "
            "model). Queue growing while compute stays flat = the model instance is saturated.",
            [p.target(_per_request(c, d.RATE), f"{label} {{{{model}}}}") for c, label in queue_vs_compute],
            "s",
            stack=True,
        ),
        p.timeseries(
            "Triton: queue vs compute per request since server start",
            "Queue per successful request and the three compute phases (input, infer, output) per executed "
            "request (response-cache hits left out) over Triton's cumulative counters: the whole server "
            "lifetime, also readable for a server with no recent traffic.",
            [p.target(_per_request(c, None), f"{label} {{{{model}}}}") for c, label in phases],
            "s",
            stack=True,
        ),
        p.timeseries(
            "Triton: pending requests and GPU utilization",
            f"{names.TRITON_PENDING} (left) and {names.TRITON_GPU_UTILIZATION} (right, 0-1).",
            [p.target(sum_by(sel(names.TRITON_PENDING, TRITON_SCOPE), ("model",)), "pending {{model}}"),
             p.target(f"avg by (gpu_uuid) ({names.TRITON_GPU_UTILIZATION})", "GPU {{gpu_uuid}}")],
            "short",
            right_axis=("GPU.*", "percentunit"),
        ),
    ]  # fmt: skip


def dashboard() -> Any:
    """The GPU dashboard (uid ``stagescope-gpu``)."""
    util = names.DCGM_GPU_UTIL
    variables = [
        *job_model_variables(),
        p.query_variable("instance", "GPU host", f"label_values({util}, instance)"),
        p.query_variable("gpu", "GPU", f"label_values({sel(util, (rx('instance', '$instance'),))}, gpu)"),
        p.query_variable(
            "triton_model", "Triton model", f"label_values({names.TRITON_REQUEST_SUCCESS}, model)"
        ),
    ]
    panels = p.layout(
        [
            ("Accelerator (dcgm-exporter names)", _dcgm()),
            ("Is the accelerator the bottleneck?", [_beside_queue()]),
            ("Triton Inference Server", [_triton()]),
        ]
    )
    return p.dashboard(
        "gpu",
        "stagescope / GPU",
        "dcgm-exporter GPU health, accelerator utilization beside queue depth, Triton queue vs compute.",
        panels,
        variables,
    )
