"""stagescope: observability for ML and LLM inference services.

Add it to a FastAPI inference service::

    import stagescope

    app = FastAPI()
    stagescope.instrument_app(app, service_name="ranker", models=["ranker-v3"])

    @app.post("/v1/predict")
    async def predict(req: Request):
        with stagescope.stage("feature_fetch"):
            features = await store.get(...)
        scores = await batcher.submit(features)  # a stagescope.DynamicBatcher: batch_wait, queue, compute
        with stagescope.stage("rerank", kind="compute"):   # a stage of the team's own, with its kind
            return rerank(scores)

Every request then reports where its time went (queue apart from GPU execution) as OpenTelemetry
spans and Prometheus metrics. The names it emits live in :mod:`stagescope.names`.

The public API is imported lazily so that ``import stagescope`` stays cheap and the analysis can be
used without the service extras installed.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "instrument_app": "stagescope.instrumentation.app",
    "uninstrument_app": "stagescope.instrumentation.app",
    "stage": "stagescope.instrumentation.record",
    "current_request": "stagescope.instrumentation.record",
    "RequestRecord": "stagescope.instrumentation.record",
    "DynamicBatcher": "stagescope.instrumentation.batching",
    "instrument_stream": "stagescope.instrumentation.streaming",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stagescope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
