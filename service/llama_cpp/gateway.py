"""The stagescope-instrumented gateway in front of one or more ``llama-server`` replicas.

A small FastAPI proxy (``stagescope.instrument_app`` + ``stagescope.instrument_stream``) that gives the
analysis what llama.cpp does not export per request: spans with TTFT, every inter-token gap and
stages. It is also the router of the scale-out lever (``replicas`` > 1).

``POST /v1/completions`` and ``POST /v1/chat/completions`` are forwarded unchanged to a replica and
the answer (an OpenAI server-sent-event stream, or one JSON document) is passed back unchanged. On
the way, per request, from one monotonic clock:

* ``queue``: arrival -> a slot is free. The router admits requests first come, first served, to the
  replica with the most free slots, at most ``slots`` per replica at once (llama.cpp would defer an
  excess request the same way, FIFO, but reports no per-request wait; holding it here measures it);
* ``prefill``: handed to the replica -> first token received. It holds the request's own prompt
  processing (llama.cpp's ``timings.prompt_ms``) and, before it, the wait for room in the engine's
  batch while other slots' prompts fill it (``llamacpp.prompt_wait_ms`` = prefill - prompt_ms, which
  also holds the HTTP hop and tokenization, under a millisecond here);
* ``decode``: first token -> last token received;
* ``batch_size``: the mean number of this replica's streams in decode, sampled at each of the
  request's tokens (the running decode batch its steps carried), and per gap in
  ``stagescope.itl.running`` (beside ``stagescope.itl.gaps``).

llama.cpp's final ``timings`` (``prompt_n``, ``prompt_ms``, ``cache_n``, ``predicted_n``,
``predicted_ms``) and ``usage`` go on the server span (names in :mod:`stagescope.names`). What the
gateway cannot see: how a step's time splits between the slots in it, and whether a slow gap was a
prompt chunk of another slot or the decode batch itself (the analysis infers that from the running
batch). Every replica's ``/metrics`` (``llamacpp:*``) is polled each second and served again on the
gateway's ``/metrics`` with a ``replica`` label, so one scrape holds both. Each response says which
replica served it (the ``x-stagescope-replica`` header; the sizing probe reads it). Content is never
recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import stagescope
from stagescope import names as N
from stagescope.gcheap import freeze_startup_heap
from stagescope.instrumentation.record import now_ns

__all__ = ["MODEL_ID", "MetricsRelay", "Replica", "Router", "create_gateway_app"]

#: The model id the gateway labels its requests with (what the served GGUF is: random weights).
MODEL_ID = "stagescope-random-weights-llama"
_DONE = b"data: [DONE]\n\n"
#: Gaps whose running batch is kept per request (the span keeps the first 4,096 gaps too).
_MAX_GAPS = 4096
_TIMINGS = {
    "prompt_n": N.ATTR_LLAMACPP_PROMPT_N, "prompt_ms": N.ATTR_LLAMACPP_PROMPT_MS, "cache_n": N.ATTR_LLAMACPP_CACHE_N,
    "predicted_n": N.ATTR_LLAMACPP_PREDICTED_N, "predicted_ms": N.ATTR_LLAMACPP_PREDICTED_MS,
}  # fmt: skip


@dataclass(eq=False)
class Replica:
    """One llama-server behind the gateway: its URL, slots, and what the gateway has in flight there."""

    index: int
    url: str
    slots: int
    busy: int = 0  # requests handed to it and not finished
    decoding: int = 0  # of those, streams past their first token


@dataclass(eq=False)
class Router:
    """FIFO admission of requests to replicas, at most ``slots`` each; the replica with the most free
    slots first (ties: the lowest index)."""

    replicas: Sequence[Replica]
    _waiters: deque[asyncio.Future[Replica]] = field(default_factory=deque)

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def _free(self) -> Replica | None:
        best = max(self.replicas, key=lambda r: (r.slots - r.busy, -r.index))
        return best if best.busy < best.slots else None

    async def acquire(self) -> Replica:
        r = self._free()
        if r is not None and not self.waiting:
            r.busy += 1
            return r
        fut: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted as we were cancelled: give the slot back
                self.release(fut.result())
            raise

    def release(self, r: Replica) -> None:
        r.busy -= 1
        while self._waiters:
            free = self._free()
            if free is None:
                return
            fut = self._waiters.popleft()
            if not fut.done():
                free.busy += 1
                fut.set_result(free)


class MetricsRelay(Collector):
    """The replicas' latest ``/metrics`` scrapes, served again with a ``replica`` label. Polled in the
    background (:meth:`run`); ``collect`` only reads the last scrape, so it never waits on a replica."""

    def __init__(self, replicas: Sequence[Replica], interval_s: float = 1.0) -> None:
        self.replicas = replicas
        self.interval_s = interval_s
        self._latest: dict[int, list[Metric]] = {}
        self.failures = 0

    async def poll_once(self, client: httpx.AsyncClient) -> None:
        for r in self.replicas:
            try:
                resp = await client.get(f"{r.url}/metrics")
                resp.raise_for_status()
                self._latest[r.index] = list(text_string_to_metric_families(resp.text))
            except (httpx.HTTPError, ValueError):
                self.failures += 1

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=max(0.5, self.interval_s)) as client:
            while True:
                await self.poll_once(client)
                await asyncio.sleep(self.interval_s)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for idx, families in sorted(self._latest.items()):
            for fam in families:
                out = merged.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
                for s in fam.samples:
                    out.add_sample(s.name, {**s.labels, N.LABEL_REPLICA: str(idx)}, s.value)
        return list(merged.values())


def _event_tokens(doc: dict[str, Any]) -> int:
    """1 when an OpenAI stream event carries generated text (completions or chat), else 0."""
    choices = doc.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return 0
    c = choices[0]
    text = c.get("text")
    if text is None:
        text = (c.get("delta") or {}).get("content")
    return 1 if text else 0


def _note_final(rec: Any, doc: dict[str, Any]) -> None:
    """llama.cpp's ``timings`` and the OpenAI ``usage`` of a final event onto the request's record."""
    timings = doc.get("timings")
    if isinstance(timings, dict):
        for k, attr in _TIMINGS.items():
            if isinstance(timings.get(k), int | float):
                rec.attributes[attr] = timings[k]
    usage = doc.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            rec.input_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]


def create_gateway_app(
    replica_urls: Sequence[str],
    slots: int,
    *,
    spans_dir: str | None = None,
    slow_threshold_ms: float | None = None,
    baseline_sample: float | None = None,
    registry: CollectorRegistry | None = None,
    service_name: str = "llama-cpp-gateway",
    measured_service_s: Mapping[str, float] | None = None,
    measured_cpu_cores: Mapping[str, float] | None = None,
    engine_pids: Mapping[int, int] | None = None,
) -> FastAPI:
    """The gateway as a FastAPI app in front of ``replica_urls`` (each with ``slots`` slots).
    ``measured_service_s``: one request's service time (s) with every slot busy, measured before the
    run, by variant (``serving``, or a lever such as ``scale-out`` for the servers it would run),
    exported as ``stagescope_executor_service_seconds{variant}`` for the scale-out model, and by
    occupancy (``variant@own+others``) as ``stagescope_executor_occupancy_service_seconds``;
    ``measured_cpu_cores``: the cores the server got in each of those measurements. Its own CPU, that of
    the engine servers it started (``engine_pids``: replica -> pid) and the machine's cores are exported
    at each scrape (:class:`~stagescope.service.llama_cpp.cpu.ProcessCPU`) for the scale-out model."""
    from stagescope.service.llama_cpp.cpu import ProcessCPU
    from stagescope.service.llama_cpp.slot_probe import export_measured

    registry = registry if registry is not None else CollectorRegistry()
    if measured_service_s or measured_cpu_cores:
        export_measured(measured_service_s or {}, registry, measured_cpu_cores)
    registry.register(ProcessCPU(engine_pids))
    replicas = [Replica(i, u.rstrip("/"), slots) for i, u in enumerate(replica_urls)]
    router = Router(replicas)
    relay = MetricsRelay(replicas)
    registry.register(relay)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)
        poller = asyncio.create_task(relay.run(), name="llamacpp-metrics-relay")
        freeze_startup_heap()  # no full collection of the startup heap pauses a request (stagescope.gcheap)
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await state["client"].aclose()
            handle.force_flush(10.0)

    app = FastAPI(title="stagescope gateway for llama.cpp", lifespan=lifespan)
    handle = stagescope.instrument_app(
        app, service_name=service_name, models=[MODEL_ID], spans_dir=spans_dir,
        slow_threshold_ms=slow_threshold_ms, baseline_sample=baseline_sample, registry=registry,
    )  # fmt: skip
    app.state.router = router
    app.state.instrumentation = handle

    def _depth() -> None:
        handle.metrics.set_queue_depth(MODEL_ID, router.waiting)

    async def forward(request: Request) -> Response:
        body = await request.body()
        try:
            doc = json.loads(body)
        except ValueError:
            return JSONResponse({"error": {"message": "the request body is not JSON"}}, status_code=400)
        if not isinstance(doc, dict):
            return JSONResponse({"error": {"message": "the request body is not a JSON object"}}, status_code=400)
        rec = stagescope.current_request()
        if rec is not None:
            rec.model = MODEL_ID
            rec.queue_depth = router.waiting
        t0 = now_ns()
        fut = router.acquire()
        _depth()
        replica = await fut
        _depth()
        t_admit = now_ns()
        if rec is not None:
            rec.add_stage(N.STAGE_QUEUE, t0, t_admit)
            rec.attributes[N.ATTR_REPLICA] = replica.index
        client: httpx.AsyncClient = state["client"]
        url = f"{replica.url}{request.url.path}"
        try:
            upstream = await client.send(
                client.build_request("POST", url, content=body, headers={"content-type": "application/json"}),
                stream=True,
            )
        except httpx.HTTPError as exc:
            router.release(replica)
            _depth()
            if rec is not None:
                rec.error_type = type(exc).__name__
            return JSONResponse({"error": {"message": f"replica {replica.index} unreachable"}}, status_code=502)
        if not doc.get("stream") or upstream.status_code != 200:
            try:
                raw = await upstream.aread()
            finally:
                await upstream.aclose()
                router.release(replica)
                _depth()
            with contextlib.suppress(ValueError):
                if rec is not None and upstream.status_code == 200:
                    _note_final(rec, json.loads(raw))
            return Response(raw, status_code=upstream.status_code, media_type="application/json",
                            headers={N.HEADER_REPLICA: str(replica.index)})  # fmt: skip
        tokens = stagescope.instrument_stream(
            _relay(upstream, replica, rec, t_admit), record=rec, tokens_per_chunk=lambda c: c[1]
        )
        return StreamingResponse(_strip(tokens), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", N.HEADER_REPLICA: str(replica.index)})  # fmt: skip

    async def _relay(
        upstream: httpx.Response, replica: Replica, rec: Any, t_admit: int
    ) -> AsyncIterator[tuple[bytes, int]]:
        """The upstream's events as ``(bytes, tokens)``, recording stages; releases the slot at the end."""
        first = last = None
        running: list[int] = []  # streams decoding on this replica at each of the request's tokens
        try:
            async for line in upstream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    yield _DONE, 0
                    continue
                n = 0
                with contextlib.suppress(ValueError):
                    doc = json.loads(payload)
                    if isinstance(doc, dict):
                        n = _event_tokens(doc)
                        if rec is not None and ("timings" in doc or "usage" in doc):
                            _note_final(rec, doc)
                if n:
                    last = now_ns()
                    if first is None:
                        first = last
                        replica.decoding += 1
                    if len(running) <= _MAX_GAPS:
                        running.append(replica.decoding)
                yield b"data: " + payload.encode() + b"\n\n", n
        finally:
            await upstream.aclose()
            if first is not None:
                replica.decoding -= 1
            router.release(replica)
            _depth()
            if rec is not None and first is not None and last is not None:
                rec.add_stage(N.STAGE_PREFILL, t_admit, first)
                if last > first:
                    rec.add_stage(N.STAGE_DECODE, first, last)
                if running:
                    rec.batch_size = round(sum(running) / len(running))
                    # per gap (gap k ends at token k+1), beside stagescope.itl.gaps
                    rec.attributes[N.ATTR_TOKEN_RUNNING] = running[1:]
                prompt_ms = rec.attributes.get(N.ATTR_LLAMACPP_PROMPT_MS)
                if isinstance(prompt_ms, int | float):
                    rec.attributes[N.ATTR_LLAMACPP_PROMPT_WAIT_MS] = round(
                        max(0.0, (first - t_admit) / 1e6 - float(prompt_ms)), 3
                    )

    async def _strip(chunks: AsyncIterator[tuple[bytes, int]]) -> AsyncIterator[bytes]:
        async for data, _ in chunks:
            yield data

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "stagescope"}]}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        client: httpx.AsyncClient = state["client"]
        for r in replicas:
            try:  # llama-server's /health: 503 while its model loads; another server may have none
                code = (await client.get(f"{r.url}/health", timeout=2.0)).status_code
                if code == 404:
                    code = (await client.get(f"{r.url}/v1/models", timeout=2.0)).status_code
                ok = code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                return JSONResponse({"status": "loading", "replica": r.index}, status_code=503)
        return JSONResponse({"status": "ready", "replicas": len(replicas), "slots": slots})

    return app
