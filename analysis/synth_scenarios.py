"""Synthetic incidents with a known root cause, one per reference-service scenario.

Independent of the reference service: each scenario is a small statistical model of where requests
spend their time (milliseconds, lognormal or uniform draws) with one fault injected into its true
stage. :func:`generate` draws one (a :class:`SynthData`); its three output forms (:func:`write_otlp`
in our span format or vLLM's, :func:`to_tables` for DuckDB, :func:`write_metrics` as Prometheus text)
live in :mod:`~stagescope.analysis.synth_data` and are re-exported here.

All data here is synthetic and says so (service name ``synthetic-service``, GPU ``modelName``
``synthetic``). ``generate(name, n)`` is deterministic for a given ``seed``.
"""

from __future__ import annotations

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth_data import (
    GENERATE,
    PREDICT,
    SERVICE,
    Scenario,
    SynthData,
    to_tables,
    write_metrics,
    write_otlp,
)

__all__ = [
    "GENERATE",
    "LLM_HEALTHY",
    "PREDICT",
    "SCENARIOS",
    "SERVICE",
    "Scenario",
    "SynthData",
    "generate",
    "to_tables",
    "write_metrics",
    "write_otlp",
]

MAX_BATCH = 32


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", PREDICT, "p99<300ms", None, None),
        Scenario("slow-feature-store", PREDICT, "p99<300ms", N.STAGE_FEATURE_FETCH, N.LEVER_CACHE_FEATURES),
        Scenario("saturated", PREDICT, "p99<300ms", N.STAGE_QUEUE, N.LEVER_SCALE_OUT),
        Scenario("long-batch-wait", PREDICT, "p99<300ms", N.STAGE_BATCH_WAIT, N.LEVER_CAP_BATCH_WAIT),
        Scenario("slow-compute", PREDICT, "p99<300ms", N.STAGE_COMPUTE, N.LEVER_QUANTIZE),
        Scenario(
            "cpu-bound-preprocess", PREDICT, "p99<300ms", N.STAGE_PREPROCESS, N.LEVER_OFFLOAD_PREPROCESSING
        ),
        Scenario("cold-start", PREDICT, "p99<300ms", N.STAGE_COLD_START, N.LEVER_PREWARM),
        Scenario("large-payload", PREDICT, "p99<300ms", N.STAGE_EGRESS, N.LEVER_SHRINK_RESPONSE),
        Scenario("repeated-inputs", PREDICT, "p99<300ms", N.STAGE_COMPUTE, N.LEVER_CACHE_RESULTS),
        Scenario("llm-long-prompts", GENERATE, "ttft:p95<500ms", N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL),
        Scenario("llm-decode-heavy", GENERATE, "itl:p99<60ms", N.STAGE_DECODE, N.LEVER_REDUCE_BATCH_TOKENS),
    )
}

#: A streaming route without a fault (not a reference-service scenario: the second route of mixes).
LLM_HEALTHY = Scenario("llm-healthy", GENERATE, "ttft:p95<500ms", None, None)
_ALL = {**SCENARIOS, LLM_HEALTHY.name: LLM_HEALTHY}

_PREDICT_ORDER = (
    N.STAGE_FEATURE_FETCH, N.STAGE_PREPROCESS, N.STAGE_COLD_START, N.STAGE_BATCH_WAIT, N.STAGE_QUEUE,
    N.STAGE_COMPUTE, N.STAGE_POSTPROCESS, N.STAGE_EGRESS,
)  # fmt: skip


def _ln(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, sigma, n))


