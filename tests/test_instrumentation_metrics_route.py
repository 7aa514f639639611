"""The metrics route's string pre-check (instrumentation/exposition.py ``metrics_route``) decides every
scope exactly as Starlette's own ``Route`` for the same path: it only skips the regex for request paths
that cannot match."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import Route

from stagescope.instrumentation.exposition import metrics_route


async def _endpoint(scope: Any, receive: Any, send: Any) -> None:
    return None


SCOPES = [
    ("http", "/metrics", "", "GET"),
    ("http", "/metrics", "", "POST"),  # partial: method not allowed
    ("http", "/predict", "", "GET"),
    ("http", "/metricsx", "", "GET"),
    ("http", "/x/metrics", "", "GET"),
    ("http", "/api/metrics", "/api", "GET"),
    ("http", "/api/metrics/", "/api", "GET"),
    ("http", "/metrics/", "", "GET"),
    ("websocket", "/metrics", "", "GET"),
    ("websocket", "/predict", "", "GET"),
]


@pytest.mark.parametrize("path", ["/metrics", "/internal/prom", "/m/{name}"])
@pytest.mark.parametrize(("kind", "req_path", "root_path", "method"), SCOPES)
def test_same_decision_as_starlette_route(
    path: str, kind: str, req_path: str, root_path: str, method: str
) -> None:
    ours, theirs = metrics_route(path, _endpoint), Route(path, endpoint=_endpoint, include_in_schema=False)
    scope = {
        "type": kind,
        "path": req_path.replace("/metrics", path),
        "root_path": root_path,
        "method": method,
    }
    got, want = ours.matches(dict(scope)), theirs.matches(dict(scope))
    assert got[0] == want[0]
    assert got[1].get("path_params") == want[1].get("path_params")
    assert ours.include_in_schema is False
