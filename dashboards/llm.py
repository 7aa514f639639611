"""Dashboard 2, "LLM serving": TTFT, inter-token latency, time per output token (each with its exact
definition), tokens per second, prefill against decode, running and waiting requests; then the same
panels for a vLLM deployment through vLLM's own metric names (``vllm:*``, label ``model_name``).

Words differ between tools (REFERENCE.md section 2): here "ITL" is the gap between two consecutive
tokens of one stream, one sample per gap (vLLM's meaning); the per-request mean gap is "TPOT". TTFT
starts at arrival at the server (vLLM's metric), not at scheduling and not at the client's send.
"""

from __future__ import annotations

from typing import Any

from stagescope import names
from stagescope.dashboards import defaults as d
from stagescope.dashboards import panels as p
from stagescope.dashboards.common import job_model_variables, slo_threshold, stage_scope, stage_variable
from stagescope.promql import Matcher, histogram_quantile, rate, rx, sel, sum_by

__all__ = ["dashboard"]

TTFT_DEF = (
    "TTFT: request arrival at the server -> first token handed to the response (includes queue and prefill)."
)
ITL_DEF = (
    "ITL: gap between two consecutive tokens of one stream, one sample per gap (vLLM's inter-token latency)."
)
TPOT_DEF = "TPOT: per request, (last token - first token) / (output tokens - 1): the mean gap of one stream."
VLLM_SCOPE: tuple[Matcher, ...] = (rx(names.VLLM_LABEL_MODEL, "$vllm_model"),)
#: The price variable (what one accelerator-hour costs, as the SLO file's accelerator_price_per_hour).
PRICE_VAR = "accelerator_price_per_hour"
#: Until set, the price is 1: the panel then reads accelerator-hours per million output tokens.
PRICE_DEFAULT = "1"
GPU_SCOPE: tuple[Matcher, ...] = (rx("instance", "$gpu_instance"),)


def _quantiles(
    metric: str, scope: tuple[Matcher, ...], qs: tuple[float, ...] = (0.5, 0.99)
) -> list[p.PromTarget]:
    # an engine's colon names are matched in both spellings a Prometheus may store (promql.sel)
    return [
        p.target(histogram_quantile(q, metric, scope, d.RATE, any_spelling=True), f"p{q * 100:g}",
                 exemplar=q == 0.99)
        for q in qs
    ]  # fmt: skip


def _vsel(metric: str) -> str:
    """A vLLM series under either spelling of its colons (promql.sel), scoped to the selected models."""
    return sel(metric, VLLM_SCOPE, any_spelling=True)


def _mean(metric: str, scope: tuple[Matcher, ...], by: tuple[str, ...] = ()) -> str:
    num = sum_by(rate(sel(metric, scope, "_sum", any_spelling=True), d.RATE), by)
    return f"{num}\n/\n{sum_by(rate(sel(metric, scope, '_count', any_spelling=True), d.RATE), by)}"


def _stagescope_latency() -> list[Any]:
    return [
        p.timeseries("Time to first token (TTFT)", TTFT_DEF + " Seconds; dashed: TTFT SLO thresholds.",
                     [*_quantiles(names.METRIC_GENAI_TTFT, d.scope(), (0.5, 0.95, 0.99)),
                      slo_threshold(names.SLI_TTFT)], "s", dashed=["SLO threshold.*"]),
        p.timeseries("Inter-token latency (ITL)", ITL_DEF + " Seconds; dashed: ITL SLO thresholds.",
                     [*_quantiles(names.METRIC_INTER_TOKEN, d.scope()), slo_threshold(names.SLI_ITL)], "s",
                     dashed=["SLO threshold.*"]),
        p.timeseries("Time per output token (TPOT)", TPOT_DEF + " Seconds.",
                     _quantiles(names.METRIC_GENAI_TPOT, d.scope()), "s"),
        p.timeseries("Token request duration (e2e)", f"{names.METRIC_GENAI_REQUEST_DURATION}: arrival at the "
                     "server -> last token written, for requests that produced or consumed tokens. Seconds.",
                     _quantiles(names.METRIC_GENAI_REQUEST_DURATION, d.scope()), "s"),
    ]  # fmt: skip


