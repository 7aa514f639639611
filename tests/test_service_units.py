"""The reference service's parts without a server: scenario data, settings, the simulated accelerator's
latency model, the LLM engine's scheduling, the feature-store latency model, the app in-process."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.instrumentation.record import RequestRecord
from stagescope.service.backends import SimulatedAccelerator, SimulatedBackend, SimulatedGpuCollector
from stagescope.service.features import LatencyModel
from stagescope.service.llm import EngineFull, LLMEngine
from stagescope.service.model import ResultCache, burn_cpu, hash_fraction
from stagescope.service.scenarios import SCENARIOS, get_scenario, settings_for
from stagescope.service.settings import Settings, apply_overrides, parse_assignments

PINNED = {
    "healthy": (None, None),
    "slow-feature-store": ("feature_fetch", "cache-features"),
    "saturated": ("queue", "scale-out"),
    "long-batch-wait": ("batch_wait", "cap-batch-wait"),
    "slow-compute": ("compute", "quantize"),
    "cpu-bound-preprocess": ("preprocess", "offload-preprocessing"),
    "cold-start": ("cold_start", "prewarm"),
    "large-payload": ("egress", "shrink-response"),
    "repeated-inputs": ("compute", "cache-results"),
    "llm-long-prompts": ("prefill", "chunked-prefill"),
    "llm-decode-heavy": ("decode", "reduce-batch-tokens"),
}


def test_scenarios_are_the_pinned_table() -> None:
    assert {n: (s.true_stage, s.lever) for n, s in SCENARIOS.items()} == PINNED
    buckets = {N.SLI_E2E: N.BUCKETS_REQUEST, N.SLI_TTFT: N.BUCKETS_GENAI_TTFT, N.SLI_ITL: N.BUCKETS_INTER_TOKEN}
    for sc in SCENARIOS.values():
        slo = sc.slo
        assert slo.threshold_s in buckets[slo.sli], sc.name  # the SLI can be read off a bucket bound
        assert 0 < sc.rate_rps <= 100
        if sc.breach:
            assert sc.lever_overrides, sc.name
            before, after = settings_for(sc.name), settings_for(sc.name, apply_lever=True)
            changed = {k for k, v in after.to_dict().items() if before.to_dict()[k] != v}
            assert changed and changed <= set(sc.lever_overrides), sc.name


def test_unknown_scenario_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match="unknown scenario 'nope'; known scenarios: healthy, slow-feature-store"):
        get_scenario("nope")


def test_settings_overrides_are_typed() -> None:
    s = apply_overrides(Settings(), parse_assignments(["max_batch_size=8", "quantize=yes", "launch_ms=2.5"]))
    assert (s.max_batch_size, s.quantize, s.launch_ms) == (8, True, 2.5)
    for bad in (["max_batch_size=eight"], ["quantize=maybe"], ["nope=1"], ["max_batch_size=0"]):
        with pytest.raises(UserError):
            apply_overrides(Settings(), parse_assignments(bad))
    with pytest.raises(UserError, match="key=value"):
        parse_assignments(["max_batch_size"])


def test_simulated_service_time_follows_the_stated_model() -> None:
    b = SimulatedBackend(Settings(launch_ms=10, per_item_ms=8))
    assert b.service_time_s(45) == pytest.approx(0.370)
    q = SimulatedBackend(Settings(launch_ms=10, per_item_ms=8, quantize=True))
    assert q.service_time_s(45) == pytest.approx(0.190)


def test_shared_device_splits_its_time_dedicated_devices_do_not() -> None:
    async def finish_order(devices: int) -> list[tuple[str, float]]:
        accel = SimulatedAccelerator(devices)
        accel.ensure_instances(2)
        t0 = time.monotonic()
        done: list[tuple[str, float]] = []

        async def job(name: str, work: float) -> None:
            await accel.run(work)
            done.append((name, time.monotonic() - t0))

        await asyncio.gather(job("short", 0.05), job("long", 0.10))
        return done

    shared = asyncio.run(finish_order(1))
    dedicated = asyncio.run(finish_order(2))
    # processor sharing: the short job needs 0.05 s of device time at half speed -> at least 0.1 s;
    # the long one ends after both jobs' work (0.15 s); dedicated devices run each at full speed.
    assert [n for n, _ in shared] == ["short", "long"]
    assert shared[0][1] >= 0.099 and shared[1][1] >= 0.149
    assert dedicated[0][1] >= 0.049 and dedicated[1][1] >= 0.099
    assert shared[1][1] > dedicated[1][1]


def test_busy_fraction_is_exported_as_dcgm_gpu_util_of_a_simulated_accelerator() -> None:
    accel = SimulatedAccelerator(1)
    coll = SimulatedGpuCollector(accel, window_s=10.0, hostname="h")

    async def busy() -> None:
        coll.utilization_pct()
        await accel.run(0.05)
        await asyncio.sleep(0.05)

    asyncio.run(busy())
    (fam,) = list(coll.collect())
    (sample,) = fam.samples
    assert fam.name == N.DCGM_GPU_UTIL
    assert sample.labels["modelName"] == N.SIMULATED_ACCELERATOR_MODEL_NAME
    assert set(sample.labels) == set(N.DCGM_LABELS)
    assert 0.0 < sample.value < 100.0  # busy for 0.05 s of the ~0.1 s since the previous reading


def _run_engine(settings: Settings, prompts: list[tuple[int, int, float]]) -> list[RequestRecord]:
    """Submit (prompt_tokens, max_tokens, at_s) sequences; return their records once all finished."""

    async def main() -> list[RequestRecord]:
        eng = LLMEngine(settings)
        await eng.start()
        recs = [RequestRecord() for _ in prompts]

        async def one(rec: RequestRecord, p: int, m: int, at: float) -> None:
            await asyncio.sleep(at)
            seq = eng.submit(p, m, rec, seed=1)
            while (tok := await seq.tokens.get()) is not None:
                rec.mark_token()
                assert isinstance(tok, str)

        await asyncio.gather(*(one(r, p, m, at) for r, (p, m, at) in zip(recs, prompts, strict=True)))
        await eng.stop()
        return recs

    return asyncio.run(main())


def test_engine_stages_and_tokens() -> None:
    s = Settings(decode_step_ms=2, decode_per_seq_ms=0.1, prefill_per_token_ms=0.01)
    (rec,) = _run_engine(s, [(100, 5, 0.0)])
    assert len(rec.token_ns) == 5 and rec.output_tokens == 5
    assert [iv.stage for iv in rec.stages] == [N.STAGE_QUEUE, N.STAGE_PREFILL, N.STAGE_DECODE]
    assert rec.batch_size == 1


def test_long_unchunked_prefill_blocks_a_short_prompt_and_chunking_lets_it_through() -> None:
    base = dict(decode_step_ms=2.0, decode_per_seq_ms=0.1, prefill_launch_ms=1.0, prefill_per_token_ms=0.05)
    for chunked in (False, True):
        s = Settings(**base, chunked_prefill=chunked, prefill_chunk_tokens=100)  # type: ignore[arg-type]
        long, short = _run_engine(s, [(4000, 2, 0.0), (20, 2, 0.02)])  # 4000 tokens: 200 ms of prefill
        assert long.first_token_ns is not None and short.first_token_ns is not None
        assert (short.first_token_ns < long.first_token_ns) == chunked


def test_running_batch_cap_and_waiting_bound() -> None:
    s = Settings(decode_step_ms=1, decode_per_seq_ms=0.1, max_running=2, max_waiting=2)

    async def main() -> None:
        eng = LLMEngine(s)  # not started: nothing runs, so admission and the bound are visible
        for _ in range(4):
            eng.submit(10, 5, None, seed=0)
        assert len(eng.running) == 2 and len(eng.waiting) == 2
        with pytest.raises(EngineFull):
            eng.submit(10, 5, None, seed=0)

    asyncio.run(main())


def test_feature_latency_model_slow_share() -> None:
    m = LatencyModel(4.0, 0.3, slow_prob=0.06, slow_min_ms=350, slow_max_ms=700)
    rng = random.Random(0)
    xs = [m.sample_s(rng) for _ in range(20000)]
    slow = sum(x >= 0.35 for x in xs) / len(xs)
    assert 0.05 < slow < 0.07
    assert sorted(xs)[len(xs) // 2] == pytest.approx(0.004, rel=0.1)


def test_result_cache_and_hash_fraction() -> None:
    c = ResultCache(2)
    import numpy as np

    for k in "abc":
        c.put(k, np.zeros(1))
    assert c.get("a") is None and c.get("c") is not None
    fr = [hash_fraction(f"{i:016x}", "heavy") for i in range(4000)]
    assert 0.06 < sum(f < 0.08 for f in fr) / len(fr) < 0.10
    assert hash_fraction("ab", "heavy") == hash_fraction("ab", "heavy") != hash_fraction("ab", "large")


def test_burn_cpu_spends_cpu_time() -> None:
    t = time.thread_time()
    burn_cpu(20)
    assert time.thread_time() - t >= 0.02


def test_burn_cpu_does_not_overshoot_when_the_machine_runs_slower_than_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The speed measured at start-up 40 % above the real one (as after a fast moment of a VM whose
    speed drifts): the burn still costs its budget, not 40 % more, since each chunk is sized at the
    speed the previous one measured."""
    from stagescope.service import model

    burn_cpu(1)  # the speed is measured
    monkeypatch.setattr(model, "_ITERS_PER_MS", [model._ITERS_PER_MS[0] * 1.4])  # restored after the test
    spent = []
    for _ in range(5):
        t = time.thread_time()
        burn_cpu(30)
        spent.append(1000 * (time.thread_time() - t))
    assert 30 <= statistics.median(spent) <= 32.5, spent


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_real_compute_backends(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    import numpy as np

    from stagescope.service.backends import PredictItem, make_backend

    async def main() -> list[np.ndarray]:
        b = make_backend(Settings(backend=backend, model_load_s=0, model_dim=64))
        await b.load()
        items = [PredictItem(np.ones(32, np.float32), 3, 10, 1), PredictItem(np.zeros(32, np.float32), 1, 4, 2)]
        return await b.run_batch(items)

    a, z = asyncio.run(main())
    assert a.shape == (10,) and z.shape == (4,)
    assert np.all((a >= 0) & (a <= 1)) and not np.array_equal(a[:4], z)


def test_result_cache_coalesces_identical_inflight_requests() -> None:
    import numpy as np

    computed = []

    async def request(c: ResultCache, key: str) -> np.ndarray:
        out = await c.lookup(key)
        if out is None:
            claim = c.claim(key)
            computed.append(key)
            await asyncio.sleep(0.02)
            out = np.full(1, len(computed))
            if claim is not None:
                c.settle(key, claim, out)
        return out

    async def main() -> list[np.ndarray]:
        c = ResultCache(8)
        first = asyncio.ensure_future(request(c, "k"))
        await asyncio.sleep(0)
        return [await first, *await asyncio.gather(*(request(c, "k") for _ in range(3)))]

    outs = asyncio.run(main())
    assert computed == ["k"] and all(int(o[0]) == 1 for o in outs)
