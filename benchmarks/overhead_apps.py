"""The servers benchmarks/overhead.py measures: one FastAPI app per variant, run by uvicorn.

Variants (see benchmarks/overhead.py for what each stands for): ``bare``, ``stock``, ``stagescope``
on the trivial endpoint (``POST /predict`` answering a small JSON); ``bare-batch``, ``stagescope-batch``,
``plain-batch`` on the realistic one (a dynamic batcher in front of a SIMULATED accelerator: 5 ms of
``asyncio.sleep`` per batch). ``?slow=1`` makes a request sleep 300 ms (the tail-sampling check).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["build_app", "serve"]


def build_app(variant: str, spans_dir: str | None) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    batcher: Any = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        if batcher is not None:
            await batcher.start()
        yield
        if batcher is not None:
            await batcher.stop()

    app = FastAPI(lifespan=lifespan)

    async def simulated_accelerator(items: list[Any]) -> list[Any]:
        await asyncio.sleep(0.005)  # SIMULATED accelerator: 5 ms per batch
        return [{"y": i} for i in range(len(items))]

    if variant == "bare":

        @app.post("/predict")
        async def predict_bare(slow: int = 0) -> dict[str, bool]:
            if slow:
                await asyncio.sleep(0.3)
            return {"ok": True}

    elif variant == "stock":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class NullExporter(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NullExporter()))

        @app.post("/predict")
        async def predict_stock(slow: int = 0) -> dict[str, bool]:
            if slow:
                await asyncio.sleep(0.3)
            return {"ok": True}

        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)

    elif variant == "stagescope":
        import stagescope

        stagescope.instrument_app(app, service_name="bench", spans_dir=spans_dir)

        @app.post("/predict")
        async def predict_stagescope(slow: int = 0) -> dict[str, bool]:
            with stagescope.stage("preprocess"):
                pass
            with stagescope.stage("compute"):
                if slow:
                    await asyncio.sleep(0.3)
            with stagescope.stage("postprocess"):
                pass
            return {"ok": True}

    elif variant in ("plain-batch", "bare-batch"):
        if variant == "plain-batch":
            batcher = _MinimalBatcher(simulated_accelerator, max_batch_size=8, max_wait_s=0.002)
        else:
            import stagescope

            batcher = stagescope.DynamicBatcher(
                simulated_accelerator, max_batch_size=8, max_wait_ms=2, model="bench-model"
            )

        @app.post("/predict")
        async def predict_bare_batch(slow: int = 0) -> Any:
            if slow:
                await asyncio.sleep(0.3)
            return await batcher.submit(1)

    elif variant == "stagescope-batch":
        import stagescope

        stagescope.instrument_app(app, service_name="bench", spans_dir=spans_dir, models=["bench-model"])
        batcher = stagescope.DynamicBatcher(
            simulated_accelerator, max_batch_size=8, max_wait_ms=2, model="bench-model"
        )

        @app.post("/predict")
        async def predict_stagescope_batch(slow: int = 0) -> Any:
            rec = stagescope.current_request()
            if rec is not None:
                rec.model = "bench-model"
            with stagescope.stage("preprocess"):
                if slow:
                    await asyncio.sleep(0.3)
            out = await batcher.submit(1)
            with stagescope.stage("postprocess"):
                pass
            return out

    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return app


class _MinimalBatcher:
    """The bare baseline: same batching policy as DynamicBatcher (close at max size or max wait after
    the first item, one executor), no telemetry."""

    def __init__(self, run_batch: Any, *, max_batch_size: int, max_wait_s: float) -> None:
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._open: list[tuple[Any, asyncio.Future[Any]]] = []
        self._closed: asyncio.Queue[list[tuple[Any, asyncio.Future[Any]]]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._closed = asyncio.Queue()
        self._task = asyncio.create_task(self._executor())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._open and self._closed is not None:
            self._closed.put_nowait(self._open)
            self._open = []

    async def submit(self, item: Any) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._open.append((item, fut))
        if len(self._open) >= self.max_batch_size:
            self._close()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._close)
        return await fut

    async def _executor(self) -> None:
        assert self._closed is not None
        while True:
            batch = await self._closed.get()
            results = await self.run_batch([i for i, _ in batch])
            for (_, fut), res in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(res)


def serve(variant: str, port: int, spans_dir: str | None) -> None:
    import uvicorn

    uvicorn.run(
        build_app(variant, spans_dir), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
