"""SLO evaluation: which samples an SLO is about, its quantiles, and breach detection per time window.

Everything here is set-based DuckDB SQL over the pinned analysis relations (``requests``,
``stages``, ``token_gaps``, ``metric_samples``), so it scales to millions of requests.

SLI samples (milliseconds):

* ``e2e``: one sample per server request, ``requests.duration_ms``;
* ``ttft``: one sample per streamed request, ``requests.ttft_ms`` (arrival to first token);
* ``itl``: one sample per inter-token gap, ``token_gaps.gap_ms``; where the data has no gaps (vLLM's
  ``llm_request`` spans carry none) the per-request ``itl_p99_ms`` (else ``itl_mean_ms``) stands in,
  with a warning.

Requests answered 429 (load shed) are not latency samples: they are counted and reported apart. Nor
are requests whose client went away before the answer was complete (status 499,
``names.STATUS_CODE_CLIENT_CLOSED``): their duration is how long the server took to notice, not a
latency anyone waited for; they are counted and a warning says how many (many of them can mean clients
giving up on a slow server).
The overall quantile uses ``quantile_cont`` (linear interpolation), like numpy's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from stagescope.analysis.keys import has_columns
from stagescope.errors import UserError
from stagescope.names import (
    ATTR_TOKEN_GAPS,
    DCGM_GPU_UTIL,
    SLI_E2E,
    SLI_ITL,
    SLI_TTFT,
    STATUS_CODE_CLIENT_CLOSED,
    TRITON_GPU_UTILIZATION,
)
from stagescope.slo import SLO, parse_duration_s

__all__ = [
    "DEFAULT_WINDOW",
    "SLIView",
    "evaluate",
    "neighbourhood_quantile",
    "network_expr",
    "quantiles",
    "request_filter",
    "scope_filter",
    "sli_view",
    "sql_str",
    "windows",
]

DEFAULT_WINDOW = "1m"
#: Metrics read as accelerator utilization (percent), in order of preference.
UTIL_METRICS: tuple[str, ...] = (DCGM_GPU_UTIL, TRITON_GPU_UTILIZATION)


def sql_str(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


@dataclass
class SLIView:
    """The samples of one SLO as a temp table ``name`` with columns ``start_unix_ns``, ``value_ms``
    and, per sample, the request's ``queue_depth``, ``batch_size`` and ``cold_start``; ``per_request``
    is False for inter-token gaps (several samples per request), whose table also has the
    ``trace_id`` of each gap's stream."""

    slo: SLO
    name: str
    request_filter: str
    value_expr: str
    per_request: bool
    count: int
    shed: int
    warnings: list[str] = field(default_factory=list)
    client_closed: int = 0

    @property
    def arrivals(self) -> str:
        """A relation with one ``start_unix_ns`` row per request (arrival) of the samples."""
        if self.per_request:
            return self.name
        return f"(SELECT DISTINCT trace_id, start_unix_ns FROM {self.name})"


#: Requests answered 429 (load shed) are not latency samples.
NOT_SHED = "coalesce(status_code, 0) <> 429"
#: Nor are requests whose client went away before the answer was complete (status 499).
NOT_CLOSED = f"coalesce(status_code, 0) <> {STATUS_CODE_CLIENT_CLOSED}"


def scope_filter(slo: SLO) -> str:
    """SQL condition on ``requests``: the requests an SLO is about (its route and model), shed or not."""
    conds = []
    if slo.route is not None:
        conds.append(f"route = {sql_str(slo.route)}")
    if slo.model is not None:
        conds.append(f"model = {sql_str(slo.model)}")
    return " AND ".join(conds) or "true"


def request_filter(slo: SLO) -> str:
    """SQL condition on ``requests``: the requests whose samples an SLO reads (:func:`scope_filter`,
    not shed, not closed by the client). A filter on requests, nothing more: weights and sampling
    apply after it."""
    scope = scope_filter(slo)
    kept = f"{NOT_SHED} AND {NOT_CLOSED}"
    return kept if scope == "true" else f"{kept} AND {scope}"


def network_expr(slo: SLO) -> str:
    """Per request, client-observed minus server time (ms): the ``network`` stage, for ``e2e`` only."""
    return "greatest(client_duration_ms - duration_ms, 0)" if slo.sli == SLI_E2E else "NULL::DOUBLE"


