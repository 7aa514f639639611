"""SYNTHETIC fleet incidents: one LLM route, one cause each, the truth after the lever known.

Each incident is a streaming route (stages queue, prefill, decode; token gaps) with the engine's and
the cluster's own metrics as they are scraped (vLLM's families, kube-state-metrics' HPA series), all
synthetic (service ``synthetic-service``, model ``llama``). Each is the incident one lever alone fires
on; :meth:`FleetIncident.true_quantile` answers what the SLO quantile really is after it, from the
generator's physics. Deterministic for a seed.

* ``fleet-hpa-on-cpu`` (TTFT p95 < 200 ms): in bursts (20 % of the time, four a run) requests wait
  ~200 ms for replicas the HPA does not add: it scales on CPU utilization (target 70 %), 2 replicas
  of at most 6. Truth after scaling on queue depth: the bursts queue like the rest.
* ``fleet-overcommitted`` (TTFT p95 < 200 ms): in bursts the engine admits ~96 streams while its KV
  cache (2,500 blocks of 16 tokens) holds ~60 of the tail's length; it preempts (20 per 5 s scrape),
  the KV cache is full, and ``gpu_memory_utilization`` is already 0.95: no memory to give.
  concurrency-limit has no effect model (truth not asked).
* ``fleet-kv-headroom``: the same preemptions with ``gpu_memory_utilization`` 0.80 (memory to give)
  and no block count exported. Truth after KV headroom: the bursts queue like the rest.
* ``fleet-prefix-spread`` (TTFT p95 < 300 ms): a quarter of the requests send one of 12 shared 4,000
  token prompts; three replicas take requests round-robin; replica 0 keeps the shared prefixes and
  hits them, replicas 1 and 2 evict them before their next use and prefill them again (prefix caching
  on everywhere). Truth after KV-cache-aware routing: every repeat hits (prefill ~22 ms).
* ``fleet-prefix-off``: the same shared prompts on one replica with prefix caching off. Truth after
  prefix caching: every repeat hits.
* ``fleet-long-outputs`` (end to end p95 < 4.5 s, 1.6 x the median): 6 % of requests generate three times
  the tokens at the same ~22 ms per token. Truth after an output budget of ``C`` tokens: each request
  keeps its first ``C - 1`` gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth_multi import _ids, _layout, _ln
from stagescope.analysis.synth_scenarios import GENERATE, Scenario, SynthData

__all__ = ["FLEET", "FleetIncident", "generate_fleet", "hpa_series"]

FLEET: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("fleet-hpa-on-cpu", GENERATE, "ttft:p95<200ms", N.STAGE_QUEUE, N.LEVER_SCALE_ON_QUEUE_DEPTH),
        Scenario("fleet-overcommitted", GENERATE, "ttft:p95<200ms", N.STAGE_QUEUE, N.LEVER_CONCURRENCY_LIMIT),
        Scenario("fleet-kv-headroom", GENERATE, "ttft:p95<200ms", N.STAGE_QUEUE, N.LEVER_KV_CACHE_HEADROOM),
        Scenario("fleet-prefix-spread", GENERATE, "ttft:p95<300ms", N.STAGE_PREFILL, N.LEVER_KV_CACHE_AWARE_ROUTING),
        Scenario("fleet-prefix-off", GENERATE, "ttft:p95<300ms", N.STAGE_PREFILL, N.LEVER_PREFIX_CACHING),
        Scenario("fleet-long-outputs", GENERATE, "p95<4500ms", N.STAGE_DECODE, N.LEVER_CAP_OUTPUT_TOKENS),
    )
}
MODEL = "llama"
SHARED_TOKENS = 4000
#: Scrape interval of the synthetic metrics (s).
SCRAPE_S = 5


@dataclass
class FleetIncident:
    """One incident: its synthetic data, each request's components (ms) and token gaps."""

    data: SynthData
    quantile: float
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    gaps: list[np.ndarray] = field(default_factory=list)

    @property
    def slo(self) -> str:
        return self.data.scenario.slo

    def true_quantile(self, setting: float | None = None) -> float:
        """The SLO quantile (ms) after the incident's own lever (``setting``: the output budget in tokens
        for cap-output-tokens), from the generator's physics."""
        p = {k: v.copy() for k, v in self.parts.items()}
        lever = self.data.scenario.lever
        if lever in (N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_KV_CACHE_HEADROOM, N.LEVER_CONCURRENCY_LIMIT):
            p["queue"] = p["queue_normal"]
        elif lever in (N.LEVER_KV_CACHE_AWARE_ROUTING, N.LEVER_PREFIX_CACHING):
            p["prefill"] = np.where(p["repeat"] > 0, p["prefill_hit"], p["prefill"])
        elif lever == N.LEVER_CAP_OUTPUT_TOKENS and setting is not None:
            p["decode"] = np.array([g[: int(setting) - 1].sum() for g in self.gaps])
        ttft = p["queue"] + p["prefill"]
        value = ttft if self.data.scenario.slo.startswith("ttft") else ttft + p["decode"] + 0.5
        return float(np.quantile(value, self.quantile))


