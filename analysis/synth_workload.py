"""Synthetic incidents of the workload levers (issue 18), each with its ground truth (stage, lever)
and the generator's own physics for what the lever would leave (:meth:`WorkloadIncident.true_quantile`).

All data here is SYNTHETIC (service ``synthetic-service``, as analysis.synth_scenarios) and
deterministic for a seed:

* ``llm-prefill-interference`` (ITL p99): a SIMULATED engine steps its running streams one step at a
  time; a step costs ``8 + 0.7 * running`` ms (noise 8 %) plus 0.12 ms per prompt token of the chunk
  it carries (one prefill at a time, 512-token chunks: chunked prefill on). Chat requests carry ~100
  prompt tokens, one in fifty (one in 35 unchunked) is a long-context request of 6,000-9,000 tokens whose prefill runs over
  ~15 steps beside the decodes: those steps' gaps spike. Truth after separate pools: the same gaps
  without the chunk's cost. With ``chunk_tokens=None`` (``llm-prefill-interference-unchunked``) a
  prompt runs whole in one step (chunked prefill off): the lever is chunked prefill.
* The same SIMULATED engine with other physics (:class:`EnginePhysics`, :data:`PHYSICS_VARIANTS`, not
  in :data:`WORKLOAD`: no effect model is checked on them): ``llm-short-prompts-large-batch`` (ITL p99):
  ~16-token prompts (8-32), a step of ``8 + 1.0 * running`` ms (0.12 ms per prompt token as above),
  requests admitted on arrival (the prefill stage holds the wait for the request's prompt step, as
  llama.cpp's gateway and the reference engine measure it), arriving in groups of 12 within 2 ms (a
  client fanning a task out into parallel calls): a group's prompts are prefilled one per step, the
  running batch climbs by 12 and the steps after it are slow for the batch they carry. Slow gaps then
  overlap prefills (92 % vs 29 % of the normal gaps, seed 1) and a slow gap is a fraction of the
  prefill window (which holds the wait), though a prompt adds ~2 ms to a step: truth (decode,
  reduce-batch-tokens). ``llm-chunk-sized-prompts`` (ITL p99): every prompt 150-256 tokens (at most
  one 256-token chunk: ~24 ms, one step with chunking on or off) beside a step of ``8 + 0.3 *
  running`` ms: the steps that carry a prompt are twice the others; chunked prefill changes nothing,
  a separate prefill pool takes the prompt off the step: truth (decode, separate-prefill-decode),
  the gaps without their prompt's cost (``true_quantile``).
  Every interference incident records each gap's running batch (``stagescope.itl.running``).
* ``llm-long-contexts`` (TTFT p95): prefill ``15 + 0.12 * prompt`` ms (noise 5 %); one request in ten
  carries a 5,000-8,000-token context; chunked prefill is on, so no request waits behind it. Truth
  with prompts capped at ``c``: the same prefill at ``min(prompt, c)``.
* ``llm-static-batches`` (TTFT p95): a SIMULATED static batcher: when the engine is free, the requests
  waiting (at most 32; the first waits at least 50 ms for company) form a batch that runs until its
  longest output; a request's batch wait is arrival to its batch's start. Truth with continuous
  batching: each request waits for the step in progress (uniform in one step) instead.
* ``predict-large-model`` (p99): compute is the large model's (lognormal, median 150 ms); the service
  shadows a small model (median 30 ms) and marks ``escalated`` the 15 % of requests (more of the slow
  ones) it would hand to the large one; its exported variant figures: INT8 loses 3 points (over the
  SLO's 1-point budget), the cascade 0.4. Truth: small model's own time, plus the large one's when
  escalated.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from stagescope import names as N
from stagescope.analysis import synth_scenarios as S
from stagescope.slo import SLO, parse_slo

__all__ = ["PHYSICS_VARIANTS", "WORKLOAD", "EnginePhysics", "WorkloadIncident", "generate", "to_tables"]

#: name -> (scenario: route, SLO, true stage, true lever; the SLO's quality budget in points or None).
WORKLOAD: dict[str, tuple[S.Scenario, float | None]] = {
    sc.name: (sc, budget)
    for sc, budget in (
        (S.Scenario("llm-prefill-interference", S.GENERATE, "itl:p99<60ms", N.STAGE_DECODE,
                    N.LEVER_SEPARATE_PREFILL_DECODE), None),
        (S.Scenario("llm-prefill-interference-unchunked", S.GENERATE, "itl:p99<60ms", N.STAGE_DECODE,
                    N.LEVER_CHUNKED_PREFILL), None),
        (S.Scenario("llm-long-contexts", S.GENERATE, "ttft:p95<500ms", N.STAGE_PREFILL, N.LEVER_CAP_PROMPT_TOKENS),
         None),
        (S.Scenario("llm-static-batches", S.GENERATE, "ttft:p95<400ms", N.STAGE_BATCH_WAIT,
                    N.LEVER_CONTINUOUS_BATCHING), None),
        (S.Scenario("predict-large-model", S.PREDICT, "p99<300ms", N.STAGE_COMPUTE, N.LEVER_CASCADE_SMALL_MODEL),
         1.0),
    )
}  # fmt: skip

PER_TOKEN_MS = 0.12  # prefill ms per prompt token (the SIMULATED engine's)


@dataclass(frozen=True)
class EnginePhysics:
    """The SIMULATED step engine of the interference incidents (defaults: ``llm-prefill-interference``).
    A step costs ``step_ms + per_seq_ms * running`` ms (noise 8 %) plus PER_TOKEN_MS per prompt token of
    the one prefill chunk it carries (``chunk_tokens`` tokens at most, None: the whole prompt). Chat
    prompts are lognormal around ``prompt_tokens`` (sigma 0.4, clipped to ``prompt_range``); one request
    in ``long_every`` (None: none) carries 6,000-9,000 tokens. ``admit_at_arrival``: the prefill stage
    starts at arrival (it holds the wait for the request's prompt step), else when its prefill starts.
    Arrivals are uniform over the run, in groups of ``group`` requests within 2 ms of each other (a
    client fanning out one task into parallel calls)."""

    chunk_tokens: int | None = 512
    prompt_tokens: float = 100.0
    prompt_range: tuple[int, int] = (8, 400)
    long_every: int | None = 50
    step_ms: float = 8.0
    per_seq_ms: float = 0.7
    admit_at_arrival: bool = False
    group: int = 1


#: Engines of other physics on the interference generator, each with its truth (module docstring).
PHYSICS_VARIANTS: dict[str, tuple[S.Scenario, EnginePhysics]] = {
    "llm-short-prompts-large-batch": (
        S.Scenario("llm-short-prompts-large-batch", S.GENERATE, "itl:p99<48ms", N.STAGE_DECODE,
                   N.LEVER_REDUCE_BATCH_TOKENS),
        EnginePhysics(prompt_tokens=16.0, prompt_range=(8, 32), long_every=None, per_seq_ms=1.0,
                      admit_at_arrival=True, group=12),
    ),
    "llm-chunk-sized-prompts": (
        S.Scenario("llm-chunk-sized-prompts", S.GENERATE, "itl:p99<30ms", N.STAGE_DECODE,
                   N.LEVER_SEPARATE_PREFILL_DECODE),
        EnginePhysics(prompt_tokens=200.0, prompt_range=(150, 256), long_every=None, per_seq_ms=0.3),
    ),
}  # fmt: skip
MAX_STATIC_BATCH = 32  # the SIMULATED static batcher's largest batch


@dataclass
class WorkloadIncident:
    """One incident: its data, the SLO (with its quality budget) and the parts its truth is built from."""

    data: S.SynthData
    slo: SLO
    parts: dict[str, Any] = field(default_factory=dict)

    def true_quantile(self, setting: float | None = None) -> float:
        """The SLO quantile (ms) after the incident's own lever, from the generator's physics
        (``setting``: the prompt cap in tokens for ``cap-prompt-tokens``; unused otherwise)."""
        p, q, name = self.parts, self.slo.objective, self.data.scenario.name
        if name.startswith("llm-prefill-interference") or name == "llm-chunk-sized-prompts":
            if name.endswith("unchunked"):  # chunked: each prefill step carries at most 256 tokens
                return float(np.quantile(p["base"] + PER_TOKEN_MS * np.minimum(p["chunk"], 256), q))
            return float(np.quantile(p["base"], q))
        if name == "llm-long-contexts":
            assert setting is not None
            pre = (15 + PER_TOKEN_MS * np.minimum(p["prompt"], setting)) * p["noise"]
            return float(np.quantile(p["queue"] + pre, q))
        if name == "llm-static-batches":
            return float(np.quantile(p["prefill"] + p["join_wait"], q))
        return float(np.quantile(p["rest"] + p["small"] + np.where(p["escalated"], p["large"], 0.0), q))


def _llm_data(
    sc: S.Scenario,
    rng: np.random.Generator,
    t0: int,
    t: np.ndarray,
    cols: dict[str, Any],
    stages: list[tuple[str, np.ndarray]],
    gaps: list[np.ndarray],
    running: np.ndarray,
) -> S.SynthData:
    """SynthData of a streaming route: stages laid end to end from each arrival (``stages``: name and
    durations), every stream's gaps in order."""
    n = len(t)
    start_ns = t0 + (t * 1e9).astype(np.int64)
    trace, span = S._ids(rng, n)
    decode = np.array([g.sum() for g in gaps])
    first = sum(d for _, d in stages)
    itl = np.array([(g.mean(), np.quantile(g, 0.99), g.max()) if len(g) else (0.0, 0.0, 0.0) for g in gaps])
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(n, S.GENERATE), "model": np.full(n, "llama"),
        "status_code": np.full(n, 200), "start_unix_ns": start_ns, "duration_ms": first + decode + 0.5,
        "ttft_ms": first, "itl_mean_ms": itl[:, 0], "itl_p99_ms": itl[:, 1], "itl_max_ms": itl[:, 2],
        "batch_size": running, "queue_depth": rng.poisson(2, n).astype(float),
        "input_hash": np.array([f"p{i:08x}" for i in rng.integers(0, 2**31, n)]), "cold_start": np.zeros(n, bool),
        **cols,
    }  # fmt: skip
    names = [s for s, _ in stages] + [N.STAGE_DECODE]
    durs = np.stack([d for _, d in stages] + [decode], axis=1)
    bounds = np.concatenate([np.zeros((n, 1)), np.cumsum(durs, axis=1)], axis=1)
    k = len(names)
    st = {
        "trace_id": np.repeat(trace, k), "stage": np.tile(np.array(names), n),
        "start_unix_ns": (np.repeat(start_ns, k) + bounds[:, :k].ravel() * 1e6).astype(np.int64),
        "end_unix_ns": (np.repeat(start_ns, k) + bounds[:, 1:].ravel() * 1e6).astype(np.int64),
    }  # fmt: skip
    owner = np.concatenate([np.full(len(g), i) for i, g in enumerate(gaps)])
    data = S.SynthData(sc, req, st, {"trace_id": trace[owner], "gap_ms": np.concatenate(gaps)})
    for sec in range(int(t.max()) + 1):
        lo, hi = np.searchsorted(start_ns, [t0 + sec * 10**9, t0 + (sec + 1) * 10**9])
        if hi > lo:
            ts = t0 // 10**6 + sec * 1000
            data.metrics.append(
                (N.VLLM_NUM_RUNNING, {N.VLLM_LABEL_MODEL: "llama"}, float(running[lo:hi].mean()), ts)
            )
    return data


