"""The slot probe's CPU share (service/llama_cpp/probe_share.py): what its servers got of the cores
they may use, the repeat of a starved probe and S taken at the server's full cores. Synthetic probes
only (the measurement is replaced; no llama-server, no live timing asserted)."""

from __future__ import annotations

from typing import Any

import pytest

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.llama_cpp import probe_share as P
from stagescope.service.llama_cpp import slot_probe as SP
from stagescope.service.llama_cpp.probe import config
from stagescope.service.llama_cpp.scenarios import LLAMA_SCENARIOS


def test_a_server_may_use_its_threads_but_no_more_than_its_part_of_the_machine() -> None:
    assert P.server_allowance(1, 1, 2.0) == 1.0
    assert P.server_allowance(1, 2, 2.0) == 1.0
    assert P.server_allowance(4, 2, 2.0) == 1.0  # 4 threads each, but two servers on 2 cores
    assert P.server_allowance(1, 2, 1.0) == 0.5  # a 1-core affinity mask or cgroup quota
    assert P.server_allowance(2, 1, 1.5) == 1.5  # a 1.5-CPU quota
    for bad in ((0, 1, 2.0), (1, 0, 2.0), (1, 1, 0.0), (1, 1, float("nan"))):
        with pytest.raises(UserError):
            P.server_allowance(*bad)


def test_the_share_is_the_cores_got_over_the_allowance_and_a_low_one_is_starved() -> None:
    # the starved probe of the last session: servers on 0.32-0.40 of their one core
    s = P.probe_share(0.36, 0.32, serving_allowance=1.0, lever_allowance=1.0)
    assert s.serving == pytest.approx(0.36) and s.lever == pytest.approx(0.32)
    assert s.lowest == pytest.approx(0.32) and s.starved
    ok = P.probe_share(0.86, 0.77, serving_allowance=1.0, lever_allowance=1.0)
    assert not ok.starved
    # against a half-core allowance (two servers on one core), 0.4 cores is 80 %
    assert not P.probe_share(None, 0.4, serving_allowance=1.0, lever_allowance=0.5).starved
    assert P.probe_share(None, 0.4, serving_allowance=1.0, lever_allowance=0.5).lowest == pytest.approx(0.8)
    # nothing read: unknown, not starved
    none = P.probe_share(None, None, serving_allowance=1.0, lever_allowance=1.0)
    assert none.lowest is None and not none.starved
    assert P.probe_share(float("nan"), -1.0, serving_allowance=1.0, lever_allowance=1.0).lowest is None


def test_the_first_probe_that_was_not_starved_counts_else_the_least_starved() -> None:
    def sh(x: float | None) -> P.ProbeShare:
        return P.probe_share(x, x, serving_allowance=1.0, lever_allowance=1.0)

    assert P.best_attempt([sh(0.9)]) == 0
    assert P.best_attempt([sh(0.3), sh(0.85)]) == 1
    assert P.best_attempt([sh(0.3), sh(0.5)]) == 1
    assert P.best_attempt([sh(0.55), sh(0.4)]) == 0
    assert P.best_attempt([sh(None), sh(0.9)]) == 0  # unknown is not starved
    with pytest.raises(ValueError):
        P.best_attempt([])


def test_s_is_taken_at_the_full_cores_and_never_made_longer() -> None:
    assert P.full_core_service(4.132, 0.36) == pytest.approx(4.132 * 0.36)
    assert P.full_core_service(1.668, 0.86) == pytest.approx(1.668 * 0.86)
    assert P.full_core_service(1.5, 1.04) == 1.5  # a share over 1 leaves it
    assert P.full_core_service(1.5, None) == 1.5
    assert P.full_core_service(1.5, 0.0) == 1.5


