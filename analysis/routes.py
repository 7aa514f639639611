"""Routes: which routes an SLO is checked on, each on its own, and which of them the report leads with.

A service's routes are different populations: a feature-fetching ``/v1/score`` and a streaming
``/v1/generate`` pooled under one e2e SLO give a tail of long generations, "decode" and a decoding
lever for a feature-store problem. So the analysis never pools routes:

* an SLO with a ``route`` (an SLO file's ``route:``, or ``analyze --route``) is checked on that route
  alone (``requests.route``, the route template; a filter on requests, nothing more);
* an SLO without one (a one-line ``--slo``, an SLO file item without ``route:``) is checked on **each
  route its SLI applies to**, on its own:

  - ``ttft`` and ``itl`` apply to routes that stream (requests with a TTFT; with token gaps or a
    per-request inter-token figure for ``itl``);
  - ``e2e`` applies to every route, except that when the data holds both streaming and non-streaming
    routes it applies to the non-streaming ones: a stream's end-to-end time is mostly its output
    length, and one threshold cannot mean both (``--route`` checks a streaming route's e2e anyway);
  - routes whose requests were all shed (429) have no latency sample and are listed, not checked;
  - at most :data:`MAX_ROUTES` routes, the busiest; the others are listed.

Routes not checked are in the report's ``routes_skipped`` with the reason. Each route checked is a
full report of its own in ``routes``; the top level is the **worst** of them (breached before no data
before met, see names.STATUSES; then furthest over, or nearest to, its threshold), so a report over one
route and a report over several read the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.breach import NOT_SHED, scope_filter
from stagescope.errors import UserError
from stagescope.slo import SLO

__all__ = ["MAX_ROUTES", "STREAMING_SHARE", "Target", "expand", "order", "restrict", "worst"]

#: Routes checked at most for one SLO (the busiest); the others are listed as skipped.
MAX_ROUTES = 20
#: A route streams when at least this share of its (not shed) requests carries a TTFT.
STREAMING_SHARE = 0.5


@dataclass(frozen=True)
class Target:
    """One (SLO, route) to check: ``slo`` as reported (bound to its route) and ``filtered`` as its
    samples are selected. They differ only where every request in the SLO's scope has that one
    route: the filter would then select them all, and it costs a string comparison per request in
    every query of the analysis (about a tenth of the verdict's time on 1,000,000 requests)."""

    slo: SLO
    filtered: SLO


def restrict(slos: Sequence[SLO], route: str | None, source: str = "--slo") -> list[SLO]:
    """The SLOs that apply to ``route`` (``analyze --route``), bound to it: those without a route and
    those for that route. Bad input (before any work): no SLO applies to it."""
    if route is None:
        return list(slos)
    if not route.strip():
        raise UserError("--route: empty route")
    if any(ord(c) < 32 or ord(c) == 127 for c in route):
        raise UserError(f"--route {route!r}: control characters in a route template")
    kept = [
        s if s.route is not None else dataclasses.replace(s, route=route)
        for s in slos
        if s.route in (None, route)
    ]
    if not kept:
        theirs = ", ".join(sorted({str(s.route) for s in slos}))
        raise UserError(f"--route {route}: no SLO in {source} is for it (its routes: {theirs})")
    return kept


def _single_route(con: duckdb.DuckDBPyConnection, scope: str) -> tuple[bool, str | None]:
    """Whether the requests in ``scope`` have one route value (and which): min and max of the column
    and its count, which DuckDB answers from Parquet statistics or in one cheap pass."""
    row = con.execute(
        f"SELECT min(route), max(route), count(route), count(*) FROM requests WHERE {scope}"
    ).fetchone()
    assert row is not None
    lo, hi, with_route, n = row
    if n == 0 or with_route == 0:
        return True, None
    return (lo == hi and with_route == n), lo


def _present(sli: str) -> str:
    if sli == N.SLI_E2E:
        return "duration_ms IS NOT NULL"
    if sli == N.SLI_TTFT:
        return "ttft_ms IS NOT NULL"
    return "(coalesce(itl_p99_ms, itl_mean_ms) IS NOT NULL OR trace_id IN (SELECT trace_id FROM token_gaps))"


def _profile(con: duckdb.DuckDBPyConnection, slo: SLO) -> list[tuple[Any, int, int, int, int]]:
    """Per route in the SLO's scope: requests, shed, samples of the SLI, requests with a TTFT."""
    rows = con.execute(
        f"""SELECT route, count(*), count(*) FILTER (WHERE NOT ({NOT_SHED})),
                   count(*) FILTER (WHERE {NOT_SHED} AND {_present(slo.sli)}),
                   count(*) FILTER (WHERE {NOT_SHED} AND ttft_ms IS NOT NULL)
            FROM requests WHERE {scope_filter(slo)} GROUP BY 1 ORDER BY 4 DESC, 2 DESC, 1"""
    ).fetchall()
    return [(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]


def _skip(route: Any, n: int, why: str) -> dict[str, Any]:
    return {"route": route, "requests": n, "why": why}


def _expand_one(con: duckdb.DuckDBPyConnection, slo: SLO) -> tuple[list[Target], list[dict[str, Any]]]:
    if slo.route is not None:
        return [Target(slo, slo)], []
    one, value = _single_route(con, scope_filter(slo))
    if one:  # one route (or none known): nothing to tell apart, nothing to filter on
        return [Target(slo if value is None else dataclasses.replace(slo, route=value), slo)], []
    prof = _profile(con, slo)
    skipped = [_skip(None, n, "no route attribute: not checked") for r, n, *_ in prof if r is None]
    prof = [p for p in prof if p[0] is not None]
    streams = {r for r, n, shed, _, ttft in prof if n - shed > 0 and ttft >= STREAMING_SHARE * (n - shed)}
    use = [p for p in prof if p[3] > 0]
    if slo.sli == N.SLI_E2E and any(p[0] not in streams for p in use) and any(p[0] in streams for p in use):
        for r, n, *_ in (p for p in use if p[0] in streams):
            why = f"streams: an e2e SLO there measures whole generations (--route {r} checks it; or a ttft / itl SLO)"
            skipped.append(_skip(r, n, why))
        use = [p for p in use if p[0] not in streams]
    for r, n, shed, samples, _ in prof:
        if samples:
            continue
        if shed == n:
            skipped.append(_skip(r, n, "all requests shed (HTTP 429): no latency sample"))
        elif slo.sli == N.SLI_TTFT:
            skipped.append(_skip(r, n, "does not stream: no TTFT"))
        elif slo.sli == N.SLI_ITL:
            skipped.append(_skip(r, n, "no inter-token gaps"))
    if not use:  # no route has a sample: one pooled entry, whose no-data reason covers every route
        return [Target(slo, slo)], skipped
    for r, n, *_ in use[MAX_ROUTES:]:
        skipped.append(_skip(r, n, f"beyond the {MAX_ROUTES} busiest routes (--route {r} checks it)"))
    bound = [dataclasses.replace(slo, route=p[0]) for p in use[:MAX_ROUTES]]
    return [Target(b, b) for b in bound], skipped


def expand(con: duckdb.DuckDBPyConnection, slos: Sequence[SLO]) -> tuple[list[Target], list[dict[str, Any]]]:
    """The (SLO, route) pairs to check (:class:`Target`), and the routes not checked
    (``{"route", "requests", "why"}``, at most :data:`MAX_ROUTES` of them per SLO); see the module
    docstring."""
    targets: list[Target] = []
    skipped: list[dict[str, Any]] = []
    for slo in slos:
        got, skip = _expand_one(con, slo)
        targets += got
        skipped += [{**s, "slo": slo.name} for s in skip[:MAX_ROUTES]]
        if len(skip) > MAX_ROUTES:
            rest = skip[MAX_ROUTES:]
            more = _skip(None, sum(s["requests"] for s in rest), f"{len(rest)} more routes not checked")
            skipped.append({**more, "slo": slo.name})
    return targets, skipped


def _rank(report: dict[str, Any]) -> tuple[int, float]:
    status = report["status"]
    q, thr = report.get("quantile_ms"), report["slo"]["threshold_ms"]
    ratio = float(q) / float(thr) if q is not None and thr else 0.0
    return N.STATUSES.index(status), -ratio


def order(reports: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the reports, worst first: breached before no data before met (an SLO that could
    not be checked outranks one checked and met), then the furthest over (or nearest to) its
    threshold; equals in their given order."""
    return sorted(range(len(reports)), key=lambda i: (_rank(reports[i]), i))


def worst(reports: Sequence[dict[str, Any]]) -> int:
    """Index of the report the top level is about: the first of :func:`order`."""
    return order(reports)[0]
