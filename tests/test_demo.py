"""``stagescope demo``: every scenario's true cause is found end to end; bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stagescope.demo.recorder import stamp_exposition
from stagescope.service.scenarios import SCENARIOS

CLI = [sys.executable, "-m", "stagescope.cli", "demo"]


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_stamp_exposition_adds_scrape_time_once() -> None:
    text = '# HELP x y\n# TYPE x gauge\nx{a="b c}"} 1.5\ny 2\nz{a="1"} 3 1700000000000\n'
    assert stamp_exposition(text, 42).splitlines() == [
        "# HELP x y", "# TYPE x gauge", 'x{a="b c}"} 1.5 42', "y 2 42", 'z{a="1"} 3 1700000000000',
    ]  # fmt: skip


@pytest.mark.slow
def test_demo_all_finds_every_true_cause(tmp_path: Path) -> None:
    out = tmp_path / "all"
    proc = _run("--all", "--duration", "8", "--out", str(out))
    rows = json.loads((out / "summary.json").read_text())
    print(proc.stdout)
    assert [r["scenario"] for r in rows] == list(SCENARIOS)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1) + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    for r in rows:
        report = json.loads((out / r["scenario"] / "report.json").read_text())
        assert report["breached"] == (SCENARIOS[r["scenario"]].true_stage is not None)
        assert (out / r["scenario"] / "report.html").stat().st_size > 10_000
        assert any((out / r["scenario"] / "metrics").glob("scrape-*.prom"))


def test_unknown_scenario_is_one_line(tmp_path: Path) -> None:
    proc = _run("--scenario", "no-such-thing", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown scenario 'no-such-thing'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; a file in the way is used instead")
def test_unwritable_out_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    proc = _run("--out", str(ro / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot write the demo's output there" in proc.stderr


def test_out_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _run("--out", str(blocker / "sub"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "cannot write the demo's output there" in proc.stderr and "Traceback" not in proc.stderr


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _run("--port", str(port), "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One demo run stopped with Ctrl-C (SIGINT) after 9 scrapes: its exit status,
    output and report, read before the second-run test below runs a demo into the same folder."""
    out = tmp_path_factory.mktemp("demo") / "int"
    proc = subprocess.Popen([*CLI, "--scenario", "healthy", "--duration", "60", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    # 9 scrapes (1 s apart): the load starts a little after the first ones, so this leaves seconds of
    # traffic for the second-run test to tell apart (at the 4th scrape a quiet machine had 27 requests)
    while time.monotonic() < deadline and len(list((out / "metrics").glob("scrape-*.prom"))) < 9:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return {"out": out, "code": proc.returncode, "stdout": stdout, "stderr": stderr, "report": report,
            "results": (out / "results.parquet").exists()}  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_stops_the_service_and_keeps_what_was_recorded(interrupted: dict[str, Any]) -> None:
    assert interrupted["code"] == 130, interrupted["stderr"][-2000:]
    assert "interrupted" in interrupted["stderr"]
    report = interrupted["report"]
    assert report is not None, interrupted["stderr"][-2000:]
    assert 0 < report["requests"] < 60 * SCENARIOS["healthy"].rate_rps
    assert interrupted["results"]
    assert "SLO p99<300ms" in interrupted["stdout"]


def test_an_earlier_runs_recordings_are_moved_aside_not_mixed_in(tmp_path: Path) -> None:
    from stagescope.demo.runner import RECORDINGS, archive_previous

    out = tmp_path / "demo"
    assert archive_previous(out) is None
    (out / "spans").mkdir(parents=True)
    (out / "spans" / "spans-1-0.jsonl").write_text("{}\n")
    (out / "metrics").mkdir()
    (out / "metrics" / "scrape-00009.prom").write_text("x 1\n")
    (out / "report.json").write_text("{}")
    (out / "lever").mkdir()
    (out / "dashboards").mkdir()  # regenerated by every run: left in place
    first = archive_previous(out)
    assert first is not None and first.parent == out / "earlier-runs"
    assert (first / "spans" / "spans-1-0.jsonl").read_text() == "{}\n"
    assert (first / "metrics" / "scrape-00009.prom").exists() and (first / "lever").is_dir()
    assert not any((out / n).exists() for n in RECORDINGS) and (out / "dashboards").is_dir()
    assert archive_previous(out) is None
    (out / "report.json").write_text("{}")
    second = archive_previous(out)  # same second: a distinct folder, the first one untouched
    assert second is not None and second != first and (first / "report.json").exists()


@pytest.mark.slow
def test_a_second_demo_run_into_the_same_folder_analyses_only_its_own_traffic(interrupted: dict[str, Any]) -> None:
    """The Ctrl-C run above is the earlier run (its report and results were written, as a finished
    run's are); a 3 s run into its folder analyses only its own requests and moves the earlier ones aside."""
    out = interrupted["out"]
    rate = SCENARIOS["healthy"].rate_rps
    # at least 1 s of earlier traffic: mixed in, it would take the count past the bound below
    assert interrupted["report"] is not None and interrupted["report"]["requests"] >= rate, interrupted["report"]
    proc = _run("--scenario", "healthy", "--duration", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    # one run's worth of requests (about 3 s at the scenario's rate), not the earlier run's too
    assert report["requests"] <= 3 * rate * 1.3
    assert "the earlier run's recordings" in proc.stderr
    runs = list((out / "earlier-runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "report.json").exists()
    assert json.loads((runs[0] / "report.json").read_text()) == interrupted["report"]


def _lever_runs(tmp_path: Path) -> tuple[Any, dict[str, Any], Callable[[float, list[float | None] | None], Any]]:
    """A real before-report (the SYNTHETIC slow-compute incident, analysed) and a RunResult maker
    for the run after the lever with a chosen measured quantile and interval."""
    import duckdb

    from stagescope.analysis import synth_scenarios as S
    from stagescope.analysis.api import analyze
    from stagescope.demo.runner import RunResult

    data = S.generate("slow-compute", 1500, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    report = json.loads(json.dumps(analyze(con, data.scenario.slo), default=str))
    before = RunResult("slow-compute", False, tmp_path, report, 1500, None)

    def after(q: float, iv: list[float | None] | None) -> RunResult:
        rep = {**report, "status": "met", "breached": False, "quantile_ms": q, "quantile_interval_ms": iv}
        return RunResult("slow-compute", True, tmp_path / "lever", rep, 1500, None)

    return before, report, after


def test_lever_check_is_judged_by_the_intervals(tmp_path: Path) -> None:
    from stagescope.demo.main import lever_check

    before, report, after = _lever_runs(tmp_path)
    lever = next(lv for lv in report["levers"] if lv["lever"] == report["verdict"]["lever"])
    lo, hi = lever["interval_ms"]
    pred = lever["predicted_p99_ms"]
    assert lo is not None and hi is not None and lo <= pred <= hi and hi > lo
    inside = lever_check(before, after((lo + hi) / 2, [lo - 5, hi + 5]))
    assert inside["predicted_interval_ms"] == [lo, hi] and inside["p99_after_interval_ms"] == [lo - 5, hi + 5]
    assert inside["p99_before_interval_ms"] == report["quantile_interval_ms"]
    assert inside["judgement"]["verdict"] == "within" and "within the predicted 95% interval" in inside["judgement"]["words"]
    above = lever_check(before, after(hi + 40.0, [hi + 30.0, hi + 55.0]))
    assert above["judgement"]["verdict"] == "outside"
    assert above["judgement"]["outside_by_ms"] == pytest.approx(40.0, abs=0.05)
    assert "outside the predicted 95% interval by 40 ms (above)" in above["judgement"]["words"]
    below = lever_check(before, after(lo - 12.5, [lo - 20.0, lo - 10.0]))
    assert below["judgement"]["outside_by_ms"] == pytest.approx(12.5, abs=0.05) and "below" in below["judgement"]["words"]
    short = lever_check(before, after(pred, [pred - 10.0, None]))  # too few samples above the p99
    assert short["judgement"]["verdict"] == "too_short" and "too short to tell" in short["judgement"]["words"]
    # the llama-cpp work's fields stay: the measured error against the prediction
    assert above["prediction_error"] == pytest.approx(round((hi + 40.0) / pred - 1, 4))
    json.dumps(above)  # lever_check.json


def test_apply_lever_prints_the_intervals_and_the_judgement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_one and run_all (the service runs replaced by the real analysed report above) print each
    interval and the judgement, and write it into lever_check.json / summary.json."""
    import io

    from rich.console import Console

    import stagescope.demo.main as D

    before, report, after = _lever_runs(tmp_path)
    lever = next(lv for lv in report["levers"] if lv["lever"] == report["verdict"]["lever"])
    hi = lever["interval_ms"][1]
    buf = io.StringIO()
    monkeypatch.setattr(D, "out_console", Console(file=buf, width=300, highlight=False))
    monkeypatch.setattr(D, "_prepare", lambda engine: None)
    monkeypatch.setattr(D, "_sizing", lambda engine, name: {})
    monkeypatch.setattr(D, "_write_dashboards", lambda out: None)
    monkeypatch.setattr(D, "_run", lambda name, out, *, apply_lever, **kw: after(hi + 40.0, [hi + 30.0, hi + 60.0])
                        if apply_lever else before)  # fmt: skip
    assert D.run_one("slow-compute", tmp_path, duration_s=1, apply_lever=True, port=0) == 0
    text = buf.getvalue()
    lo_s, hi_s = (f"{x:,.0f}" for x in lever["interval_ms"])
    assert f"predicted {lever['predicted_p99_ms']:,.0f} ms [{lo_s}, {hi_s}]" in text
    assert f"measured after {hi + 40.0:,.0f} ms [{hi + 30.0:,.0f}, {hi + 60.0:,.0f}]" in text
    assert "judged by the 95% intervals: outside the predicted 95% interval by 40 ms" in text
    check = json.loads((tmp_path / "lever_check.json").read_text())
    assert check["judgement"]["verdict"] == "outside" and check["predicted_interval_ms"] == lever["interval_ms"]

    buf.truncate(0)

    def run(name: str, out: Path, *, apply_lever: bool, **kw: object) -> object:
        out.mkdir(parents=True, exist_ok=True)  # as the real run does
        if apply_lever:
            return after(lever["predicted_p99_ms"], [lever["predicted_p99_ms"] - 5, None])
        return D.RunResult(name, False, out, report if name == "slow-compute" else {**report, "verdict": None}, 1, None)

    monkeypatch.setattr(D, "_run", run)
    D.run_all(tmp_path / "all", duration_s=1, apply_lever=True, port=0)
    rows = {r["scenario"]: r for r in json.loads((tmp_path / "all" / "summary.json").read_text())}
    assert rows["slow-compute"]["judgement"]["verdict"] == "too_short"
    assert "judged by intervals" in buf.getvalue() and "too short to tell" in buf.getvalue()


@pytest.mark.parametrize("predicted_miss", [True, False], ids=["miss-predicted", "miss-not-predicted"])
def test_run_all_fails_a_lever_check_only_where_the_prediction_said_the_slo_would_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], predicted_miss: bool
) -> None:
    """A lever check left above the threshold is a failure of the demo when the analysis predicted the
    lever would meet the SLO; where its predicted quantile was above the threshold too (the lever alone
    is not enough, as on the ONNX slow-compute-strict scenario), the prediction was right and the row
    is ok, said on stdout."""
    import copy

    import stagescope.demo.main as D

    _, report, after = _lever_runs(tmp_path)
    threshold = report["slo"]["threshold_ms"]
    if predicted_miss:
        report = copy.deepcopy(report)
        next(lv for lv in report["levers"] if lv["lever"] == report["verdict"]["lever"])["predicted_p99_ms"] = 1.5 * threshold
    monkeypatch.setattr(D, "_prepare", lambda engine: None)
    monkeypatch.setattr(D, "_sizing", lambda engine, name: {})
    monkeypatch.setattr(D, "_write_dashboards", lambda out: None)

    def run(name: str, out: Path, *, apply_lever: bool, **kw: object) -> object:
        out.mkdir(parents=True, exist_ok=True)
        if apply_lever:
            return after(1.6 * threshold, [1.5 * threshold, 1.7 * threshold])
        return D.RunResult(name, False, out, report if name == "slow-compute" else {**report, "verdict": None}, 1, None)

    monkeypatch.setattr(D, "_run", run)
    D.run_all(tmp_path / "all", duration_s=1, apply_lever=True, port=0)
    rows = {r["scenario"]: r for r in json.loads((tmp_path / "all" / "summary.json").read_text())}
    captured = capsys.readouterr()
    row = rows["slow-compute"]
    assert row["slo_missed_as_predicted"] is predicted_miss and row["ok"] is predicted_miss
    assert ("left the SLO breached, as the analysis predicted" in captured.out) is predicted_miss
    assert ("lever check(s) left the SLO breached (cause found" in captured.err) is not predicted_miss