def test_the_line_says_what_the_probe_got_and_what_was_made_of_it() -> None:
    ok = P.probe_share(0.86, 0.8, serving_allowance=1.0, lever_allowance=1.0)
    line = P.share_line(ok, 1, 1.668, P.full_core_service(1.668, ok.serving))
    assert "86% of the 1 core(s)" in line and "80% of 1 each" in line and "1,668 -> 1,434 ms" in line
    assert "starved" not in line and "\n" not in line
    again = P.share_line(ok, 2, 1.668, 1.434)
    assert "1 probe(s) before ran starved" in again and "repeated" in again
    bad = P.probe_share(0.4, 0.3, serving_allowance=1.0, lever_allowance=1.0)
    assert "all 2 probe(s) ran starved" in P.share_line(bad, 2, 4.0, 1.6)
    assert "as measured" in P.share_line(P.probe_share(1.02, None, serving_allowance=1.0, lever_allowance=1.0),
                                         1, 1.5, 1.5)  # fmt: skip


def _probe(s: float, serving_cores: float, lever_cores: float) -> tuple[Any, Any]:
    """A measurement as slot_probe._measure returns it: S with its cores, and the lever's table."""
    table = {(1, 0): (0.7 * s, lever_cores), (1, 1): (0.9 * s, lever_cores), (2, 1): (1.1 * s, lever_cores),
             (1, 2): (1.0 * s, lever_cores), (2, 2): (1.2 * s, lever_cores)}  # fmt: skip
    return (s, serving_cores), table


@pytest.mark.parametrize("cores", [2.0, 1.0])
def test_a_starved_probe_is_repeated_and_the_rate_follows_s_at_full_cores(monkeypatch: pytest.MonkeyPatch,
                                                                          cores: float) -> None:  # fmt: skip
    sc = LLAMA_SCENARIOS["llama-slots-busy"]
    lever_allow = P.server_allowance(config(sc, apply_lever=True).threads, 2, cores)
    # first probe: other work held the cores (S 4.1 s on 0.36 cores); the repeat ran on 0.86
    probes = iter([_probe(4.132, 0.36, 0.32 * lever_allow), _probe(1.668, 0.86, 0.8 * lever_allow)])
    calls: list[int] = []

    def fake_measure(cfg: Any, lever: Any, sc_: Any) -> Any:
        calls.append(1)
        return next(probes)

    monkeypatch.setattr(SP, "_measure", fake_measure)
    monkeypatch.setattr(SP, "available_cores", lambda: cores)
    over, line = SP.size_slots(sc)
    assert len(calls) == 2
    s_full = 1.668 * min(1.0, 0.86 / P.server_allowance(config(sc).threads, 1, cores))
    rate, ttft = SP.slot_load(s_full, slots=config(sc).parallel)
    assert over["scenario.rate_rps"] == round(rate, 1)
    assert over["scenario.slo_spec"].endswith(f"<{max(10, round(ttft, -1)):g}ms")
    # the analysis gets the probe's times and cores as measured (it rescales them itself)
    assert over[f"{SP.MEASURED_PREFIX}{N.VARIANT_SERVING}"] == 1.668
    assert over[f"{SP.MEASURED_CPU_PREFIX}{N.VARIANT_SERVING}"] == 0.86
    assert over[SP.MEASURED_PREFIX + SP.occupancy_key(str(sc.lever), 2, 2)] == pytest.approx(1.2 * 1.668, abs=1e-4)
    assert "1 probe(s) before ran starved" in line.splitlines()[-1]
    # the lever's share busy: its all-busy time at full cores as S (the raw 2+2 time would say more)
    lever = config(sc, apply_lever=True)
    cap = lever.parallel * lever.replicas / (1.2 * 1.668 * min(1.0, 0.8))
    assert f"{round(rate, 1) / cap:.0%} busy at that rate" in line


