"""The ``onnx`` engine's scenarios: the reference service on a real model, ground truth as data.

Same shape as :mod:`stagescope.service.scenarios` (settings, rate, SLO, true stage, lever and the
lever's setting change), sized for ONNX Runtime on one core per batch (``onnx_threads=1``) of a
small shared machine: the digits MLP (:mod:`stagescope.service.onnx_model`) costs about 0.06-0.2 ms
of real matrix work per image in FP32 depending on how busy the machine is, and a request classifies
``items_per_request`` images (``heavy_items`` for the ``heavy_share`` of inputs chosen by hash).
Four executors each run a batch on its own thread, so a heavy batch rarely makes another wait for an
executor (on a busy machine the batches share the cores, and their wall time stretches instead).

* ``healthy``: one image per request in batches of up to 16; far within the SLO.
* ``slow-compute``: 5 % of requests classify a batch of 5,000 images (a few hundred ms of FP32
  matrix work each): compute owns the tail. Lever: ``quantize`` (the dynamic INT8 model), whose speed
  and accuracy the service measures at load; the SLO file's ``quality_budget`` allows 0.5 points of
  accuracy.
* ``slow-compute-strict``: the same load on another model, ``digits-ink-mlp`` (the digits plus their
  total ink as a 65th input in raw units, 185-433, beside pixels in [0, 1]: see
  :mod:`stagescope.service.onnx_model`), with ONNX Runtime's graph optimizations off, under the same
  0.5-point quality budget. Dynamic INT8 quantizes each MatMul input with one scale per tensor from
  its range, so the raw ink makes the step ~1.6 and the pixels collapse to a coarse threshold: INT8
  costs this model some 22-30 points on its eval set (8 training seeds), on any machine, so
  ``quantize`` is not acceptable and the next lever, ``compile-runtime`` (optimization level
  ``all``), is the one to apply. It is not expected to meet the SLO by itself: the graph fusions buy
  far less than INT8 would. Its heavy requests are sized to 2x the SLO threshold (not slow-compute's
  1.35x) so that the breach has a wide margin.
* ``long-batch-wait``: batches close 400 ms after their first item at 20/s, each item 64 images;
  capping the wait is the lever, its model fitted on the real per-batch compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from stagescope import names as N
from stagescope.service.scenarios import PREDICT_ROUTE, Scenario

__all__ = ["ONNX_SCENARIOS"]

_E2E = "p99<300ms"
_BASE: dict[str, Any] = {"backend": "onnx", "model_name": "digits-mlp", "onnx_threads": 1, "executors": 4,
                         "devices": 4, "preprocess_cpu_ms": 0.3}  # fmt: skip
_SERIAL = {**_BASE, "max_batch_size": 1, "max_batch_wait_ms": 0.0}
_HEAVY = {**_SERIAL, "heavy_share": 0.05, "heavy_items": 5000}
#: the model dynamic INT8 hurts (service.onnx_model.INK_RECIPE), under its own name in the metrics; it
#: costs ~0.018 ms of CPU per image (digits-mlp ~0.07), so ``serve``'s unsized heavy request is 30,000
#: images (~550 ms) for a breach like slow-compute's (the demo sizes it to the machine)
_INK = {"onnx_model": "digits-ink-mlp", "model_name": "digits-ink-mlp", "heavy_items": 30000}
#: slow-compute-strict's heavy batches take twice the SLO threshold at the pace measured before the run,
#: not slow-compute's 1.35x (onnx_backend.HEAVY_OVER_SLO, sized so that INT8 brings them under it): its
#: lever is not expected to meet the SLO, and at 1.15x (the old factor) a machine that got quieter between the sizing and
#: the run (a CI run) served the heavy requests under the threshold, so there was no breach to gate.
STRICT_HEAVY_OVER_SLO = 2.0


def _f(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


ONNX_SCENARIOS: Mapping[str, Scenario] = MappingProxyType(
    {
        s.name: s
        for s in (
            Scenario("healthy", "one image per request, batches of up to 16", PREDICT_ROUTE, 10.0, _E2E,
                     None, None, _f(_BASE), quality_budget=0.5),
            Scenario("slow-compute", "5% of requests classify 5,000 images in FP32", PREDICT_ROUTE, 10.0, _E2E,
                     N.STAGE_COMPUTE, N.LEVER_QUANTIZE, _f(_HEAVY), _f({"quantize": True}), quality_budget=0.5),
            Scenario("slow-compute-strict", "slow-compute on digits-ink-mlp (a raw-unit input INT8 crushes), "
                     "graph optimizations off", PREDICT_ROUTE, 10.0, _E2E, N.STAGE_COMPUTE, N.LEVER_COMPILE_RUNTIME,
                     _f({**_HEAVY, **_INK, "ort_optimization": "disable"}), _f({"ort_optimization": "all"}),
                     quality_budget=0.5, heavy_over_slo=STRICT_HEAVY_OVER_SLO),
            Scenario("long-batch-wait", "batch window (400 ms) far too long for 20 req/s of 64 images",
                     PREDICT_ROUTE, 20.0, _E2E, N.STAGE_BATCH_WAIT, N.LEVER_CAP_BATCH_WAIT,
                     _f({**_BASE, "max_batch_size": 64, "max_batch_wait_ms": 400.0, "items_per_request": 64,
                         "executors": 1}),
                     _f({"max_batch_wait_ms": 5.0}), quality_budget=0.5),
        )
    }
)  # fmt: skip
