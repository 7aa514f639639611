"""Checking what a user typed, before any work starts: one clear line now beats a traceback later.

Two kinds of helpers, one rule each:

* **argparse types** (:func:`number`, :func:`integer`, :func:`port`, :func:`http_url`, :func:`route`):
  a command names them in ``add_argument(type=...)``, so a bad value stops the command while its
  options are parsed, before anything is read, bound or sent. They raise
  :class:`argparse.ArgumentTypeError`, which :class:`~stagescope.cli.OneLineParser` prints as one line
  (``stagescope load: error: argument --rate: ...``) with exit status 2.
* **value checks** (:func:`check_number`, :func:`check_http_url`, :func:`check_text`, :func:`parse_bool`): the same rules for
  values read from files, ``--set KEY=VALUE`` and the environment; they raise
  :class:`~stagescope.errors.UserError` (or ``ValueError`` where a library caller expects one).

What "a number" means here: a finite ``int`` or ``float`` (``nan`` and ``inf`` are refused, as are
booleans: YAML's ``true`` is not 1), or text that parses as one. Ranges are closed unless ``*_open``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from stagescope.errors import UserError

__all__ = [
    "BOOL_WORDS",
    "PORT_MAX",
    "check_bindable",
    "check_http_url",
    "check_number",
    "check_reachable",
    "check_span_destination",
    "check_text",
    "connect_error",
    "host",
    "http_url",
    "integer",
    "number",
    "parse_bool",
    "port",
    "readable_file",
    "route",
]

PORT_MAX = 65535
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        return f"a finite number in {left}{_num(lo)}, {_num(hi)}{right}"
    if lo is not None:
        return f"a finite number {'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None:
        return f"a finite number {'<' if hi_open else '<='} {_num(hi)}"
    return "a finite number"


def check_number(
    value: Any,
    what: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    integral: bool = False,
    error: type[Exception] = UserError,
) -> float:
    """``value`` as a float, or ``error("<what> must be ..., got <value>")``.

    Accepts ``int``, ``float`` and numeric text; refuses booleans, ``None``, containers, ``nan``,
    ``inf`` and values outside ``[lo, hi]`` (``(`` / ``)`` with ``lo_open`` / ``hi_open``).
    ``integral``: the value must also be a whole number (``8`` or ``"8"``, not ``8.5``).
    """
    rule = _range_text(lo, hi, lo_open, hi_open)
    if integral:
        rule = rule.replace("a finite number", "a whole number")
    head = f"{what} must be" if what else "expected"
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    if isinstance(value, bool) or value is None or not isinstance(value, int | float | str):
        raise error(f"{head} {rule}, got {shown}")
    try:
        x = float(value.strip().replace("_", "")) if isinstance(value, str) else float(value)
    except (ValueError, OverflowError):
        raise error(f"{head} {rule}, got {shown}") from None
    bad_lo = lo is not None and (x <= lo if lo_open else x < lo)
    bad_hi = hi is not None and (x >= hi if hi_open else x > hi)
    if not math.isfinite(x) or (integral and not x.is_integer()) or bad_lo or bad_hi:
        raise error(f"{head} {rule}, got {shown}")
    return x


def number(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float within the bounds (see :func:`check_number`)."""

    def parse(text: str) -> float:
        return check_number(
            text, "", lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, error=argparse.ArgumentTypeError
        )

    parse.__name__ = "number"
    return parse


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number within ``[lo, hi]`` (``8``; ``8.0`` and ``1e3`` also read)."""

    def parse(text: str) -> int:
        text = text.strip()
        if re.fullmatch(r"[+-]?\d[\d_]*", text):  # exact, however many digits
            n = int(text.replace("_", ""))
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                rule = _range_text(lo, hi, False, False).replace("a finite number", "a whole number")
                shown = text if len(text) <= 40 else text[:37] + "..."
                raise argparse.ArgumentTypeError(f"expected {rule}, got {shown!r}")
            return n
        x = check_number(text, "", lo=lo, hi=hi, integral=True, error=argparse.ArgumentTypeError)
        return int(x)

    parse.__name__ = "integer"
    return parse


def port(*, allow_zero: bool = True) -> Callable[[str], int]:
    """An argparse ``type`` for a port to listen on: 0-65535 (0: the system picks a free one)."""
    inner = integer(0 if allow_zero else 1, PORT_MAX)

    def parse(text: str) -> int:
        try:
            return inner(text)
        except argparse.ArgumentTypeError:
            low = "0 (any free port)" if allow_zero else "1"
            raise argparse.ArgumentTypeError(
                f"a port must be a whole number from {low} to {PORT_MAX}, got {text!r}"
            ) from None

    parse.__name__ = "port"
    return parse


#: The words a yes/no setting or environment variable accepts (any case, spaces around ignored).
BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_bool(value: Any) -> bool | None:
    """``value`` as a yes/no: a ``bool`` as it is, one of :data:`BOOL_WORDS` as its meaning, anything
    else ``None`` (the caller names the setting in its own error)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, str | int):
        return None
    return BOOL_WORDS.get(str(value).strip().lower())