def sli_view(con: duckdb.DuckDBPyConnection, slo: SLO, name: str = "ss_sli") -> SLIView:
    """Create (or replace) the temp table of ``slo``'s samples and count them."""
    flt = request_filter(slo)
    warnings: list[str] = []
    per_request = True
    if slo.sli == SLI_E2E:
        value_expr = "duration_ms"
    elif slo.sli == SLI_TTFT:
        value_expr = "ttft_ms"
    elif slo.sli == SLI_ITL:
        value_expr = "coalesce(itl_p99_ms, itl_mean_ms)"
        per_request = False
    else:  # pragma: no cover - SLO validates its sli
        raise UserError(f"unknown SLI {slo.sli!r}")
    extra = (
        "CAST(queue_depth AS DOUBLE) AS queue_depth, CAST(batch_size AS DOUBLE) AS batch_size, "
        "CAST(cold_start AS BOOLEAN) AS cold_start"
    )
    # materialized once: every later step (quantiles, windows, arrivals) reads this, not the inputs.
    # Per-request samples carry no trace id (the widest column by far); the breakdown reads the trace
    # ids of the requests it breaks down from ``requests`` (see attribution.build_breakdown)
    key = "" if per_request else "trace_id, "
    per_request_sql = (
        f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {key}start_unix_ns, CAST({value_expr} AS DOUBLE) "
        f"AS value_ms, {extra} FROM requests WHERE {flt} AND {value_expr} IS NOT NULL"
    )
    if per_request:
        con.execute(per_request_sql)
    else:
        n_gaps = con.execute(
            f"SELECT count(*) FROM token_gaps g SEMI JOIN (SELECT trace_id FROM requests WHERE {flt}) r "
            "USING (trace_id)"
        ).fetchone()
        if n_gaps is not None and n_gaps[0] > 0:
            running = "g.running" if has_columns(con, "token_gaps", "running") else "NULL"
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT g.trace_id, r.start_unix_ns, "
                # a gap's own running batch where the server counted it, else its stream's mean
                f"CAST(g.gap_ms AS DOUBLE) AS value_ms, "
                f"{extra.replace('CAST(batch_size AS DOUBLE)', f'CAST(coalesce({running}, r.batch_size) AS DOUBLE)')} "
                f"FROM token_gaps g JOIN requests r USING (trace_id) "
                f"WHERE {flt} AND g.gap_ms IS NOT NULL"
            )
        else:
            warnings.append(
                f"no per-gap inter-token samples ({ATTR_TOKEN_GAPS}) in the data: one inter-token p99 (else "
                "mean) per stream stands in for its gaps, so the quantile is of streams, not of gaps, and can "
                "be off either way"
            )
            con.execute(per_request_sql)
    row = con.execute(f"SELECT count(*) FROM {name}").fetchone()
    count = int(row[0]) if row else 0
    srow = con.execute(f"SELECT count(*) FROM requests WHERE status_code = 429 AND {scope_filter(slo)}").fetchone()
    shed = int(srow[0]) if srow else 0
    if shed:
        warnings.append(
            f"{shed} requests were shed (HTTP 429) and are not latency samples: the quantile leaves out the "
            "requests the service refused, so it reads better than its clients fared"
        )
    crow = con.execute(
        f"SELECT count(*) FROM requests WHERE status_code = {STATUS_CODE_CLIENT_CLOSED} AND {scope_filter(slo)}"
    ).fetchone()
    closed = int(crow[0]) if crow else 0
    if closed:
        warnings.append(
            f"{closed} requests were closed by their client before the answer was complete "
            f"(status {STATUS_CODE_CLIENT_CLOSED}) and are not latency samples: if clients gave up on a slow "
            "server, the quantile reads better than they fared"
        )
    return SLIView(slo, name, flt, value_expr, per_request, count, shed, warnings, closed)


def neighbourhood_quantile(q: float) -> float:
    """The quantile where the neighbourhood of the SLO quantile ``q`` starts: ten times its error
    budget below it, and not below the median (0.9 for a p99, 0.5 for a p95)."""
    return max(0.5, 1.0 - 10.0 * (1.0 - q))


