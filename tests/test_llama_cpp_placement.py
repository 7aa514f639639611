"""Where the llama-servers run: each on cores of its own where the machine has them (server.placement),
set before exec so every thread the server starts inherits it; unpinned where it has too few."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from stagescope.service.llama_cpp.server import EngineConfig, LlamaServer, placement


def test_each_server_gets_its_own_threads_worth_of_cores_in_order() -> None:
    assert placement(2, 1, [3, 1]) == [frozenset({1}), frozenset({3})]
    assert placement(1, 1, [0, 1]) == [frozenset({0})]  # today's one server: the first core
    assert placement(2, 2, range(5)) == [frozenset({0, 1}), frozenset({2, 3})]
    assert placement(3, 1, [0, 1]) is None  # fewer cores than servers x threads: the scheduler shares them
    assert placement(2, 2, [0, 1, 2]) is None
    assert placement(0, 1, [0]) is None


def _allowed(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            out: set[int] = set()
            for part in line.split(":", 1)[1].strip().split(","):
                a, _, b = part.partition("-")
                out.update(range(int(a), int(b or a) + 1))
            return out
    raise AssertionError("no Cpus_allowed_list")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity is read from /proc (Linux)")
@pytest.mark.parametrize("pin", [True, False])
def test_a_pinned_server_process_runs_only_on_its_cores(tmp_path: Path, pin: bool) -> None:
    fake = tmp_path / "llama-server"  # stands in for the binary: takes its arguments, sleeps
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    cpus = frozenset({min(os.sched_getaffinity(0))}) if pin else None
    s = LlamaServer(fake, tmp_path / "model.gguf", EngineConfig(), log=tmp_path / "log", cpus=cpus)
    try:
        time.sleep(0.2)
        assert s.proc.poll() is None
        assert _allowed(s.proc.pid) == (set(cpus) if cpus else set(os.sched_getaffinity(0)))
    finally:
        s.stop()
