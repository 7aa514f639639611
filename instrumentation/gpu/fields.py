"""dcgm-exporter's counters CSV, and how each of its fields is read from NVML.

dcgm-exporter is configured by a CSV of ``DCGM FIELD, Prometheus metric type, help message`` rows
(``#`` starts a comment; whitespace around the commas is irregular, e.g. ``DCGM_FI_DEV_DEC_UTIL ,``).
Rows of type ``label`` add a label to every GPU metric instead of a metric. :func:`parse_counters_csv`
reads that format; :data:`READERS` maps each field NVML can provide to a function
``(nvml, handle) -> value`` in the field's dcgm-exporter unit:

=====================================  ========  =================================================
field                                  unit      NVML call
=====================================  ========  =================================================
DCGM_FI_DEV_SM_CLOCK / MEM_CLOCK       MHz       nvmlDeviceGetClockInfo(SM / MEM)
DCGM_FI_DEV_GPU_TEMP                   C         nvmlDeviceGetTemperature(GPU)
DCGM_FI_DEV_MEMORY_TEMP                C         nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)
DCGM_FI_DEV_POWER_USAGE                W         nvmlDeviceGetPowerUsage (mW) / 1000
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION   mJ        nvmlDeviceGetTotalEnergyConsumption
DCGM_FI_DEV_PCIE_REPLAY_COUNTER        count     nvmlDeviceGetPcieReplayCounter
DCGM_FI_DEV_GPU_UTIL / MEM_COPY_UTIL   %         nvmlDeviceGetUtilizationRates (latest sample)
DCGM_FI_DEV_ENC_UTIL / DEC_UTIL        %         nvmlDeviceGetEncoder/DecoderUtilization
DCGM_FI_DEV_XID_ERRORS                 code      XID critical-error events (last one; 0 = none)
DCGM_FI_DEV_FB_FREE / USED / RESERVED  MiB       nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2)
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL     count     nvmlDeviceGetFieldValues(NVLINK_BANDWIDTH_C0_TOTAL)
DCGM_FI_DEV_*REMAPPED_ROWS, ROW_REMAP_FAILURE    nvmlDeviceGetRemappedRows
DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES  bytes/s   nvmlDeviceGetPcieThroughput (KB/s) * 1024
DCGM_FI_DEV_CLOCKS_EVENT_REASONS       bitmask   nvmlDeviceGetCurrentClocksEventReasons (also
  (before DCGM 3.3: _CLOCK_THROTTLE_REASONS)     under the old name, for CSVs that list it)
DCGM_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL count  nvmlDeviceGetTotalEccErrors
DCGM_FI_PROF_GR_ENGINE_ACTIVE,         ratio     NVML GPM (Hopper and newer), see gpm.py
  PIPE_TENSOR_ACTIVE, DRAM_ACTIVE
=====================================  ========  =================================================

Not provided (listed in :data:`NOT_PROVIDED` with the reason): ``DCGM_FI_DEV_VGPU_LICENSE_STATUS`` (a
DCGM-side vGPU state with no one-to-one NVML call). The profiling fields are omitted on GPUs without
GPM (before Hopper), as any unsupported field is.

NVML constants are spelled here by value (they are ABI, stable across driver releases; a test checks
them against ``pynvml``) so this module imports without ``pynvml`` installed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagescope import names
from stagescope.errors import UserError
from stagescope.instrumentation.gpu.gpm import GPM_FIELDS

__all__ = [
    "DEFAULT_COUNTERS_CSV",
    "GPM_FIELDS",
    "LABEL_READERS",
    "METRIC_TYPES",
    "NOT_PROVIDED",
    "READERS",
    "SAMPLER_FIELDS",
    "CounterSpec",
    "load_counters_csv",
    "parse_counters_csv",
]

#: The counters CSV shipped with stagescope: dcgm-exporter's default list plus NVML extras.
DEFAULT_COUNTERS_CSV = Path(__file__).with_name("counters.csv")
METRIC_TYPES = ("gauge", "counter", "label")

# NVML enum values (nvml.h).
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL = 66
NVML_MEMORY_V2 = 0x2000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
MIB = 1024 * 1024
_MAX_CSV_BYTES = MIB
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class CounterSpec:
    """One row of a dcgm-exporter counters CSV."""

    name: str  # DCGM field name, also the Prometheus metric (or label) name
    type: str  # "gauge" | "counter" | "label"
    help: str
    line: int  # 1-based line in the CSV, for error messages


def parse_counters_csv(text: str, source: str = "<counters>") -> list[CounterSpec]:
    """Parse dcgm-exporter's counters CSV format; raise :class:`UserError` naming file:line."""
    out: list[CounterSpec] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0]:
            raise UserError(f"{source}:{lineno}: expected 'DCGM FIELD, type, help', got {raw!r}")
        name, typ = parts[0], parts[1].lower()
        if not _METRIC_NAME.fullmatch(name):
            raise UserError(f"{source}:{lineno}: {name[:80]!r} is not a field name (letters, digits, '_')")
        if typ not in METRIC_TYPES:
            raise UserError(f"{source}:{lineno}: unknown metric type {parts[1]!r} (one of {METRIC_TYPES})")
        if name in seen:
            raise UserError(f"{source}:{lineno}: field {name} listed twice")
        seen.add(name)
        out.append(CounterSpec(name, typ, parts[2] if len(parts) > 2 else "", lineno))
    if not any(c.type != "label" for c in out):
        raise UserError(f"{source}: no counters to publish (rows 'DCGM FIELD, gauge|counter, help')")
    return out


