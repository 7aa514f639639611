"""Whether the ``send`` a middleware was given runs only the server's own code (no one else's).

uvicorn arms its keep-alive timer (``loop.call_later``) inside the response's last ``send``, so the
timer handle holds a copy of the request's context; cancelled when the next request arrives, it stays
in the loop's heap until asyncio purges cancelled handles (about 100 requests later at 16 connections).
A request record current in that copy stays alive that long: counted by the garbage collector,
promoted through its generations, and so the cause of most of the collections a traced service makes
(measured in the README's Cost section). The middleware takes its record and OpenTelemetry context
out of the current context for that one call, but only when nothing but the server and Starlette's
own pass-through runs inside it: no middleware of the user's, no span that could end there, nobody to
ask for ``current_request()`` (:func:`server_send_only` tells; the middleware's send does the rest).
Any other ``send`` keeps today's context.
"""

from __future__ import annotations

from types import CodeType
from typing import Any

__all__ = ["server_send_only"]

#: (file name suffix, function qualname) of sends that run the server's code only.
_SERVER_SENDS = (
    ("uvicorn/protocols/http/h11_impl.py", "RequestResponseCycle.send"),
    ("uvicorn/protocols/http/httptools_impl.py", "RequestResponseCycle.send"),
)
#: Pass-through wrappers (code that only notes the message and awaits the ``send`` it closes over).
_PASS_THROUGH = (("starlette/middleware/errors.py", "ServerErrorMiddleware.__call__.<locals>._send"),)

# id of a code object -> (the code object, _SERVER | index of the wrapped send in the closure | None).
# Keyed by id, not by the code object: a code object's hash is computed from its contents every time
# (about a thousand machine instructions), an int's is itself. The entry holds the code object, so
# its id cannot be reused while the entry exists.
_kinds: dict[int, tuple[CodeType, Any]] = {}
_UNSEEN = (None, None)
_SERVER = -1  # the kind of a server's own send (a pass-through's kind is its closure index, >= 0)


def _kind(code: CodeType) -> Any:
    entry = _kinds.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    name = code.co_filename.replace("\\", "/")
    kind: Any = None
    if any(name.endswith(f) and code.co_qualname == q for f, q in _SERVER_SENDS):
        kind = _SERVER
    elif "send" in code.co_freevars and any(
        name.endswith(f) and code.co_qualname == q for f, q in _PASS_THROUGH
    ):
        kind = code.co_freevars.index("send")
    if len(_kinds) < 256:
        _kinds[id(code)] = (code, kind)
    return kind


def server_send_only(send: Any, depth: int = 4) -> bool:
    """True when ``send`` is the server's (uvicorn's) own, reached through at most ``depth`` of
    Starlette's pass-through wrappers; False for anything else (and for anything unexpected)."""
    while depth > 0:  # not ``for _ in range(depth)``: a range and its iterator per request cost more
        depth -= 1
        try:  # a function, or a bound method (which passes __code__ and __closure__ on from its function)
            code = send.__code__
        except AttributeError:
            return False
        entry = _kinds.get(id(code), _UNSEEN)  # _kind's cache read here: this runs for every request
        kind = entry[1] if entry[0] is code else _kind(code)
        if kind is None:
            return False
        if kind is _SERVER:
            return True
        try:
            send = send.__closure__[kind].cell_contents
        except (AttributeError, TypeError, IndexError, ValueError):
            return False
    return False
