"""The reference inference service: a FastAPI app instrumented with stagescope's public API only.

Routes:

* ``POST /v1/predict``: feature fetch -> preprocess -> (result cache) -> dynamic batcher -> model ->
  postprocess -> JSON. 429 with ``Retry-After`` when the batcher's queue is full.
* ``POST /v1/generate``: streaming tokens as server-sent events (``data: {"index": i, "token": w}``
  lines, then ``data: [DONE]``), or one JSON answer with ``"stream": false``; continuous batching
  in :mod:`stagescope.service.llm`.
* ``GET /healthz`` (the process is up), ``GET /readyz`` (503 until the model is loaded and the
  feature store reachable), ``GET /metrics`` (installed by ``stagescope.instrument_app``).

Inputs are hashed onto the request record (``current_request().set_input``), never stored; prompt
and completion text appear in no span, metric or log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names as N
from stagescope.gcheap import freeze_startup_heap
from stagescope.instrumentation.batching import QueueFull
from stagescope.service.backends import PredictItem, SimulatedAccelerator, SimulatedGpuCollector, make_backend
from stagescope.service.features import Features, FeatureStoreUnavailable
from stagescope.service.llm import EngineFull, LLMEngine
from stagescope.service.model import ModelManager, ResultCache, burn_cpu, hash_fraction, preprocess
from stagescope.service.schemas import BadRequest, GenerateRequest, PredictRequest, parse_body, read_body
from stagescope.service.settings import Settings
from stagescope.service.variants import VariantCollector, VariantSource

__all__ = ["Service", "create_app"]

_DONE = b"data: [DONE]\n\n"
_EGRESS_CHUNK = 16 * 1024


def _digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def _too_busy(error: str, retry_after: str) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=429, headers={"Retry-After": retry_after})


class Service:
    """The parts of one service instance, started and stopped by the app's lifespan."""

    def __init__(self, settings: Settings, instrumentation: Any = None) -> None:
        self.settings = s = settings
        self.accel = SimulatedAccelerator(s.devices)
        self.backend = make_backend(s, self.accel)
        self.features = Features(s)
        self.model = ModelManager(s, self.backend, instrumentation)
        self.results = ResultCache(s.result_cache_size) if s.result_cache else None
        self.pool = ThreadPoolExecutor(max_workers=s.preprocess_workers, thread_name_prefix="preprocess")
        self.batcher = stagescope.DynamicBatcher(
            self.backend.run_batch, max_batch_size=s.max_batch_size, max_wait_ms=s.max_batch_wait_ms,
            max_queue=s.max_queue, executors=s.executors, model=s.model_name,
        )  # fmt: skip
        self.engine = LLMEngine(s, self.accel)
        self.features_ready = False

    async def start(self) -> None:
        if self.settings.preprocess_cpu_ms > 0:
            # the CPU burner measures its speed (3 x 20,000 PBKDF2 rounds, ~35 ms) before /readyz says
            # ready, not on the first requests, where every pool thread raced to measure it at once and
            # the first few requests of a healthy run took 55-80 ms in preprocess
            await asyncio.get_running_loop().run_in_executor(self.pool, burn_cpu, 0.5)
        await self.batcher.start()
        await self.engine.start()
        await self.model.start()
        await self.features.start()
        self.features_ready = True

    async def stop(self) -> None:
        await self.model.stop()
        await self.engine.stop()
        await self.batcher.stop(drain=False)
        await self.features.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return self.model.ready and self.features_ready and self.features.ready

    # -- /v1/predict ----------------------------------------------------------------------------
    async def predict(self, raw: bytes) -> Response:
        s = self.settings
        rec = stagescope.current_request()
        req = parse_body(PredictRequest, raw)
        key = orjson.dumps(req.inputs)
        h = rec.set_input(key) if rec is not None else _digest(key)
        if rec is not None:
            rec.model = s.model_name
        self.model.note_request()
        entity = req.entity_id if req.entity_id is not None else int(h[:8], 16)
        async with stagescope.stage(N.STAGE_FEATURE_FETCH):
            feats = await self.features.get(entity)
        async with stagescope.stage(N.STAGE_PREPROCESS):
            loop = asyncio.get_running_loop()
            x = await loop.run_in_executor(self.pool, preprocess, feats, req.inputs, s.preprocess_cpu_ms)
        heavy = hash_fraction(h, "heavy") < s.heavy_share
        large = hash_fraction(h, "large") < s.large_response_share
        dim = s.large_response_dim if large else s.response_dim
        ckey = f"{h}:{dim}"
        out = await self.results.lookup(ckey) if self.results is not None else None
        if out is None:
            await self.model.wait_ready()
            item = PredictItem(x, s.heavy_items if heavy else s.items_per_request, dim, int(h[:8], 16))
            claim = self.results.claim(ckey) if self.results is not None else None
            try:
                out = await self.batcher.submit(item)
            except QueueFull as exc:
                return _too_busy(str(exc), exc.retry_after_header)
            finally:
                if self.results is not None and claim is not None:
                    self.results.settle(ckey, claim, out)
        with stagescope.stage(N.STAGE_POSTPROCESS):
            top = np.argsort(out[: min(out.size, 4096)])[::-1][:5]
            answer = {"model": s.model_name, "top": top.tolist(), "scores": out}
        return self._egress(answer)

    def _egress(self, answer: dict[str, Any]) -> Response:
        """Serialize, then write (paced by the SIMULATED client link when egress_bytes_per_s > 0)."""
        rate = self.settings.egress_bytes_per_s
        rec = stagescope.current_request()
        if rate <= 0:
            with stagescope.stage(N.STAGE_EGRESS):
                body = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
            return Response(body, media_type="application/json")
        t0 = time.perf_counter_ns()  # the records' clock
        body = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)

        async def paced() -> AsyncIterator[bytes]:
            try:
                for i in range(0, len(body), _EGRESS_CHUNK):
                    chunk = body[i : i + _EGRESS_CHUNK]
                    await asyncio.sleep(len(chunk) / rate)
                    yield chunk
            finally:
                if rec is not None:
                    rec.add_stage(N.STAGE_EGRESS, t0, time.perf_counter_ns())

        return StreamingResponse(
            paced(), media_type="application/json", headers={"Content-Length": str(len(body))}
        )

    # -- /v1/generate ---------------------------------------------------------------------------
    async def generate(self, raw: bytes) -> Response:
        s = self.settings
        rec = stagescope.current_request()
        req = parse_body(GenerateRequest, raw)
        max_tokens = req.max_tokens or s.default_max_tokens
        if max_tokens > s.max_new_tokens:
            raise BadRequest(422, f"max_tokens must be at most {s.max_new_tokens}")
        with stagescope.stage(N.STAGE_PREPROCESS):  # tokenize: one token per word
            n_prompt = len(req.prompt.split())
            h = rec.set_input(req.prompt) if rec is not None else _digest(req.prompt.encode())
        if n_prompt > s.max_prompt_tokens:
            raise BadRequest(422, f"prompt has {n_prompt} tokens; at most {s.max_prompt_tokens} allowed")
        if rec is not None:
            rec.model = s.llm_model_name
            rec.input_tokens = n_prompt
        self.model.note_request()
        await self.model.wait_ready()
        try:
            seq = self.engine.submit(n_prompt, max_tokens, rec, int(h[:8], 16))
        except EngineFull as exc:
            return _too_busy(str(exc), str(max(1, int(exc.retry_after_s + 0.999))))
        engine = self.engine

        async def tokens() -> AsyncIterator[bytes]:
            try:
                i = 0
                while True:
                    word = await seq.tokens.get()
                    if word is None:
                        break
                    yield b"data: " + orjson.dumps({"index": i, "token": word}) + b"\n\n"
                    i += 1
                yield _DONE
            finally:
                if not seq.finished:
                    engine.cancel(seq)

        if not req.stream:
            words = []
            async for chunk in tokens():
                if chunk is not _DONE:
                    words.append(orjson.loads(chunk[6:])["token"])
            return JSONResponse({"model": s.llm_model_name, "text": " ".join(words), "output_tokens": len(words)})
        stream = stagescope.instrument_stream(
            tokens(), record=rec, tokens_per_chunk=lambda c: 0 if c is _DONE else 1
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def create_app(
    settings: Settings | None = None,
    *,
    spans_dir: str | None = None,
    slow_threshold_ms: float | None = None,
    baseline_sample: float | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The service as a FastAPI app (``settings`` default: healthy). ``spans_dir``: embedded span sink."""
    s = settings or Settings()
    registry = registry if registry is not None else CollectorRegistry()
    holder: dict[str, Service] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = holder["service"]
        await svc.start()
        # the startup heap out of every later full collection (see stagescope.gcheap): the 55-73 ms
        # pauses those took during traffic were the reference service's, not its scenario's
        freeze_startup_heap()
        try:
            yield
        finally:  # then the instrumentation drains span export (it sees the lifespan shutdown complete)
            await svc.stop()

    app = FastAPI(title="stagescope reference inference service", lifespan=lifespan)
    handle = stagescope.instrument_app(
        app, service_name=s.service_name, models=[s.model_name, s.llm_model_name], spans_dir=spans_dir,
        slow_threshold_ms=slow_threshold_ms, baseline_sample=baseline_sample, registry=registry,
    )  # fmt: skip
    svc = holder["service"] = Service(s, handle)
    app.state.service = svc
    app.state.instrumentation = handle
    if s.backend == "simulated":
        registry.register(SimulatedGpuCollector(svc.accel))
    if isinstance(svc.backend, VariantSource):  # what the model-changing levers would do, measured
        registry.register(VariantCollector(svc.backend))

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(FeatureStoreUnavailable)
    async def feature_store_down(request: Request, exc: FeatureStoreUnavailable) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.post("/v1/predict")
    async def predict(request: Request) -> Response:
        return await svc.predict(await read_body(request, s.max_body_bytes))

    @app.post("/v1/generate")
    async def generate(request: Request) -> Response:
        return await svc.generate(await read_body(request, s.max_body_bytes))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if svc.ready:
            return JSONResponse({"status": "ready", "model_loads": svc.model.loads})
        return JSONResponse({"status": "loading"}, status_code=503)

    return app
