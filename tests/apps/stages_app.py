"""A team's own FastAPI ranking service with stages of its own names, for test_stages_e2e.py.

``POST /v1/rank``: ``retrieve`` (kind fetch, a 3 ms await standing in for a vector-store read),
``tokenize`` (kind cpu, real CPU: BLAKE2b rounds over the body), ``rerank`` (kind from
``$RERANK_KIND``, default compute: a SIMULATED reranker, an asyncio sleep of 5 ms, 250 ms for one
request in ``$SLOW_EVERY``) and ``safety-filter`` (no kind: recorded as ``unknown``). Spans go to
``$STAGESCOPE_SPANS_DIR`` with every request kept (``baseline_sample=1``), so the test compares
the analysis with what the service did. Run: ``uvicorn stages_app:app --app-dir tests/apps``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

import stagescope

RERANK_KIND = os.environ.get("RERANK_KIND", "compute")
SLOW_EVERY = int(os.environ.get("SLOW_EVERY", "10"))
SLOW_RERANK_S, RERANK_S, RETRIEVE_S = 0.25, 0.005, 0.003
_count = itertools.count()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.stagescope.force_flush(10)  # graceful stop: every kept trace is written


app = FastAPI(lifespan=lifespan)


@app.post("/v1/rank")
async def rank(request: Request) -> dict[str, int]:
    body = await request.body()
    n = next(_count)
    async with stagescope.stage("retrieve", kind="fetch"):
        await asyncio.sleep(RETRIEVE_S)
    with stagescope.stage("tokenize", kind="cpu"):
        digest = body
        for _ in range(200):
            digest = hashlib.blake2b(digest).digest()
    async with stagescope.stage("rerank", kind=RERANK_KIND):
        await asyncio.sleep(SLOW_RERANK_S if n % SLOW_EVERY == SLOW_EVERY - 1 else RERANK_S)
    with stagescope.stage("safety-filter"):
        flagged = digest[0] == 0
    return {"n": n, "flagged": int(flagged)}


app.state.stagescope = stagescope.instrument_app(app, service_name="ranker", baseline_sample=1.0)
