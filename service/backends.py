"""Model backends of the reference service, and the SIMULATED accelerator.

* ``simulated``: a SIMULATED accelerator (no hardware). A batch occupies a simulated device for
  ``launch_ms + per_item_ms * scale * units`` seconds of device time (``scale`` 0.5 for an int8
  model), spent in ``asyncio`` sleeps so that no CPU is burnt. Several model instances may share one
  device; a shared device splits its time equally between the batches running on it (processor
  sharing, as concurrent kernels from several instances share one GPU). Its busy fraction is exported
  as dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` with ``modelName="simulated-accelerator"``.
* ``numpy``: real matrix compute on the CPU (a small MLP, ``units`` rows per input) in a worker
  thread, so the time is genuinely spent multiplying matrices.
* ``torch``: the same MLP with PyTorch, on CUDA when available; GPU time is measured with CUDA events.
  Only importable where torch is installed; never required.
* ``onnx``: a real trained classifier on ONNX Runtime, with real INT8 and graph optimization levers
  (:mod:`stagescope.service.onnx_backend`; needs the ``onnx`` extra).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.settings import Settings
from stagescope.service.variants import VariantReport

__all__ = [
    "Backend",
    "NumpyBackend",
    "PredictItem",
    "SimulatedAccelerator",
    "SimulatedBackend",
    "SimulatedGpuCollector",
    "TorchBackend",
    "make_backend",
]


@dataclass(slots=True)
class PredictItem:
    """One input of a ``/v1/predict`` batch: model input vector, work units, answer size, seed."""

    x: np.ndarray
    units: int
    response_dim: int
    seed: int


class Backend(Protocol):
    name: str

    async def run_batch(self, items: list[PredictItem]) -> list[np.ndarray]: ...

    async def load(self) -> None: ...


def _answer(vec: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """Expand a model output vector to ``dim`` scores in [0, 1], rounded to 4 decimals."""
    base = 1.0 / (1.0 + np.exp(-vec.astype(np.float64)))
    if dim <= base.size:
        out = base[:dim]
    else:
        rng = np.random.default_rng(seed)
        out = np.resize(base, dim) * rng.uniform(0.5, 1.0, dim)
    return np.round(out, 4)


# --------------------------------------------------------------------------------------------------
# The SIMULATED accelerator
# --------------------------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class _Job:
    remaining_s: float
    future: asyncio.Future[None]


class _SimDevice:
    """One simulated device: jobs share its time equally (processor sharing). Event-loop thread only."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._jobs: list[_Job] = []
        self._t = time.monotonic()
        self._busy_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def _advance(self) -> None:
        now = time.monotonic()
        dt = now - self._t
        self._t = now
        k = len(self._jobs)
        if k and dt > 0:
            self._busy_s += dt
            share = dt / k
            for j in self._jobs:
                j.remaining_s -= share

    def busy_seconds(self) -> float:
        """Seconds during which at least one batch was running (what GPU utilization counts)."""
        extra = time.monotonic() - self._t if self._jobs else 0.0
        return self._busy_s + extra

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._jobs:
            k = len(self._jobs)
            delay = max(0.0, min(j.remaining_s for j in self._jobs)) * k
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._advance()
        done = [j for j in self._jobs if j.remaining_s <= 1e-6]
        self._jobs = [j for j in self._jobs if j.remaining_s > 1e-6]
        for j in done:
            if not j.future.done():
                j.future.set_result(None)
        self._reschedule()

    async def run(self, work_s: float) -> None:
        """Occupy the device for ``work_s`` seconds of its time (longer in wall time when shared)."""
        self._advance()
        job = _Job(work_s, asyncio.get_running_loop().create_future())
        self._jobs.append(job)
        self._reschedule()
        try:
            await job.future
        except asyncio.CancelledError:
            self._advance()
            if job in self._jobs:
                self._jobs.remove(job)
            self._reschedule()
            raise


class SimulatedAccelerator:
    """``devices`` SIMULATED devices and the model instances placed on them (instance i on i % devices)."""

    def __init__(self, devices: int = 1) -> None:
        self.devices = [_SimDevice(i) for i in range(max(1, devices))]
        self._free_instances: deque[int] = deque()
        self._instances = 0

    def ensure_instances(self, n: int) -> None:
        while self._instances < n:
            self._free_instances.append(self._instances)
            self._instances += 1

    async def run(self, work_s: float) -> None:
        """Run ``work_s`` of device time on a free instance's device (the batcher bounds concurrency)."""
        if not self._free_instances:
            self.ensure_instances(self._instances + 1)
        inst = self._free_instances.popleft()
        try:
            await self.devices[inst % len(self.devices)].run(work_s)
        finally:
            self._free_instances.appendleft(inst)


