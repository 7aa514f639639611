"""``llama-server`` child processes: the engine settings a scenario sets, and starting/stopping them.

:class:`EngineConfig` holds the llama.cpp settings the scenarios and their levers change (what each
flag means is llama.cpp's ``tools/server/README.md``):

* ``parallel`` (``--parallel``): slots, the sequences one server decodes together (continuous
  batching, ``--cont-batching``, llama.cpp's default);
* ``batch_size`` / ``ubatch_size`` (``--batch-size`` / ``--ubatch-size``): tokens one engine step may
  carry (logical / physical). A prompt is processed at most ``batch_size`` tokens per step, so this is
  llama.cpp's form of chunked prefill: a smaller value lets the other slots' tokens through sooner;
* ``replicas``: how many servers run behind the gateway (scale-out);
* ``threads`` (``--threads`` and ``--threads-batch``): CPU threads per server (1 by default, so that
  the load generator and the gateway keep a core on a 2-core machine);
* ``ctx_per_slot``: KV-cache tokens per slot (``--ctx-size`` is ``parallel x ctx_per_slot``).

Every server runs with ``--metrics`` (Prometheus ``llamacpp:*`` on ``/metrics``), on 127.0.0.1 and
an OS-chosen port, its output in a log file.

Placement (:func:`placement`, on request: ``serve --pin``): where the cores this process may run on hold
``threads`` of their own for every server, server ``i`` is pinned (CPU affinity, set before exec, so
every thread inherits it) to the ``i``-th ``threads`` of them, as a second engine on a second machine
has cores of its own; the gateway and the load generator are not pinned (they run on whichever core
is free). With fewer cores than that the servers are not pinned. Not the default: on this 2-core
machine pinning did not make the lever's slot times steadier against today's
(docs/llama_cpp_slots_operating_point.md, s12), and a pinned server cannot move off a core that
other work holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagescope.errors import UserError
from stagescope.procs import stop_process

__all__ = ["EngineConfig", "LlamaServer", "free_port", "placement"]

#: Seconds a server may take to answer ``/health`` with 200 (the model loads in well under 1 s).
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EngineConfig:
    """The llama.cpp settings of one run (see the module docstring)."""

    parallel: int = 4
    batch_size: int = 2048
    ubatch_size: int = 512
    replicas: int = 1
    threads: int = 1
    ctx_per_slot: int = 4096

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"llama.cpp setting {f.name} must be a positive integer, got {v!r}")
        if self.ubatch_size > self.batch_size:
            raise UserError(f"llama.cpp ubatch_size ({self.ubatch_size}) must not exceed batch_size ({self.batch_size})")

    def with_overrides(self, overrides: Mapping[str, Any]) -> EngineConfig:
        """A copy with ``overrides`` applied; an unknown key or a bad value is one UserError line."""
        known = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise UserError(f"unknown llama.cpp setting(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        vals: dict[str, Any] = {}
        for k, v in overrides.items():
            try:
                vals[k] = int(v)
            except (TypeError, ValueError):
                raise UserError(f"llama.cpp setting {k} must be a positive integer, got {v!r}") from None
        return dataclasses.replace(self, **vals)

    def server_args(self, model: Path, port: int) -> list[str]:
        """``llama-server`` arguments serving ``model`` on 127.0.0.1:``port``."""
        return [
            "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(self.parallel), "--ctx-size", str(self.parallel * self.ctx_per_slot),
            "--batch-size", str(self.batch_size), "--ubatch-size", str(self.ubatch_size),
            "--threads", str(self.threads), "--threads-batch", str(self.threads),
            "--cont-batching", "--metrics", "--no-webui",
        ]  # fmt: skip


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGTERM the server when the process that started it dies, so none is left behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def placement(replicas: int, threads: int, cpus: Iterable[int] | None = None) -> list[frozenset[int]] | None:
    """The cores each of ``replicas`` servers of ``threads`` threads is pinned to: server ``i`` gets the
    ``i``-th ``threads`` of ``cpus`` (default: the cores this process may run on, in order), or None
    where ``cpus`` has fewer than ``replicas x threads`` (see the module docstring)."""
    if cpus is None:
        try:
            cpus = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return None
    got = sorted(set(cpus))
    if replicas < 1 or threads < 1 or len(got) < replicas * threads:
        return None
    return [frozenset(got[i * threads:(i + 1) * threads]) for i in range(replicas)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """One ``llama-server`` child process; :meth:`stop` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: Path, model: Path, cfg: EngineConfig, *, log: Path, port: int | None = None,
                 cpus: frozenset[int] | None = None) -> None:  # fmt: skip
        """``cpus``: the cores to pin the server to (:func:`placement`); None: not pinned."""
        self.port = port or free_port()
        self.cpus = cpus
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [str(binary), *cfg.server_args(model, self.port)]
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=self._prepare_child if sys.platform == "linux" else None,
        )  # fmt: skip

    def _prepare_child(self) -> None:  # pragma: no cover - runs in the child before exec
        _die_with_parent()
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # before exec: every thread the server starts inherits it

    def _last_line(self) -> str:
        self._log.flush()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else "(no output)"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until ``/health`` answers 200; a server that exits or stays unready is a UserError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"llama-server exited ({self.proc.returncode}): {self._last_line()} (log {self.log_path})")
            with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(
                f"{self.url}/health", timeout=1.0
            ) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise UserError(f"llama-server was not ready within {timeout_s:g} s (log {self.log_path})")

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.proc, signal.SIGTERM, timeout_s)
        self._log.close()
