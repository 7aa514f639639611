"""With every trace kept nothing is lost: 10,000 requests, 1,000 in flight at once, no cross-talk."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names

N_REQUESTS = 10_000
IN_FLIGHT = 1_000
STAGE_CYCLE = ("feature_fetch", "preprocess", "compute", "postprocess")


def test_10000_requests_1000_in_flight_every_trace_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.delenv(names.ENV_BASELINE_SAMPLE, raising=False)
    app = FastAPI()
    inflight = 0
    max_inflight = 0
    gate = asyncio.Event()

    @app.get("/r/{n}")
    async def handler(n: int) -> dict[str, int]:
        nonlocal inflight, max_inflight
        inflight += 1
        max_inflight = max(max_inflight, inflight)
        if inflight >= IN_FLIGHT:
            gate.set()
        try:
            # request n records (n % 4) + 1 stages, interleaved with every other request's
            for stage in STAGE_CYCLE[: n % 4 + 1]:
                async with stagescope.stage(stage):
                    await gate.wait()
                    await asyncio.sleep(0)
            stagescope.current_request().attributes["test.n"] = n  # type: ignore[union-attr]
        finally:
            inflight -= 1
        return {"n": n}

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    handle = stagescope.instrument_app(app, service_name="load", registry=registry, tracer_provider=provider)
    assert handle.policy.keeps_everything

    trace_of = {n: random.getrandbits(128) | 1 for n in range(N_REQUESTS)}

    async def run() -> None:
        sem = asyncio.Semaphore(IN_FLIGHT)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", limits=limits) as client:

            async def one(n: int) -> None:
                async with sem:
                    tp = f"00-{trace_of[n]:032x}-{n + 1:016x}-01"
                    r = await client.get(f"/r/{n}", headers={"traceparent": tp})
                    assert r.status_code == 200 and r.json() == {"n": n}

            await asyncio.gather(*(one(n) for n in range(N_REQUESTS)))

    asyncio.run(run())
    assert max_inflight == IN_FLIGHT
    assert handle.force_flush(60)
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert len(servers) == N_REQUESTS
    stages_by_parent: dict[int, list[str]] = defaultdict(list)
    trace_by_parent: dict[int, set[int]] = defaultdict(set)
    for s in spans:
        if s.kind == SpanKind.INTERNAL:
            assert s.parent is not None and s.context is not None
            stages_by_parent[s.parent.span_id].append(s.name)
            trace_by_parent[s.parent.span_id].add(s.context.trace_id)
    seen = Counter[int]()
    for server in servers:
        assert server.context is not None and server.parent is not None
        n = dict(server.attributes or {})["test.n"]
        assert isinstance(n, int)
        seen[n] += 1
        assert server.context.trace_id == trace_of[n]  # joined the caller's trace
        assert server.parent.span_id == n + 1
        assert stages_by_parent[server.context.span_id] == list(STAGE_CYCLE[: n % 4 + 1])
        assert trace_by_parent[server.context.span_id] == {trace_of[n]}
    assert set(seen) == set(range(N_REQUESTS)) and set(seen.values()) == {1}
    assert sum(len(v) for v in stages_by_parent.values()) == sum(n % 4 + 1 for n in range(N_REQUESTS))
    dropped = registry.get_sample_value(
        names.METRIC_SPANS_DROPPED, {"exporter": "tracer_provider", "reason": "queue_full"}
    )
    assert not dropped
    handle.shutdown()
