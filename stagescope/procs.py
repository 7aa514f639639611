"""Child processes as every stagescope launcher handles them: stopping one (a signal first, so the child
can flush what it recorded, then SIGKILL if it has not exited within a grace period), and reading the
CPU time a process has taken."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["process_cpu_s", "stop_process"]


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    """Send ``sig`` to ``proc`` unless it has already exited, wait up to ``timeout_s`` seconds for it,
    then kill it and reap it. Returns once the process is gone."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) process ``pid`` has taken, from ``/proc/<pid>/stat``;
    None where it cannot be read (gone, not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None
