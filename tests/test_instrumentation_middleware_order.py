"""stagescope's middleware is the outermost of the app's when the app builds its middleware stack
(instrumentation/app.py): a middleware added after ``instrument_app`` (the usual order: an app is
instrumented right after it is made, then gets CORS, auth, a rate limiter) ran outside it, so its time
was client time only (the analysis calls that ``network``) and the requests it answered itself (a 429,
a 401) were never recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.middleware import StagescopeMiddleware

AUTH_S = 0.05


def _app(records: list[Any], registry: CollectorRegistry) -> FastAPI:
    app = FastAPI()
    stagescope.instrument_app(app, service_name="s", registry=registry, record_hook=records.append)

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Any:  # added after instrument_app
        await asyncio.sleep(AUTH_S)  # a token check against an auth service
        if request.headers.get("x-api-key") != "k":
            return JSONResponse({"error": "slow down"}, status_code=429)
        return await call_next(request)

    app.add_middleware(CORSMiddleware, allow_origins=["*"])

    @app.get("/v1/x")
    async def x() -> dict[str, int]:
        return {"x": 1}

    return app


def test_a_middleware_added_after_instrument_app_is_measured() -> None:
    records: list[Any] = []
    registry = CollectorRegistry()
    app = _app(records, registry)

    async def main() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            ok = await c.get("/v1/x", headers={"x-api-key": "k", "origin": "http://a"})
            shed = await c.get("/v1/x")
            return [ok.status_code, shed.status_code]

    assert asyncio.run(main()) == [200, 429]
    assert app.user_middleware[0].cls is StagescopeMiddleware
    assert [r.status_code for r in records] == [200, 429]
    assert all(r.duration_s >= AUTH_S for r in records), [r.duration_s for r in records]
    shed = registry.get_sample_value(names.METRIC_REQUESTS_SHED, {"route": "/v1/x", "model": ""})
    assert shed == 1.0
    stagescope.uninstrument_app(app)
    assert "build_middleware_stack" not in app.__dict__
    assert StagescopeMiddleware not in [m.cls for m in app.user_middleware]
