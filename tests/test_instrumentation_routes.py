"""The metrics route's place among the app's routes (instrumentation/routes.py).

``instrument_app`` mounts ``/metrics`` when it is called; the routes a service declares afterwards (the
usual order) come after it, so the router would test it first on every request. The resolver moves it
to the end once those routes exist, unless another route also answers its path (a catch-all), and
``/metrics`` is served by stagescope either way.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgi_support import asgi_call
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names


def test_metrics_route_goes_last_when_routes_come_after_instrumenting() -> None:
    app = FastAPI()
    handle = stagescope.instrument_app(app, service_name="s", registry=CollectorRegistry())

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    assert app.router.routes[-1] is not handle._metrics_route
    assert asgi_call(app, "GET", "/items/3") == (200, b'{"id":3}')
    assert app.router.routes[-1] is handle._metrics_route
    status, body = asgi_call(app, "GET", "/metrics")
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
    assert asgi_call(app, "GET", "/about") == (200, b'{"page":"about"}')
    assert app.router.routes.index(handle._metrics_route) == at  # not moved behind the catch-all
    status, body = asgi_call(app, "GET", "/metrics")
    assert status == 200 and names.METRIC_REQUEST_DURATION.encode() in body
    stagescope.uninstrument_app(app)


def _routes_seen(app: Any) -> list[str]:
    """The route each request is recorded under (every record, kept or not)."""
    seen: list[str] = []
    stagescope.instrument_app(
        app, service_name="s", registry=CollectorRegistry(), record_hook=lambda rec: seen.append(rec.route)
    )
    return seen


def test_a_mounted_sub_app_has_its_own_route_templates(tmp_path: Any) -> None:
    """``app.mount("/admin", sub)``: each route of the sub-app is its own template under the mount's
    path (the stock instrumentation's ``/admin`` pooled them all, so a slow one hid among fast ones);
    nested ``Mount(routes=...)`` too; nothing inside matching is unmatched."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    app = FastAPI()
    seen = _routes_seen(app)
    sub = FastAPI()

    @sub.get("/users/{uid}")
    async def user(uid: str) -> dict[str, str]:
        return {"uid": uid}

    @sub.get("/health")
    async def health() -> dict[str, str]:
        return {}

    app.mount("/admin", sub)
    app.router.routes.append(
        Mount("/raw", routes=[Mount("/deep", routes=[Route("/z/{zid}", lambda r: PlainTextResponse("z"))])])
    )
    for path in ("/admin/users/1", "/admin/users/2", "/admin/health", "/raw/deep/z/9", "/admin/nope"):
        asgi_call(app, "GET", path)
    assert seen == [
        "/admin/users/{uid}",
        "/admin/users/{uid}",
        "/admin/health",
        "/raw/deep/z/{zid}",
        "unmatched",
    ]
    status, body = asgi_call(app, "GET", "/metrics")
    assert status == 200 and b'route="/admin/users/{uid}"' in body and b'route="/admin"' not in body
    stagescope.uninstrument_app(app)


def test_a_mount_at_the_root_is_one_route_not_one_per_path(tmp_path: Any) -> None:
    """``app.mount("/", StaticFiles(...))`` (a single-page app's files): every file (and every 404 a
    scanner asks for) is the one template ``/{path}``, never its raw path; ``/metrics`` is still served
    before the mount; a ``Host`` route's paths are its templates."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Host, Route, Router
    from starlette.staticfiles import StaticFiles

    for i in range(20):
        (tmp_path / f"chunk-{i}.js").write_text("x")
    app = FastAPI()
    seen = _routes_seen(app)

    @app.get("/api/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    app.router.routes.append(
        Host("api.example.com", app=Router(routes=[Route("/h/{hid}", lambda r: PlainTextResponse("h"))]))
    )
    app.mount("/", StaticFiles(directory=tmp_path))
    for i in range(20):
        assert asgi_call(app, "GET", f"/chunk-{i}.js")[0] == 200
    assert asgi_call(app, "GET", "/wp-login.php")[0] == 404
    assert asgi_call(app, "GET", "/api/items/3")[0] == 200
    assert set(seen) == {"/{path}", "/api/items/{item_id}"} and seen.count("/{path}") == 21
    del seen[:]
    assert asgi_call(app, "GET", "/h/5", host=b"api.example.com")[0] == 200
    assert asgi_call(app, "GET", "/h/5")[0] == 404  # the same path on another host: the static files'
    assert seen == ["/h/{hid}", "/{path}"]
    status, body = asgi_call(app, "GET", "/metrics")
    assert status == 200 and names.METRIC_REQUEST_DURATION.encode() in body
    assert b"chunk-" not in body
    stagescope.uninstrument_app(app)


def test_otel_fastapi_mode_names_the_mounted_route_as_the_metrics_do() -> None:
    """The stock instrumentor names every route of a mounted app ``GET /admin``; in ``otel-fastapi``
    mode its span carries the template stagescope's metrics do, so spans and metrics name one route."""
    pytest.importorskip("opentelemetry.instrumentation.fastapi")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app, sub = FastAPI(), FastAPI()

    @sub.get("/users/{uid}")
    async def user(uid: str) -> dict[str, str]:
        return {"uid": uid}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    app.mount("/admin", sub)
    stagescope.instrument_app(
        app, service_name="s", registry=CollectorRegistry(), mode="otel-fastapi", tracer_provider=provider
    )
    assert asgi_call(app, "GET", "/admin/users/7")[0] == 200
    assert asgi_call(app, "GET", "/items/3")[0] == 200
    provider.force_flush()
    server = [
        (s.name, (s.attributes or {}).get("http.route"))
        for s in exporter.get_finished_spans()
        if s.kind.name == "SERVER"
    ]
    assert server == [
        ("GET /admin/users/{uid}", "/admin/users/{uid}"),
        ("GET /items/{item_id}", "/items/{item_id}"),
    ]
    stagescope.uninstrument_app(app)


def test_include_router_routes_without_iter_route_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI 0.137.0 and 0.137.1 (``pyproject.toml`` allows them) nest ``include_router``'s routes
    under an ``_IncludedRouter`` node and have no ``iter_route_contexts`` (0.137.2): the routes are read
    through the node's ``effective_route_contexts()``. Without that every route of an app built from
    ``APIRouter``s was ``unmatched`` there (checked against a real fastapi 0.137.0). Simulated here on
    the installed FastAPI by taking ``iter_route_contexts`` away."""
    import fastapi.routing
    from fastapi import APIRouter

    from stagescope.instrumentation.routes import RouteResolver

    app = FastAPI()
    v1, models = APIRouter(prefix="/v1"), APIRouter(prefix="/models")

    @models.post("/{model}/predict")
    def predict(model: str) -> dict[str, str]:
        return {"model": model}

    @v1.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    v1.include_router(models)
    app.include_router(v1)
    if not any(hasattr(r, "effective_route_contexts") for r in app.router.routes):
        pytest.skip("this FastAPI does not nest included routers (before 0.137)")
    monkeypatch.delattr(fastapi.routing, "iter_route_contexts")

    def resolve(method: str, path: str) -> str | None:
        return RouteResolver(app).resolve(
            {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
        )

    assert resolve("POST", "/v1/models/m1/predict") == "/v1/models/{model}/predict"
    assert resolve("GET", "/v1/items/3") == "/v1/items/{item_id}"
    assert resolve("DELETE", "/v1/items/3") == "/v1/items/{item_id}"  # 405: the partial match's template
    assert resolve("GET", "/v2/nope") is None
