"""Serving the metrics: the ``/metrics`` ASGI app, and multiprocess mode's live-gauge upkeep.

Multiprocess (``uvicorn --workers N``, gunicorn): set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory
before the workers start; every worker writes its values there and :func:`make_metrics_app` serves the
sum over workers (gauges: ``livesum``; ``stagescope_model_ready``: ``livemax``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

__all__ = ["MULTIPROC_ENV", "make_metrics_app", "metrics_route", "reap_dead_workers"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def make_metrics_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """An ASGI app answering GET with the exposition of ``registry`` (default: the global one).

    Content negotiation is prometheus-client's: ``Accept: application/openmetrics-text`` gets OpenMetrics
    (with exemplars), anything else the text format (no exemplars); gzip when accepted. When
    ``PROMETHEUS_MULTIPROC_DIR`` is set (read here, when the app is built) the answer aggregates the
    values every worker process wrote to that directory.
    """
    from prometheus_client import make_asgi_app

    source: CollectorRegistry = REGISTRY if registry is None else registry
    mp_dir = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    if mp_dir:
        from prometheus_client import multiprocess

        source = CollectorRegistry()
        multiprocess.MultiProcessCollector(source, path=mp_dir)
    inner = make_asgi_app(source)

    async def metrics_app(
        scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope.get("type") != "http":
            if scope.get("type") == "lifespan":  # mounted standalone: accept lifespan politely
                while True:
                    msg = await receive()
                    if msg["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif msg["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            return
        if mp_dir:
            reap_dead_workers(mp_dir)
        await inner(scope, receive, send)

    return metrics_app


def metrics_route(path: str, endpoint: Any) -> Any:
    """A Starlette route serving ``endpoint`` at ``path``, out of the OpenAPI schema.

    It sits before the routes an app defines after ``instrument_app``, so each of their requests
    tries it first; a request path that does not end with ``path`` cannot match it (the route path is
    the request path less its root path), and a string test says so before Starlette's regex does.
    """
    from starlette.routing import Match, Route

    class MetricsRoute(Route):
        def matches(self, scope: Any) -> tuple[Match, Any]:
            if scope["type"] == "http" and not scope["path"].endswith(path):
                return Match.NONE, {}
            return super().matches(scope)

    return (Route if "{" in path else MetricsRoute)(path, endpoint=endpoint, include_in_schema=False)


_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def reap_dead_workers(path: str) -> list[int]:
    """Drop the live-gauge files of worker processes that no longer exist (multiprocess mode).

    prometheus-client keeps a dead worker's ``live*`` gauges (in-flight requests, queue depth) until
    someone calls ``mark_process_dead``; gunicorn has a hook for it, uvicorn's supervisor has none, so
    the metrics app does it on each scrape. Counters and histograms of dead workers stay (they are
    totals). Returns the pids reaped.
    """
    from prometheus_client import multiprocess

    dead = set()
    try:
        entries = os.listdir(path)
    except OSError:
        return []
    for name in entries:
        m = _LIVE_GAUGE_FILE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            dead.add(int(m.group(1)))
    for pid in dead:
        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid, path)
    return sorted(dead)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