def hpa_series(
    t0_ms: int, duration_s: float, *, metric: str = "cpu", target_type: str = "utilization", target: float = 70.0,
    current: float = 2.0, max_replicas: float = 6.0, hpa: str = "llm", every_s: int = 10,
) -> list[tuple[str, dict[str, str], float, int]]:  # fmt: skip
    """kube-state-metrics' HPA series of one autoscaler, scraped every ``every_s`` (SYNTHETIC): its
    target (``metric_name`` / ``metric_target_type`` labels, kubernetes/kube-state-metrics
    docs/horizontalpodautoscaler-metrics.md), max and min replicas, current and desired replicas."""
    out = []
    base = {N.KSM_LABEL_HPA: hpa, "namespace": "serving"}
    for s in range(0, int(duration_s) + 1, every_s):
        ts = t0_ms + s * 1000
        tgt = {**base, N.KSM_LABEL_METRIC_NAME: metric, N.KSM_LABEL_METRIC_TARGET_TYPE: target_type}
        out += [
            (N.KSM_HPA_SPEC_TARGET_METRIC, tgt, target, ts), (N.KSM_HPA_SPEC_MAX_REPLICAS, base, max_replicas, ts),
            (N.KSM_HPA_SPEC_MIN_REPLICAS, base, 1.0, ts), (N.KSM_HPA_CURRENT_REPLICAS, base, current, ts),
            (N.KSM_HPA_DESIRED_REPLICAS, base, current, ts),
        ]  # fmt: skip
    return out


def _vllm_series(
    t0_ms: int, dur_s: float, busy_at: np.ndarray, *, n: int, preempt_per_scrape: float = 20.0,
    cache_info: dict[str, str] | None = None, instance: str = "10.0.0.1:8000",
) -> list[tuple[str, dict[str, str], float, int]]:  # fmt: skip
    """One vLLM engine's scrapes every SCRAPE_S (SYNTHETIC): running / waiting / KV-cache gauges high
    while ``busy_at(second)``, preemptions counted then, the queue-time histogram's count (requests),
    and ``vllm:cache_config_info`` with ``cache_info`` as labels."""
    lab = {N.VLLM_LABEL_MODEL: MODEL, N.VLLM_LABEL_ENGINE: "0", "instance": instance}
    out: list[tuple[str, dict[str, str], float, int]] = []
    pre = 0.0
    steps = list(range(0, int(dur_s) + 1, SCRAPE_S))
    for k, s in enumerate(steps):
        ts = t0_ms + s * 1000
        busy = bool(busy_at[min(s, len(busy_at) - 1)])
        pre += preempt_per_scrape if busy and k else 0.0
        out += [
            (N.VLLM_NUM_RUNNING, lab, 96.0 if busy else 8.0, ts), (N.VLLM_NUM_WAITING, lab, 30.0 if busy else 0.0, ts),
            (N.VLLM_KV_CACHE_USAGE, lab, 0.99 if busy else 0.5, ts), (N.VLLM_NUM_PREEMPTIONS, lab, pre, ts),
            (f"{N.VLLM_QUEUE_TIME}_count", lab, n * k / (len(steps) - 1), ts),
            (f"{N.VLLM_QUEUE_TIME}_sum", lab, 0.01 * n * k / (len(steps) - 1), ts),
        ]  # fmt: skip
    info = {"block_size": "16", "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9", **(cache_info or {})}
    out.append((N.VLLM_CACHE_CONFIG_INFO, info, 1.0, t0_ms))
    return out