def _ids(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    hi = rng.integers(1, 2**63, n, dtype=np.int64)
    lo = rng.integers(1, 2**63, n, dtype=np.int64)
    trace = np.array([f"{a:016x}{b:016x}" for a, b in zip(hi, lo, strict=True)])
    return trace, np.array([t[:16] for t in trace])


def _predict(sc: Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float) -> SynthData:
    t = np.sort(rng.uniform(0, dur_s, n))
    d = {
        N.STAGE_FEATURE_FETCH: _ln(rng, 4, 0.3, n),
        N.STAGE_PREPROCESS: _ln(rng, 3, 0.3, n),
        N.STAGE_COLD_START: np.zeros(n),
        N.STAGE_BATCH_WAIT: rng.uniform(0, 5, n),
        N.STAGE_QUEUE: rng.exponential(2, n),
        N.STAGE_COMPUTE: _ln(rng, 20, 0.15, n),
        N.STAGE_POSTPROCESS: _ln(rng, 1, 0.2, n),
        N.STAGE_EGRESS: _ln(rng, 1, 0.2, n),
    }
    batch = rng.integers(8, 17, n).astype(float)
    qdepth = rng.poisson(3, n).astype(float)
    util_level = np.full(n, 60.0)
    hashes = np.array([f"h{i:08x}" for i in rng.integers(0, 2**31, n)])
    cold = np.zeros(n, dtype=bool)
    hit = rng.random(n)
    name = sc.name
    if name == "slow-feature-store":
        m = hit < 0.08
        d[N.STAGE_FEATURE_FETCH][m] += _ln(rng, 350, 0.3, int(m.sum()))
    elif name == "saturated":  # two overload bursts: a backlog builds and drains (queue time ~ backlog)
        phase = (t % (dur_s / 2)) / (dur_s / 2)
        backlog = np.clip(np.sin(np.pi * phase), 0, None) ** 4 * 900
        d[N.STAGE_QUEUE] += backlog * rng.uniform(0.8, 1.0, n)
        qdepth = backlog / 20 * MAX_BATCH / 4 + rng.poisson(3, n)
        batch[:] = MAX_BATCH
        util_level[:] = 97.0
    elif name == "long-batch-wait":
        d[N.STAGE_BATCH_WAIT] = rng.uniform(0, 420, n)
        batch = rng.integers(1, 3, n).astype(float)
        util_level[:] = 12.0
    elif name in ("slow-compute", "repeated-inputs"):
        m = hit < 0.08
        d[N.STAGE_COMPUTE][m] = _ln(rng, 380, 0.25, int(m.sum()))
        util_level[:] = 92.0
        if name == "repeated-inputs":
            hot = np.array([f"hot{i:04d}" for i in range(3)])
            hashes[m] = hot[rng.integers(0, len(hot), int(m.sum()))]
    elif name == "cpu-bound-preprocess":
        m = hit < 0.08
        d[N.STAGE_PREPROCESS][m] += _ln(rng, 360, 0.25, int(m.sum()))
        util_level[:] = 18.0
    elif name == "cold-start":
        m = t < dur_s * 0.04
        d[N.STAGE_COLD_START][m] = (dur_s * 0.04 - t[m]) * 1000 * 0.5 + 400
        cold = m
    elif name == "large-payload":
        m = hit < 0.07
        d[N.STAGE_EGRESS][m] += _ln(rng, 420, 0.2, int(m.sum()))
    # lay the stages out in order; two parallel feature-store reads (the request waits for the slower)
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    stage_names: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    idx = np.arange(n)
    start_ns = t0 + (t * 1e9).astype(np.int64)
    off = np.zeros(n)
    for st in _PREDICT_ORDER:
        dur = d[st]
        keep = dur > 0
        if st == N.STAGE_FEATURE_FETCH:
            other = dur * rng.uniform(0.3, 1.0, n)
            starts.append(start_ns + (off * 1e6).astype(np.int64))
            ends.append(start_ns + ((off + other) * 1e6).astype(np.int64))
            stage_names.append(np.full(n, st))
            owners.append(idx)
        s = start_ns[keep] + (off[keep] * 1e6).astype(np.int64)
        starts.append(s)
        ends.append(s + (dur[keep] * 1e6).astype(np.int64))
        stage_names.append(np.full(int(keep.sum()), st))
        owners.append(idx[keep])
        off = off + dur
    duration = off + 0.3  # a little time outside any stage (routing, middleware)
    trace, span = _ids(rng, n)
    o = np.concatenate(owners)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, PREDICT), "model": np.full(n, "resnet"),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": duration,
        "batch_size": batch, "queue_depth": qdepth, "input_hash": hashes, "cold_start": cold,
        "client_duration_ms": duration + _ln(rng, 1.5, 0.2, n),
    }  # fmt: skip
    stages = {"trace_id": trace[o], "stage": np.concatenate(stage_names),
              "start_unix_ns": np.concatenate(starts), "end_unix_ns": np.concatenate(ends)}  # fmt: skip
    data = SynthData(sc, req, stages)
    _util_metrics(data, start_ns, util_level, qdepth, t0, dur_s)
    if name == "slow-compute":
        _variant_metrics(data, t0)
    return data


