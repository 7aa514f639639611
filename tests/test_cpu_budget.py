"""The scale-out model's CPU budget (analysis.cpu_budget) and what feeds it: the machine's cores, the
run's own processes' CPU exported by the gateway and the demo's recorder, the probe's cores per
occupancy. Arithmetic on synthetic inputs; no live run, no timing."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from stagescope import names as N
from stagescope.analysis import cpu_budget as CB
from stagescope.errors import UserError

_S = 1_000_000_000  # ns per s


def _recorded_run(*, gw_cpu: float, client_cpu: float, engine_cpu: float, tokens: int, holds: list[tuple[float, float]],
                  window_s: float = 10.0, cores: float = 2.0, host_cpu: float | None = None,
                  ) -> duckdb.DuckDBPyConnection:  # fmt: skip
    """A baseline run as the analysis ingests it: CPU counters at the window's two ends (Unix ms), the
    host's cores (and, given ``host_cpu``, the host's competing CPU over the window), and requests
    holding a slot over ``holds`` (s), ``tokens`` tokens each."""
    con = duckdb.connect()
    con.execute("CREATE TABLE metric_samples (metric VARCHAR, labels MAP(VARCHAR, VARCHAR), value DOUBLE, ts_ms BIGINT)")
    t0 = 1_700_000_000_000
    rows = [
        (N.METRIC_PROCESS_CPU, {N.LABEL_ROLE: N.ROLE_GATEWAY, N.LABEL_REPLICA: ""}, 5.0, 5.0 + gw_cpu),
        (N.METRIC_PROCESS_CPU, {N.LABEL_ROLE: N.ROLE_CLIENT}, 1.0, 1.0 + client_cpu),
        (N.METRIC_PROCESS_CPU, {N.LABEL_ROLE: N.ROLE_ENGINE, N.LABEL_REPLICA: "0"}, 2.0, 2.0 + engine_cpu),
    ]
    if host_cpu is not None:
        rows.append((N.METRIC_HOST_CPU_COMPETING, {}, 1000.0, 1000.0 + host_cpu))
    for metric, labels, a, b in rows:
        for v, ts in ((a, t0), (b, t0 + int(window_s * 1000))):
            con.execute("INSERT INTO metric_samples VALUES (?, MAP(?, ?), ?, ?)",
                        [metric, list(labels), list(labels.values()), v, ts])  # fmt: skip
    con.execute("INSERT INTO metric_samples VALUES (?, MAP([], []), ?, ?)", [N.METRIC_HOST_CPU_CORES, cores, t0])
    con.execute("CREATE TABLE stages (request_key UBIGINT, stage VARCHAR, start_unix_ns BIGINT, end_unix_ns BIGINT)")
    con.execute("CREATE TABLE requests (request_key UBIGINT, output_tokens BIGINT)")
    base = t0 * 1_000_000
    for k, (s, e) in enumerate(holds):
        mid = (s + e) / 2
        con.execute("INSERT INTO stages VALUES (?, 'prefill', ?, ?), (?, 'decode', ?, ?)",
                    [k, base + int(s * _S), base + int(mid * _S), k, base + int(mid * _S), base + int(e * _S)])  # fmt: skip
        con.execute("INSERT INTO requests VALUES (?, ?)", [k, tokens])
    return con


def test_the_baseline_budget_is_the_run_own_cpu_over_its_tokens_and_busy_time() -> None:
    # two overlapping holds (1-4 s, 3-6 s) and one apart (7-9 s): slots busy 7 s of the 10 s window
    con = _recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=6.3, tokens=100, holds=[(1, 4), (3, 6), (7, 9)])
    b = CB.baseline_budget(con, ["prefill", "decode"])
    assert b is not None
    assert b.cores == 2.0
    assert b.path_s_per_token == pytest.approx(2.0 / 300)  # gateway + client CPU over the tokens streamed
    assert b.path_cores == pytest.approx(0.2)  # over the 10 s window
    assert b.engine_cores == pytest.approx(6.3 / 7.0)  # engine CPU over the time a slot was busy


def test_the_outside_load_is_the_host_competing_cpu_less_the_run_own() -> None:
    holds = [(1, 4), (3, 6), (7, 9)]
    # over the 10 s window: the run's processes 1.5 + 0.5 + 6.3 = 8.3 CPU s, the host's competing 16.3
    b = CB.baseline_budget(_recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=6.3, tokens=100, holds=holds,
                                         host_cpu=16.3), ["prefill", "decode"])  # fmt: skip
    assert b is not None and b.outside_cores == pytest.approx(0.8)  # (16.3 - 8.3) / 10 s
    # the host's counter missing (a gateway before it, a cgroup quota): no outside load known, as before
    b0 = CB.baseline_budget(_recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=6.3, tokens=100, holds=holds),
                            ["prefill", "decode"])  # fmt: skip
    assert b0 is not None and b0.outside_cores == 0.0
    # a host counter under the run's own (clock ticks against process times): never negative
    bn = CB.baseline_budget(_recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=6.3, tokens=100, holds=holds,
                                          host_cpu=8.0), ["prefill", "decode"])  # fmt: skip
    assert bn is not None and bn.outside_cores == 0.0


def test_the_engine_cpu_per_request_is_the_servers_cpu_over_the_requests_that_generated() -> None:
    con = _recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=6.3, tokens=100, holds=[(1, 4), (3, 6), (7, 9)])
    assert CB.engine_cpu_per_request(con) == pytest.approx(6.3 / 3)
    con.execute("INSERT INTO requests VALUES (99, 0)")  # a request that generated nothing does not count
    assert CB.engine_cpu_per_request(con) == pytest.approx(6.3 / 3)
    con.execute("DELETE FROM metric_samples WHERE labels[?] = ?", [N.LABEL_ROLE, N.ROLE_ENGINE])
    assert CB.engine_cpu_per_request(con) is None  # a fronted server: no pid, no CPU
    assert CB.engine_cpu_per_request(duckdb.connect()) is None


def test_the_outside_work_keeps_at_most_its_fair_share_beside_the_servers() -> None:
    b = CB.CPUBudget(cores=2.0, path_s_per_token=0.0, engine_cores=1.0, path_cores=0.2, outside_cores=0.8)
    # one outside thread beside two busy servers on the 1.8 cores the path leaves: 0.6 each, so 0.6
    assert CB.outside_share(b, left=1.8, servers=2) == pytest.approx(0.6)
    # beside one server it keeps the 0.8 it took (its fair share would be 0.9)
    assert CB.outside_share(b, left=1.8, servers=1) == pytest.approx(0.8)
    # 1.5 cores outside: two threads, at most 2 x 1.8 / 4 = 0.9 beside two servers
    b15 = CB.CPUBudget(cores=2.0, path_s_per_token=0.0, engine_cores=1.0, path_cores=0.2, outside_cores=1.5)
    assert CB.outside_share(b15, left=1.8, servers=2) == pytest.approx(0.9)
    none = CB.CPUBudget(cores=2.0, path_s_per_token=0.0, engine_cores=1.0, path_cores=0.2)
    assert CB.outside_share(none, left=1.8, servers=2) == 0.0
    # the servers get what is left: a busy loop beside two servers and no path CPU leaves each 2/3 core
    loop = CB.CPUBudget(cores=2.0, path_s_per_token=0.0, engine_cores=1.0, path_cores=0.0, outside_cores=1.0)
    got = CB.server_cores(loop, probe_cores=0.95, probe_total=1.9, busy_slots=4, tokens=128, probe_ms=1600.0,
                          servers=2)  # fmt: skip
    assert got == pytest.approx(0.95 * (2.0 - 2.0 / 3.0) / 1.9)
    assert got < CB.server_cores(none, probe_cores=0.95, probe_total=1.9, busy_slots=4, tokens=128,
                                 probe_ms=1600.0, servers=2)  # fmt: skip


def test_the_competing_cpu_is_read_from_proc_stat_over_the_usable_cores() -> None:
    from stagescope.service.llama_cpp.cpu import competing_cpu_s

    stat = ("cpu  300 30 60 900 9 0 6 3 0 0\n"
            "cpu0 100 10 20 300 3 0 2 1 0 0\n"   # user nice system idle iowait irq softirq steal
            "cpu1 200 20 40 600 6 0 4 2 0 0\n"
            "cpu2 999 99 99 999 9 0 9 9 0 0\n"
            "intr 1 2 3\n")  # fmt: skip
    # user + system + irq + softirq + steal of cpu0 and cpu1, in clock ticks of 100 per second
    assert competing_cpu_s(stat, {0, 1}, niced=False, clk_tck=100.0) == pytest.approx((123 + 246) / 100.0)
    # niced itself: other niced work competes with it too
    assert competing_cpu_s(stat, {0, 1}, niced=True, clk_tck=100.0) == pytest.approx((133 + 266) / 100.0)
    assert competing_cpu_s(stat, {0, 3}, niced=False, clk_tck=100.0) is None  # no line for cpu3
    assert competing_cpu_s("cpu0 x y\n", {0}, niced=False, clk_tck=100.0) is None
    assert competing_cpu_s(stat, set(), niced=False, clk_tck=100.0) is None


def test_no_budget_without_the_cores_the_gateway_cpu_or_an_engine() -> None:
    con = _recorded_run(gw_cpu=1.0, client_cpu=0.5, engine_cpu=5.0, tokens=100, holds=[(1, 4)])
    con.execute("DELETE FROM metric_samples WHERE metric = ?", [N.METRIC_HOST_CPU_CORES])
    assert CB.baseline_budget(con, ["prefill", "decode"]) is None
    con = _recorded_run(gw_cpu=1.0, client_cpu=0.5, engine_cpu=5.0, tokens=100, holds=[(1, 4)])
    con.execute("DELETE FROM metric_samples WHERE labels[?] = ?", [N.LABEL_ROLE, N.ROLE_ENGINE])
    assert CB.baseline_budget(con, ["prefill", "decode"]) is None  # a fronted server: no pid, no CPU
    assert CB.baseline_budget(duckdb.connect(), ["prefill", "decode"]) is None


def _budget(path_ms_per_token: float) -> CB.CPUBudget:
    return CB.CPUBudget(cores=2.0, path_s_per_token=path_ms_per_token / 1000.0, engine_cores=1.0, path_cores=0.2)


def test_the_run_leaves_the_servers_the_cores_less_the_gateway_and_the_client() -> None:
    b = _budget(1.0)
    # the probe's two servers got 0.95 cores each with every slot busy; 4 streams of 128 tokens at ~1.6 s
    got = CB.server_cores(b, probe_cores=0.95, probe_total=1.9, busy_slots=4, tokens=128, probe_ms=1600.0)
    hold_s = 1.6 * 0.95 / got
    assert got == pytest.approx(0.95 * (2.0 - 0.001 * 4 * 128 / hold_s) / 1.9, rel=1e-6)  # the fixed point
    assert got < 0.95  # the run's telemetry takes more than the probe left to others
    # more CPU per token leaves less; none leaves the probe's share scaled to the whole machine, capped
    assert CB.server_cores(_budget(2.0), probe_cores=0.95, probe_total=1.9, busy_slots=4, tokens=128,
                           probe_ms=1600.0) < got  # fmt: skip
    assert CB.server_cores(_budget(0.0), probe_cores=0.95, probe_total=1.9, busy_slots=4, tokens=128,
                           probe_ms=1600.0) == pytest.approx(1.0)  # fmt: skip
    # one server busy on an otherwise idle machine: never more than one server used in the baseline
    assert CB.server_cores(b, probe_cores=1.0, probe_total=1.0, busy_slots=1, tokens=128, probe_ms=800.0) == 1.0


def test_rescale_moves_each_cell_from_the_probe_cores_to_the_run_ones() -> None:
    b = _budget(1.0)
    table = {(1, 0): 800.0, (1, 1): 1000.0, (2, 1): 1500.0, (1, 2): 1100.0, (2, 2): 1700.0}
    # a probe disturbed by other load: its servers got 0.6 cores each at 2+2, 0.9 and 0.8 at 2+1 / 1+2
    cores = {(1, 0): 1.0, (1, 1): 0.85, (2, 1): 0.9, (1, 2): 0.8, (2, 2): 0.6}
    out, served = CB.rescale(table, cores, b, served_ms=1400.0, served_cores=0.9, replicas=2, tokens=128)
    assert served == pytest.approx(1400.0 * 0.9)  # as served, at the baseline server's own cores
    assert out[(1, 0)] == pytest.approx(800.0)  # alone: all it can use, in the probe and in the run
    r22 = CB.server_cores(b, probe_cores=0.6, probe_total=1.2, busy_slots=4, tokens=128, probe_ms=1700.0)
    assert r22 > 0.75 and out[(2, 2)] == pytest.approx(1700.0 * 0.6 / r22)  # the run leaves them more
    # the 2+1 and 1+2 cells keep the probe's split (the server with 2 busy slots took more)
    r21 = CB.server_cores(b, probe_cores=0.9, probe_total=1.7, busy_slots=3, tokens=128, probe_ms=1500.0)
    assert out[(2, 1)] == pytest.approx(1500.0 * 0.9 / r21)
    # a cell without its cores stays as measured
    out2, _ = CB.rescale({**table, (3, 0): 2000.0}, cores, b, served_ms=1400.0, served_cores=None, replicas=2,
                         tokens=128)  # fmt: skip
    assert out2[(3, 0)] == 2000.0


def test_available_cores_follow_the_affinity_mask_and_a_cgroup_quota(tmp_path: Path) -> None:
    mask = float(len(os.sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cores(tmp_path) == mask
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert _cores(tmp_path) == min(mask, 0.5)
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cores(tmp_path) == mask  # v1, no quota
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("25000\n")
    assert _cores(tmp_path) == min(mask, 0.25)


def _cores(root: Path) -> float:
    from stagescope.service.llama_cpp.cpu import available_cores

    return available_cores(root)


def test_process_cpu_is_read_from_proc_and_a_gone_process_is_none() -> None:
    from stagescope.service.llama_cpp.cpu import process_cpu_s

    got = process_cpu_s(os.getpid())
    assert got is not None and got >= 0.0
    assert process_cpu_s(2**22 + 12345) is None  # above pid_max's default: no such process


def test_the_gateway_exports_its_cpu_its_engines_and_the_probe_cores() -> None:
    from stagescope.service.llama_cpp.gateway import create_gateway_app
    from stagescope.service.llama_cpp.serve import main, measured_cpu

    cpu = measured_cpu(["serving=0.97", "scale-out@2+2=0.85"])
    assert cpu == {"serving": 0.97, "scale-out@2+2": 0.85}
    for bad in (["scale-out@2+2=0"], ["scale-out@2+2=x"], ["scale-out@x=1"]):
        with pytest.raises(UserError):
            measured_cpu(bad)
    assert main(["--scenario", "llama-slots-busy", "--measured-cpu", "serving=-1", "--print-config"]) == 2
    reg = CollectorRegistry()
    create_gateway_app(["http://127.0.0.1:9"], 2, registry=reg, measured_cpu_cores=cpu,
                       engine_pids={0: os.getpid(), 1: 2**22 + 12345})  # fmt: skip
    text = generate_latest(reg).decode()
    assert (f'{N.METRIC_EXECUTOR_OCCUPANCY_CPU}{{{N.LABEL_BUSY_OTHERS}="2",{N.LABEL_BUSY_OWN}="2",'
            f'{N.LABEL_VARIANT}="{N.LEVER_SCALE_OUT}"}} 0.85') in text  # fmt: skip
    assert f'{N.METRIC_PROCESS_CPU}{{{N.LABEL_REPLICA}="",{N.LABEL_ROLE}="{N.ROLE_GATEWAY}"}}' in text
    assert f'{N.METRIC_PROCESS_CPU}{{{N.LABEL_REPLICA}="0",{N.LABEL_ROLE}="{N.ROLE_ENGINE}"}}' in text
    assert f'{N.LABEL_REPLICA}="1"' not in text  # a process that is gone: no sample, a failure counted
    assert f"{N.METRIC_PROCESS_CPU_READ_FAILURES} 1.0" in text
    assert f"{N.METRIC_HOST_CPU_CORES} " in text
    from stagescope.service.llama_cpp.cpu import _competing_now

    # exported where /proc/stat is read and no cgroup quota caps the cores below the affinity set
    assert (f"{N.METRIC_HOST_CPU_COMPETING} " in text) == (_competing_now() is not None)


def test_the_probe_cores_are_read_back_by_occupancy() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE metric_samples (metric VARCHAR, labels MAP(VARCHAR, VARCHAR), value DOUBLE, ts_ms BIGINT)")
    for variant, own, others, v in ((N.VARIANT_SERVING, "0", "0", 0.97), (N.LEVER_SCALE_OUT, "2", "2", 0.85),
                                    (N.LEVER_SCALE_OUT, "1", "0", 1.0), ("other", "1", "0", 0.1)):  # fmt: skip
        con.execute("INSERT INTO metric_samples VALUES (?, MAP(?, ?), ?, 1)",
                    [N.METRIC_EXECUTOR_OCCUPANCY_CPU, [N.LABEL_VARIANT, N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS],
                     [variant, own, others], v])  # fmt: skip
    table, served = CB.occupancy_cores(con, N.LEVER_SCALE_OUT)
    assert table == {(2, 2): 0.85, (1, 0): 1.0} and served == 0.97
    assert CB.occupancy_cores(duckdb.connect(), N.LEVER_SCALE_OUT) == ({}, None)


def test_the_demo_recorder_adds_the_client_cpu_to_each_scrape() -> None:
    from stagescope.analysis.ingest.prom import parse_exposition
    from stagescope.demo.recorder import MetricsRecorder

    line = MetricsRecorder._client_cpu()
    got = list(parse_exposition("up 1\n" + line))
    assert got[-1][0] == N.METRIC_PROCESS_CPU and got[-1][1] == {N.LABEL_ROLE: N.ROLE_CLIENT}
    assert got[-1][2] is not None and got[-1][2] >= 0.0


def test_measured_cpu_overrides_become_gateway_options() -> None:
    from stagescope.service.llama_cpp import engine
    from stagescope.service.llama_cpp.scenarios import get_scenario
    from stagescope.service.llama_cpp.slot_probe import MEASURED_CPU_PREFIX

    cmd = engine.serve_command(get_scenario("llama-slots-busy"), port=1, spans_dir=Path("spans"), apply_lever=False,
                               overrides={f"{MEASURED_CPU_PREFIX}scale-out@2+2": 0.85})  # fmt: skip
    assert cmd[cmd.index("--measured-cpu") + 1] == "scale-out@2+2=0.85" and "--set" not in cmd


def test_the_run_table_is_rescaled_only_where_both_the_run_and_the_probe_measured_cpu() -> None:
    table = {(1, 0): 800.0, (2, 2): 1700.0}
    con = _recorded_run(gw_cpu=1.5, client_cpu=0.5, engine_cpu=7.0, tokens=100, holds=[(1, 4), (3, 6), (6, 9)])
    assert CB.for_run(con, table, 1400.0, ["prefill", "decode"], N.LEVER_SCALE_OUT, replicas=2) == (table, 1400.0, None)
    for (own, others), v in (((1, 0), 1.0), ((2, 2), 0.7)):
        con.execute("INSERT INTO metric_samples VALUES (?, MAP(?, ?), ?, 1)",
                    [N.METRIC_EXECUTOR_OCCUPANCY_CPU, [N.LABEL_VARIANT, N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS],
                     [N.LEVER_SCALE_OUT, str(own), str(others)], v])  # fmt: skip
    got, served, budget = CB.for_run(con, table, 1400.0, ["prefill", "decode"], N.LEVER_SCALE_OUT, replicas=2)
    assert budget is not None and served == 1400.0  # no cores measured as served: S as measured
    assert got == pytest.approx(CB.rescale(table, {(1, 0): 1.0, (2, 2): 0.7}, budget, served_ms=1400.0,
                                           served_cores=None, replicas=2, tokens=100.0)[0])  # fmt: skip
    assert got[(2, 2)] != 1700.0