def _prefix_counters(
    t0_ms: int, dur_s: float, replica: np.ndarray, prompt: np.ndarray, cached: np.ndarray, *, enabled: bool
) -> list[tuple[str, dict[str, str], float, int]]:
    """Each replica's prefix-cache counters (tokens queried, tokens hit) and request count at the start
    and the end of the run, and its cache_config_info (SYNTHETIC)."""
    out: list[tuple[str, dict[str, str], float, int]] = []
    for r in np.unique(replica):
        lab = {N.VLLM_LABEL_MODEL: MODEL, N.VLLM_LABEL_ENGINE: "0", "instance": f"10.0.0.{int(r) + 1}:8000"}
        m = replica == r
        for ts, f in ((t0_ms, 0.0), (t0_ms + int(dur_s * 1000), 1.0)):
            out += [
                (N.VLLM_PREFIX_CACHE_QUERIES, lab, f * float(prompt[m].sum()), ts),
                (N.VLLM_PREFIX_CACHE_HITS, lab, f * float(cached[m].sum()), ts),
                (f"{N.VLLM_QUEUE_TIME}_count", lab, f * float(m.sum()), ts),
                (f"{N.VLLM_QUEUE_TIME}_sum", lab, f * 0.005 * float(m.sum()), ts),
            ]  # fmt: skip
        info = {"block_size": "16", "enable_prefix_caching": str(enabled), "gpu_memory_utilization": "0.9",
                "instance": lab["instance"]}  # fmt: skip
        out.append((N.VLLM_CACHE_CONFIG_INFO, info, 1.0, t0_ms))
    return out