class SimulatedGpuCollector(Collector):
    """Exports the SIMULATED accelerator's busy percentage under dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL``.

    Like dcgm-exporter, the value is the share of the last sampling period (``window_s``) during
    which the device was running work, in percent, one sample per device with dcgm's labels and
    ``modelName="simulated-accelerator"`` (never mistaken for a real GPU).
    """

    def __init__(self, accel: SimulatedAccelerator, window_s: float = 1.0, hostname: str | None = None) -> None:
        self.accel = accel
        self.window_s = window_s
        self.hostname = hostname or socket.gethostname()
        self._history: list[deque[tuple[float, float]]] = [deque() for _ in accel.devices]

    def utilization_pct(self) -> list[float]:
        now = time.monotonic()
        out = []
        for dev, hist in zip(self.accel.devices, self._history, strict=True):
            busy = dev.busy_seconds()
            hist.append((now, busy))
            while len(hist) > 1 and now - hist[1][0] >= self.window_s:
                hist.popleft()
            t0, b0 = hist[0]
            if now - t0 <= 1e-6:
                out.append(0.0)
            else:
                out.append(max(0.0, min(100.0, 100.0 * (busy - b0) / (now - t0))))
            while len(hist) > 64:
                hist.popleft()
        return out

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily(
            N.DCGM_GPU_UTIL, "GPU utilization (in %) of the SIMULATED accelerator", labels=list(N.DCGM_LABELS)
        )
        for i, pct in enumerate(self.utilization_pct()):
            labels = {
                "gpu": str(i),
                "UUID": f"SIMULATED-ACCELERATOR-{i}",
                "pci_bus_id": "simulated",
                "device": f"sim{i}",
                "modelName": N.SIMULATED_ACCELERATOR_MODEL_NAME,
                N.DCGM_LABEL_HOSTNAME: self.hostname,
            }
            fam.add_metric([labels[k] for k in N.DCGM_LABELS], pct)
        yield fam


class SimulatedBackend:
    """The SIMULATED accelerator running the ranker: device time follows the stated latency model."""

    name = "simulated"

    def __init__(self, settings: Settings, accel: SimulatedAccelerator | None = None) -> None:
        self.settings = settings
        self.accel = accel or SimulatedAccelerator(settings.devices)
        self.accel.ensure_instances(settings.executors)
        rng = np.random.default_rng(settings.seed)
        self._w = rng.normal(0, 0.3, (settings.feature_dim * 2, 8)).astype(np.float32)

    def service_time_s(self, units: int, quantize: bool | None = None) -> float:
        """Device seconds of one batch holding ``units`` work units in total (``quantize``: as with
        that setting; default the backend's own)."""
        s = self.settings
        scale = 0.5 if (s.quantize if quantize is None else quantize) else 1.0
        return (s.launch_ms + s.per_item_ms * scale * units) / 1000.0

    async def load(self) -> None:
        await asyncio.sleep(self.settings.model_load_s)

    def variant_report(self) -> VariantReport:
        """The batch device times of its SIMULATED latency model (computed, not measured) as served and with
        ``quantize``; no accuracy (there is no model to evaluate)."""
        s = self.settings
        rows = sorted({1, 16, s.items_per_request, s.heavy_items if s.heavy_share > 0 else 1})
        rep = VariantReport(model=s.model_name, how="SIMULATED accelerator: its stated latency model, not a measurement")
        rep.batch_seconds["serving"] = {r: self.service_time_s(r) for r in rows}
        if not s.quantize:
            rep.batch_seconds[N.LEVER_QUANTIZE] = {r: self.service_time_s(r, quantize=True) for r in rows}
        return rep

    async def run_batch(self, items: list[PredictItem]) -> list[np.ndarray]:
        await self.accel.run(self.service_time_s(sum(it.units for it in items)))
        return [_answer(_project(it.x, self._w), it.response_dim, it.seed) for it in items]


