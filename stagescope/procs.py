"""Stopping a child process the way every stagescope launcher does: a signal first (so the child can
flush what it recorded), then SIGKILL if it has not exited within a grace period."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

__all__ = ["stop_process"]


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