def generate_fleet(
    name: str, n: int = 1500, *, seed: int = 0, duration_s: float = 120.0, t0_ns: int = 1_764_460_800 * 10**9
) -> FleetIncident:
    """Synthesize ``n`` requests of fleet incident ``name`` (a key of :data:`FLEET`)."""
    sc = FLEET[name]
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, duration_s, n))
    start_ns = t0_ns + (t * 1e9).astype(np.int64)
    t0_ms = t0_ns // 10**6
    queued = name in ("fleet-hpa-on-cpu", "fleet-overcommitted", "fleet-kv-headroom")
    # the queue incidents' prompts vary little, so that the tail is the queue's alone
    prompt = np.clip(_ln(rng, 600, 0.1 if queued else 0.4, n), 32, 4000).astype(int)
    out = np.clip(_ln(rng, 40, 0.3, n), 4, 120).astype(int)
    per_token = 10.0
    queue_normal = rng.exponential(3.0, n)
    queue = queue_normal.copy()
    busy = ((t / duration_s * 4) % 1.0) < 0.2  # four bursts, 20 % of the time
    noise = np.exp(rng.normal(0, 0.03, n))
    repeat = np.zeros(n)
    prefill_hit = np.zeros(n)
    metrics: list[tuple[str, dict[str, str], float, int]] = []
    hashes = np.array([f"p{i:08x}" for i in rng.integers(0, 2**31, n)])
    if queued:
        queue = np.where(busy, 200.0 * np.exp(rng.normal(0, 0.03, n)), queue_normal)
        sec_busy = ((np.arange(int(duration_s) + 1) / duration_s * 4) % 1.0) < 0.2
        if name == "fleet-hpa-on-cpu":
            metrics += hpa_series(t0_ms, duration_s)
        else:
            info = ({"gpu_memory_utilization": "0.95", "num_gpu_blocks": "2500"} if name == "fleet-overcommitted"
                    else {"gpu_memory_utilization": "0.8"})  # fmt: skip
            metrics += _vllm_series(t0_ms, duration_s, sec_busy, n=n, cache_info=info)
    prefill = (20.0 + 0.1 * prompt) * noise
    if name in ("fleet-prefix-spread", "fleet-prefix-off"):
        shared = rng.random(n) < 0.25
        doc = rng.integers(0, 12, n)
        hashes[shared] = np.array([f"shared-doc-{d:02d}" for d in doc[shared]])
        prompt[shared] = SHARED_TOKENS
        replica = np.arange(n) % 3 if name == "fleet-prefix-spread" else np.zeros(n, int)
        _, first = np.unique(hashes, return_index=True)
        is_first = np.zeros(n, bool)
        is_first[first] = True
        repeat = (shared & ~is_first).astype(float)
        prefill_hit = (20.0 + 0.1 * 16) * noise  # the last block is computed again
        seen0: set[str] = set()
        hit = np.zeros(n, bool)
        for i in range(n):  # replica 0 keeps the shared prefixes; 1 and 2 evict them before their next use
            if shared[i] and replica[i] == 0 and name == "fleet-prefix-spread":
                hit[i] = hashes[i] in seen0
                seen0.add(str(hashes[i]))
        prefill = np.where(hit, prefill_hit, (20.0 + 0.1 * prompt) * noise)
        cached = np.where(hit, prompt - 16, 0)
        metrics += _prefix_counters(t0_ms, duration_s, replica, prompt, cached, enabled=name == "fleet-prefix-spread")
    if name == "fleet-long-outputs":
        out = np.clip(_ln(rng, 120, 0.3, n), 8, 1000).astype(int)
        long = rng.random(n) < 0.06
        out[long] *= 3
        per_token = 22.0
    gaps = [per_token * np.exp(rng.normal(0, 0.08, int(k) - 1)) for k in out]
    decode = np.array([g.sum() for g in gaps])
    ttft = queue + prefill
    e2e = ttft + decode + 0.5
    trace, span = _ids(rng, n)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, GENERATE), "model": np.full(n, MODEL),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": e2e, "ttft_ms": ttft,
        "itl_mean_ms": np.array([g.mean() for g in gaps]), "itl_p99_ms": np.array([np.quantile(g, 0.99) for g in gaps]),
        "itl_max_ms": np.array([g.max() for g in gaps]), "input_tokens": prompt, "output_tokens": out,
        "batch_size": 8.0 + rng.integers(-2, 3, n), "input_hash": hashes, "cold_start": np.zeros(n, bool),
        "queue_depth": np.where(busy & (queue > 50), 40, rng.poisson(2, n)).astype(float),
    }  # fmt: skip
    durs = [(N.STAGE_QUEUE, queue), (N.STAGE_PREFILL, prefill), (N.STAGE_DECODE, decode)]
    owner = np.concatenate([np.full(len(g), i) for i, g in enumerate(gaps)])
    data = SynthData(sc, req, _layout(trace, start_ns, durs),
                     {"trace_id": trace[owner], "gap_ms": np.concatenate(gaps)}, metrics)  # fmt: skip
    parts = {"queue": queue, "queue_normal": queue_normal, "prefill": prefill, "prefill_hit": prefill_hit,
             "repeat": repeat, "decode": decode}  # fmt: skip
    return FleetIncident(data, 0.95, parts, gaps)
