"""The request path's shortcuts (instrumentation/middleware.py, serversend.py, stagenames.py,
disconnect.py) must give what the long way gives: the verdict on a server's ``send`` from the code's
own file and name, never from a look-alike's; a stage without a kind named from the same table as
``resolve``; the server's ``send`` handed the response's start as it is; and each request's
disconnect watch registered with the sweeper of the loop that runs it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope.instrumentation import disconnect, serversend, stagenames
from stagescope.instrumentation.disconnect import ClientWatch
from stagescope.instrumentation.middleware import StagescopeMiddleware
from stagescope.instrumentation.record import RequestRecord, reset_current_request, set_current_request
from stagescope.instrumentation.stagenames import StageNames

_SEND_SOURCE = """
class RequestResponseCycle:
    async def send(self, message):
        return None
"""


def _cycle_send(filename: str) -> Any:
    """``RequestResponseCycle().send`` compiled from the same source under ``filename``."""
    ns: dict[str, Any] = {}
    exec(compile(_SEND_SOURCE, filename, "exec"), ns)
    return ns["RequestResponseCycle"]().send


def test_a_look_alike_of_uvicorns_send_in_another_file_is_not_the_servers() -> None:
    # code objects compare (and hash) equal without their file name: the same source and qualname in
    # another file must not inherit the verdict given to uvicorn's
    server = _cycle_send("/site-packages/uvicorn/protocols/http/h11_impl.py")
    other = _cycle_send("/srv/app/my_middleware.py")
    assert server.__code__ == other.__code__ and server.__code__ is not other.__code__
    assert serversend.server_send_only(server) is True
    assert serversend.server_send_only(other) is False
    assert serversend.server_send_only(server) is True  # both verdicts cached, each under its own code


def test_a_stage_without_a_kind_reads_the_same_table_as_resolve() -> None:
    names = StageNames(max_custom=2)
    for n in ("rerank", "tokenize", "retrieve"):  # the third is past the cap: folded
        names.resolve(n, None, strict=False)
    names.resolve("fetch_x", "fetch", strict=False)  # with a kind: not in the kind-less table
    plain = {k[0]: v for k, v in names._cache.items() if k[1] is None}
    assert names._plain == plain
    assert names._plain["retrieve"][0] == stagescope.names.STAGE_OVERFLOW
    assert "fetch_x" not in names._plain


def test_stage_blocks_record_what_resolve_says(monkeypatch: Any) -> None:
    monkeypatch.setattr(stagenames, "_NAMES", StageNames(max_custom=1))
    rec = RequestRecord()
    token = set_current_request(rec)
    try:
        for name in ("preprocess", "rerank", "rerank", "tokenize", 7):  # 7: a bad name, recorded folded
            with stagescope.stage(name):  # type: ignore[arg-type]
                pass
        with stagescope.stage("rerank", kind="cpu"):  # a kind that conflicts with the first: lenient
            pass
    finally:
        reset_current_request(token)
    got = [(iv.stage, iv.kind) for iv in rec.stages]
    want = [stagenames.resolve_stage(n, k) for n, k in
            (("preprocess", None), ("rerank", None), ("rerank", None), ("tokenize", None), (7, None), ("rerank", "cpu"))]  # fmt: skip
    assert got == want
    assert got[1] == ("rerank", stagescope.names.KIND_UNKNOWN)
    assert got[3][0] == stagescope.names.STAGE_OVERFLOW  # past the cap of one custom name


def test_the_response_start_goes_to_the_servers_send_as_it_is() -> None:
    records: list[Any] = []
    app = FastAPI()
    stagescope.instrument_app(app, service_name="t", registry=CollectorRegistry(), record_hook=records.append)
    mw: Any = app.build_middleware_stack()
    while not isinstance(mw, StagescopeMiddleware):
        mw = mw.app
    got: list[Any] = []

    async def raw(scope: Any, receive: Any, send: Any) -> None:  # an app that keeps what send returns
        out = send({"type": "http.response.start", "status": 201, "headers": []})
        got.append(out)
        await out
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    mw.app = raw

    class Awaited:  # what the server's send returns: an awaitable of its own
        def __await__(self) -> Any:
            return iter(())

    handed: list[tuple[str, Awaited]] = []

    def server_send(message: Any) -> Awaited:
        out = Awaited()
        handed.append((message["type"], out))
        return out

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/x", "raw_path": b"/x", "query_string": b"", "root_path": "", "headers": [(b"host", b"t")],
        "client": ("127.0.0.1", 1), "server": ("t", 80),
    }  # fmt: skip
    asyncio.run(mw(scope, receive, server_send))
    assert [kind for kind, _ in handed] == ["http.response.start", "http.response.body"]
    assert got[0] is handed[0][1]  # the server's own awaitable, no coroutine of stagescope's around it
    (rec,) = records
    assert rec.status_code == 201 and rec.end_ns is not None


def test_each_loop_registers_its_watches_with_its_own_sweeper() -> None:
    class Rec:
        start_ns = 0
        end_ns = None

    seen: list[tuple[Any, Any]] = []

    async def one() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        watch = ClientWatch(receive, Rec(), True)
        seen.append((watch._sweeper, asyncio.get_running_loop()))
        assert watch in watch._sweeper._watches  # type: ignore[union-attr]
        watch.stop()

    asyncio.run(one())
    asyncio.run(one())  # a new loop in the same thread: not the old loop's sweeper
    t = threading.Thread(target=lambda: asyncio.run(one()))
    t.start()
    t.join()
    asyncio.run(one())  # back in this thread after another thread's loop was the last one
    assert len(seen) == 4
    for sweeper, loop in seen:
        assert sweeper is not None and sweeper._loop is loop
    assert disconnect._last._loop is seen[-1][1]
