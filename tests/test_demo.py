"""``stagescope demo``: every scenario's true cause is found end to end; bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.slow
def test_ctrl_c_stops_the_service_and_keeps_what_was_recorded(tmp_path: Path) -> None:
    out = tmp_path / "int"
    proc = subprocess.Popen([*CLI, "--scenario", "healthy", "--duration", "60", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((out / "metrics").glob("scrape-0000[3-9].prom")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    report = json.loads((out / "report.json").read_text())
    assert 0 < report["requests"] < 60 * SCENARIOS["healthy"].rate_rps
    assert (out / "results.parquet").exists()
    assert "SLO p99<300ms" in stdout