def quantiles(con: duckdb.DuckDBPyConnection, view: SLIView) -> dict[str, float | None]:
    """p50, p95, p99, the SLO's own quantile (key ``"q"``) and its :func:`neighbourhood_quantile`
    (key ``"near"``) of the samples, in milliseconds (one pass)."""
    q = view.slo.quantile
    levels = [0.5, 0.95, 0.99, q, neighbourhood_quantile(q)]
    row = con.execute(f"SELECT quantile_cont(value_ms, {levels}) FROM {view.name}").fetchone()
    vals = row[0] if row and row[0] is not None else [None] * len(levels)
    return dict(zip(("p50", "p95", "p99", "q", "near"), vals, strict=True))


def _util_sql(con: duckdb.DuckDBPyConnection) -> str | None:
    for metric in UTIL_METRICS:
        row = con.execute(
            "SELECT count(*) FROM metric_samples WHERE metric = ? AND ts_ms IS NOT NULL", [metric]
        ).fetchone()
        if row and row[0]:
            return f"SELECT ts_ms, value FROM metric_samples WHERE metric = {sql_str(metric)} AND ts_ms IS NOT NULL"
    return None


def windows(
    con: duckdb.DuckDBPyConnection, view: SLIView, window: str = DEFAULT_WINDOW
) -> list[dict[str, Any]]:
    """Per time window (by request start): sample count, p50, the SLO quantile, share of samples over
    the threshold, whether the window breaches, mean queue depth seen by its requests and mean
    accelerator utilization (percent, from ``metric_samples`` when present)."""
    try:
        w_s = parse_duration_s(window)
    except ValueError as exc:
        raise UserError(f"bad --window: {exc}") from None
    if w_s <= 0:
        raise UserError(f"bad --window {window!r}: must be positive")
    w_ns = int(w_s * 1e9)
    q = view.slo.quantile
    thr = view.slo.threshold_ms
    util = _util_sql(con)
    util_join = (
        f"LEFT JOIN (SELECT (ts_ms * 1000000 // {w_ns}) * {w_ns} AS w, avg(value) AS util FROM ({util}) "
        "GROUP BY 1) u ON u.w = s.w"
        if util
        else ""
    )
    util_col = "u.util" if util else "NULL::DOUBLE"
    rows = con.execute(
        f"""
        WITH s AS (
            SELECT (start_unix_ns // {w_ns}) * {w_ns} AS w, count(*) AS n,
                   quantile_cont(value_ms, [0.5, {q}]) AS qs,
                   avg(CASE WHEN value_ms > {thr} THEN 1.0 ELSE 0.0 END) AS bad,
                   avg(queue_depth) AS qd, avg(batch_size) AS bs
            FROM {view.name} GROUP BY 1
        )
        SELECT s.w, s.n, s.qs[1], s.qs[2], s.bad, s.qd, s.bs, {util_col}
        FROM s {util_join} ORDER BY s.w
        """
    ).fetchall()
    out = []
    for w, n, p50, pq, bad, qd, bs, ut in rows:
        out.append(
            {
                "start_unix_ms": int(w // 1_000_000),
                "seconds": w_s,
                "samples": int(n),
                "p50_ms": _r(p50),
                "quantile_ms": _r(pq),
                "over_threshold_share": _r(bad, 4),
                "breached": bool(pq is not None and pq > thr),
                "queue_depth_mean": _r(qd),
                "batch_size_mean": _r(bs),
                "utilization_pct": _r(ut),
            }
        )
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def evaluate(con: duckdb.DuckDBPyConnection, slo: SLO, window: str = DEFAULT_WINDOW) -> dict[str, Any]:
    """Quantiles, breach flag and windows of one SLO (creates the temp view ``ss_sli``)."""
    view = sli_view(con, slo)
    qs = quantiles(con, view) if view.count else dict.fromkeys(("p50", "p95", "p99", "q", "near"))
    breached = bool(qs["q"] is not None and qs["q"] > slo.threshold_ms)
    return {
        "view": view,
        "quantiles": qs,
        "breached": breached,
        "windows": windows(con, view, window) if view.count else [],
    }
