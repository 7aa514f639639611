"""Every command has help and is documented in the README (as sqlite-utils checks its CLI)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stagescope.cli import build_parser, main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_part_registers_its_command() -> None:
    assert set(_commands()) == {"demo", "serve", "load", "analyze", "dashboards", "alerts", "gpu-exporter"}


@pytest.mark.parametrize("command", sorted(_commands()))
def test_command_has_help_and_readme_entry(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert len(help_text) > 200 and "usage: stagescope" in help_text
    assert re.search(rf"stagescope {re.escape(command)}\b", README), f"README does not document {command!r}"


def test_no_command_prints_help_and_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "stagescope.cli"], capture_output=True, text=True)
    assert proc.returncode == 2 and "COMMAND" in proc.stdout
