"""The metrics route's place among the app's routes (instrumentation/routes.py).

``instrument_app`` mounts ``/metrics`` when it is called; the routes a service declares afterwards (the
usual order) come after it, so the router would test it first on every request. The resolver moves it
to the end once those routes exist, unless another route also answers its path (a catch-all), and
``/metrics`` is served by stagescope either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names


def _call(app: Any, method: str, path: str) -> tuple[int, bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"test")], "client": ("127.0.0.1", 1), "server": ("test", 80),
    }  # fmt: skip
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return out["status"], out["body"]


def test_metrics_route_goes_last_when_routes_come_after_instrumenting() -> None:
    app = FastAPI()
    handle = stagescope.instrument_app(app, service_name="s", registry=CollectorRegistry())

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    assert app.router.routes[-1] is not handle._metrics_route
    assert _call(app, "GET", "/items/3") == (200, b'{"id":3}')
    assert app.router.routes[-1] is handle._metrics_route
    status, body = _call(app, "GET", "/metrics")
    assert status == 200 and names.METRIC_REQUEST_DURATION.encode() in body
    assert b'route="/items/{item_id}"' in body
    stagescope.uninstrument_app(app)


def test_metrics_route_stays_before_a_catch_all_route() -> None:
    app = FastAPI()
    handle = stagescope.instrument_app(app, service_name="s", registry=CollectorRegistry())

    @app.get("/{path:path}")
    async def spa(path: str) -> dict[str, str]:
        return {"page": path}

    at = app.router.routes.index(handle._metrics_route)
    assert _call(app, "GET", "/about") == (200, b'{"page":"about"}')
    assert app.router.routes.index(handle._metrics_route) == at  # not moved behind the catch-all
    status, body = _call(app, "GET", "/metrics")
    assert status == 200 and names.METRIC_REQUEST_DURATION.encode() in body
    stagescope.uninstrument_app(app)
