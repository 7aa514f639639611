"""benchmarks/overhead_server.py: bad input is one line on stderr and exit 2, before any server starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "overhead_server.py"


@pytest.mark.parametrize(
    "args",
    [["--variants", "bare,nope"], ["--variants", ","], ["--duration", "0"], ["--top", "-1"],
     ["--variants", "bare-batch"]],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, str(_SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""  # nothing measured, nothing started
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overhead_server.py: "), proc.stderr
