"""A small instrumented FastAPI inference app for the metrics tests (in-process and under uvicorn).

Routes: ``POST /v1/predict/{item}`` runs a DynamicBatcher (batch_wait, queue, compute) and answers 429
with ``Retry-After`` when the batcher's queue is full; ``GET /v1/generate`` streams tokens through
``instrument_stream``; ``GET /pid`` tells which worker answered. ``build_app(registry=...)`` makes a
fresh app; ``create_app`` is the factory for ``uvicorn --factory metrics_app:create_app --workers N``
(global registry, models ``ranker,llm``, spans to ``$STAGESCOPE_SPANS_DIR`` when set).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

import stagescope
from stagescope.instrumentation.batching import DynamicBatcher, QueueFull
from stagescope.instrumentation.metrics import default_metrics
from stagescope.names import ENV_SPANS_DIR

MODELS = ("ranker", "llm")


def build_app(registry: Any = None, spans_dir: str | None = None, max_queue: int | None = None) -> FastAPI:
    app = FastAPI()

    async def run_batch(items: list[int]) -> list[int]:
        await asyncio.sleep(0.002 + 0.0005 * len(items))  # a simulated accelerator: fixed + per item
        return [i * 2 for i in items]

    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        run_batch, max_batch_size=8, max_wait_ms=2, max_queue=max_queue, model="ranker"
    )
    app.state.batcher = batcher

    @app.post("/v1/predict/{item}")
    async def predict(item: int, model: str = "ranker") -> Any:
        rec = stagescope.current_request()
        if rec is not None:
            rec.model = model
            rec.set_input(str(item))
        with stagescope.stage("preprocess"):
            x = item + 1
        try:
            y = await batcher.submit(x)
        except QueueFull as full:
            return JSONResponse(
                {"error": "busy"}, status_code=429, headers={"Retry-After": full.retry_after_header}
            )
        return {"y": y, "pid": os.getpid()}

    @app.get("/v1/generate")
    async def generate(n: int = 5, model: str = "llm") -> StreamingResponse:
        rec = stagescope.current_request()
        if rec is not None:
            rec.model = model
            rec.input_tokens = 16

        async def tokens() -> AsyncIterator[str]:
            for i in range(n):
                await asyncio.sleep(0.002)
                yield f"t{i} "

        return StreamingResponse(stagescope.instrument_stream(tokens()), media_type="text/plain")

    @app.get("/pid")
    async def pid() -> dict[str, int]:
        return {"pid": os.getpid()}

    app.state.stagescope = stagescope.instrument_app(
        app, service_name="metrics-test", models=MODELS, registry=registry, spans_dir=spans_dir
    )
    m = default_metrics()
    for name in MODELS:  # models are "loaded" when the app is built
        m.model_loaded(name)
        m.set_model_ready(name, True)
    return app


def create_app() -> FastAPI:
    return build_app(spans_dir=os.environ.get(ENV_SPANS_DIR) or None)
