"""Sub-second GPU utilization: a background thread that fills a time window per GPU.

dcgm-exporter reports the utilization NVML holds at scrape time, so a 1 s saturation between two
15 s scrapes is invisible. The sampler keeps every utilization sample of the last ``window_s``
seconds (set it to the Prometheus scrape interval) and the collector publishes their max and mean.

Where the driver keeps a sample buffer (``nvmlDeviceGetSamples`` with ``NVML_GPU_UTILIZATION_SAMPLES``
and ``NVML_MEMORY_UTILIZATION_SAMPLES``, one sample per driver sampling period, typically 1/6 s to
1 s), the sampler drains it every ``interval_s`` and keeps the driver's own timestamps. Where the
buffer is not supported it polls ``nvmlDeviceGetUtilizationRates`` every ``interval_s``.

The same thread drains XID critical-error events (``nvmlEventSetWait_v2`` with a zero timeout) so
``DCGM_FI_DEV_XID_ERRORS`` holds the last XID of each GPU, as dcgm-exporter's does.

Times are Unix seconds (``clock``, default :func:`time.time`); NVML sample timestamps are Unix µs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ENGINES", "UtilizationSampler", "WindowStats"]

log = logging.getLogger(__name__)

#: engine label value -> (NVML sample type, attribute of nvmlDeviceGetUtilizationRates' struct)
ENGINES: dict[str, tuple[int, str]] = {"gpu": (1, "gpu"), "memory_copy": (2, "memory")}
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 8
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_NOT_FOUND = 6


@dataclass(frozen=True)
class WindowStats:
    """Utilization samples of one GPU engine inside the window (percent)."""

    max: float
    mean: float
    count: int


class _Series:
    """(unix_s, value) samples, pruned to the window on every append and read."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, v: float) -> None:
        self.samples.append((t, v))

    def stats(self, since: float) -> WindowStats | None:
        s = self.samples
        while s and s[0][0] < since:
            s.popleft()
        if not s:
            return None
        vals = [v for _, v in s]
        return WindowStats(max(vals), sum(vals) / len(vals), len(vals))


class UtilizationSampler:
    """Polls utilization of every GPU handle at ``interval_s`` into a ``window_s`` window.

    ``handles`` maps the ``gpu`` index to its NVML handle. :meth:`sample_once` does one round (tests
    and benchmarks call it directly); :meth:`start` runs rounds on a daemon thread until :meth:`stop`.
    NVML errors never leave the thread: a GPU that fails is skipped until it answers again.
    """

    def __init__(
        self,
        nvml: Any,
        handles: dict[int, Any],
        *,
        interval_s: float = 0.1,
        window_s: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0 or window_s <= 0:
            raise ValueError(f"interval_s and window_s must be > 0, got {interval_s}, {window_s}")
        self.nvml = nvml
        self.handles = dict(handles)
        self.interval_s = interval_s
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._series: dict[tuple[int, str], _Series] = {}
        self._last_seen_us: dict[tuple[int, str], int] = {}
        self._use_buffer: dict[tuple[int, str], bool] = {}
        self.last_xid: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self._events: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._register_xid_events()

    # ---------------------------------------------------------------------------------------------
    def _register_xid_events(self) -> None:
        try:
            self._events = self.nvml.nvmlEventSetCreate()
        except Exception as exc:  # NVMLError or a missing function: XID field is then omitted
            log.debug("XID events unavailable: %s", exc)
            return
        for gpu, h in self.handles.items():
            try:
                self.nvml.nvmlDeviceRegisterEvents(h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self._events)
                self.last_xid[gpu] = 0
            except Exception as exc:
                log.debug("gpu %s: XID events not supported: %s", gpu, exc)

    def _drain_xid(self) -> None:
        if self._events is None or not self.last_xid:
            return
        for _ in range(64):  # bounded: never spin on a flood of events
            try:
                data = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                return
            try:
                gpu = int(self.nvml.nvmlDeviceGetIndex(data.device))
            except Exception:
                continue
            if data.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                self.last_xid[gpu] = int(data.eventData)

    def _sample_gpu(self, gpu: int, h: Any, now: float) -> None:
        polled: Any = None
        for engine, (sample_type, attr) in ENGINES.items():
            key = (gpu, engine)
            series = self._series.setdefault(key, _Series())
            if self._use_buffer.get(key, True):
                try:
                    _vt, samples = self.nvml.nvmlDeviceGetSamples(
                        h, sample_type, self._last_seen_us.get(key, 0)
                    )
                except self.nvml.NVMLError as exc:
                    if exc.value == NVML_ERROR_NOT_FOUND:  # no new sample since last_seen
                        continue
                    if exc.value != NVML_ERROR_NOT_SUPPORTED:
                        raise
                    self._use_buffer[key] = False
                else:
                    self._use_buffer[key] = True
                    last = self._last_seen_us.get(key, 0)
                    for s in samples:
                        ts = int(s.timeStamp)
                        if ts > last:
                            series.add(ts / 1e6, float(s.sampleValue.uiVal))
                            last = ts
                    self._last_seen_us[key] = last
                    continue
            if polled is None:
                polled = self.nvml.nvmlDeviceGetUtilizationRates(h)
            series.add(now, float(getattr(polled, attr)))

    def sample_once(self) -> None:
        """One round: every GPU's utilization, then pending XID events."""
        now = self.clock()
        with self._lock:
            for gpu, h in self.handles.items():
                try:
                    self._sample_gpu(gpu, h, now)
                except Exception as exc:  # a failing GPU must not stop the others
                    self.failures[gpu] = self.failures.get(gpu, 0) + 1
                    if self.failures[gpu] == 1:
                        log.warning("gpu %s: utilization sampling failed: %s", gpu, exc)
            self._drain_xid()

    def add_handle(self, gpu: int, handle: Any) -> None:
        """Sample ``gpu`` from now on (a GPU identified after start-up)."""
        with self._lock:
            self.handles[gpu] = handle

    def stats(self, gpu: int, engine: str) -> WindowStats | None:
        """Max / mean / count of ``engine`` utilization on ``gpu`` over the last ``window_s``."""
        with self._lock:
            series = self._series.get((gpu, engine))
            return series.stats(self.clock() - self.window_s) if series else None

    # ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="stagescope-gpu-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._events is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(self._events)
            self._events = None
