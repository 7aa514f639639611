"""dcgm-exporter's profiling (DCP) fields from NVML's GPU Performance Monitoring (GPM), Hopper and newer.

DCGM reads ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` and
``DCGM_FI_PROF_DRAM_ACTIVE`` from its profiling module. On GPUs with GPM (Hopper and newer, where
``nvmlGpmQueryDeviceSupport`` says so) NVML computes the same activities between two GPM samples:

=================================  ==================================  ============================
DCGM field (ratio 0..1)            NVML GPM metric (percent 0..100)    meaning
=================================  ==================================  ============================
DCGM_FI_PROF_GR_ENGINE_ACTIVE      NVML_GPM_METRIC_GRAPHICS_UTIL       graphics/compute engine busy
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE    NVML_GPM_METRIC_ANY_TENSOR_UTIL     tensor pipes busy (any type)
DCGM_FI_PROF_DRAM_ACTIVE           NVML_GPM_METRIC_DRAM_BW_UTIL        DRAM bandwidth used
=================================  ==================================  ============================

:class:`GpmReader` keeps the previous sample of its GPU, so each read is the mean over the time since
the previous read (one scrape interval). The first read only takes the first sample and returns
nothing. GPUs without GPM raise ``NVMLError_NotSupported`` and the fields are omitted, as the
collector does for any unsupported field. The mapping to DCGM's fields is the closest GPM metric;
it has not been compared with DCGM on a real GPU here (no GPU was available).
"""

from __future__ import annotations

import contextlib
from typing import Any

from stagescope import names

__all__ = ["GPM_FIELDS", "GpmReader"]

NVML_GPM_METRICS_GET_VERSION = 1
NVML_ERROR_NOT_SUPPORTED = 3
#: DCGM field -> NVML GPM metric id (values in percent; published as a ratio like DCGM's).
GPM_FIELDS: dict[str, int] = {
    names.DCGM_PROF_GR_ENGINE_ACTIVE: 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    names.DCGM_PROF_PIPE_TENSOR_ACTIVE: 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    names.DCGM_PROF_DRAM_ACTIVE: 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
}


class GpmReader:
    """GPM activity ratios of one GPU between consecutive :meth:`read` calls."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        support = nvml.nvmlGpmQueryDeviceSupport(handle)
        if not support.isSupportedDevice:
            raise nvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._prev = nvml.nvmlGpmSampleAlloc()
        self._cur = nvml.nvmlGpmSampleAlloc()
        self._primed = False
        self._mg = nvml.c_nvmlGpmMetricsGet_t()  # reused: the struct holds room for every GPM metric

    def read(self) -> dict[str, float]:
        """DCGM field -> ratio (0..1) since the previous read; empty on the first read."""
        n = self.nvml
        n.nvmlGpmSampleGet(self.handle, self._cur)
        if not self._primed:
            self._prev, self._cur = self._cur, self._prev
            self._primed = True
            return {}
        mg = self._mg
        mg.version = NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_FIELDS)
        mg.sample1 = self._prev
        mg.sample2 = self._cur
        for i, metric_id in enumerate(GPM_FIELDS.values()):
            mg.metrics[i].metricId = metric_id
        n.nvmlGpmMetricsGet(mg)
        self._prev, self._cur = self._cur, self._prev
        out = {}
        for i, field in enumerate(GPM_FIELDS):
            m = mg.metrics[i]
            if m.nvmlReturn == 0:
                out[field] = float(m.value) / 100.0
        return out

    def close(self) -> None:
        for s in (self._prev, self._cur):
            with contextlib.suppress(Exception):
                self.nvml.nvmlGpmSampleFree(s)
