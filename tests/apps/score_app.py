"""A team's own small FastAPI service, instrumented as the README says, with stagescope's defaults.

``uvicorn --app-dir tests/apps score_app:app``; spans go to the embedded sink in
``$STAGESCOPE_SPANS_DIR``, metrics to ``/metrics``; sampling is stagescope's default (every request
slower than 250 ms or failed, 1 % of the rest). Not the reference service: no batcher, no scenarios.

* ``POST /v1/score``: reads a JSON body, fetches features from a feature store (an in-process
  SIMULATED store: an asyncio sleep) and scores them. About one request in 16 misses the store's
  cache and waits 300-450 ms for its features; the others take 24-30 ms. Which ones is a function of
  the body, not of the trace id, so sampling by trace id sees them as they come.
* ``POST /v1/generate``: a streamed answer (server-sent events, one ``data:`` event per token,
  ``data: [DONE]``), ``max_tokens`` tokens about 6 ms apart after a 20 ms first token, through
  ``stagescope.instrument_stream``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

import stagescope

app = FastAPI()
instrumentation = stagescope.instrument_app(app, service_name="scorer")

#: Share of /v1/score requests whose features miss the (SIMULATED) store's cache: 16 of 256.
MISS_BYTES = 16


async def fetch_features(key: bytes) -> list[float]:
    """SIMULATED feature store: 24-30 ms on a cache hit, 300-450 ms on a miss."""
    h = hashlib.blake2b(key, digest_size=4).digest()
    miss = h[0] < MISS_BYTES
    delay = 0.300 + 0.150 * h[1] / 255 if miss else 0.024 + 0.006 * h[1] / 255
    await asyncio.sleep(delay)
    return [b / 255 for b in h]


@app.post("/v1/score")
async def score(request: Request) -> dict[str, float]:
    body = await request.body()
    rec = stagescope.current_request()
    if rec is not None:
        rec.set_input(body)  # a hash of it; the content is never recorded
    with stagescope.stage("feature_fetch"):
        features = await fetch_features(body)
    with stagescope.stage("compute"):
        value = sum(f * w for f, w in zip(features, (0.4, 0.3, 0.2, 0.1), strict=True))
        await asyncio.sleep(0.004)
    return {"score": round(value, 6)}


@app.post("/v1/generate")
async def generate(request: Request) -> StreamingResponse:
    try:
        n = max(1, min(256, int(json.loads(await request.body() or b"{}").get("max_tokens", 16))))
    except (ValueError, TypeError, AttributeError):
        n = 16

    async def events() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.020)
        for i in range(n):
            if i:
                await asyncio.sleep(0.006)
            yield f"data: {json.dumps({'index': i, 'token': 'tok'})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stagescope.instrument_stream(events()), media_type="text/event-stream")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