#: What the synthetic service says it measured about its INT8 variant (SYNTHETIC figures, in the
#: families a real service exports: see analysis.quality): batch seconds at 1 and 45 rows, accuracy.
SYNTH_VARIANTS = {
    N.VARIANT_SERVING: ({1: 0.020, 45: 0.380}, 0.9711),
    N.LEVER_QUANTIZE: ({1: 0.011, 45: 0.171}, 0.9689),
}


def _variant_metrics(
    data: SynthData, t0: int, variants: dict[str, tuple[dict[int, float], float]] | None = None,
    eval_samples: float = 450.0,
) -> None:
    """The model variants' eval-set accuracy and measured batch seconds (per row count) as the service
    exports them: ``variants`` (default SYNTH_VARIANTS) maps variant -> ({rows: seconds}, accuracy)."""
    ts = t0 // 10**6
    for variant, (batch_s, acc) in (SYNTH_VARIANTS if variants is None else variants).items():
        labels = {N.LABEL_MODEL: "resnet", N.LABEL_VARIANT: variant}
        data.metrics.append((N.METRIC_MODEL_EVAL_ACCURACY, labels, acc, ts))
        data.metrics.append((N.METRIC_MODEL_EVAL_SAMPLES, labels, eval_samples, ts))
        for rows, sec in batch_s.items():
            data.metrics.append((N.METRIC_MODEL_VARIANT_BATCH, {**labels, N.LABEL_ROWS: str(rows)}, sec, ts))


