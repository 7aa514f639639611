"""SYNTHETIC multi-cause incidents: breaches no single lever fixes, with the truth after each lever.

Each incident's generator keeps every request's components (milliseconds) and the physics of each
fault, so :meth:`MultiIncident.true_quantile` answers what the SLO quantile really is after a list
of levers with their settings (what the plan in analysis.plan predicts from the trace alone):

* ``llm-seed-001`` (the seeds' worked example; TTFT p95 < 500 ms): 50 ms in the ingress gateway; in
  bursts the autoscaler, scaling on CPU, lags and requests wait ~200 ms for a pod (queue), and run in
  full batches of 256 tokens whose model execution (prefill) takes 50 + 1.95 ms per batch token
  (~550 ms). Scaling on queue depth serves the bursts like the rest (queue p95 ~20 ms); a batch cap
  of ``B`` tokens makes execution ``50 + 1.95 * min(tokens, B)``. p95 ~800 ms; with both ~370 ms.
  kube-state-metrics' HPA series say what the seed says: the HPA scales on CPU utilization (2
  replicas of at most 8), so the plan's first step is scale-on-queue-depth (analysis.synth_fleet).
* ``llm-burst-long-outputs`` (end to end p95 < 1200 ms): a batch client's bursts wait ~1 s for
  replicas and generate ~400 tokens at the normal ~10 ms per token; scaling on queue depth removes
  the wait, an output budget of ``C`` tokens cuts each request to its first ``C - 1`` gaps.
* ``predict-payload-repeats`` (p99 < 300 ms): 8% of requests repeat one of 3 hot inputs whose
  compute is slow (~380 ms) and whose responses are large (egress +320 ms); a results cache serves
  every repeat after the first without batch wait, queue or compute, a smaller response takes the
  normal egress time.
* ``predict-burst-faults`` (p90 < 300 ms): in bursts (8 % of the time) the autoscaler lags and
  requests wait ~1 s in the queue; besides, 8 % of requests repeat one of 2 hot inputs whose
  compute is slow (~350 ms) and another 6 % (distinct inputs) get large responses (egress +320 ms).
  Scaling on queue depth leaves 14 % of requests slow, above the p90's 10 %: either the results
  cache (the repeats) or the smaller response (the large answers) then leaves under 10 %, and the
  cache costs less (its repeats skip the accelerator): the plan's cheaper final step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth_scenarios import GENERATE, PREDICT, Scenario, SynthData

__all__ = ["MULTI", "MultiIncident", "generate_multi"]

#: The multi-cause incidents: name -> (route, SLO, the levers of the right plan in order).
MULTI: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "llm-seed-001": (GENERATE, "ttft:p95<500ms", (N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_REDUCE_BATCH_TOKENS)),
    "llm-burst-long-outputs": (GENERATE, "p95<1200ms", (N.LEVER_SCALE_OUT, N.LEVER_CAP_OUTPUT_TOKENS)),
    "predict-payload-repeats": (PREDICT, "p99<300ms", (N.LEVER_SHRINK_RESPONSE, N.LEVER_CACHE_RESULTS)),
    # with a price set; without one the plan keeps the phase order (shrink-response last)
    "predict-burst-faults": (PREDICT, "p90<300ms", (N.LEVER_SCALE_OUT, N.LEVER_CACHE_RESULTS)),
}
#: Seed 001's model execution: fixed ms plus ms per batch token (550 ms at 256 tokens, 300 at 128).
EXEC_FIXED_MS = 50.0
EXEC_PER_TOKEN_MS = 250.0 / 128.0


@dataclass
class MultiIncident:
    """One incident: its synthetic data, the levers of the right plan and each request's components."""

    data: SynthData
    plan: tuple[str, ...]
    quantile: float
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    gaps: list[np.ndarray] = field(default_factory=list)

    def true_quantile(self, steps: list[tuple[str, float | None]]) -> float:
        """The SLO quantile (ms) after the levers ``(lever, setting)`` in order (setting: the batch
        cap in tokens, the output budget in tokens; None for the others), from the generator's physics."""
        p = {k: v.copy() for k, v in self.parts.items()}
        name = self.data.scenario.name
        for lever, setting in steps:
            if lever in (N.LEVER_SCALE_OUT, N.LEVER_SCALE_ON_QUEUE_DEPTH):
                p["queue"] = p["queue_normal"]
            elif lever == N.LEVER_REDUCE_BATCH_TOKENS and setting is not None:
                p["prefill"] = (EXEC_FIXED_MS + EXEC_PER_TOKEN_MS * np.minimum(p["tokens"], setting)) * p[
                    "noise"
                ]
            elif lever == N.LEVER_CAP_OUTPUT_TOKENS and setting is not None:
                keep = int(setting) - 1
                p["decode"] = np.array([g[:keep].sum() for g in self.gaps])
            elif lever == N.LEVER_SHRINK_RESPONSE:
                p["egress"] = p["egress_normal"]
            elif lever == N.LEVER_CACHE_RESULTS:
                for k in ("batch_wait", "queue", "compute"):
                    p[k] = np.where(p["repeat"] > 0, 0.0, p[k])
        stages = [k for k in _LAYOUT[name] if k in p]
        value = sum(p[k] for k in stages) + p.get("rest", 0.0)
        return float(np.quantile(value, self.quantile))