def _stagescope_work() -> list[Any]:
    gaps = sum_by(rate(sel(names.METRIC_INTER_TOKEN, d.scope(), "_count"), d.RATE))
    firsts = sum_by(rate(sel(names.METRIC_GENAI_TTFT, d.scope(), "_count"), d.RATE))
    phases = stage_scope(rx(names.LABEL_KIND, f"{names.KIND_PREFILL}|{names.KIND_DECODE}"))
    return [
        p.timeseries(
            "Output tokens per second",
            "Tokens handed to responses per second = streams started (one first token each) + inter-token "
            "gaps (one per further token), from the TTFT and ITL histogram counts.",
            [p.target(f"{gaps}\n+\n{firsts}", "output tokens/s"), p.target(firsts, "streams/s")],
            "short",
            right_axis=("streams/s", "reqps"),
        ),
        p.timeseries(
            "Prefill vs decode (p99 and mean)",
            "Stages of kind prefill (admitted to the engine -> first token) and decode (first token -> "
            "last token) that $stage selects. Seconds.",
            [
                p.target(histogram_quantile(0.99, names.METRIC_STAGE_DURATION, phases, d.RATE, (names.LABEL_STAGE,)),
                         "{{stage}} p99"),
                p.target(_mean(names.METRIC_STAGE_DURATION, phases, (names.LABEL_STAGE,)), "{{stage}} mean"),
            ],
            "s",
        ),
        p.timeseries(
            "Running and waiting requests",
            "Running: requests being served (in flight). Waiting: requests queued in front of the engine.",
            [
                p.target(sum_by(sel(names.METRIC_INFLIGHT, d.scope(model=False))), "running (in flight)"),
                p.target(sum_by(sel(names.METRIC_QUEUE_DEPTH, d.scope())), "waiting"),
            ],
            "short",
        ),
    ]  # fmt: skip


def _tokens_per_s(by: tuple[str, ...] = ()) -> str:
    """Output tokens per second: streams started (one first token each) + inter-token gaps."""
    gaps = sum_by(rate(sel(names.METRIC_INTER_TOKEN, d.scope(), "_count"), d.RATE), by)
    firsts = sum_by(rate(sel(names.METRIC_GENAI_TTFT, d.scope(), "_count"), d.RATE), by)
    return f"({gaps}\n+\n{firsts})"


def _cost() -> list[Any]:
    """Cost per million output tokens, as the report's cost block computes it (analysis.cost)."""
    price = f"${PRICE_VAR} / 3600"
    busy = sum_by(rate(sel(names.METRIC_EXECUTOR_BUSY, d.scope()), d.RATE), (names.LABEL_MODEL,))
    util = f"sum({sel(names.DCGM_GPU_UTIL, GPU_SCOPE)}) / 100"
    gpus = f"count({sel(names.DCGM_GPU_UTIL, GPU_SCOPE)})"
    return [
        p.timeseries(
            "Cost per million output tokens",
            f"${PRICE_VAR} (the dashboard variable: the price of one accelerator-hour, as the SLO file's "
            f"accelerator_price_per_hour; {PRICE_DEFAULT} until set, so the panel reads accelerator-hours) / 3600 "
            "x accelerator-seconds per second / output tokens per second x 10^6. Accelerator-seconds: executor "
            f"busy time ({names.METRIC_EXECUTOR_BUSY}, per model, one executor taken for one accelerator), "
            f"or {names.DCGM_GPU_UTIL} / 100 summed over the $gpu_instance GPUs (utilization x time), or "
            "every such GPU whole (the fleet, idle time included). Output tokens as in 'Output tokens per "
            "second'. Idle time is charged only by the fleet series.",
            [
                p.target(f"{price} * {busy}\n/\n{_tokens_per_s((names.LABEL_MODEL,))} * 1e6",
                         "executor busy time {{model}}"),
                p.target(f"{price} * {util}\n/\n{_tokens_per_s()} * 1e6", "GPU utilization x time"),
                p.target(f"{price} * {gpus}\n/\n{_tokens_per_s()} * 1e6", "fleet (every GPU, idle included)"),
            ],
            "short",
        ),
    ]  # fmt: skip


