"""`stagescope gpu-exporter`: bad input is one line and exit 2; without NVML it keeps serving up=0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from stagescope import names
from stagescope.instrumentation.gpu import GpuCollector, serve
from stagescope.instrumentation.gpu.fake_nvml import FakeNvml

CMD = [sys.executable, "-m", "stagescope.cli", "gpu-exporter"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "argument --interval: expected a finite number in [0.001, 3600], got '0'"),
        (["--port", "70000"], "argument --port: a port must be a whole number from 0 (any free port) to 65535"),
        (["--collectors", "{tmp}/c.csv"], "c.csv:2: unknown metric type"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "c.csv").write_text("# x\nDCGM_FI_DEV_GPU_UTIL, gaug, typo\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    p = subprocess.run(CMD + args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and message in p.stderr and "Traceback" not in p.stderr


def test_without_nvml_the_command_keeps_serving_exporter_up_0() -> None:
    """This machine has no GPU driver: the real pynvml fails to load, the exporter stays up."""
    port = free_port()
    proc = subprocess.Popen([*CMD, "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        body = None
        while body is None:
            try:
                body = get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                assert proc.poll() is None, "exporter exited"
                assert time.monotonic() < deadline, "exporter never answered"
                time.sleep(0.1)
        if "stagescope_gpu_up" in body:  # pragma: no cover - only on a GPU machine
            pytest.skip("this machine has a working NVML")
        assert f"{names.METRIC_GPU_EXPORTER_UP} 0.0" in body
        time.sleep(0.3)
        assert proc.poll() is None  # no crash loop
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "NVML unavailable" in errors[0] and "nvmlInit failed" in errors[0]


def test_http_endpoint_serves_the_collector() -> None:
    c = GpuCollector(FakeNvml(2), hostname="h", start_sampler=False)
    server = serve(c, "127.0.0.1", 0)
    try:
        body = get(f"http://127.0.0.1:{server.server_port}/metrics")
        assert f'{names.METRIC_GPU_UP}{{gpu="1"}} 1.0' in body
        assert f"# TYPE {names.DCGM_TOTAL_ENERGY} counter" in body
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{server.server_port}/nope")
    finally:
        server.shutdown()
        c.close()


def test_command_is_registered_with_help() -> None:
    p = subprocess.run([sys.executable, "-m", "stagescope.cli", "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ})  # fmt: skip
    assert "gpu-exporter" in p.stdout
