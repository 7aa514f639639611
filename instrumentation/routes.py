"""The route *template* of a request (``/v1/items/{id}``, never the raw path), as
opentelemetry-instrumentation-fastapi finds it: the first full Starlette match, cached per method and
path, so that route labels stay bounded. (Split out of the middleware, which asks it once per request.)
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["RouteResolver"]

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]

_ROUTE_CACHE_MAX = 4096


class RouteResolver:
    """Route template of a request, as opentelemetry-instrumentation-fastapi finds it, cached.

    ``last``: stagescope's metrics route. Routes added after ``instrument_app`` (the usual order: the
    app is instrumented, then its routes are declared) would come after it, so the router would test
    it first on every request; when the routes change it is moved to the end, unless another route
    matches its path (a catch-all route: then it stays where it was and keeps answering there)."""

    def __init__(self, app: Any, last: Any = None) -> None:
        self.app = app
        self.last = last
        self._cache: dict[tuple[str, str], str | None] = {}
        self._nroutes = -1

    def resolve(self, scope: Scope) -> str | None:
        routes = self.app.router.routes
        if len(routes) != self._nroutes:  # routes added after instrument_app: start over
            self._cache.clear()
            self._move_last(routes)
            self._nroutes = len(routes)
        key = (scope.get("method", ""), scope.get("path", ""))
        try:
            return self._cache[key]
        except KeyError:
            pass
        route = self._match(scope, routes)
        if len(self._cache) >= _ROUTE_CACHE_MAX:
            self._cache.clear()
        self._cache[key] = route
        return route

    def _move_last(self, routes: Any) -> None:
        last = self.last
        if last is None or not routes or routes[-1] is last or last not in routes:
            return
        others = [r for r in routes if r is not last]
        probe = {"type": "http", "method": "GET", "path": last.path, "root_path": "", "headers": []}
        try:
            if self._match(probe, others) is None:  # nobody else answers its path: last is as good
                routes.remove(last)
                routes.append(last)
        except Exception:  # a route that cannot be probed: leave the order as the app made it
            _log.debug("stagescope: could not probe the routes for the metrics path", exc_info=True)

    @staticmethod
    def _match(scope: Scope, routes: Any) -> str | None:
        from starlette.routing import Match, Route

        try:
            from fastapi.routing import iter_route_contexts

            candidates: Any = iter_route_contexts(routes)
        except ImportError:  # FastAPI < 0.137.2: routes are matchable as they are
            candidates = routes
        route: str | None = None
        for r in candidates:
            match, _ = Route.matches(r, scope) if isinstance(r, Route) else r.matches(scope)
            if match == Match.FULL:
                route = getattr(r, "path", None) or scope.get("path")
                break
            if match == Match.PARTIAL:
                route = getattr(r, "path", None)
        return route
