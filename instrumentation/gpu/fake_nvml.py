"""FAKE NVML: a simulated multi-GPU machine for tests and benchmarks (no GPU is touched).

This is a test double at the hardware boundary, named as such everywhere it appears: every
simulated GPU's ``modelName`` starts with ``"fake-nvml "``. It mirrors ``pynvml``'s function names,
signatures and return values (the real ctypes structs from ``pynvml``: ``c_nvmlUtilization_t``,
``c_nvmlMemory_v2_t``, ``nvmlPciInfo_t``, ``c_nvmlSample_t``, ``c_nvmlFieldValue_t``,
``c_nvmlProcessUtilizationSample_t``, ``c_nvmlEventData_t``) and raises ``pynvml``'s own error classes
(``pynvml.NVMLError(code)`` maps to ``NVMLError_NotSupported``, ``NVMLError_GpuIsLost`` ...), so code
that runs against it runs against the real library.

Broken machines it can play:

- ``FakeNvml(init_error=NVML_ERROR_DRIVER_NOT_LOADED)`` (or ``..._LIBRARY_NOT_FOUND``): ``nvmlInit`` fails;
- ``FakeGpu(unsupported={"nvmlDeviceGetTotalEnergyConsumption", ...})``: those calls raise
  ``NVMLError_NotSupported`` on that GPU (``"field:82"`` makes one field value unsupported);
- ``gpu.lost = True``: the GPU fell off the bus; every call on it raises ``NVMLError_GpuIsLost``
  (``nvmlDeviceGetHandleByIndex`` too);
- ``FakeGpu(name="fake-nvml Tesla T4", gpm=False)``: a GPU before Hopper, without GPM (``nvmlGpmQueryDeviceSupport`` says so), so
  the profiling fields are omitted; with ``gpm=True`` the GPM metrics report ``gr_engine_pct``,
  ``tensor_pct`` and ``dram_pct`` as they were when the second of the two samples was taken;
- ``FakeGpu(sample_buffer=True, samples={1: [(unix_us, percent), ...]})``: the driver sample buffer;
  by default ``nvmlDeviceGetSamples`` is not supported and the sampler polls.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

__all__ = ["FakeGpu", "FakeNvml"]

FAKE_MODEL_PREFIX = "fake-nvml "


@dataclass
class FakeGpu:
    """State of one simulated GPU; tests change the fields while the exporter runs."""

    name: str = FAKE_MODEL_PREFIX + "NVIDIA H100 80GB HBM3"
    minor: int = 0
    uuid: str = ""
    bus_id: str = ""
    util_gpu: int = 0  # % (what nvmlDeviceGetUtilizationRates returns now)
    util_mem: int = 0
    mem_total: int = 80 * 1024**3  # bytes
    mem_used: int = 0
    mem_reserved: int = 512 * 1024**2
    sm_clock: int = 1980  # MHz
    mem_clock: int = 2619
    temp: int = 40  # C
    mem_temp: int = 45
    power_mw: int = 70_000
    energy_mj: int = 1_000_000
    pcie_replay: int = 0
    pcie_tx_kbs: int = 100
    pcie_rx_kbs: int = 200
    enc_util: int = 0
    dec_util: int = 0
    nvlink_bw: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure
    throttle: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> count
    serial: str = "0000000000000"
    vbios: str = "96.00.00.00.00"
    processes: list[tuple[int, int | None, int, int]] = field(default_factory=list)  # pid, bytes, sm%, mem%
    #: driver sample buffer: engine sample type (1 gpu, 2 memory) -> [(unix µs, percent)]
    samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    gpm: bool = True  # GPU Performance Monitoring (Hopper and newer; False for an older GPU)
    gr_engine_pct: float = 0.0  # GPM NVML_GPM_METRIC_GRAPHICS_UTIL, percent
    tensor_pct: float = 0.0  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    dram_pct: float = 0.0  # NVML_GPM_METRIC_DRAM_BW_UTIL
    sample_buffer: bool = False  # True: nvmlDeviceGetSamples serves `samples`; False: NotSupported
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    calls: int = 0


class FakeNvml:
    """A stand-in for the ``pynvml`` module (FAKE: simulated GPUs, see the module docstring)."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: int | Iterable[FakeGpu] = 2,
        *,
        driver_version: str = "550.54.15",
        init_error: int | None = None,
    ) -> None:
        if isinstance(gpus, int):
            gpus = [FakeGpu() for _ in range(gpus)]
        self.gpus: list[FakeGpu] = list(gpus)
        for i, g in enumerate(self.gpus):
            g.minor = g.minor or i
            g.uuid = g.uuid or f"GPU-fa4e0000-0000-4000-8000-{i:012x}"
            g.bus_id = g.bus_id or f"00000000:{0x17 + i:02X}:00.0"
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in self.gpus]
        self.handles = [ctypes.pointer(s) for s in self._structs]
        self.driver_version = driver_version
        self.init_error = init_error
        self.initialized = False
        self.pending_events: list[tuple[int, int, int]] = []  # (gpu, event type, data)
        self.registered: dict[int, int] = {}
        self._gpm_samples: dict[int, tuple[int, int, dict[int, float]]] = {}  # address -> (gpu, seq, metrics)
        self._gpm_seq = 0

    # -- helpers -----------------------------------------------------------------------------------
    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        idx = self._index(handle)
        g = self.gpus[idx]
        g.calls += 1
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def _index(self, handle: Any) -> int:
        addr = ctypes.addressof(handle.contents)
        for i, s in enumerate(self._structs):
            if ctypes.addressof(s) == addr:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def xid(self, gpu: int, code: int) -> None:
        """Simulate an XID critical error on ``gpu``."""
        if gpu in self.registered:
            self.pending_events.append((gpu, pynvml.nvmlEventTypeXidCriticalError, code))

    # -- init / system -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12." + self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpu(self.handles[index], "nvmlDeviceGetHandleByIndex")
        return self.handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._index(handle)

    # -- identity ----------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = g.bus_id.encode()
        info.busIdLegacy = g.bus_id[4:].encode()
        info.bus = int(g.bus_id.split(":")[1], 16)
        return info

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetVbiosVersion").vbios

    # -- readings ----------------------------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type == pynvml.NVML_CLOCK_SM:
            return g.sm_clock
        if type == pynvml.NVML_CLOCK_MEM:
            return g.mem_clock
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        g = self._gpu(device, "nvmlDeviceGetPcieThroughput")
        return g.pcie_tx_kbs if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kbs

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return [self._gpu(handle, "nvmlDeviceGetEncoderUtilization").enc_util, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return [self._gpu(handle, "nvmlDeviceGetDecoderUtilization").dec_util, 167_000]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        free = g.mem_total - g.mem_used - (g.mem_reserved if version else 0)
        if not version:
            return pynvml.c_nvmlMemory_t(total=g.mem_total, free=g.mem_total - g.mem_used, used=g.mem_used)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=g.mem_total, reserved=g.mem_reserved, free=free, used=g.mem_used
        )

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            values[i].fieldId = fid
            if f"field:{fid}" in g.unsupported:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.mem_temp
            elif fid == pynvml.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = g.nvlink_bw
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list[Any]]:
        g = self._gpu(device, "nvmlDeviceGetSamples")
        if not g.sample_buffer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for ts, v in g.samples.get(sampling_type, []):
            if ts > timeStamp:
                s = pynvml.c_nvmlSample_t()
                s.timeStamp = ts
                s.sampleValue.uiVal = v
                out.append(s)
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        g = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        out = []
        for pid, used, _sm, _mem in g.processes:
            obj = pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=used or 0)
            )
            if used is None:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        g = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        if not g.processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [
            pynvml.c_nvmlProcessUtilizationSample_t(pid=pid, timeStamp=timeStamp + 1, smUtil=sm, memUtil=mem)
            for pid, _used, sm, mem in g.processes
        ]

    # -- GPM (profiling) ---------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g = self._gpu(device, "nvmlGpmQueryDeviceSupport")
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(g.gpm)
        )

    def nvmlGpmSampleAlloc(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gpm_samples.pop(ctypes.addressof(gpmSample.contents), None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        g = self._gpu(device, "nvmlGpmSampleGet")
        if not g.gpm:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_seq += 1
        metrics = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: g.gr_engine_pct,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: g.tensor_pct,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: g.dram_pct,
        }
        self._gpm_samples[ctypes.addressof(gpmSample.contents)] = (
            self._index(device),
            self._gpm_seq,
            metrics,
        )
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        try:
            gpu1, seq1, _ = self._gpm_samples[ctypes.addressof(metricsGet.sample1.contents)]
            gpu2, seq2, metrics = self._gpm_samples[ctypes.addressof(metricsGet.sample2.contents)]
        except (KeyError, ValueError):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        if gpu1 != gpu2 or seq2 <= seq1 or metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpu(self.handles[gpu2], "nvmlGpmMetricsGet")
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            if m.metricId in metrics:
                m.value = metrics[m.metricId]
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # -- events ------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlEventSet_t())

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        return None

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        g = self._gpu(handle, "nvmlDeviceRegisterEvents")
        self.registered[self.gpus.index(g)] = eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        if not self.pending_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, etype, data = self.pending_events.pop(0)
        ev = pynvml.c_nvmlEventData_t()
        ev.device = self.handles[gpu]
        ev.eventType = etype
        ev.eventData = data
        return ev
