"""One HTTP request to an ASGI app in-process, as a server makes it, for the tests that need no server:
the request body once, then a ``receive`` that waits (the client never disconnects; the server's own
cancellation ends the wait), so an app's disconnect listener does not spin."""

from __future__ import annotations

import asyncio
from typing import Any


async def asgi_request(
    app: Any, method: str, path: str, *, query: str = "", root_path: str = "", host: bytes = b"test"
) -> tuple[int, bytes]:
    """``(status, body)`` of one request to ``app``."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
        "root_path": root_path, "headers": [(b"host", host)], "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }  # fmt: skip
    out: dict[str, Any] = {"body": b""}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["body"]


def asgi_call(app: Any, method: str, path: str, **kw: Any) -> tuple[int, bytes]:
    """:func:`asgi_request` in a fresh event loop."""
    return asyncio.run(asgi_request(app, method, path, **kw))
