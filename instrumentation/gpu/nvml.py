"""Opening NVML, and the NVML reads the GPU collector makes beside the field table.

:func:`load_nvml` imports ``pynvml`` and initialises it, :func:`init_nvml` initialises an injected NVML
(``pynvml`` or the simulated :class:`~stagescope.instrumentation.gpu.fake_nvml.FakeNvml`); both raise
:class:`NvmlUnavailable` with a one-line reason. :data:`UNSUPPORTED_CODES` are the NVML return codes
that mean "this field is not there on this GPU". :func:`process_samples` reads each process's GPU
memory (bytes) and utilization (%).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["UNSUPPORTED_CODES", "NvmlUnavailable", "init_nvml", "load_nvml", "process_samples"]

#: NVML return codes meaning "this field is not there on this GPU": omit the field for good.
UNSUPPORTED_CODES = frozenset(
    {3, 4, 6, 13, 2}
)  # NotSupported, NoPermission, NotFound, FunctionNotFound, InvalidArgument


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (library missing, driver not loaded, ...)."""


def load_nvml(import_module: Callable[[str], Any] | None = None) -> Any:
    """Import ``pynvml`` and initialise NVML; raise :class:`NvmlUnavailable` with a one-line reason."""
    import importlib

    imp = import_module or importlib.import_module
    try:
        nvml = imp("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"the pynvml module is not installed (pip install 'stagescope[gpu]'): {exc}") from None
    init_nvml(nvml)
    return nvml


def init_nvml(nvml: Any) -> None:
    """``nvml.nvmlInit()``; raise :class:`NvmlUnavailable` with a one-line reason when it fails."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, OSError ...
        raise NvmlUnavailable(f"nvmlInit failed: {type(exc).__name__}: {exc}") from None


def process_samples(
    nvml: Any, handle: Any, clock: Callable[[], float], window_s: float
) -> list[tuple[int, float | None, dict[str, float]]]:
    """(pid, used bytes or None, {engine: mean %}) for each process on the GPU ``handle``: its memory from
    ``nvmlDeviceGetComputeRunningProcesses``, its ``sm`` and ``memory_copy`` utilization averaged over
    the ``nvmlDeviceGetProcessUtilization`` samples of the last ``window_s`` seconds of ``clock`` (Unix
    seconds; no utilization where that call is not supported). Raises NVML's error for any other failure."""
    n, h = nvml, handle
    mem: dict[int, float | None] = {}
    for p in n.nvmlDeviceGetComputeRunningProcesses(h):
        mem[int(p.pid)] = None if p.usedGpuMemory is None else float(p.usedGpuMemory)
    util: dict[int, dict[str, list[float]]] = {}
    since_us = int((clock() - window_s) * 1e6)
    try:
        for s in n.nvmlDeviceGetProcessUtilization(h, since_us):
            u = util.setdefault(int(s.pid), {"sm": [], "memory_copy": []})
            u["sm"].append(float(s.smUtil))
            u["memory_copy"].append(float(s.memUtil))
    except n.NVMLError as exc:
        if exc.value not in UNSUPPORTED_CODES:
            raise
    out = []
    for pid in sorted(set(mem) | set(util)):
        means = {k: sum(v) / len(v) for k, v in util.get(pid, {}).items() if v}
        out.append((pid, mem.get(pid), means))
    return out
