"""The lever models the llama.cpp lever check measures: the slot replay for scale-out, the measured
speed of the added servers, the running-batch cap of reduce-batch-tokens and llama.cpp's slot-ordered
chunked prefill; and the gateway and serve plumbing that carries the measured speed (no llama-server
needed: the analysis runs on synthetic incidents, the gateway on its app object)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from stagescope import names as N
from stagescope.analysis import llm_levers as L
from stagescope.analysis import quality as QL
from stagescope.analysis import queueing as Q
from stagescope.analysis import synth_multi as M
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.errors import UserError
from stagescope.slo import parse_slo


def test_replay_waits_is_first_come_first_served_over_c_servers() -> None:
    # one server: each waits for the ones before it
    assert Q.replay_waits([0.0, 0.0, 0.0], [10.0, 10.0, 10.0], 1) == [0.0, 10.0, 20.0]
    # two servers: the third takes the first free one
    assert Q.replay_waits([0.0, 0.0, 0.0, 5.0], [10.0, 4.0, 10.0, 1.0], 2) == [0.0, 0.0, 4.0, 5.0]
    # arrivals after the servers are free never wait
    assert Q.replay_waits([0.0, 100.0], [10.0, 10.0], 1) == [0.0, 0.0]
    with pytest.raises(ValueError):
        Q.replay_waits([0.0], [1.0], 0)


def _metrics_con(rows: list[tuple[str, dict[str, str], float]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE metric_samples (metric VARCHAR, labels MAP(VARCHAR, VARCHAR), value DOUBLE, ts_ms BIGINT)")
    for i, (metric, labels, value) in enumerate(rows):
        con.execute("INSERT INTO metric_samples VALUES (?, MAP(?, ?), ?, ?)",
                    [metric, list(labels), list(labels.values()), value, i])  # fmt: skip
    return con


def test_service_ratio_reads_the_latest_measurement_of_both_variants() -> None:
    con = _metrics_con([
        (N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.VARIANT_SERVING}, 1.0),
        (N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT}, 3.0),
        (N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT}, 1.5),  # the later scrape wins
    ])  # fmt: skip
    assert QL.service_ratio(con, N.LEVER_SCALE_OUT) == pytest.approx((1.5, 1000.0, 1500.0))
    only = _metrics_con([(N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.VARIANT_SERVING}, 1.0)])
    assert QL.service_ratio(only, N.LEVER_SCALE_OUT) is None
    zero = _metrics_con([(N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.VARIANT_SERVING}, 0.0),
                         (N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT}, 1.0)])  # fmt: skip
    assert QL.service_ratio(zero, N.LEVER_SCALE_OUT) is None
    assert QL.service_ratio(duckdb.connect(), N.LEVER_SCALE_OUT) is None  # no metrics at all


def test_slot_ordered_fill_is_known_by_llama_cpp_metrics() -> None:
    assert L.slot_ordered_fill(_metrics_con([(N.LLAMACPP_DECODE_CALLS, {N.LABEL_REPLICA: "0"}, 3.0)]))
    assert not L.slot_ordered_fill(_metrics_con([("vllm:num_requests_running", {}, 3.0)]))
    assert not L.slot_ordered_fill(duckdb.connect())


def _lever(rep: dict, lever: str) -> dict:  # type: ignore[type-arg]
    return next(x for x in rep["levers"] if x["lever"] == lever)


def test_chunked_prefill_on_a_slot_ordered_engine_keeps_the_later_slots_waiting() -> None:
    """The same incident predicted with the fair chunk model and, where llama.cpp's metrics say the
    engine fills its steps slot by slot, with half the waiting prompts still behind the long one: the
    prediction cannot be lower, and its line says why."""
    data = S.generate("llm-long-prompts", 2000, seed=5)
    con = duckdb.connect()
    S.to_tables(con, data)
    slo = parse_slo(data.scenario.slo)[0]
    fair = _lever(analyze(con, slo), N.LEVER_CHUNKED_PREFILL)
    data.metrics.append((N.LLAMACPP_DECODE_CALLS, {N.LABEL_REPLICA: "0"}, 100.0, 1))
    con = duckdb.connect()
    S.to_tables(con, data)
    rep = analyze(con, slo)
    assert rep["verdict"]["lever"] == N.LEVER_CHUNKED_PREFILL
    ordered = _lever(rep, N.LEVER_CHUNKED_PREFILL)
    assert ordered["predicted_p99_ms"] >= fair["predicted_p99_ms"]
    assert "slot by slot" in ordered["rationale"] and "slot by slot" not in fair["rationale"]
    assert rep["quantile_ms"] >= ordered["predicted_p99_ms"]  # never worse than doing nothing


def test_the_running_cap_is_the_largest_whose_prediction_keeps_headroom() -> None:
    for seed in (1, 2):
        data = S.generate("llm-decode-heavy", 1200, seed=seed)
        con = duckdb.connect()
        S.to_tables(con, data)
        rep = analyze(con, data.scenario.slo)
        lv = _lever(rep, N.LEVER_REDUCE_BATCH_TOKENS)
        thr = rep["slo"]["threshold_ms"]
        assert lv["predicted_p99_ms"] <= L.CAP_HEADROOM * thr + 1e-6
        cap = rep["evidence"]["running_cap"]
        ev = rep["evidence"]
        # one stream more would already predict past the headroom: the fitted step alone says so, or
        # the scatter does (the prediction is the step plus a non-negative scatter)
        step = ev["batch_intercept_ms"] + ev["batch_slope_ms"] * cap
        assert step <= L.CAP_HEADROOM * thr + 1e-6
        assert f"capped at {cap} streams" in lv["rationale"]


def test_slot_scale_out_is_used_only_where_the_replay_reproduces_the_queue() -> None:
    """A synthetic multi-cause incident whose queue is not made by its streams' slot times: replayed
    with today's slots it would not wait, so the steady-state queue model answers (its line), and a
    measured speed of the added servers still scales the executor time."""
    inc = M.generate_multi("llm-seed-001", 3000, seed=3)
    # without its HPA series (an autoscaler on CPU): the queue's lever is then scale-out itself
    inc.data.metrics[:] = [m for m in inc.data.metrics if not m[0].startswith("kube_horizontalpodautoscaler_")]
    slo = parse_slo(inc.data.scenario.slo)[0]
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    base = _lever(analyze(con, slo), N.LEVER_SCALE_OUT)
    assert "Allen-Cunneen" in base["rationale"] and "replayed" not in base["rationale"]
    inc.data.metrics.append((N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.VARIANT_SERVING}, 1.0, 1))
    inc.data.metrics.append((N.METRIC_EXECUTOR_SERVICE, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT}, 1.3, 1))
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    slower = _lever(analyze(con, slo), N.LEVER_SCALE_OUT)
    assert "x1.30 as the service measured" in slower["rationale"]
    assert slower["predicted_p99_ms"] >= base["predicted_p99_ms"]


def test_gateway_exports_the_measured_service_times() -> None:
    from stagescope.service.llama_cpp.gateway import create_gateway_app

    reg = CollectorRegistry()
    create_gateway_app(["http://127.0.0.1:9"], 2, registry=reg,
                       measured_service_s={N.VARIANT_SERVING: 1.25, N.LEVER_SCALE_OUT: 2.5})  # fmt: skip
    text = generate_latest(reg).decode()
    assert f'{N.METRIC_EXECUTOR_SERVICE}{{variant="{N.VARIANT_SERVING}"}} 1.25' in text
    assert f'{N.METRIC_EXECUTOR_SERVICE}{{variant="{N.LEVER_SCALE_OUT}"}} 2.5' in text
    quiet = CollectorRegistry()
    create_gateway_app(["http://127.0.0.1:9"], 2, registry=quiet)
    assert N.METRIC_EXECUTOR_SERVICE not in generate_latest(quiet).decode()


def test_measured_service_overrides_become_gateway_options_and_bad_ones_are_one_line() -> None:
    from stagescope.service.llama_cpp import engine
    from stagescope.service.llama_cpp.scenarios import get_scenario
    from stagescope.service.llama_cpp.serve import main, measured_service

    cmd = engine.serve_command(get_scenario("llama-slots-busy"), port=1, spans_dir=Path("spans"), apply_lever=True,
                               overrides={f"{engine.MEASURED_PREFIX}serving": 1.3, "parallel": 2})  # fmt: skip
    assert cmd[cmd.index("--measured-service") + 1] == "serving=1.3"
    assert cmd[cmd.index("--set") + 1] == "parallel=2"
    assert measured_service(["serving=1.5", "scale-out=2"]) == {"serving": 1.5, "scale-out": 2.0}
    for bad in (["serving=x"], ["serving=0"], ["serving=-1"], ["serving=inf"], ["=1"], ["serving"]):
        with pytest.raises(UserError):
            measured_service(bad)
    assert main(["--scenario", "llama-slots-busy", "--measured-service", "serving=nope", "--print-config"]) == 2


def test_replay_shared_follows_the_occupancy_of_the_machine() -> None:
    """The occupancy replay: at a constant speed it is the plain replay over replicas x slots (at twice
    the time, the plain replay of doubled holds); where a request slows while the other server is
    busy, the requests that overlap take longer, and the next one waits for that."""
    import random

    rng = random.Random(3)
    arr = sorted(rng.uniform(0, 10_000) for _ in range(60))
    svc = [rng.uniform(500, 1500) for _ in arr]
    plain = Q.replay_waits(arr, svc, 4)
    same = Q.replay_shared(arr, svc, replicas=2, slots=2, slowdown=lambda own, others: 1.0)
    assert same == pytest.approx(plain, abs=1e-6)
    doubled = Q.replay_shared(arr, svc, replicas=2, slots=2, slowdown=lambda own, others: 2.0)
    assert doubled == pytest.approx(Q.replay_waits(arr, [2 * s for s in svc], 4), abs=1e-6)
    # two at once on two one-slot servers, each 1.5x slower while the other runs: both end at 15, the
    # third waits 15; alone it would run at full speed
    assert Q.replay_shared([0.0, 0.0, 0.0], [10.0] * 3, replicas=2, slots=1,
                           slowdown=lambda own, others: 1.0 + 0.5 * others) == pytest.approx([0.0, 0.0, 15.0])  # fmt: skip
    # the first finishes at 10 alone (the second arrives at 10): no slowdown is ever applied
    assert Q.replay_shared([0.0, 10.0], [10.0, 10.0], replicas=2, slots=1,
                           slowdown=lambda own, others: 1.0 + 0.5 * others) == pytest.approx([0.0, 0.0])  # fmt: skip
    with pytest.raises(ValueError):
        Q.replay_shared([0.0], [1.0], replicas=0, slots=1, slowdown=lambda own, others: 1.0)
    with pytest.raises(ValueError):
        Q.replay_shared([0.0, 1.0], [1.0], replicas=1, slots=1, slowdown=lambda own, others: 1.0)


def test_speed_drift_is_the_spread_of_the_medians_of_a_run_s_parts() -> None:
    """The slot times' own uncertainty for the scale-out interval: the largest over the smallest median
    of a run's consecutive thirds, minus 1; one slow request in a part does not move its median; too
    few holds a part say nothing (0)."""
    holds = [1000.0, 990.0, 1010.0, 1100.0, 1090.0, 5000.0, 1050.0, 1040.0, 1060.0]
    assert Q.speed_drift(holds) == pytest.approx(0.1)
    assert Q.speed_drift(holds[::-1]) == pytest.approx(0.1)
    assert Q.speed_drift([1000.0] * 9) == 0.0
    assert Q.speed_drift([1000.0, 1200.0, 900.0, 1100.0, 800.0]) == 0.0  # fewer than 2 a part
    assert Q.speed_drift(holds, parts=1) == 0.0
    # a knee: the same arrivals through 4 slots at slot times +/- that drift move the wait quantile
    # by more than the drift where the queue is near saturation, by little where it is light
    import random

    rng = random.Random(5)
    arr = sorted(rng.uniform(0, 60_000) for _ in range(80))
    work = [rng.uniform(1300, 1600) for _ in arr]

    def p95(k: float, scale: float) -> float:
        w = sorted(Q.replay_waits([a * scale for a in arr], [h * k for h in work], 4))
        return w[int(0.95 * len(w))]

    busy = (p95(1.1, 1.0) - p95(0.9, 1.0)) / max(p95(1.0, 1.0), 1.0)
    light = (p95(1.1, 3.0) - p95(0.9, 3.0)) / max(p95(1.0, 3.0), 1.0)
    assert busy > 0.2 > light


def test_holds_become_work_with_every_slot_busy() -> None:
    """A hold that ran while some of the server's slots were free ran faster: as work at the speed of
    every slot busy it counts 1 / slowdown(busy) per ms, piece by piece of its occupancy."""
    half = lambda busy: 0.5 if busy < 2 else 1.0  # noqa: E731  (alone: twice the speed of 2 busy)
    assert Q.work_at_full([(0.0, 10.0)], half) == pytest.approx([20.0])
    assert Q.work_at_full([(0.0, 10.0), (0.0, 10.0)], half) == pytest.approx([10.0, 10.0])
    # 5 ms alone (10 of work) then 5 ms together (5): 15 each; the third, alone later, 2 x its time
    got = Q.work_at_full([(0.0, 10.0), (5.0, 15.0), (20.0, 23.0)], half)
    assert got == pytest.approx([15.0, 15.0, 6.0])
    assert Q.work_at_full([(3.0, 3.0)], half) == [0.0]  # no stream: no work
    # the same holds at a constant speed are their own times
    assert Q.work_at_full([(0.0, 7.0), (1.0, 4.0)], lambda busy: 1.0) == pytest.approx([7.0, 3.0])


def test_each_measured_occupancy_has_a_key() -> None:
    from stagescope.service.llama_cpp import slot_probe as P

    key = P.occupancy_key(N.LEVER_SCALE_OUT, 2, 1)
    assert key == "scale-out@2+1" and P.parse_occupancy_key(key) == (N.LEVER_SCALE_OUT, 2, 1)
    assert P.parse_occupancy_key(N.VARIANT_SERVING) is None
    for bad in ("scale-out@", "scale-out@2", "scale-out@0+1", "@1+0", "scale-out@a+1", "scale-out@1+-1"):
        with pytest.raises(UserError):
            P.parse_occupancy_key(bad)


def test_occupancy_times_travel_from_the_serve_options_to_the_gateway_and_the_model() -> None:
    from stagescope.service.llama_cpp.gateway import create_gateway_app
    from stagescope.service.llama_cpp.serve import main, measured_service

    got = measured_service(["serving=1.2", "scale-out@2+2=1.5", "scale-out@1+0=0.6"])
    assert got == {"serving": 1.2, "scale-out@2+2": 1.5, "scale-out@1+0": 0.6}
    assert main(["--scenario", "llama-slots-busy", "--measured-service", "scale-out@x=1", "--print-config"]) == 2
    reg = CollectorRegistry()
    create_gateway_app(["http://127.0.0.1:9"], 2, registry=reg, measured_service_s=got)
    text = generate_latest(reg).decode()
    assert (f'{N.METRIC_EXECUTOR_OCCUPANCY}{{{N.LABEL_BUSY_OTHERS}="2",{N.LABEL_BUSY_OWN}="2",'
            f'{N.LABEL_VARIANT}="{N.LEVER_SCALE_OUT}"}} 1.5') in text  # fmt: skip
    assert f'{N.METRIC_EXECUTOR_SERVICE}{{variant="{N.VARIANT_SERVING}"}} 1.2' in text
    con = _metrics_con([
        (N.METRIC_EXECUTOR_OCCUPANCY, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT, N.LABEL_BUSY_OWN: "2", N.LABEL_BUSY_OTHERS: "2"}, 1.5),
        (N.METRIC_EXECUTOR_OCCUPANCY, {N.LABEL_VARIANT: N.LEVER_SCALE_OUT, N.LABEL_BUSY_OWN: "1", N.LABEL_BUSY_OTHERS: "0"}, 0.6),
        (N.METRIC_EXECUTOR_OCCUPANCY, {N.LABEL_VARIANT: "other", N.LABEL_BUSY_OWN: "1", N.LABEL_BUSY_OTHERS: "0"}, 9.0),
    ])  # fmt: skip
    table = L.occupancy_table(con, N.LEVER_SCALE_OUT)
    assert table == pytest.approx({(2, 2): 1500.0, (1, 0): 600.0})
    assert L.occupancy_table(duckdb.connect(), N.LEVER_SCALE_OUT) == {}
    slow = L.occupancy_slowdown(table, 1200.0)
    assert slow(2, 2) == pytest.approx(1.25) and slow(1, 0) == pytest.approx(0.5)
    assert slow(2, 1) == pytest.approx(1.25)  # not measured: the nearest with as many on its own server
    assert slow(1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        L.occupancy_slowdown({}, 1200.0)


def test_a_slot_fault_asks_for_runs_long_enough_for_its_quantile() -> None:
    from stagescope.demo.runner import MIN_DURATION_KEY, apply_workload, run_duration
    from stagescope.service.llama_cpp.scenarios import get_scenario

    assert run_duration(12.0, {MIN_DURATION_KEY: 35.0}) == 35.0
    assert run_duration(60.0, {MIN_DURATION_KEY: 35.0}) == 60.0
    assert run_duration(12.0, {}) == 12.0 and run_duration(12.0, None) == 12.0
    _, rest = apply_workload(get_scenario("llama-slots-busy"), {MIN_DURATION_KEY: 35.0, "parallel": 2})
    assert rest == {"parallel": 2}  # the service never sees it
