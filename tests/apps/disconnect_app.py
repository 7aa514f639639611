"""An instrumented app for client-disconnect tests: ``uvicorn --app-dir tests/apps disconnect_app:app``.

Spans go to ``$STAGESCOPE_SPANS_DIR``; ``/metrics`` serves the request histogram.

* ``POST /upload``: reads the whole body (Starlette raises ``ClientDisconnect`` when the client leaves);
* ``POST /echo``: answers the body it read;
* ``GET /slow``, ``POST /slow``: (read the body, then) 0.5 s of work, then the answer;
* ``GET /stream``: 20 chunks, 50 ms apart;
* ``GET /disconnected``: ``request.is_disconnected()`` as the app sees it (False while the client waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

import stagescope

app = FastAPI()
instrumentation = stagescope.instrument_app(app, service_name="disconnect")


@app.post("/upload")
async def upload(request: Request) -> dict[str, int]:
    body = await request.body()
    return {"bytes": len(body)}


@app.post("/echo")
async def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(await request.body())


@app.get("/slow")
async def slow_get() -> dict[str, bool]:
    async with stagescope.stage("compute"):
        await asyncio.sleep(0.5)
    return {"ok": True}


@app.post("/slow")
async def slow_post(request: Request) -> dict[str, int]:
    body = await request.body()
    async with stagescope.stage("compute"):
        await asyncio.sleep(0.5)
    return {"bytes": len(body)}


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(20):
            yield f"chunk {i}\n".encode()
            await asyncio.sleep(0.05)

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/disconnected")
async def disconnected(request: Request) -> dict[str, bool]:
    return {"disconnected": await request.is_disconnected()}
