"""How telemetry stops: the shutdown timeout, and failure logs that stay one line a minute.

**Graceful stop.** uvicorn (0.29 and later; one process, ``--workers N``, gunicorn's uvicorn worker)
turns SIGTERM and SIGINT into a graceful shutdown: stop accepting, let requests in flight finish, run
the ASGI lifespan shutdown, and then *raise the same signal again* with the default handler restored
(``uvicorn.Server.capture_signals``), so the exit status says what stopped it. For SIGTERM that
default is to terminate at once: ``atexit`` handlers never run, and spans still queued in memory (up to
one span-thread interval, 0.2 s, plus one exporter interval, 1 s for the file sink, 0.5 s for OTLP)
were lost. stagescope therefore drains when the app's lifespan shutdown completes (the middleware sees
``lifespan.shutdown.complete``), bounded by :func:`resolve_shutdown_timeout`; ``atexit`` (a normal exit,
SIGINT's ``KeyboardInterrupt``) and :meth:`Instrumentation.shutdown` drain the same way. What is still
queued at the deadline is dropped, counted (``reason="shutdown"``) and logged once.

A server started with ``--lifespan off`` gives no such hook: a SIGTERM then loses what is queued.

**Failure logs.** :class:`RateLimitedLog` turns a failure that repeats on every write (a full disk, a
collector that is down) into one line when it starts, one line a minute while it lasts (with the count)
and one line when it ends; never a traceback per write.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from stagescope.names import ENV_SHUTDOWN_TIMEOUT_S

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "RateLimitedLog",
    "argument_or_env",
    "env_or_fallback",
    "resolve_shutdown_timeout",
]

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_A = TypeVar("_A")


def env_or_fallback(resolve: Callable[[], _T], fallback: _T, instead: str) -> _T:
    """``resolve()``, which reads an environment variable and raises ``ValueError`` naming it for a bad
    value; in an application's process that is one warning line and ``fallback`` (``instead`` says what
    happens then): a typo in a deployment's telemetry variable never stops the service it observes.

    Only for values that come from the environment: a bad argument of ``instrument_app`` is the
    caller's code and still raises. stagescope's own commands (``serve``, ``load``) call the resolvers
    directly before they start and refuse a bad variable (one line, exit 2).
    """
    try:
        return resolve()
    except ValueError as exc:
        _log.warning("stagescope: %s; %s", str(exc).replace("\n", " "), instead)
        return fallback


def argument_or_env(value: _A | None, resolve: Callable[[_A | None], _T], fallback: _T, instead: str) -> _T:
    """An ``instrument_app`` setting: ``resolve(value)`` for an argument given (a bad one raises: the
    caller's code), else ``resolve(None)`` from the environment through :func:`env_or_fallback`."""
    if value is not None:
        return resolve(value)
    return env_or_fallback(lambda: resolve(None), fallback, instead)


def resolve_shutdown_timeout(value: float | None = None) -> float:
    """Seconds a stop may spend exporting queued spans: ``value``, else ``$STAGESCOPE_SHUTDOWN_TIMEOUT_S``,
    else 5 s. A value that is not a finite number > 0 raises ``ValueError``."""
    source = "shutdown_timeout_s"
    if value is None:
        raw = os.environ.get(ENV_SHUTDOWN_TIMEOUT_S, "").strip()
        if not raw:
            return DEFAULT_SHUTDOWN_TIMEOUT_S
        source = f"environment variable {ENV_SHUTDOWN_TIMEOUT_S}"
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{source}={raw!r} is not a number of seconds") from None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{source} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class RateLimitedLog:
    """One warning when a failure starts, then at most one per ``interval_s`` while it repeats, then one
    when it stops (:meth:`recovered`). Thread-safe; never raises; no tracebacks."""

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.what = what
        self.interval_s = interval_s
        self.failures = 0  # since the failure started
        self._unreported = 0
        self._last_log = -math.inf
        self._lock = threading.Lock()

    def failed(self, detail: object, consequence: str = "") -> None:
        """Record one failure (``detail``: the error, one line); logs if the last line is old enough."""
        now = time.monotonic()
        with self._lock:
            first = self.failures == 0
            self.failures += 1
            self._unreported += 1
            if not first and now - self._last_log < self.interval_s:
                return
            n, self._unreported, self._last_log = self._unreported, 0, now
        try:
            tail = f"; {consequence}" if consequence else ""
            if first:
                self.logger.warning("stagescope: %s failed: %s%s (repeats are logged once a minute)",
                                    self.what, detail, tail)  # fmt: skip
            else:
                self.logger.warning("stagescope: %s failed %d more times since the last report (last: %s)%s",
                                    self.what, n, detail, tail)  # fmt: skip
        except Exception:  # a broken log handler must not break the caller
            pass

    def recovered(self) -> None:
        """The operation worked again: say so once if it had failed."""
        if not self.failures:
            return
        with self._lock:
            n, self.failures, self._unreported, self._last_log = self.failures, 0, 0, -math.inf
        with contextlib.suppress(Exception):
            self.logger.warning("stagescope: %s works again after %d failures", self.what, n)