def _arrivals(rng: np.random.Generator, n: int, dur_s: float, ph: EnginePhysics) -> np.ndarray:
    """Sorted arrival times (s), uniform over the run, in groups of ``ph.group`` within 2 ms."""
    if ph.group <= 1:
        return np.sort(rng.uniform(0, dur_s, n))
    m = -(-n // ph.group)
    t = np.repeat(rng.uniform(0, dur_s, m), ph.group) + rng.uniform(0, 0.002, m * ph.group)
    return np.sort(t[:n])


def _interference(
    sc: S.Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float, ph: EnginePhysics
) -> WorkloadIncident:
    """The SIMULATED engine of ``llm-prefill-interference`` (module docstring), step by step."""
    chunk_tokens = ph.chunk_tokens
    t = _arrivals(rng, n, dur_s, ph)
    prompt = np.clip(S._ln(rng, ph.prompt_tokens, 0.4, n), *ph.prompt_range).astype(int)
    if ph.long_every is not None:
        long_idx = np.arange(ph.long_every // 2, n, ph.long_every)
        prompt[long_idx] = rng.integers(6000, 9000, len(long_idx))
    out = np.clip(S._ln(rng, 40, 0.3, n), 8, 120).astype(int)
    waiting: deque[int] = deque()
    running: dict[int, int] = {}  # stream -> tokens still to generate
    gaps: list[list[float]] = [[] for _ in range(n)]
    base: list[list[float]] = [[] for _ in range(n)]
    chunk_of: list[list[float]] = [[] for _ in range(n)]
    run_of: list[list[float]] = [[] for _ in range(n)]  # streams decoding in each gap's step
    pf_start, first_tok, run_at = np.zeros(n), np.zeros(n), np.zeros(n)
    now, nxt, pre, left = 0.0, 0, -1, 0
    while nxt < n or waiting or running or pre >= 0:
        while nxt < n and t[nxt] * 1000 <= now:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running and pre < 0:
            now = t[nxt] * 1000
            continue
        if pre < 0 and waiting:
            pre = waiting.popleft()
            pf_start[pre], left = now, int(prompt[pre])
        chunk = 0
        if pre >= 0:
            chunk = left if chunk_tokens is None else min(chunk_tokens, left)
            left -= chunk
        b = (ph.step_ms + ph.per_seq_ms * len(running)) * float(np.exp(rng.normal(0, 0.08)))
        step = b + PER_TOKEN_MS * chunk
        now += step
        batch = len(running)
        for i in list(running):
            gaps[i].append(step)
            base[i].append(b)
            chunk_of[i].append(chunk)
            run_of[i].append(batch)
            running[i] -= 1
            if running[i] <= 0:
                del running[i]
        if pre >= 0 and left == 0:
            first_tok[pre], run_at[pre] = now, len(running)
            running[pre] = int(out[pre]) - 1
            pre = -1
    admitted = t * 1000 if ph.admit_at_arrival else pf_start
    queue, prefill = admitted - t * 1000, first_tok - admitted
    g = [np.array(x) for x in gaps]
    data = _llm_data(sc, rng, t0, t, {"input_tokens": prompt, "output_tokens": out},
                     [(N.STAGE_QUEUE, queue), (N.STAGE_PREFILL, prefill)], g, run_at + 1)  # fmt: skip
    data.gaps["running"] = np.concatenate([np.array(x, dtype=float) for x in run_of])
    parts = {
        "base": np.concatenate([np.array(x) for x in base]),
        "chunk": np.concatenate([np.array(x) for x in chunk_of]),
    }
    return WorkloadIncident(data, parse_slo(sc.slo)[0], parts)


def _long_contexts(
    sc: S.Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float
) -> WorkloadIncident:
    t = np.sort(rng.uniform(0, dur_s, n))
    prompt = np.clip(S._ln(rng, 500, 0.5, n), 16, 3000).astype(int)
    rag = rng.random(n) < 0.1
    prompt[rag] = rng.integers(5000, 8000, int(rag.sum()))
    out = np.clip(S._ln(rng, 40, 0.4, n), 4, 160).astype(int)
    queue = rng.exponential(5, n)
    noise = np.exp(rng.normal(0, 0.05, n))
    prefill = (15 + PER_TOKEN_MS * prompt) * noise
    running = np.full(n, 8.0) + rng.integers(-2, 3, n)
    gaps = [(8 + 0.7 * running[i]) * np.exp(rng.normal(0, 0.08, out[i] - 1)) for i in range(n)]
    data = _llm_data(sc, rng, t0, t, {"input_tokens": prompt, "output_tokens": out},
                     [(N.STAGE_QUEUE, queue), (N.STAGE_PREFILL, prefill)], gaps, running)  # fmt: skip
    return WorkloadIncident(data, parse_slo(sc.slo)[0], {"prompt": prompt, "noise": noise, "queue": queue})


def _static_batches(
    sc: S.Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float
) -> WorkloadIncident:
    t = np.sort(rng.uniform(0, dur_s, n)) * 1000
    prompt = np.clip(S._ln(rng, 500, 0.5, n), 16, 3000).astype(int)
    out = np.clip(S._ln(rng, 20, 0.4, n), 4, 60).astype(int)
    prefill = (15 + PER_TOKEN_MS * prompt) * np.exp(rng.normal(0, 0.05, n))
    wait, size, step_of = np.zeros(n), np.zeros(n), np.zeros(n)
    gaps: list[np.ndarray] = [np.zeros(0)] * n
    free, i = 0.0, 0
    while i < n:
        close = max(free, t[i] + 50.0)
        j = i
        while j < n and j - i < MAX_STATIC_BATCH and t[j] <= close:
            j += 1
        members = np.arange(i, j)
        step = 8 + 0.7 * len(members)
        for k in members:
            gaps[k] = step * np.exp(rng.normal(0, 0.08, out[k] - 1))
        wait[members], size[members], step_of[members] = close - t[members], len(members), step
        free = close + float(prefill[members].max()) + max(float(gaps[k].sum()) for k in members)
        i = j
    join_wait = rng.uniform(0, 1, n) * step_of  # continuous: the step in progress
    data = _llm_data(sc, rng, t0, t / 1000, {"input_tokens": prompt, "output_tokens": out},
                     [(N.STAGE_BATCH_WAIT, wait), (N.STAGE_PREFILL, prefill)], gaps, size)  # fmt: skip
    return WorkloadIncident(data, parse_slo(sc.slo)[0], {"prefill": prefill, "join_wait": join_wait})


#: What the SYNTHETIC service says it measured about its variants (batch seconds at 1 and 32 rows,
#: eval-set accuracy): INT8 costs 3 points, the cascade (small model, escalations to the large) 0.4.
LARGE_VARIANTS = {
    N.VARIANT_SERVING: ({1: 0.150, 32: 1.60}, 0.9120),
    N.LEVER_QUANTIZE: ({1: 0.080, 32: 0.85}, 0.8820),
    N.LEVER_CASCADE_SMALL_MODEL: ({1: 0.030, 32: 0.32}, 0.9080),
}


def _large_model(sc: S.Scenario, rng: np.random.Generator, n: int, t0: int, dur_s: float) -> WorkloadIncident:
    base = S._predict(dataclasses.replace(S.SCENARIOS["healthy"], name=sc.name), rng, n, t0, dur_s)
    data = dataclasses.replace(base, scenario=sc)
    st = data.stages
    comp = st["stage"] == N.STAGE_COMPUTE
    old = (st["end_unix_ns"][comp] - st["start_unix_ns"][comp]) / 1e6
    large = S._ln(rng, 150, 0.4, n)
    small = S._ln(rng, 30, 0.3, n)
    # the small model hands over the hard inputs: more of the slow ones escalate
    escalated = rng.random(n) < np.clip(0.05 + 0.25 * (large > 200), 0, 1)
    shift = ((large - old) * 1e6).astype(np.int64)  # later stages of each request move by the change
    order = {tid: k for k, tid in enumerate(data.requests["trace_id"])}
    idx = np.array([order[x] for x in st["trace_id"]])
    comp_end = np.zeros(n, dtype=np.int64)
    comp_end[idx[comp]] = st["end_unix_ns"][comp]
    later = st["start_unix_ns"] >= comp_end[idx] - 1000
    st["end_unix_ns"] = np.where(comp, st["end_unix_ns"] + shift[idx], st["end_unix_ns"])
    st["start_unix_ns"] = np.where(later & ~comp, st["start_unix_ns"] + shift[idx], st["start_unix_ns"])
    st["end_unix_ns"] = np.where(later & ~comp, st["end_unix_ns"] + shift[idx], st["end_unix_ns"])
    req = data.requests
    req["duration_ms"] = req["duration_ms"] + (large - old)
    req["client_duration_ms"] = req["client_duration_ms"] + (large - old)
    req["escalated"] = escalated
    req["batch_size"] = np.ones(n)  # one request per model call (the measured times at 1 row are per request)
    S._variant_metrics(data, t0, LARGE_VARIANTS, eval_samples=2000.0)
    slo = dataclasses.replace(parse_slo(sc.slo)[0], quality_budget=WORKLOAD[sc.name][1])
    parts = {"rest": req["duration_ms"] - large, "small": small, "large": large, "escalated": escalated}
    return WorkloadIncident(data, slo, parts)


def generate(
    name: str, n: int = 1500, *, seed: int = 0, duration_s: float = 120.0, t0_ns: int = 1_764_460_800 * 10**9
) -> WorkloadIncident:
    """Synthesize ``n`` requests of the workload incident ``name`` (a key of :data:`WORKLOAD` or of
    :data:`PHYSICS_VARIANTS`)."""
    rng = np.random.default_rng(seed)
    if name in PHYSICS_VARIANTS:
        sc, ph = PHYSICS_VARIANTS[name]
        return _interference(sc, rng, n, t0_ns, duration_s, ph)
    sc = WORKLOAD[name][0]
    if name == "llm-prefill-interference":
        return _interference(sc, rng, n, t0_ns, duration_s, EnginePhysics())
    if name == "llm-prefill-interference-unchunked":  # one slow step per long prompt, so more of them
        return _interference(sc, rng, n, t0_ns, duration_s, EnginePhysics(chunk_tokens=None, long_every=35))
    if name == "llm-long-contexts":
        return _long_contexts(sc, rng, n, t0_ns, duration_s)
    if name == "llm-static-batches":
        return _static_batches(sc, rng, n, t0_ns, duration_s)
    return _large_model(sc, rng, n, t0_ns, duration_s)


def to_tables(con: duckdb.DuckDBPyConnection, inc: WorkloadIncident) -> None:
    """The pinned relations of the incident (analysis.synth_scenarios.to_tables), and the requests'
    ``escalated`` where the incident marks it."""
    S.to_tables(con, inc.data)
    esc = inc.data.requests.get("escalated")
    if esc is not None:
        import pyarrow as pa

        con.register("esc_tbl", pa.table({"trace_id": inc.data.requests["trace_id"], "escalated": esc}))
        con.execute("CREATE OR REPLACE TABLE requests AS SELECT r.*, e.escalated FROM requests r "
                    "LEFT JOIN esc_tbl e USING (trace_id)")  # fmt: skip
        con.unregister("esc_tbl")
