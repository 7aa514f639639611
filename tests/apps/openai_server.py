"""A small OpenAI-compatible streaming server for the load generator's tests, with known token delays.

Not an inference engine: it streams ``max_tokens`` words with a fixed schedule, and records when it
handed each chunk to the server, so a test can compare the load generator's TTFT and inter-token gaps
with the server's own. Written from the OpenAI API reference (chat completion chunk object,
completions streaming, ``stream_options.include_usage``) and what vLLM's serving code sends:

* ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL, "object": "model", ...}]}``.
* ``POST /v1/chat/completions`` and ``POST /v1/completions`` with ``"stream": true``: ``text/event-
  stream``, one ``data: <chunk>\\n\\n`` per event. Chat: a first chunk with ``delta: {"role":
  "assistant", "content": ""}`` at once (before any token exists: a client must not take it for the
  first token), then one chunk per token with ``delta.content``, then a chunk with an empty delta and
  ``finish_reason: "length"``. Completions: one chunk per token with ``text``, the last one carrying
  ``finish_reason``. With ``stream_options.include_usage`` every chunk has ``"usage": null`` and a
  last chunk has ``"choices": []`` and the usage; then ``data: [DONE]``.
* The first token comes ``TTFT_MS`` after the request arrived, token k (k >= 1) ``GAPS_MS[k % 3]``
  after token k-1. Every 7th token is sent as two SSE comments (``: ping``) plus the chunk split over
  two writes, so readers must join partial events.
* Bad requests get OpenAI's error object: unknown model 404 ``model_not_found``, a body that is not
  JSON or lacks the prompt/messages 400 ``invalid_request_error``.
* ``POST /v1/score``: any JSON service; records the path, query, body and ``x-`` headers it got.
* ``GET /_records``: per request (keyed by the trace id of its ``traceparent``): arrival and each
  token chunk's hand-off time (Unix ns), the number of tokens, the BLAKE2b-64 of the raw body.

Run ``python tests/apps/openai_server.py --port 0``: uvicorn on 127.0.0.1, first stdout line ``PORT <n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "tiny-test-model"
TTFT_MS = 60.0
GAPS_MS = (12.0, 20.0, 28.0)
RECORDS: dict[str, dict[str, Any]] = {}


def _error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


async def models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                     "owned_by": "stagescope-tests"}]})  # fmt: skip


async def _tokens(
    rec: dict[str, Any], n: int, chunk_of: Any, end_chunks: list[dict[str, Any]], usage: dict[str, Any] | None
) -> AsyncIterator[bytes]:
    start = rec["arrival_mono"]
    due = start + TTFT_MS / 1e3
    for k in range(n):
        if k:
            due += GAPS_MS[k % 3] / 1e3
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        data = b"data: " + json.dumps(chunk_of(k, n)).encode() + b"\n\n"
        if k % 7 == 6:  # comments, and an event split over two writes (complete at the second)
            yield b": ping\n\n: ping\n\n" + data[:9]
            await asyncio.sleep(0.001)
            rec["token_ns"].append(time.time_ns())
            yield data[9:]
        else:
            rec["token_ns"].append(time.time_ns())
            yield data
    for c in end_chunks:
        yield b"data: " + json.dumps(c).encode() + b"\n\n"
    if usage is not None:
        yield b"data: " + json.dumps(usage).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _generate(request: Request, chat: bool) -> Response:
    arrival_mono, arrival_ns = time.monotonic(), time.time_ns()
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "The body must be a JSON object.", "invalid_request_error")
    if body.get("model") != MODEL:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "invalid_request_error",
                      "model_not_found")  # fmt: skip
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not isinstance(msgs[-1], dict) or "content" not in msgs[-1]:
            return _error(400, "'messages' is a required property", "invalid_request_error")
        prompt = str(msgs[-1]["content"])
    else:
        if not isinstance(body.get("prompt"), str):
            return _error(400, "'prompt' is a required property", "invalid_request_error")
        prompt = body["prompt"]
    if body.get("stream") is not True:
        return _error(400, "this test server only streams ('stream': true)", "invalid_request_error")
    n = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return _error(400, "max_tokens must be a positive integer", "invalid_request_error")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    tp = request.headers.get("traceparent", "")
    key = tp.split("-")[1] if tp.count("-") == 3 else uuid.uuid4().hex
    rec: dict[str, Any] = {"arrival_ns": arrival_ns, "arrival_mono": arrival_mono, "token_ns": [], "n": n,
                           "body_hash": hashlib.blake2b(raw, digest_size=8).hexdigest()}  # fmt: skip
    RECORDS[key] = rec
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    u: dict[str, Any] = {} if not include_usage else {"usage": None}

    def base(choices: list[dict[str, Any]], obj: str) -> dict[str, Any]:
        return {"id": cid, "object": obj, "created": created, "model": MODEL, "choices": choices, **u}

    obj = "chat.completion.chunk" if chat else "text_completion"
    usage_chunk = None
    if include_usage:
        p_tokens = len(prompt.split())
        usage_chunk = {**base([], obj), "usage": {"prompt_tokens": p_tokens, "completion_tokens": n,
                                                  "total_tokens": p_tokens + n}}  # fmt: skip
    if chat:

        def chunk_of(k: int, total: int) -> dict[str, Any]:
            return base([{"index": 0, "delta": {"content": f"w{k} "}, "logprobs": None, "finish_reason": None}], obj)

        head = b"data: " + json.dumps(base([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}], obj)).encode() + b"\n\n"  # fmt: skip
        end = [base([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}], obj)]
    else:

        def chunk_of(k: int, total: int) -> dict[str, Any]:
            fin = "length" if k == total - 1 else None
            return base([{"index": 0, "text": f"w{k} ", "logprobs": None, "finish_reason": fin}], obj)

        head, end = b"", []

    async def stream() -> AsyncIterator[bytes]:
        if head:
            yield head
        async for part in _tokens(rec, n, chunk_of, end, usage_chunk):
            yield part

    return StreamingResponse(stream(), media_type="text/event-stream")


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def score(request: Request) -> Response:
    """Any JSON service: records the path and body it was called with, answers a small JSON."""
    raw = await request.body()
    tp = request.headers.get("traceparent", "")
    key = tp.split("-")[1] if tp.count("-") == 3 else uuid.uuid4().hex
    try:
        body = json.loads(raw)
    except ValueError:
        return _error(400, "not JSON", "invalid_request_error")
    RECORDS[key] = {"path": request.url.path, "query": request.url.query, "body": body,
                    "body_hash": hashlib.blake2b(raw, digest_size=8).hexdigest(),
                    "headers": {k: v for k, v in request.headers.items() if k.startswith("x-")}}  # fmt: skip
    await asyncio.sleep(0.005)
    return JSONResponse({"score": 0.5})


async def records(_: Request) -> Response:
    return JSONResponse({k: {kk: vv for kk, vv in v.items() if kk != "arrival_mono"} for k, v in RECORDS.items()})


app = Starlette(routes=[
    Route("/v1/models", models), Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]), Route("/_records", records),
    Route("/v1/score", score, methods=["POST"]),
])  # fmt: skip


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