def _project(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    v = np.zeros(w.shape[0], dtype=np.float32)
    n = min(v.size, x.size)
    v[:n] = x[:n]
    out: np.ndarray = v @ w
    return out


# --------------------------------------------------------------------------------------------------
# Real compute
# --------------------------------------------------------------------------------------------------


def _input_rows(items: Sequence[PredictItem], width: int, dtype: Any) -> np.ndarray:
    """The batch's model input: each item's vector, cut or zero-padded to ``width``, repeated once
    per unit of work it asks for (``units``), stacked into one matrix."""
    rows = []
    for it in items:
        v = np.zeros(width, dtype=dtype)
        n = min(v.size, it.x.size)
        v[:n] = it.x[:n]
        rows.append(np.tile(v, (max(1, it.units), 1)))
    return np.concatenate(rows)


def _item_answers(logits: np.ndarray, items: Sequence[PredictItem]) -> list[np.ndarray]:
    """Each item's answer from the batch's output rows (laid out as :func:`_input_rows` stacked
    them): the mean of its ``units`` rows, expanded by :func:`_answer`."""
    out = []
    k = 0
    for it in items:
        u = max(1, it.units)
        out.append(_answer(logits[k : k + u].mean(axis=0), it.response_dim, it.seed))
        k += u
    return out


class NumpyBackend:
    """A real MLP on the CPU: each work unit is one row through ``model_dim``-wide layers."""

    name = "numpy"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._weights: list[np.ndarray] | None = None
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        s = self.settings
        dtype = np.float32 if s.quantize else np.float64  # halving the bytes per weight, as int8 would

        def build() -> list[np.ndarray]:
            rng = np.random.default_rng(s.seed)
            d = s.model_dim
            return [
                rng.normal(0, 1 / np.sqrt(2 * s.feature_dim), (2 * s.feature_dim, d)).astype(dtype),
                rng.normal(0, 1 / np.sqrt(d), (d, d)).astype(dtype),
                rng.normal(0, 1 / np.sqrt(d), (d, d)).astype(dtype),
                rng.normal(0, 1 / np.sqrt(d), (d, 8)).astype(dtype),
            ]

        t0 = time.monotonic()
        self._weights = await asyncio.to_thread(build)
        await asyncio.sleep(max(0.0, self.settings.model_load_s - (time.monotonic() - t0)))

    def _forward(self, items: Sequence[PredictItem]) -> list[np.ndarray]:
        assert self._weights is not None
        w0, w1, w2, w3 = self._weights
        h = _input_rows(items, w0.shape[0], w0.dtype)
        h = np.maximum(h @ w0, 0)
        h = np.maximum(h @ w1, 0)
        h = np.maximum(h @ w2, 0)
        return _item_answers(h @ w3, items)

    async def run_batch(self, items: list[PredictItem]) -> list[np.ndarray]:
        return await asyncio.to_thread(self._forward, items)


class TorchBackend(NumpyBackend):
    """The MLP in PyTorch (CUDA when available); GPU time of each batch measured with CUDA events."""

    name = "torch"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        try:
            import torch
        except ImportError:
            raise UserError("backend 'torch' needs PyTorch installed (pip install torch)") from None
        self._torch: Any = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.last_gpu_ms: float | None = None
        self._tw: list[Any] = []

    async def load(self) -> None:
        await super().load()
        torch = self._torch
        dtype = torch.float16 if (self.settings.quantize and self.device == "cuda") else torch.float32
        assert self._weights is not None
        self._tw = [torch.as_tensor(w, dtype=dtype, device=self.device) for w in self._weights]

    def _forward(self, items: Sequence[PredictItem]) -> list[np.ndarray]:
        torch = self._torch
        w0, w1, w2, w3 = self._tw
        x = _input_rows(items, w0.shape[0], np.float32)
        with torch.inference_mode():
            h = torch.as_tensor(x, dtype=w0.dtype, device=self.device)
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            h = torch.relu(h @ w0)
            h = torch.relu(h @ w1)
            h = torch.relu(h @ w2)
            logits = h @ w3
            if self.device == "cuda":
                end.record()
                end.synchronize()
                self.last_gpu_ms = float(start.elapsed_time(end))
            lg = logits.float().cpu().numpy()
        return _item_answers(lg, items)


def make_backend(settings: Settings, accel: SimulatedAccelerator | None = None) -> Backend:
    if settings.backend == "simulated":
        return SimulatedBackend(settings, accel)
    if settings.backend == "numpy":
        return NumpyBackend(settings)
    if settings.backend == "onnx":
        from stagescope.service.onnx_backend import OnnxBackend

        return OnnxBackend(settings)
    return TorchBackend(settings)