def _vllm_latency() -> list[Any]:
    return [
        p.timeseries("vLLM: time to first token", f"{names.VLLM_TTFT}. " + TTFT_DEF,
                     _quantiles(names.VLLM_TTFT, VLLM_SCOPE), "s"),
        p.timeseries("vLLM: inter-token latency", f"{names.VLLM_ITL}. " + ITL_DEF,
                     _quantiles(names.VLLM_ITL, VLLM_SCOPE), "s"),
        p.timeseries("vLLM: time per output token", f"{names.VLLM_TPOT}. " + TPOT_DEF,
                     _quantiles(names.VLLM_TPOT, VLLM_SCOPE), "s"),
    ]  # fmt: skip


def _vllm_work() -> list[Any]:
    by_model = (names.VLLM_LABEL_MODEL,)
    phases = [
        (names.VLLM_QUEUE_TIME, "queue"),
        (names.VLLM_PREFILL_TIME, "prefill"),
        (names.VLLM_DECODE_TIME, "decode"),
    ]
    return [
        p.timeseries(
            "vLLM: tokens per second",
            f"{names.VLLM_GENERATION_TOKENS} and {names.VLLM_PROMPT_TOKENS}, per second.",
            [p.target(sum_by(rate(_vsel(names.VLLM_GENERATION_TOKENS), d.RATE), by_model),
                      "generated {{model_name}}"),
             p.target(sum_by(rate(_vsel(names.VLLM_PROMPT_TOKENS), d.RATE), by_model),
                      "prompt {{model_name}}")],
            "short",
        ),
        p.timeseries(
            "vLLM: queue, prefill and decode (mean per request)",
            f"{names.VLLM_QUEUE_TIME} (QUEUED -> SCHEDULED), request_prefill_time_seconds and "
            "request_decode_time_seconds: mean seconds per finished request.",
            [p.target(_mean(metric, VLLM_SCOPE), label) for metric, label in phases],
            "s",
        ),
        p.timeseries(
            "vLLM: running and waiting requests, KV cache use",
            f"{names.VLLM_NUM_RUNNING}, {names.VLLM_NUM_WAITING} (left) and {names.VLLM_KV_CACHE_USAGE} (right, 0-1).",
            [p.target(sum_by(_vsel(names.VLLM_NUM_RUNNING), by_model), "running {{model_name}}"),
             p.target(sum_by(_vsel(names.VLLM_NUM_WAITING), by_model), "waiting {{model_name}}"),
             p.target(f"max by ({names.VLLM_LABEL_MODEL}) ({_vsel(names.VLLM_KV_CACHE_USAGE)})",
                      "KV cache {{model_name}}")],
            "short",
            right_axis=("KV cache.*", "percentunit"),
        ),
    ]  # fmt: skip


def dashboard() -> Any:
    """The LLM serving dashboard (uid ``stagescope-llm``)."""
    vllm_model = p.query_variable(
        "vllm_model", "vLLM model", f"label_values({sel(names.VLLM_NUM_RUNNING, any_spelling=True)}, model_name)"
    )
    gpus = p.query_variable("gpu_instance", "GPU exporter", f"label_values({names.DCGM_GPU_UTIL}, instance)")
    price = p.textbox_variable(PRICE_VAR, "Accelerator price per hour", PRICE_DEFAULT)
    panels = p.layout(
        [
            ("stagescope: this service's token latencies", [_stagescope_latency(), _stagescope_work()]),
            ("stagescope: cost", [_cost()]),
            ("vLLM deployment (vLLM's own metric names)", [_vllm_latency(), _vllm_work()]),
        ]
    )
    return p.dashboard(
        "llm",
        "stagescope / LLM serving",
        "TTFT, inter-token latency and time per output token with exact definitions; prefill vs decode; "
        "the same views for vLLM.",
        panels,
        [*job_model_variables(), stage_variable(), vllm_model, gpus, price],
    )