def load_counters_csv(path: str | Path | None = None) -> list[CounterSpec]:
    """Read a counters CSV (default: :data:`DEFAULT_COUNTERS_CSV`)."""
    p = Path(path) if path is not None else DEFAULT_COUNTERS_CSV
    try:
        with p.open("rb") as f:
            data = f.read(_MAX_CSV_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{p}: cannot read counters CSV ({exc.strerror or exc})") from None
    if len(data) > _MAX_CSV_BYTES:
        raise UserError(f"{p}: larger than 1 MiB; not a counters CSV")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not UTF-8 text (byte {exc.start}); expected a dcgm-exporter counters CSV") from None
    return parse_counters_csv(text, str(p))


def field_value(nvml: Any, handle: Any, field_id: int) -> float:
    """Read one NVML field value; a per-field error is raised as that NVML error."""
    (fv,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if fv.nvmlReturn != 0:
        raise nvml.NVMLError(fv.nvmlReturn)
    vt = fv.valueType
    v = fv.value
    if vt == NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vt == NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    if vt == NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if vt == NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.ullVal)
    if vt == NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    return float(v.siVal)


def _memory(nvml: Any, h: Any, attr: str) -> float:
    return float(getattr(nvml.nvmlDeviceGetMemoryInfo(h, version=NVML_MEMORY_V2), attr)) / MIB


def _remapped(index: int) -> Callable[[Any, Any], float]:
    return lambda n, h: float(n.nvmlDeviceGetRemappedRows(h)[index])


def _ecc(error_type: int, counter_type: int) -> Callable[[Any, Any], float]:
    return lambda n, h: float(n.nvmlDeviceGetTotalEccErrors(h, error_type, counter_type))


def _throttle(n: Any, h: Any) -> float:
    fn = (
        getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or n.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return float(fn(h))


Reader = Callable[[Any, Any], float]

#: DCGM field -> NVML reader returning the value in dcgm-exporter's unit, read at scrape time (GPU_UTIL
#: is NVML's latest value, as dcgm-exporter's; the sub-second window is the sampler's, see sampler.py).
READERS: dict[str, Reader] = {
    names.DCGM_SM_CLOCK: lambda n, h: float(n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)),
    names.DCGM_MEM_CLOCK: lambda n, h: float(n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM)),
    names.DCGM_MEMORY_TEMP: lambda n, h: field_value(n, h, NVML_FI_DEV_MEMORY_TEMP),
    names.DCGM_GPU_TEMP: lambda n, h: float(n.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)),
    names.DCGM_POWER_USAGE: lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
    names.DCGM_TOTAL_ENERGY: lambda n, h: float(n.nvmlDeviceGetTotalEnergyConsumption(h)),
    names.DCGM_PCIE_REPLAY: lambda n, h: float(n.nvmlDeviceGetPcieReplayCounter(h)),
    names.DCGM_GPU_UTIL: lambda n, h: float(n.nvmlDeviceGetUtilizationRates(h).gpu),
    names.DCGM_MEM_COPY_UTIL: lambda n, h: float(n.nvmlDeviceGetUtilizationRates(h).memory),
    names.DCGM_ENC_UTIL: lambda n, h: float(n.nvmlDeviceGetEncoderUtilization(h)[0]),
    names.DCGM_DEC_UTIL: lambda n, h: float(n.nvmlDeviceGetDecoderUtilization(h)[0]),
    names.DCGM_FB_FREE: lambda n, h: _memory(n, h, "free"),
    names.DCGM_FB_USED: lambda n, h: _memory(n, h, "used"),
    names.DCGM_FB_RESERVED: lambda n, h: _memory(n, h, "reserved"),
    names.DCGM_NVLINK_BANDWIDTH_TOTAL: lambda n, h: field_value(n, h, NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL),
    names.DCGM_CORRECTABLE_REMAPPED_ROWS: _remapped(0),
    names.DCGM_UNCORRECTABLE_REMAPPED_ROWS: _remapped(1),
    names.DCGM_ROW_REMAP_FAILURE: _remapped(3),
    names.DCGM_PCIE_TX_BYTES: lambda n, h: n.nvmlDeviceGetPcieThroughput(h, NVML_PCIE_UTIL_TX_BYTES) * 1024.0,
    names.DCGM_PCIE_RX_BYTES: lambda n, h: n.nvmlDeviceGetPcieThroughput(h, NVML_PCIE_UTIL_RX_BYTES) * 1024.0,
    names.DCGM_CLOCKS_EVENT_REASONS: _throttle,
    names.DCGM_CLOCK_THROTTLE_REASONS: _throttle,
    names.DCGM_ECC_SBE_VOL_TOTAL: _ecc(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
    names.DCGM_ECC_DBE_VOL_TOTAL: _ecc(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
    names.DCGM_ECC_SBE_AGG_TOTAL: _ecc(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
    names.DCGM_ECC_DBE_AGG_TOTAL: _ecc(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
}

#: Fields served from the sampler thread's NVML event stream instead of a scrape-time read.
SAMPLER_FIELDS: frozenset[str] = frozenset({names.DCGM_XID_ERRORS})

#: dcgm-exporter "label" fields NVML can provide: field -> reader (nvml, handle) -> str.
LABEL_READERS: dict[str, Callable[[Any, Any], str]] = {
    names.DCGM_LABEL_DRIVER_VERSION: lambda n, h: str(n.nvmlSystemGetDriverVersion()),
    names.DCGM_LABEL_NVML_VERSION: lambda n, h: str(n.nvmlSystemGetNVMLVersion()),
    names.DCGM_LABEL_SERIAL: lambda n, h: str(n.nvmlDeviceGetSerial(h)),
    names.DCGM_LABEL_VBIOS_VERSION: lambda n, h: str(n.nvmlDeviceGetVbiosVersion(h)),
}

#: Fields of dcgm-exporter's default list that this exporter leaves out, and why.
NOT_PROVIDED: dict[str, str] = {
    names.DCGM_VGPU_LICENSE_STATUS: "DCGM-side vGPU license state with no one-to-one NVML call",
}
