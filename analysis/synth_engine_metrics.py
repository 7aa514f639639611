"""SIMULATED ``/metrics`` scrapes of vLLM and SGLang, from the ground truth of
:func:`stagescope.analysis.synth_engines.timelines`.

The exposition follows what the engines' source registers and prometheus_client writes: vLLM V1's
families with labels ``model_name`` and ``engine`` (one series per data-parallel engine;
vllm-project/vllm vllm/v1/metrics/loggers.py @ a6f0308c, ``PrometheusStatLogger``; the newer names
``kv_cache_usage_perc`` and ``prefix_cache_*`` of docs/design/metrics.md @ 0328b592), counters with
their ``_total`` suffix, histograms as ``_bucket``/``_sum``/``_count`` with the source's bucket
bounds; SGLang's ``sglang:`` families with ``model_name`` and the publishing ranks (sgl-project/sglang
python/sglang/srt/metrics/collector.py @ 00ae9c15: ``per_stage_req_latency_seconds`` with
``stage``, exponential buckets from 1 ms by 1.62; ``queue_time_seconds``; the tokenizer's TTFT and
e2e histograms). A request is counted by the engine that served it (``index % engines``) once it has
finished (its e2e end at or before the scrape), after the last restart (``since_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth_engines import MODEL, Timelines

__all__ = ["Window", "sglang_scrape", "vllm_scrape", "window"]

#: vLLM's ``request_latency_buckets`` (loggers.py), seconds.
_LATENCY = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
_SGL_STAGE = tuple(0.001 * 1.62**i for i in range(30))  # collector.py exponential_buckets(0.001, 1.62, 30)


@dataclass
class Window:
    """The true figures of the requests counted between two scrapes (or since the start)."""

    requests: int
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    ttft_ms: float
    e2e_ms: float


def _finished_s(tl: Timelines) -> np.ndarray:
    """Each request's e2e end (vLLM's last front-end iteration), seconds from the first arrival."""
    t0 = (tl.t0_ns - tl.t0_ns.min()) / 1e9
    return t0 + (tl.pre + tl.engine_ttft + tl.decode + tl.back) / 1e3


def _select(tl: Timelines, since_s: float, until_s: float | None) -> np.ndarray:
    f = _finished_s(tl)
    return (f > since_s) & (f <= (np.inf if until_s is None else until_s))


def window(tl: Timelines, since_s: float = -1.0, until_s: float | None = None) -> Window:
    """The truth for the requests finished in ``(since_s, until_s]``: count and mean ms."""
    m = _select(tl, since_s, until_s)
    e2e = tl.engine_ttft + tl.decode + tl.back
    return Window(
        int(m.sum()), *(float(x[m].mean()) for x in (tl.queue, tl.prefill, tl.decode, tl.engine_ttft, e2e))
    )


def _lab(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _histogram(
    name: str, labels: dict[str, str], values_s: np.ndarray, bounds: tuple[float, ...], ts: str
) -> list[str]:
    out = []
    for b in bounds:
        out.append(
            f"{name}_bucket{_lab({**labels, 'le': repr(float(b))})} {float((values_s <= b).sum())}{ts}"
        )
    out.append(f"{name}_bucket{_lab({**labels, 'le': '+Inf'})} {float(len(values_s))}{ts}")
    out.append(f"{name}_count{_lab(labels)} {float(len(values_s))}{ts}")
    out.append(f"{name}_sum{_lab(labels)} {float(values_s.sum())!r}{ts}")
    return out


def vllm_scrape(
    tl: Timelines, *, engines: int = 2, until_s: float | None = None, since_s: float = -1.0,
    ts_ms: int | None = None, instance: str | None = None, running: float = 8.0, waiting: float = 0.0,
    kv_usage: float = 0.4, preemptions: float = 0.0, prefix_hit_ratio: float = 0.0,
    prefix_caching: bool = True,
) -> str:  # fmt: skip
    """One scrape of a vLLM V1 server with ``engines`` data-parallel engines (SIMULATED): every request
    of ``tl`` finished in ``(since_s, until_s]`` counted by its engine; ``ts_ms`` (Unix ms) written on
    every sample when given; ``instance`` added as a label (a Prometheus scrape's). Gauges and the
    preemption count are per engine; ``prefix_hit_ratio`` of the prompt tokens are cache hits."""
    ts = f" {ts_ms}" if ts_ms is not None else ""
    m = _select(tl, since_s, until_s)
    idx = np.arange(tl.n)
    lines: list[str] = []
    fams: dict[str, list[str]] = {}
    for e in range(engines):
        labels = {N.VLLM_LABEL_MODEL: MODEL, N.VLLM_LABEL_ENGINE: str(e)}
        if instance is not None:
            labels["instance"] = instance
        k = m & (idx % engines == e)
        s = 1e-3
        obs = {
            N.VLLM_QUEUE_TIME: tl.queue[k] * s, N.VLLM_PREFILL_TIME: tl.prefill[k] * s,
            N.VLLM_DECODE_TIME: tl.decode[k] * s, N.VLLM_INFERENCE_TIME: (tl.prefill[k] + tl.decode[k]) * s,
            N.VLLM_E2E: (tl.engine_ttft[k] + tl.decode[k] + tl.back[k]) * s,
        }  # fmt: skip
        for name, vals in obs.items():
            fams.setdefault(f"histogram {name}", []).extend(_histogram(name, labels, vals, _LATENCY, ts))
        fams.setdefault(f"histogram {N.VLLM_TTFT}", []).extend(
            _histogram(N.VLLM_TTFT, labels, tl.engine_ttft[k] * s, _TTFT, ts)
        )
        prompt = float(tl.prompt_tokens[k].sum())
        for name, value in (
            (N.VLLM_PROMPT_TOKENS, prompt), (N.VLLM_GENERATION_TOKENS, float(tl.output_tokens[k].sum())),
            (N.VLLM_NUM_PREEMPTIONS, preemptions), (N.VLLM_PREFIX_CACHE_QUERIES, prompt),
            (N.VLLM_PREFIX_CACHE_HITS, round(prompt * prefix_hit_ratio)),
        ):  # fmt: skip
            fams.setdefault(f"counter {name}", []).append(f"{name}{_lab(labels)} {value}{ts}")
        fams.setdefault(f"counter {N.VLLM_REQUEST_SUCCESS}", []).append(
            f"{N.VLLM_REQUEST_SUCCESS}{_lab({**labels, 'finished_reason': 'stop'})} {float(k.sum())}{ts}"
        )
        for name, value in (
            (N.VLLM_NUM_RUNNING, running),
            (N.VLLM_NUM_WAITING, waiting),
            (N.VLLM_KV_CACHE_USAGE, kv_usage),
        ):
            fams.setdefault(f"gauge {name}", []).append(f"{name}{_lab(labels)} {float(value)}{ts}")
    info = {"block_size": "16", "enable_prefix_caching": str(prefix_caching), "gpu_memory_utilization": "0.9"}
    fams[f"gauge {N.VLLM_CACHE_CONFIG_INFO}"] = [f"{N.VLLM_CACHE_CONFIG_INFO}{_lab(info)} 1.0{ts}"]
    for key, samples in fams.items():
        typ, name = key.split(" ", 1)
        base = name.removesuffix("_total") if typ == "counter" else name
        lines += [
            f"# HELP {base} SIMULATED (stagescope synth_engine_metrics)",
            f"# TYPE {base} {typ}",
            *samples,
        ]
    return "\n".join(lines) + "\n"


def sglang_scrape(tl: Timelines, *, dp_ranks: int = 2, ts_ms: int | None = None, waiting: float = 0.0,
                  cache_hit_rate: float = 0.0) -> str:  # fmt: skip
    """One scrape of an SGLang server with ``dp_ranks`` data-parallel ranks (SIMULATED): the tokenizer's
    TTFT / e2e histograms, the scheduler's queue-time histogram and per-stage latencies
    (``request_process`` = 0 here, ``prefill_forward``), queue and cache gauges, per rank."""
    ts = f" {ts_ms}" if ts_ms is not None else ""
    idx = np.arange(tl.n)
    lines: list[str] = []
    for r in range(dp_ranks):
        labels = {N.SGLANG_LABEL_MODEL: MODEL, "tp_rank": "0", "dp_rank": str(r), "pp_rank": "0"}
        k = idx % dp_ranks == r
        s = 1e-3
        lines += _histogram(N.SGLANG_TTFT, labels, tl.engine_ttft[k] * s, _TTFT, ts)
        lines += _histogram(N.SGLANG_E2E, labels, (tl.engine_ttft[k] + tl.decode[k]) * s, _LATENCY, ts)
        lines += _histogram(N.SGLANG_QUEUE_TIME, labels, tl.queue[k] * s, _LATENCY, ts)
        for stage, vals in (
            ("request_process", np.zeros(int(k.sum()))),
            ("prefill_forward", tl.prefill[k] * s),
        ):
            lines += _histogram(
                N.SGLANG_PER_STAGE_LATENCY, {**labels, N.SGLANG_LABEL_STAGE: stage}, vals, _SGL_STAGE, ts
            )
        lines.append(f"{N.SGLANG_NUM_REQUESTS}{_lab(labels)} {float(k.sum())}{ts}")
        lines.append(f"{N.SGLANG_NUM_QUEUE_REQS}{_lab(labels)} {float(waiting)}{ts}")
        lines.append(f"{N.SGLANG_CACHE_HIT_RATE}{_lab(labels)} {float(cache_hit_rate)}{ts}")
    return "\n".join(lines) + "\n"
