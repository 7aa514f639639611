"""The GPU collector: NVML read at scrape time, published under dcgm-exporter's names.

:class:`GpuCollector` is a prometheus_client custom collector. Its NVML is injected, the way
``ProcessCollector(proc=...)`` takes its /proc: pass the ``pynvml`` module (what :func:`load_nvml`
returns) or any object with the same functions, such as the simulated
:class:`~stagescope.instrumentation.gpu.fake_nvml.FakeNvml` the tests use.

Never crash:

- no NVML at all (``import pynvml`` fails, ``NVMLError_LibraryNotFound``, ``NVMLError_DriverNotLoaded``):
  the collector logs one line and serves ``stagescope_gpu_exporter_up 0`` and nothing else;
- a field the GPU does not support (``NVMLError_NotSupported``, ``NoPermission``, ``FunctionNotFound``...)
  is omitted, and not asked again;
- a GPU that fails (``NVMLError_GpuIsLost`` or any other error outside that list) gets
  ``stagescope_gpu_up{gpu="N"} 0`` and no other sample this scrape; the other GPUs keep reporting, and
  the failing one is asked again on the next scrape.

Counters keep dcgm-exporter's names (no ``_total`` suffix is added): serve them with
:func:`stagescope.instrumentation.gpu.exposition.generate_text`, not prometheus_client's
``generate_latest`` (which renames counter families to ``NAME_total``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from stagescope import names
from stagescope.instrumentation.gpu.fields import (
    GPM_FIELDS,
    LABEL_READERS,
    READERS,
    SAMPLER_FIELDS,
    CounterSpec,
    load_counters_csv,
)
from stagescope.instrumentation.gpu.gpm import GpmReader
from stagescope.instrumentation.gpu.nvml import (
    UNSUPPORTED_CODES,
    NvmlUnavailable,
    init_nvml,
    load_nvml,
    process_samples,
)
from stagescope.instrumentation.gpu.sampler import ENGINES, UtilizationSampler

__all__ = ["GpuCollector", "NvmlUnavailable", "load_nvml"]

log = logging.getLogger(__name__)

def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class _Gpu:
    index: int
    handle: Any = None
    labels: dict[str, str] = field(default_factory=dict)  # dcgm identity + label fields
    unsupported: set[str] = field(default_factory=set)
    gpm: GpmReader | None = None  # profiling fields (Hopper+); None when the GPU has no GPM


class GpuCollector(Collector):
    """Collects every GPU NVML reports; see the module docstring for the failure rules.

    ``nvml``: the NVML module (``pynvml``) or a stand-in, already initialised unless ``init=True``;
    ``None`` loads the real one with :func:`load_nvml`. ``counters``: the dcgm-exporter counters to
    publish (default: stagescope's ``counters.csv``). ``hostname``: the host label's value (default:
    ``$NODE_NAME`` as dcgm-exporter reads it, else this machine's name); ``hostname_label``: its key,
    ``hostname`` as dcgm-exporter HEAD writes it, or ``Hostname`` (its releases up to 4.5.3-4.8.2) for
    dashboards written against those. ``interval_s``/``window_s``:
    the sampler's period and window (seconds); ``start_sampler=False`` leaves the sampler to the caller
    (``collector.sampler.sample_once()``). ``registry``: registered there when given.
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        init: bool = True,
        counters: Sequence[CounterSpec] | None = None,
        hostname: str | None = None,
        hostname_label: str = names.DCGM_LABEL_HOSTNAME,
        interval_s: float = 0.1,
        window_s: float = 15.0,
        start_sampler: bool = True,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        import os

        self.counters = list(counters) if counters is not None else load_counters_csv()
        if hostname_label not in (names.DCGM_LABEL_HOSTNAME, names.DCGM_LABEL_HOSTNAME_LEGACY):
            raise ValueError(f"hostname_label must be {names.DCGM_LABEL_HOSTNAME!r} or "
                             f"{names.DCGM_LABEL_HOSTNAME_LEGACY!r}, got {hostname_label!r}")  # fmt: skip
        self.hostname = hostname or os.environ.get("NODE_NAME") or socket.gethostname()
        self.hostname_label = hostname_label
        self.window_s = window_s
        self.clock = clock
        self.nvml: Any = None
        self.unavailable_reason: str | None = None
        self.gpus: list[_Gpu] = []
        self.sampler: UtilizationSampler | None = None
        self.errors: dict[int, int] = {}
        try:
            if nvml is None:
                self.nvml = load_nvml()
            else:
                if init:
                    init_nvml(nvml)
                self.nvml = nvml
            self._discover()
        except NvmlUnavailable as exc:
            self.nvml = None
            self.unavailable_reason = str(exc)
            log.error(
                "stagescope gpu-exporter: NVML unavailable, serving %s 0: %s",
                names.METRIC_GPU_EXPORTER_UP,
                exc,
            )
        self._label_fields = [c.name for c in self.counters if c.type == "label" and c.name in LABEL_READERS]
        self._metric_fields = [
            c
            for c in self.counters
            if c.type != "label" and (c.name in READERS or c.name in SAMPLER_FIELDS or c.name in GPM_FIELDS)
        ]
        self._gpm_wanted = {c.name for c in self._metric_fields if c.name in GPM_FIELDS}
        self._process_ts_us: dict[int, int] = {}
        if self.nvml is not None:
            for g in self.gpus:
                if g.handle is not None:
                    self._init_gpm(g)
            handles = {g.index: g.handle for g in self.gpus if g.handle is not None}
            self.sampler = UtilizationSampler(
                self.nvml, handles, interval_s=interval_s, window_s=window_s, clock=clock
            )
            if start_sampler:
                self.sampler.start()
        if registry is not None:
            registry.register(self)

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def _discover(self) -> None:
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
        except Exception as exc:
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {type(exc).__name__}: {exc}") from None
        self.gpus = [_Gpu(i) for i in range(count)]
        for g in self.gpus:
            self._identify(g)

    def _identify(self, g: _Gpu) -> bool:
        """Fetch the handle and static labels of ``g``; False (and logged) when the GPU fails."""
        n = self.nvml
        try:
            h = n.nvmlDeviceGetHandleByIndex(g.index)
            labels = {
                "gpu": str(g.index),
                "UUID": _text(n.nvmlDeviceGetUUID(h)),
                "pci_bus_id": _text(n.nvmlDeviceGetPciInfo(h).busId),
                "device": f"nvidia{int(n.nvmlDeviceGetMinorNumber(h))}",
                "modelName": _text(n.nvmlDeviceGetName(h)),
                self.hostname_label: self.hostname,
            }
        except Exception as exc:
            log.warning(
                "gpu %d: cannot identify (%s: %s); %s 0",
                g.index,
                type(exc).__name__,
                exc,
                names.METRIC_GPU_UP,
            )
            return False
        g.handle, g.labels = h, labels
        return True

    def _init_gpm(self, g: _Gpu) -> None:
        """Take the first GPM sample of ``g`` (so the first scrape has an interval), or mark it unsupported."""
        if not self._gpm_wanted or g.gpm is not None or self._gpm_wanted <= g.unsupported:
            return
        try:
            g.gpm = GpmReader(self.nvml, g.handle)
            g.gpm.read()
        except Exception as exc:  # NotSupported (before Hopper), an older pynvml without GPM ...
            log.debug("gpu %d: GPM profiling fields omitted: %s", g.index, exc)
            g.gpm = None
            g.unsupported.update(GPM_FIELDS)

    def _labels_for(self, g: _Gpu) -> dict[str, str]:
        out = dict(g.labels)
        for name in self._label_fields:
            try:
                out[name] = LABEL_READERS[name](self.nvml, g.handle)
            except Exception:
                out[name] = ""
        return out

    # ---------------------------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:  # no scrape at registration time
        return iter(())

    def collect(self) -> Iterator[Metric]:
        up = Metric(
            names.METRIC_GPU_EXPORTER_UP,
            "1 when NVML is usable, 0 when it is not (no GPU, no driver).",
            "gauge",
        )
        up.add_sample(names.METRIC_GPU_EXPORTER_UP, {}, 1.0 if self.available else 0.0)
        yield up
        if not self.available:
            return
        families: dict[str, Metric] = {c.name: Metric(c.name, c.help, c.type) for c in self._metric_fields}
        gpu_up = Metric(
            names.METRIC_GPU_UP, "1 when every NVML call for this GPU answers, 0 when it fails.", "gauge"
        )
        err = Metric(
            names.METRIC_GPU_SCRAPE_ERRORS.removesuffix("_total"),
            "NVML calls for this GPU that failed.",
            "counter",
        )
        extra = self._extra_families()
        for g in self.gpus:
            ok = self._collect_gpu(g, families, extra)
            gpu_up.add_sample(names.METRIC_GPU_UP, {names.LABEL_GPU: str(g.index)}, 1.0 if ok else 0.0)
            err.add_sample(
                names.METRIC_GPU_SCRAPE_ERRORS,
                {names.LABEL_GPU: str(g.index)},
                float(self.errors.get(g.index, 0)),
            )
        yield gpu_up
        yield err
        for fam in families.values():
            if fam.samples:
                yield fam
        for fam in extra.values():
            if fam.samples:
                yield fam

    def _extra_families(self) -> dict[str, Metric]:
        w = self.window_s
        return {
            "max": Metric(
                names.METRIC_GPU_UTIL_WINDOW_MAX,
                f"Max utilization sample (%) over the last {w:g} s, per engine.",
                "gauge",
            ),
            "mean": Metric(
                names.METRIC_GPU_UTIL_WINDOW_MEAN,
                f"Mean utilization sample (%) over the last {w:g} s, per engine.",
                "gauge",
            ),
            "count": Metric(
                names.METRIC_GPU_UTIL_WINDOW_SAMPLES, "Utilization samples in the window.", "gauge"
            ),
            "window": Metric(
                names.METRIC_GPU_WINDOW_SECONDS, "Length of the utilization window (s).", "gauge"
            ),
            "pmem": Metric(names.METRIC_GPU_PROCESS_MEMORY, "GPU memory used by a process (bytes).", "gauge"),
            "putil": Metric(
                names.METRIC_GPU_PROCESS_UTIL,
                f"Mean utilization (%) of a process over the last {w:g} s (sm, memory_copy).",
                "gauge",
            ),
        }

    def _failed(self, g: _Gpu, exc: BaseException) -> bool:
        self.errors[g.index] = self.errors.get(g.index, 0) + 1
        if self.errors[g.index] == 1:
            log.warning(
                "gpu %d: NVML failed (%s: %s); %s 0", g.index, type(exc).__name__, exc, names.METRIC_GPU_UP
            )
        return False

    def _collect_gpu(self, g: _Gpu, families: dict[str, Metric], extra: dict[str, Metric]) -> bool:
        if g.handle is None:
            if not self._identify(g):
                self.errors[g.index] = self.errors.get(g.index, 0) + 1
                return False
            if self.sampler is not None:
                self.sampler.add_handle(g.index, g.handle)
            self._init_gpm(g)
        n, h = self.nvml, g.handle
        labels = self._labels_for(g)
        values: list[tuple[str, float]] = []
        for spec in self._metric_fields:
            if spec.name in g.unsupported:
                continue
            if spec.name in SAMPLER_FIELDS or spec.name in GPM_FIELDS:
                continue  # from the sampler's event stream / the GPM reader below
            try:
                values.append((spec.name, READERS[spec.name](n, h)))
            except n.NVMLError as exc:
                if exc.value in UNSUPPORTED_CODES:
                    g.unsupported.add(spec.name)
                    continue
                return self._failed(g, exc)
            except Exception as exc:  # a stand-in without the function, a ctypes surprise ...
                log.debug("gpu %d: %s omitted: %s", g.index, spec.name, exc)
                g.unsupported.add(spec.name)
        if g.gpm is not None:
            try:
                values.extend((k, v) for k, v in g.gpm.read().items() if k in self._gpm_wanted)
            except n.NVMLError as exc:
                if exc.value not in UNSUPPORTED_CODES:
                    return self._failed(g, exc)
                g.unsupported.update(GPM_FIELDS)
                g.gpm = None
        try:
            procs = process_samples(n, h, self.clock, self.window_s)
        except n.NVMLError as exc:
            if exc.value not in UNSUPPORTED_CODES:
                return self._failed(g, exc)
            procs = []
        # Publish only when the whole GPU answered, so a half-read GPU never mixes with up=0.
        for name, v in values:
            families[name].add_sample(name, labels, v)
        sampler = self.sampler
        if sampler is not None:
            if names.DCGM_XID_ERRORS in families and g.index in sampler.last_xid:
                families[names.DCGM_XID_ERRORS].add_sample(
                    names.DCGM_XID_ERRORS, labels, float(sampler.last_xid[g.index])
                )
            for engine in ENGINES:
                st = sampler.stats(g.index, engine)
                if st is None:
                    continue
                el = {**labels, names.LABEL_ENGINE: engine}
                extra["max"].add_sample(names.METRIC_GPU_UTIL_WINDOW_MAX, el, st.max)
                extra["mean"].add_sample(names.METRIC_GPU_UTIL_WINDOW_MEAN, el, st.mean)
                extra["count"].add_sample(names.METRIC_GPU_UTIL_WINDOW_SAMPLES, el, float(st.count))
            extra["window"].add_sample(names.METRIC_GPU_WINDOW_SECONDS, labels, self.window_s)
        ident = {"gpu": labels["gpu"], "UUID": labels["UUID"]}
        for pid, mem, util in procs:
            pl = {**ident, names.LABEL_PID: str(pid)}
            if mem is not None:
                extra["pmem"].add_sample(names.METRIC_GPU_PROCESS_MEMORY, pl, mem)
            for engine, v in util.items():
                extra["putil"].add_sample(
                    names.METRIC_GPU_PROCESS_UTIL, {**pl, names.LABEL_ENGINE: engine}, v
                )
        return True

    def close(self) -> None:
        """Stop the sampler and shut NVML down (idempotent)."""
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        for g in self.gpus:
            if g.gpm is not None:
                g.gpm.close()
                g.gpm = None
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self.nvml = None
            self.unavailable_reason = "closed"
