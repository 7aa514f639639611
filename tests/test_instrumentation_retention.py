"""What a request leaves reachable after it ends, from a context copied during its last send.

uvicorn's h11 and httptools protocols arm their keep-alive timer (``loop.call_later``) inside the last
``send`` of a response, so the timer handle holds a copy of the request's context; cancelled when the
next request arrives, it stays in the loop's heap for up to the keep-alive timeout. Whatever that
context reaches stays alive that long, is counted by the garbage collector and promoted through its
generations: for a trace that is not kept, it must not reach the ASGI scope (and all the app put in
it), and the OpenTelemetry context must not hold the record.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope.instrumentation.otel_context import SPAN_KEY, current_context
from stagescope.instrumentation.record import _current


def _reaches(root: object, target: object, limit: int = 200_000) -> bool:
    seen: set[int] = set()
    todo = [root]
    while todo and len(seen) < limit:
        o = todo.pop()
        if o is target:
            return True
        if id(o) in seen:
            continue
        seen.add(id(o))
        todo.extend(gc.get_referents(o))
    return False


def _serve_one(app: FastAPI) -> tuple[dict[str, Any], contextvars.Context]:
    """One GET through the app; returns its scope and the context copied in the response's last send."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/item", "raw_path": b"/item", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"test")], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    copied: list[contextvars.Context] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            copied.append(contextvars.copy_context())  # what loop.call_later(...) keeps

    asyncio.run(app(scope, receive, send))
    assert len(copied) == 1
    return scope, copied[0]


def _app(**kw: Any) -> tuple[FastAPI, Any]:
    app = FastAPI()

    @app.get("/item")
    async def item() -> dict[str, bool]:
        with stagescope.stage("compute"):
            pass
        return {"ok": True}

    handle = stagescope.instrument_app(app, service_name="retention", registry=CollectorRegistry(), **kw)
    return app, handle


def test_a_context_copied_in_the_last_send_does_not_keep_a_dropped_requests_scope(tmp_path: Any) -> None:
    app, handle = _app(spans_dir=tmp_path / "spans", baseline_sample=0.0, slow_threshold_ms=60_000)
    try:
        scope, ctx = _serve_one(app)
        rec = ctx[_current]
        assert rec is not None and rec.end_ns is not None and rec.sampled_reason is None
        assert [s.stage for s in rec.stages] == ["compute"]  # what the request recorded stays
        assert rec.scope is None
        assert not _reaches(ctx, scope)
        span = ctx.run(current_context).get(SPAN_KEY)  # the request's span in the OTel context
        assert span.get_span_context().trace_id == rec.trace_id
        assert span.get_span_context().span_id == rec.span_id
        assert not _reaches(span, rec)
    finally:
        handle.shutdown()


def test_a_kept_request_keeps_its_scope_for_the_span_thread(tmp_path: Any) -> None:
    app, handle = _app(spans_dir=tmp_path / "spans", baseline_sample=1.0)
    try:
        scope, ctx = _serve_one(app)
        rec = ctx[_current]
        assert rec.sampled_reason == "baseline"
        assert rec.scope is scope  # its HTTP attributes are read from it when the span is built
    finally:
        handle.shutdown()


def _serve_uvicorn(app: Any, requests: int, asgi: Any = None) -> Any:
    """``requests`` GETs of /item on one keep-alive connection to a real uvicorn server (in a thread)
    serving ``asgi`` (default: ``app``); returns the contexts of the timer handles in the server loop's
    heap after them."""
    import http.client
    import threading
    import time

    import uvicorn

    loops: list[asyncio.AbstractEventLoop] = []

    @app.get("/loop")
    async def loop_of() -> dict[str, bool]:
        loops.append(asyncio.get_running_loop())
        return {"ok": True}

    server = uvicorn.Server(uvicorn.Config(asgi or app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        idle.request("GET", "/loop")  # its keep-alive timer, first in the heap, keeps the rest there
        idle.getresponse().read()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(requests):
            conn.request("GET", "/item")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
        time.sleep(0.1)
        contexts = [h._context for h in list(loops[0]._scheduled) if getattr(h, "_context", None) is not None]
        conn.close()
        idle.close()
        return contexts
    finally:
        server.should_exit = True
        thread.join(10)


def test_uvicorns_keep_alive_timers_hold_no_request_record(tmp_path: Any) -> None:
    app, handle = _app(spans_dir=tmp_path / "spans", baseline_sample=0.0, slow_threshold_ms=60_000)
    try:
        contexts = _serve_uvicorn(app, 20)
        assert len(contexts) >= 20  # a keep-alive timer per response, cancelled ones included
        assert all(ctx.get(_current) is None for ctx in contexts)
        assert all(ctx.run(current_context).get(SPAN_KEY) is None for ctx in contexts)
    finally:
        handle.shutdown()


def test_a_users_middleware_outside_still_sees_the_record_in_the_last_send(tmp_path: Any) -> None:
    app, handle = _app(spans_dir=tmp_path / "spans", baseline_sample=0.0, slow_threshold_ms=60_000)
    seen: list[Any] = []

    class Outer:  # wraps the app: outside stagescope's middleware (one added to the app goes inside)
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def wrapped(message: Any) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    seen.append((stagescope.current_request(), current_context().get(SPAN_KEY)))
                await send(message)

            await self.app(scope, receive, wrapped if scope["type"] == "http" else send)

    try:
        _serve_uvicorn(app, 5, asgi=Outer(app))
        item = [(rec, span) for rec, span in seen if rec is not None and rec.route == "/item"]
        assert len(item) == 5
        assert all(span.get_span_context().span_id == rec.span_id for rec, span in item)
    finally:
        handle.shutdown()