_LAYOUT = {
    "llm-seed-001": (N.STAGE_GATEWAY, "queue", "prefill"),
    "llm-burst-long-outputs": ("queue", "prefill", "decode"),
    "predict-payload-repeats": (
        N.STAGE_FEATURE_FETCH, N.STAGE_PREPROCESS, N.STAGE_BATCH_WAIT, "queue", "compute",
        N.STAGE_POSTPROCESS, "egress",
    ),
}  # fmt: skip
_LAYOUT["predict-burst-faults"] = _LAYOUT["predict-payload-repeats"]


def _ln(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, sigma, n))


def _ids(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    hi = rng.integers(1, 2**63, n, dtype=np.int64)
    lo = rng.integers(1, 2**63, n, dtype=np.int64)
    trace = np.array([f"{a:016x}{b:016x}" for a, b in zip(hi, lo, strict=True)])
    return trace, np.array([t[:16] for t in trace])


def _layout(
    trace: np.ndarray, start_ns: np.ndarray, durs: list[tuple[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Stage spans one after another from each request's start (ms durations)."""
    n = len(trace)
    off = np.zeros(n)
    tids, names, starts, ends = [], [], [], []
    for st, d in durs:
        keep = d > 0
        s = start_ns[keep] + (off[keep] * 1e6).astype(np.int64)
        tids.append(trace[keep])
        names.append(np.full(int(keep.sum()), st))
        starts.append(s)
        ends.append(s + (d[keep] * 1e6).astype(np.int64))
        off = off + d
    return {"trace_id": np.concatenate(tids), "stage": np.concatenate(names),
            "start_unix_ns": np.concatenate(starts), "end_unix_ns": np.concatenate(ends)}  # fmt: skip


def _llm(name: str, rng: np.random.Generator, n: int, t0: int, dur_s: float) -> MultiIncident:
    route, slo, plan = MULTI[name]
    t = np.sort(rng.uniform(0, dur_s, n))
    start_ns = t0 + (t * 1e9).astype(np.int64)
    seed = name == "llm-seed-001"
    # bursts the CPU-driven autoscaler answers late: 20% (seed) / 15% of the time, four times a run
    busy = ((t / dur_s * 4) % 1.0) < (0.2 if seed else 0.15)
    queue_normal = rng.exponential(20.0 / 3.0 if seed else 5.0, n)  # seed: queue p95 ~20 ms
    queue = np.where(busy, (200.0 if seed else 1000.0) * np.exp(rng.normal(0, 0.03, n)), queue_normal)
    tokens = (
        np.where(busy, 256, rng.integers(64, 129, n)).astype(float) if seed else 8.0 + rng.integers(-2, 3, n)
    )
    noise = np.exp(rng.normal(0, 0.02, n))
    prompt = np.clip(_ln(rng, 500, 0.4, n), 16, 4000).astype(int)
    if seed:
        prefill = (EXEC_FIXED_MS + EXEC_PER_TOKEN_MS * tokens) * noise
        out = np.full(n, 8)
    else:
        prefill = (15 + 0.03 * prompt) * noise
        out = np.where(busy, rng.integers(360, 440, n), np.clip(_ln(rng, 40, 0.3, n), 4, 120)).astype(int)
    gaps = [10.0 * np.exp(rng.normal(0, 0.1, int(k) - 1)) for k in out]
    decode = np.array([g.sum() for g in gaps])
    gateway = 50.0 * np.exp(rng.normal(0, 0.02, n)) if seed else np.zeros(n)
    ttft = gateway + queue + prefill
    e2e = ttft + decode + 0.5
    trace, span = _ids(rng, n)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, route), "model": np.full(n, "llama"),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": e2e, "ttft_ms": ttft,
        "itl_mean_ms": np.array([g.mean() for g in gaps]), "itl_p99_ms": np.array([np.quantile(g, 0.99) for g in gaps]),
        "itl_max_ms": np.array([g.max() for g in gaps]), "input_tokens": prompt, "output_tokens": out,
        "batch_size": tokens, "queue_depth": np.where(busy, 40, rng.poisson(2, n)).astype(float),
        "input_hash": np.array([f"p{i:08x}" for i in rng.integers(0, 2**31, n)]), "cold_start": np.zeros(n, bool),
    }  # fmt: skip
    durs: list[tuple[str, np.ndarray]] = [(N.STAGE_GATEWAY, gateway)] if seed else []
    durs += [(N.STAGE_QUEUE, queue), (N.STAGE_PREFILL, prefill), (N.STAGE_DECODE, decode)]
    owner = np.concatenate([np.full(len(g), i) for i, g in enumerate(gaps)])
    sc = Scenario(name, route, slo, None, plan[0])
    data = SynthData(
        sc, req, _layout(trace, start_ns, durs), {"trace_id": trace[owner], "gap_ms": np.concatenate(gaps)}
    )
    if seed:  # the HPA scales on CPU, as the seed says
        from stagescope.analysis.synth_fleet import hpa_series  # it builds on this module

        data.metrics += hpa_series(t0 // 10**6, dur_s, current=2.0, max_replicas=8.0)
    parts = {N.STAGE_GATEWAY: gateway, "queue": queue, "queue_normal": queue_normal, "prefill": prefill,
             "tokens": tokens, "noise": noise}  # fmt: skip
    if not seed:  # end to end: decode and the time outside any stage count
        parts.update(decode=decode, rest=np.full(n, 0.5))
    q = float(slo.split("<")[0].split("p")[-1]) / 100.0
    return MultiIncident(data, plan, q, parts, gaps)


def _predict(name: str, rng: np.random.Generator, n: int, t0: int, dur_s: float) -> MultiIncident:
    route, slo, plan = MULTI[name]
    rare = name == "predict-burst-faults"
    t = np.sort(rng.uniform(0, dur_s, n))
    start_ns = t0 + (t * 1e9).astype(np.int64)
    d = {
        N.STAGE_FEATURE_FETCH: _ln(rng, 4, 0.3, n), N.STAGE_PREPROCESS: _ln(rng, 3, 0.3, n),
        N.STAGE_BATCH_WAIT: rng.uniform(0, 5, n), "queue": rng.exponential(2, n), "compute": _ln(rng, 20, 0.15, n),
        N.STAGE_POSTPROCESS: _ln(rng, 1, 0.2, n), "egress": _ln(rng, 1, 0.2, n),
    }  # fmt: skip
    hashes = np.array([f"h{i:08x}" for i in rng.integers(0, 2**31, n)])
    u = rng.random(n)
    hot = u < 0.08
    hashes[hot] = np.array(["hot0", "hot1", "hot2"][: 2 if rare else 3])[rng.integers(0, 2 if rare else 3, int(hot.sum()))]
    large = (u >= 0.08) & (u < 0.14) if rare else hot  # rare: the large answers are other requests
    egress_normal = d["egress"].copy()
    d["compute"][hot] = _ln(rng, 350, 0.1, int(hot.sum())) if rare else _ln(rng, 380, 0.25, int(hot.sum()))
    d["egress"][large] += _ln(rng, 320, 0.2, int(large.sum()))
    queue_normal = d["queue"].copy()
    busy = np.zeros(n, bool)
    if rare:  # bursts the CPU-driven autoscaler answers late: 6 % of the time, four times a run
        busy = ((t / dur_s * 4) % 1.0) < 0.08
        d["queue"] = np.where(busy, _ln(rng, 1000, 0.05, n), d["queue"])
    _, first = np.unique(hashes, return_index=True)
    repeat = np.ones(n)
    repeat[first] = 0.0
    duration = np.sum(np.stack(list(d.values())), axis=0) + 0.3
    trace, span = _ids(rng, n)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, route), "model": np.full(n, "resnet"),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": duration,
        "batch_size": rng.integers(8, 17, n).astype(float), "queue_depth": np.where(busy, 40, rng.poisson(3, n)).astype(float),
        "input_hash": hashes, "cold_start": np.zeros(n, bool), "client_duration_ms": duration + _ln(rng, 1.5, 0.2, n),
    }  # fmt: skip
    stage = {"queue": N.STAGE_QUEUE, "compute": N.STAGE_COMPUTE, "egress": N.STAGE_EGRESS}
    spans = _layout(trace, start_ns, [(stage.get(k, k), v) for k, v in d.items()])
    sc = Scenario(name, route, slo, None, plan[0])
    parts = {**d, "egress_normal": egress_normal, "queue_normal": queue_normal, "repeat": repeat,
             "rest": np.full(n, 0.3)}  # fmt: skip
    return MultiIncident(SynthData(sc, req, spans), plan, 0.90 if rare else 0.99, parts)


def generate_multi(
    name: str, n: int = 2000, *, seed: int = 0, duration_s: float = 120.0, t0_ns: int = 1_764_460_800 * 10**9
) -> MultiIncident:
    """Synthesize ``n`` requests of multi-cause incident ``name`` (a key of :data:`MULTI`)."""
    rng = np.random.default_rng(seed)
    if MULTI[name][0] == PREDICT:
        return _predict(name, rng, n, t0_ns, duration_s)
    return _llm(name, rng, n, t0_ns, duration_s)
