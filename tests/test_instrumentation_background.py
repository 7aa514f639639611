"""Work after the response (instrumentation/record.py ``stage``): FastAPI's ``BackgroundTasks`` run
after the last body chunk was sent, still inside the request's context. A stage they enter is not the
request's latency: before, it was appended to the record the span thread was already turning into spans
(in a span or not, depending on which came first: 35 of 40 kept requests had it in one run) and never
reached the stage histogram, and its span lay after its parent's end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgi_support import asgi_call
from fastapi import BackgroundTasks, FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import stagescope


def test_a_background_task_stage_is_not_the_requests() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = FastAPI()
    records: list[Any] = []
    handle = stagescope.instrument_app(
        app, service_name="s", registry=CollectorRegistry(), tracer_provider=provider, baseline_sample=1.0,
        record_hook=records.append,
    )  # fmt: skip

    def audit_log(item_id: int) -> None:  # sync: Starlette runs it in its threadpool
        with stagescope.stage("audit_log", kind="cpu"):
            time.sleep(0.01)

    async def warm_cache(item_id: int) -> None:
        async with stagescope.stage("warm_cache", kind="fetch"):
            await asyncio.sleep(0.01)

    @app.get("/items/{item_id}")
    async def item(item_id: int, background: BackgroundTasks) -> dict[str, int]:
        with stagescope.stage("lookup", kind="fetch"):
            pass
        background.add_task(audit_log, item_id)
        background.add_task(warm_cache, item_id)
        return {"id": item_id}

    for i in range(3):
        assert asgi_call(app, "GET", f"/items/{i}")[0] == 200
    assert handle.force_flush()
    assert [[iv.stage for iv in rec.stages] for rec in records] == [["lookup"]] * 3
    names = sorted({s.name for s in exporter.get_finished_spans()})
    assert names == ["GET /items/{item_id}", "lookup"]
    stagescope.uninstrument_app(app)
