"""``onnx``: the reference service's ``/v1/predict`` model on ONNX Runtime (real compute, real INT8).

The model is a digits classifier of :mod:`stagescope.service.onnx_model` (trained on this machine,
cached): ``digits-mlp``, or with ``onnx_model=digits-ink-mlp`` the variant with a raw-unit ink input
that dynamic INT8 hurts. Each request names the images it asks to classify: the load generator sends 16 floats,
not images, so the request's input hash picks ``units`` images of the held-out eval set (``units``
is ``items_per_request``, or ``heavy_items`` for the ``heavy_share`` of inputs chosen by hash, as in
every backend). A batch is one ``InferenceSession.run`` over all its items' images stacked into one
matrix, so its cost is the model's own matrix work: nothing is slept.

Settings that are levers, all data in the scenario table:

* ``quantize``: serve ``int8.onnx`` (dynamic INT8 weights, ``onnxruntime.quantization``) instead of
  ``fp32.onnx``;
* ``ort_optimization``: ONNX Runtime's graph optimization level (``disable``, ``basic``,
  ``extended``, ``all``; ORT's own default is ``all``): constant folding, MatMul+Add -> Gemm and
  activation fusions; ``compile-runtime`` raises it to ``all``;
* ``onnx_threads``: ``intra_op_num_threads`` of the session (1: a batch uses one core, so the load
  generator on the same machine is not starved); ``executors`` batches run at once, each on its
  calling thread.

When it loads, the backend measures the variants its levers would switch to (see
:mod:`stagescope.service.variants`): each variant's accuracy on the eval set, and the median CPU time
of one batch at a few batch sizes (the scenario's item sizes among them), interleaved. CPU time
rather than wall time: on a machine shared with other work a batch's wall time stretches with the
load (2x was seen here), the ratio of two variants' CPU times does not. The CUDA execution provider is used when ONNX Runtime
offers it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stagescope import names as N
from stagescope.service.backends import PredictItem
from stagescope.service.onnx_model import INPUT_NAME, OUTPUT_NAME, Artifacts, ensure_artifacts
from stagescope.service.settings import Settings
from stagescope.service.variants import VariantReport

__all__ = ["HEAVY_OVER_SLO", "ORT_LEVELS", "OnnxBackend", "size_heavy_items"]

log = logging.getLogger("stagescope.service")

#: ``ort_optimization`` values -> ``onnxruntime.GraphOptimizationLevel`` member names.
ORT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
#: Batches per variant and batch size in the load-time micro-benchmark (the median is exported).
BENCH_REPEATS = 5
#: A heavy request's FP32 batch is sized to this multiple of the SLO threshold (see size_heavy_items).
#: INT8 about halves it, so 1.35 leaves a wide margin on both sides: before the lever the p99 breaches
#: by ~45 % (443-474 ms in three runs), after it meets the SLO by ~20 % (223-244 ms); at 1.15 the breach
#: hung on a 10 % margin (p99 332 ms) that a machine quieter in the run than at the sizing could erase.
HEAVY_OVER_SLO = 1.35
#: Batch sizes (rows) always benchmarked, besides the scenario's own item sizes.
_BENCH_ROWS = (1, 16, 256)


@dataclass(frozen=True)
class _Variant:
    name: str  # "serving" or the lever that would serve it
    int8: bool
    level: str


def _session(path: str, level: str, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_LEVELS[level])
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between batches
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    return ort.InferenceSession(path, so, providers=providers)


class OnnxBackend:
    """A digits MLP on ONNX Runtime; see the module docstring."""

    name = "onnx"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.artifacts: Artifacts | None = None
        self._sess: Any = None
        self._x: np.ndarray | None = None
        self._report: VariantReport | None = None

    # -- loading and measuring ------------------------------------------------------------------
    def _variants(self) -> list[_Variant]:
        s = self.settings
        out = [_Variant("serving", s.quantize, s.ort_optimization)]
        if not s.quantize:
            out.append(_Variant(N.LEVER_QUANTIZE, True, s.ort_optimization))
        if s.ort_optimization != "all":
            out.append(_Variant(N.LEVER_COMPILE_RUNTIME, s.quantize, "all"))
        return out

    def _bench_rows(self) -> list[int]:
        s = self.settings
        return sorted({*_BENCH_ROWS, s.items_per_request, s.heavy_items if s.heavy_share > 0 else 1})

    def _load_sync(self) -> None:
        art = ensure_artifacts(model=self.settings.onnx_model)
        x, y = art.eval_set()
        s = self.settings
        sessions = {}
        for v in self._variants():
            sessions[v.name] = _session(str(art.int8 if v.int8 else art.fp32), v.level, s.onnx_threads)
        report = VariantReport(model=s.model_name, how=(
            f"{art.folder.name}: accuracy on {len(y)} held-out eval images; median CPU time of {BENCH_REPEATS} batches per "
            f"variant and size, interleaved, intra_op_num_threads={s.onnx_threads}"))  # fmt: skip
        for name, sess in sessions.items():
            pred = sess.run([OUTPUT_NAME], {INPUT_NAME: x})[0].argmax(axis=1)
            report.accuracy[name] = float((pred == y).mean())
            report.eval_samples[name] = len(y)
        rng = np.random.default_rng(s.seed)
        times: dict[str, dict[int, list[float]]] = {n: {} for n in sessions}
        for rows in self._bench_rows():
            batch = x[rng.integers(0, len(x), rows)]
            for sess in sessions.values():  # warm-up: first runs allocate
                sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
            for _ in range(BENCH_REPEATS):
                for name, sess in sessions.items():
                    t0 = time.process_time()  # CPU time of the process: the service is idle while loading
                    sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
                    times[name].setdefault(rows, []).append(time.process_time() - t0)
        report.batch_seconds = {n: {r: float(np.median(ts)) for r, ts in d.items()} for n, d in times.items()}
        self.artifacts, self._x, self._sess, self._report = art, x, sessions["serving"], report
        log.info("onnx backend: %s", report.to_dict())

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    def variant_report(self) -> VariantReport | None:
        return self._report

    # -- serving --------------------------------------------------------------------------------
    def _rows(self, items: Sequence[PredictItem]) -> tuple[np.ndarray, list[int]]:
        """The batch's images: item ``i`` asks for ``units`` eval images, chosen by its input hash."""
        assert self._x is not None
        n = len(self._x)
        idx: list[np.ndarray] = []
        counts = []
        for it in items:
            k = max(1, it.units)
            idx.append((it.seed + 7919 * np.arange(k)) % n)
            counts.append(k)
        return self._x[np.concatenate(idx)], counts

    def _forward(self, items: Sequence[PredictItem]) -> list[np.ndarray]:
        x, counts = self._rows(items)
        probs = self._sess.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
        out, k = [], 0
        for it, c in zip(items, counts, strict=True):
            # the answer: class probabilities of the item's first image (cut or repeated to its size)
            out.append(np.round(np.resize(probs[k].astype(np.float64), it.response_dim), 4))
            k += c
        return out

    async def run_batch(self, items: list[PredictItem]) -> list[np.ndarray]:
        return await asyncio.to_thread(self._forward, items)


def size_heavy_items(settings: Settings, target_ms: float, rows: int = 1000) -> tuple[int, float]:
    """Images per heavy request so that its batch takes about ``target_ms`` of wall time in FP32 on
    this machine now: ``(images, ms per image)``. The model's per-image cost is timed (median wall time
    of 3 batches) at ``rows`` images, then again at the count that gives, since a large batch costs more
    per image than a small one (its activations outgrow the caches). Wall time, with the machine's
    current load, which stretches it 1-4x on a shared 2-core machine: a fixed image count breaches on a
    busy machine and not on an idle one. Between 500 and 50,000 images."""
    art = ensure_artifacts(model=settings.onnx_model)
    x, _ = art.eval_set()
    sess = _session(str(art.int8 if settings.quantize else art.fp32), settings.ort_optimization, settings.onnx_threads)
    rng = np.random.default_rng(settings.seed)

    def per_image_ms(n: int) -> float:
        batch = x[rng.integers(0, len(x), n)]
        sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1000.0 / n

    def count(ms: float) -> int:
        return int(min(50_000, max(500, round(target_ms / ms))))

    first = per_image_ms(rows)
    second = per_image_ms(count(first))
    return count(second), second