def check_text(
    value: Any, what: str, *, max_len: int = 256, empty: bool = False, error: type[Exception] = UserError
) -> str:
    """``value`` as text that can travel into labels, PromQL and headers: no control characters."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise error(f"{what} must be text, got {value!r}"[:300])
    text = str(value)
    if not text.strip() and not empty:
        raise error(f"{what} must not be empty")
    if len(text) > max_len:
        raise error(f"{what} is {len(text)} characters long; at most {max_len} allowed")
    if _CONTROL.search(text):
        raise error(f"{what} must not contain control characters (newline, tab, NUL ...), got {text!r}"[:300])
    return text


def check_http_url(text: str, what: str, *, base: bool = True, error: type[Exception] = UserError) -> str:
    """An ``http(s)://host[:port][/path]`` URL with a port in 1-65535; returns it unchanged.

    ``base``: a base URL that paths are appended to, so no ``?query`` or ``#fragment``.
    """
    if _CONTROL.search(text) or any(c.isspace() for c in text):
        raise error(f"{what} {text!r} is not a URL: it contains spaces or control characters")
    try:
        parts = urlsplit(text)
        url_port = parts.port  # raises ValueError when not a number or beyond 65535
    except ValueError as exc:
        raise error(f"{what} {text!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise error(f"{what} {text!r} is not an http(s) URL (e.g. http://127.0.0.1:8000)")
    if not parts.hostname:
        raise error(f"{what} {text!r} has no host (e.g. http://127.0.0.1:8000)")
    if url_port is not None and not 1 <= url_port <= PORT_MAX:
        raise error(f"{what} {text!r}: port must be from 1 to {PORT_MAX}, got {url_port}")
    if base and (parts.query or parts.fragment):
        raise error(f"{what} {text!r}: give the base URL without '?query' or '#fragment'")
    return text


def http_url(text: str) -> str:
    """An argparse ``type`` for an http(s) URL (see :func:`check_http_url`; a query is allowed)."""
    return check_http_url(text, "URL", base=False, error=argparse.ArgumentTypeError)


def host(text: str) -> str:
    """An argparse ``type`` for an address to listen on: not empty (an empty one would silently mean
    every interface), no spaces or control characters. Whether it can be bound is checked by binding."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an address must not be empty (0.0.0.0 listens on every interface)")
    if _CONTROL.search(text) or any(c.isspace() for c in text) or len(text) > 255:
        raise argparse.ArgumentTypeError(f"not an address: {text[:80]!r}")
    return text


def readable_file(text: str) -> str:
    """An argparse ``type`` for a file the command will read (``--events FILE``): it exists and is a
    regular file (not a folder); its content is checked by its reader, still before any work."""
    if not text or _CONTROL.search(text):
        raise argparse.ArgumentTypeError(f"not a file name: {text[:80]!r}")
    if not os.path.isfile(text):
        from stagescope.paths import not_readable_reason

        raise argparse.ArgumentTypeError(f"{text[:200]}: {not_readable_reason(text)}")
    return text


def route(text: str) -> str:
    """An argparse ``type`` for an HTTP path: starts with ``/``, no spaces or control characters."""
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"a route must start with '/', got {text!r}")
    if _CONTROL.search(text) or any(c.isspace() for c in text) or len(text) > 2048:
        raise argparse.ArgumentTypeError(
            f"a route must be a URL path without spaces or control characters, got {text!r}"
        )
    return text


def check_reachable(url: str, what: str, *, timeout_s: float = 3.0) -> None:
    """One line (``UserError``) unless a TCP connection to ``url``'s host and port opens in time.

    For services a command needs before it starts its work (a Prometheus to query), so that a wrong
    address is reported first, not after minutes of reading traces.
    """
    import socket
    import urllib.request

    parts = urlsplit(url)
    host = parts.hostname or ""
    default = 443 if parts.scheme == "https" else 80
    if parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(host):
        return  # reached through a proxy (HTTP(S)_PROXY): a direct connection proves nothing
    try:
        with socket.create_connection((host, parts.port or default), timeout=timeout_s):
            pass
    except TimeoutError:
        raise UserError(f"{what} {url}: no answer to a connection attempt within {timeout_s:g} s") from None
    except OSError as exc:
        raise UserError(f"{what} {url}: {connect_error(exc)}") from None


def connect_error(exc: OSError) -> str:
    """A failed TCP connection in a few words: ``cannot connect: Connection refused``; a host name that
    does not resolve (``socket.gaierror``, whose errno is a negative EAI code, not an errno that
    ``os.strerror`` knows: "Unknown error -2") is ``cannot resolve host name: Name or service not known``."""
    import socket

    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name: {exc.strerror or exc}"
    # the errno's own words first: asyncio's strerror is "Connect call failed ('127.0.0.1', 9)"
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else (exc.strerror or str(exc))
    return f"cannot connect: {reason}"


def check_span_destination(spans_dir: str | os.PathLike[str] | None, what: str = "spans") -> None:
    """Check, before a run, where :func:`~stagescope.instrumentation.export.make_span_exporter` will
    send spans: the OTLP endpoint (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) must be an http(s) URL, and the sink folder (``spans_dir``, else
    ``STAGESCOPE_SPANS_DIR``) must be writable (it is created). ``UserError`` naming the variable."""
    from stagescope.names import ENV_SPANS_DIR
    from stagescope.paths import ensure_writable_dir

    for var in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        value = os.environ.get(var, "").strip()
        if value:
            check_http_url(value, var, base=False)
            break
    for label, directory in (("the spans folder", spans_dir), (ENV_SPANS_DIR, os.environ.get(ENV_SPANS_DIR, ""))):
        if directory is not None and str(directory).strip():
            ensure_writable_dir(directory, what if label == "the spans folder" else f"{what} ({label})")
            break


def check_bindable(host: str, port: int) -> None:
    """``UserError`` unless ``host:port`` can be bound now (checked before slow start-up work, so that
    a port in use or a wrong address is the one line a user sees; the real bind follows)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if port and exc.errno in (48, 98, 10048):  # EADDRINUSE on macOS, Linux, Windows
                raise UserError(f"port {port} on {host} is already in use") from None
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
