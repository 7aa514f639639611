"""The route *template* of a request (``/v1/items/{id}``, never the raw path), as
opentelemetry-instrumentation-fastapi finds it: the first full Starlette match, cached per method and
path, so that route labels stay bounded. (Split out of the middleware, which asks it once per request.)

Unlike the stock instrumentation it looks inside a matching ``Mount`` or ``Host`` whose app has routes
(``app.mount("/admin", sub_app)``, ``Mount("/v2", routes=[...])``): the template is the mount's path
joined to the sub-app's (``/admin/users/{uid}``), not ``/admin`` for every route of the sub-app, and
nothing inside it matching is :data:`~stagescope.names.UNMATCHED_ROUTE`. A mount of an app without
routes (``StaticFiles``, a WSGI app) is its path, and at the root, where that path is empty, Starlette's
own template ``/{path}``: the raw request path is never a route (the stock fallback to it made every
file of ``app.mount("/", StaticFiles(...))`` and every path of a ``Host`` a route of its own).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["RouteResolver"]

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]

_ROUTE_CACHE_MAX = 4096
#: How deep mounts inside mounts are followed (a mount cycle must not recurse for ever).
_MAX_DEPTH = 8


class RouteResolver:
    """Route template of a request, as opentelemetry-instrumentation-fastapi finds it, cached.

    ``last``: stagescope's metrics route. Routes added after ``instrument_app`` (the usual order: the
    app is instrumented, then its routes are declared) would come after it, so the router would test
    it first on every request; when the routes change it is moved to the end, unless another route
    matches its path (a catch-all route: then it stays where it was and keeps answering there)."""

    def __init__(self, app: Any, last: Any = None) -> None:
        self.app = app
        self.last = last
        self._cache: dict[tuple[str, ...], str | None] = {}
        self._nroutes = -1
        self._hosts = False  # a Host route at the top: the cache key holds the Host header

    def resolve(self, scope: Scope) -> str | None:
        routes = self.app.router.routes
        if len(routes) != self._nroutes:  # routes added after instrument_app: start over
            self._cache.clear()
            self._move_last(routes)
            self._nroutes = len(routes)
            self._hosts = _has_host(routes)
        key: tuple[Any, ...] = (scope.get("method", ""), scope.get("path", ""))
        if self._hosts:  # Host routing: one path can be two routes
            key = (*key, _host(scope))
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
            # the top-level routes alone: a mount at the root takes the path whether or not its app
            # has a route for it
            if self._match(probe, others, descend=False) is None:  # nobody else answers its path
                routes.remove(last)
                routes.append(last)
        except Exception:  # a route that cannot be probed: leave the order as the app made it
            _log.debug("stagescope: could not probe the routes for the metrics path", exc_info=True)

    @staticmethod
    def _match(scope: Scope, routes: Any, depth: int = 0, descend: bool = True) -> str | None:
        from starlette.routing import Match, Route

        try:
            from fastapi.routing import iter_route_contexts

            candidates: Any = iter_route_contexts(routes)
        except ImportError:  # FastAPI < 0.137.2: routes are matchable as they are, but in 0.137.0-0.137.1
            candidates = _flatten(routes)  # include_router's routes sit under an _IncludedRouter node
        route: str | None = None
        for r in candidates:
            match, child = Route.matches(r, scope) if isinstance(r, Route) else r.matches(scope)
            if match == Match.FULL:
                return RouteResolver._template(r, scope, child, depth, descend)
            if match == Match.PARTIAL:
                route = getattr(r, "path", None)
        return route

    @staticmethod
    def _template(r: Any, scope: Scope, child: Any, depth: int, descend: bool) -> str | None:
        """The template of a full match ``r``: a route's path; for a mount (or host) of an app with
        routes, its path joined to the template of the sub-app's route that matches (None when none
        does); for a mount of an app without routes, its path, or ``/{path}`` at the root."""
        path = getattr(r, "path", None)
        if descend and depth < _MAX_DEPTH:
            try:
                inner = getattr(r, "routes", None)
            except Exception:  # an app whose routes cannot be read: the mount itself
                inner = None
            if inner:
                sub = RouteResolver._match({**scope, **(child or {})}, inner, depth + 1)
                return None if sub is None else (path or "") + sub
        if path:
            return str(path)
        fmt = getattr(r, "path_format", None)  # Mount(""): "/{path}"
        return str(fmt) if fmt else None


def _flatten(routes: Any) -> Any:
    """The matchable routes of FastAPI 0.137.0-0.137.1 without ``iter_route_contexts``: a router added
    by ``include_router`` is an ``_IncludedRouter`` with no path whose ``effective_route_contexts()``
    are its routes (as opentelemetry-instrumentation-fastapi's ``_flatten_routes`` reads them); every
    route of an app built from ``APIRouter``s was unmatched there. Older FastAPI: the routes as they are."""
    for r in routes:
        contexts = getattr(r, "effective_route_contexts", None)
        if contexts is not None:
            yield from contexts()
        else:
            yield r


def _has_host(routes: Any) -> bool:
    from starlette.routing import Host

    return any(isinstance(r, Host) for r in routes)


def _host(scope: Scope) -> bytes:
    for k, v in scope.get("headers") or ():
        if k == b"host":
            return bytes(v)
    return b""