def test_a_probe_starved_every_time_keeps_the_least_starved(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = LLAMA_SCENARIOS["llama-slots-busy"]
    probes = iter([_probe(3.0, 0.5, 0.45), _probe(4.0, 0.4, 0.35)])
    monkeypatch.setattr(SP, "_measure", lambda *a: next(probes))
    monkeypatch.setattr(SP, "available_cores", lambda: 2.0)
    over, line = SP.size_slots(sc)
    assert over[f"{SP.MEASURED_PREFIX}{N.VARIANT_SERVING}"] == 3.0
    rate, _ = SP.slot_load(3.0 * 0.5, slots=config(sc).parallel)
    assert over["scenario.rate_rps"] == round(rate, 1)
    assert f"all {P.PROBE_ATTEMPTS} probe(s) ran starved" in line


def test_a_probe_that_was_not_starved_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = LLAMA_SCENARIOS["llama-slots-busy"]
    calls: list[int] = []

    def once(*a: Any) -> Any:
        calls.append(1)
        return _probe(1.5, 1.02, 0.9)

    monkeypatch.setattr(SP, "_measure", once)
    monkeypatch.setattr(SP, "available_cores", lambda: 2.0)
    over, line = SP.size_slots(sc)
    assert calls == [1]
    rate, _ = SP.slot_load(1.5, slots=config(sc).parallel)  # a share over 1 leaves S as measured
    assert over["scenario.rate_rps"] == round(rate, 1) and "S 1,500 ms as measured" in line


# -- the long prompts' probe: the same starvation check (service/llama_cpp/sizing.py) -----------------


def test_prompt_steps_are_taken_at_the_server_full_core() -> None:
    from stagescope.service.llama_cpp import sizing as SZ

    # a step on half its core took twice its full-core time; a share over 1 or unknown leaves it
    assert SZ.full_core_steps([(513, 400.0, 0.5), (2049, 2400.0, 1.03), (100, 50.0, None)]) == [
        (513, 200.0), (2049, 2400.0), (100, 50.0)]  # fmt: skip


def test_a_starved_prompt_probe_is_repeated_and_sizes_longer_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    from stagescope.service.llama_cpp import sizing as SZ

    sc = LLAMA_SCENARIOS["llama-long-prompts"]
    # recorded shape (this machine: 513 tokens in 139-218 ms, 2,049 in 1,013-1,273 ms on a free core);
    # the first probe ran on 40 % of its core, the second on 95 %
    probes = iter([[(513, 450.0, 0.40), (2049, 2800.0, 0.42)], [(513, 190.0, 0.95), (2049, 1150.0, 0.97)]])
    monkeypatch.setattr(SZ, "_prompt_step_ms", lambda sc: next(probes))
    over, line = SZ.sizing(sc)
    target = SZ.LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms
    room = min(config(sc).batch_size, config(sc).ctx_per_slot) - sc.workload.max_tokens - 64
    want = max(256, min(room, SZ.tokens_for(target, [(513, 190.0 * 0.95), (2049, 1150.0 * 0.97)])))
    assert over["workload.long_prompt_tokens"] == want
    assert "1 probe(s) before ran starved" in line
    # sized on the starved probe as measured, the prompts would have been far shorter
    assert SZ.tokens_for(target, [(513, 450.0), (2049, 2800.0)]) < 0.7 * want


def test_a_prompt_probe_starved_twice_keeps_the_least_starved_at_its_full_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from stagescope.service.llama_cpp import sizing as SZ

    sc = LLAMA_SCENARIOS["llama-long-prompts"]
    calls: list[int] = []
    got = [[(513, 450.0, 0.40), (2049, 2800.0, 0.42)], [(513, 380.0, 0.55), (2049, 2300.0, 0.5)]]

    def probe(sc: Any) -> Any:
        calls.append(1)
        return got[len(calls) - 1]

    monkeypatch.setattr(SZ, "_prompt_step_ms", probe)
    over, line = SZ.sizing(sc)
    assert len(calls) == P.PROBE_ATTEMPTS == 2
    target = SZ.LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms
    room = min(config(sc).batch_size, config(sc).ctx_per_slot) - sc.workload.max_tokens - 64
    assert over["workload.long_prompt_tokens"] == max(256, min(room, SZ.tokens_for(target, [(513, 380.0 * 0.55),
                                                                                          (2049, 2300.0 * 0.5)])))
    assert "all 2 probe(s) ran starved" in line
    # a probe whose server CPU could not be read runs once, as measured
    calls.clear()
    got[0] = [(513, 200.0, None), (2049, 1200.0, None)]
    over, line = SZ.sizing(sc)
    assert calls == [1] and "starved" not in line