def _util_metrics(
    data: SynthData, start_ns: np.ndarray, util: np.ndarray, qd: np.ndarray, t0: int, dur_s: float
) -> None:
    for sec in range(int(dur_s)):
        lo, hi = np.searchsorted(start_ns, [t0 + sec * 10**9, t0 + (sec + 1) * 10**9])
        ts = (t0 // 10**6) + sec * 1000
        if hi > lo:
            labels = {"gpu": "0", "modelName": "synthetic"}
            data.metrics.append((N.DCGM_GPU_UTIL, labels, float(util[lo:hi].mean()), ts))
            data.metrics.append((N.METRIC_QUEUE_DEPTH, {"model": "resnet"}, float(qd[lo:hi].mean()), ts))


def _generate_llm(sc: Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float) -> SynthData:
    t = np.sort(rng.uniform(0, dur_s, n))
    prompt = np.clip(_ln(rng, 500, 0.5, n), 16, 4000).astype(int)
    out = np.clip(_ln(rng, 40, 0.4, n), 4, 160).astype(int)
    long_idx = np.array([], dtype=int)
    if sc.name == "llm-long-prompts":  # 1 in 40 prompts is long; its prefill holds the engine
        long_idx = np.arange(20, n, 40)
        prompt[long_idx] = rng.integers(7000, 9000, len(long_idx))
    running = np.full(n, 8.0) + rng.integers(-2, 3, n)
    if sc.name == "llm-decode-heavy":  # busy periods: the running decode batch grows to ~96 streams
        busy = ((t / dur_s * 5) % 1.0) < 0.4
        running[busy] = rng.integers(88, 104, int(busy.sum()))
    queue = rng.exponential(5, n)
    prefill = 15 + 0.12 * prompt * np.exp(rng.normal(0, 0.05, n))
    # requests arriving while a long prefill runs wait for it (head-of-line blocking): each waits until
    # the last long prefill that holds the engine at its arrival ends (a maximum: two overlapping long
    # prefills are one wait, not two, so an engine that falls behind queues up linearly)
    wait_until = np.zeros(n)
    for i in long_idx:  # in arrival order
        busy_until = t[i] + (queue[i] + prefill[i]) / 1000 + max(0.0, wait_until[i] - t[i])
        blocked = (t > t[i]) & (t < busy_until)
        wait_until[blocked] = np.maximum(wait_until[blocked], busy_until)
    prefill += np.maximum(0.0, wait_until - t) * 1000
    start_ns = t0 + (t * 1e9).astype(np.int64)
    gap_owner, gap_ms = [], []
    decode = np.zeros(n)
    itl = np.zeros((n, 3))
    for i in range(n):
        g = (8 + 0.7 * running[i]) * np.exp(rng.normal(0, 0.08, out[i] - 1))
        gap_owner.append(np.full(len(g), i))
        gap_ms.append(g)
        decode[i] = g.sum()
        itl[i] = (g.mean(), np.quantile(g, 0.99), g.max())
    ttft = queue + prefill
    e2e = ttft + decode + 0.5
    trace, span = _ids(rng, n)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, GENERATE), "model": np.full(n, "llama"),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": e2e, "ttft_ms": ttft,
        "itl_mean_ms": itl[:, 0], "itl_p99_ms": itl[:, 1], "itl_max_ms": itl[:, 2], "input_tokens": prompt,
        "output_tokens": out, "batch_size": running, "queue_depth": rng.poisson(2, n).astype(float),
        "input_hash": np.array([f"p{i:08x}" for i in rng.integers(0, 2**31, n)]), "cold_start": np.zeros(n, bool),
    }  # fmt: skip
    bounds = np.cumsum(np.stack([queue, prefill, decode], axis=1), axis=1)
    bounds = np.concatenate([np.zeros((n, 1)), bounds], axis=1)
    st = [N.STAGE_QUEUE, N.STAGE_PREFILL, N.STAGE_DECODE]
    stages = {
        "trace_id": np.repeat(trace, 3), "stage": np.tile(np.array(st), n),
        "start_unix_ns": (np.repeat(start_ns, 3) + (bounds[:, :3].ravel() * 1e6)).astype(np.int64),
        "end_unix_ns": (np.repeat(start_ns, 3) + (bounds[:, 1:].ravel() * 1e6)).astype(np.int64),
    }  # fmt: skip
    owner = np.concatenate(gap_owner)
    data = SynthData(sc, req, stages, {"trace_id": trace[owner], "gap_ms": np.concatenate(gap_ms)})
    for sec in range(int(dur_s)):
        lo, hi = np.searchsorted(start_ns, [t0 + sec * 10**9, t0 + (sec + 1) * 10**9])
        if hi > lo:
            ts = t0 // 10**6 + sec * 1000
            data.metrics.append(
                (N.VLLM_NUM_RUNNING, {N.VLLM_LABEL_MODEL: "llama"}, float(running[lo:hi].mean()), ts)
            )
            data.metrics.append((N.DCGM_GPU_UTIL, {"gpu": "0", "modelName": "synthetic"}, 85.0, ts))
    return data


def generate(
    name: str, n: int = 2000, *, seed: int = 0, duration_s: float = 120.0, t0_ns: int = 1_764_460_800 * 10**9
) -> SynthData:
    """Synthesize ``n`` requests of scenario ``name`` over ``duration_s`` seconds (a name of
    :data:`SCENARIOS`, ``llm-healthy``: a streaming route without a fault, or a multi-cause incident
    of analysis.synth_multi, such as ``llm-seed-001``)."""
    if name not in _ALL:
        from stagescope.analysis.synth_multi import generate_multi  # it builds on this module

        return generate_multi(name, n, seed=seed, duration_s=duration_s, t0_ns=t0_ns).data
    sc = _ALL[name]
    rng = np.random.default_rng(seed)
    if sc.route == GENERATE:
        return _generate_llm(sc, rng, n, t0_ns, duration_s)
    return _predict(sc, rng, n, t0_ns, duration_s)

