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
The overall quantile uses ``quantile_cont`` (linear interpolation), like numpy's default. Every
quantile comes with its 95 % confidence interval (analysis.intervals: order statistics, or Woodruff's
effective sample size for weighted samples), overall and per window.

Each sample carries ``w``, how many requests it stands for (analysis.weighting): ``1 / sampling_p``
for a sampled trace (Horvitz-Thompson), 1 where the probability is unknown. Where a complete source
covers the SLO's requests (the load generator's results, or request-duration histograms in the
scraped metrics: analysis.sources) the samples come from it, or are calibrated to it. With weights
that are not all 1 the quantiles, shares over the threshold and window figures are weighted; with
every weight 1 they are DuckDB's own; so are the intervals (the weighted ones account for the
sampling: with every weight 1 they are the order-statistic intervals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from stagescope.analysis.histogram_source import histogram_estimates, quantile_bucket, share_over
from stagescope.analysis.interval_sql import quantile_estimates, window_intervals
from stagescope.analysis.keys import has_columns
from stagescope.analysis.weighting import (
    mean_sql,
    sampling_kind_sql,
    sampling_weight_sql,
    weighted_quantile_sql,
)
from stagescope.errors import UserError
from stagescope.names import (
    ATTR_TOKEN_GAPS,
    DCGM_GPU_UTIL,
    SLI_E2E,
    SLI_ITL,
    SLI_TTFT,
    SOURCE_TRACES,
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
    "over_threshold_share",
    "quantiles",
    "request_filter",
    "scope_filter",
    "sli_view",
    "sql_str",
    "util_pct_sql",
    "windows",
]

DEFAULT_WINDOW = "1m"
#: Metrics read as accelerator utilization (percent), in order of preference.
UTIL_METRICS: tuple[str, ...] = (DCGM_GPU_UTIL, TRITON_GPU_UTILIZATION)
#: Each one's factor to percent: dcgm-exporter writes 0..100 (default-counters.csv "GPU utilization
#: (in %)"), Triton a rate 0.0..1.0 (server docs/user_guide/metrics.md "GPU Utilization").
UTIL_TO_PCT: dict[str, float] = {DCGM_GPU_UTIL: 1.0, TRITON_GPU_UTILIZATION: 100.0}


def util_pct_sql(metric: str) -> str:
    """SQL of a utilization sample's ``value`` in percent, for one of :data:`UTIL_METRICS`."""
    return f"(value * {UTIL_TO_PCT[metric]!r})"


def sql_str(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


@dataclass
class SLIView:
    """The samples of one SLO as a temp table ``name`` with columns ``start_unix_ns``, ``value_ms``,
    ``w`` (requests the sample stands for) and, per sample, the request's ``queue_depth``,
    ``batch_size`` and ``cold_start``; ``per_request`` is False for inter-token gaps (several samples
    per request), whose table also has the ``trace_id`` of each gap's stream.

    ``count``: samples (rows); ``weight_total``: requests (or gaps) they stand for; ``weighted``:
    some ``w`` is not 1; ``source``: where the samples come from (``names.SOURCE_*``);
    ``trace_samples``: the SLO's samples in the traces; ``sampling``: what the traces say about their
    sampling (see analysis.sources); ``sampled_traces``: some traced sample has a sampling weight
    other than 1. Per-request tables built from the traces also have ``pk``
    (weighting.sampling_kind_sql). Rows a histogram adds for buckets no trace fell in have no
    ``start_unix_ns`` (and no ``trace_id``); ``buckets``: that histogram's per-bucket ``(upper bound
    ms, count)`` when it is the source (the quantiles are then its ``histogram_quantile``, except
    in the ``traced_buckets``, the upper bounds of those whose every request was traced or whose
    traces are a large enough probability sample of them, where the traces' weighted values give
    them: analysis.histogram_source)."""

    slo: SLO
    name: str
    request_filter: str
    value_expr: str
    per_request: bool
    count: int
    shed: int
    warnings: list[str] = field(default_factory=list)
    client_closed: int = 0
    weight_total: float = 0.0
    weighted: bool = False
    source: str = SOURCE_TRACES
    trace_samples: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)
    sampled_traces: bool = False
    buckets: list[tuple[float, float]] | None = None
    traced_buckets: frozenset[float] = frozenset()

    def request_weight(self, con: duckdb.DuckDBPyConnection, alias: str = "") -> str:
        """SQL for a ``requests`` row's sampling weight (``"1.0"`` when no traced sample has one
        other than 1: the common case costs no column read)."""
        return sampling_weight_sql(con, alias) if self.sampled_traces else "1.0"

    @property
    def weight(self) -> str | None:
        """The weight column to use, or None when every sample counts once."""
        return "w" if self.weighted else None

    @property
    def arrivals(self) -> str:
        """A relation with one ``start_unix_ns`` (arrival) and ``w`` row per request of the samples."""
        if self.per_request:
            return f"(SELECT start_unix_ns, w FROM {self.name} WHERE start_unix_ns IS NOT NULL)"
        return (
            f"(SELECT trace_id, start_unix_ns, any_value(w) AS w FROM {self.name} "
            "WHERE start_unix_ns IS NOT NULL GROUP BY ALL)"
        )

    def count_rows(self, con: duckdb.DuckDBPyConnection) -> None:
        """Refresh ``count``, ``weight_total`` and ``weighted`` from the table (one pass)."""
        row = con.execute(
            f"SELECT count(*), coalesce(sum(w), 0), count(*) FILTER (WHERE w <> 1) FROM {self.name}"
        ).fetchone()
        self.count = int(row[0]) if row else 0
        self.weight_total = float(row[1]) if row else 0.0
        self.weighted = bool(row and row[2])


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


def error_answer_warning(con: duckdb.DuckDBPyConnection, slo: SLO, flt: str) -> str | None:
    """A warning when some of the SLO's requests were answered with an HTTP error (4xx other than
    429, or 5xx): they stay latency samples, but their latency is that of the error answer, not of
    serving the request (a load generator sending the wrong method or path gets fast 404s and 405s
    that read as a met SLO). Shares are weighted by the sampling, as the quantile is."""
    if not has_columns(con, "requests", "status_code"):
        return None
    w = sampling_weight_sql(con)
    row = con.execute(
        f"SELECT sum({w}) FILTER (WHERE status_code >= 400), sum({w}), count(*) FILTER (WHERE status_code >= 400) "
        f"FROM requests WHERE {flt}"
    ).fetchone()
    if not row or not row[2] or not row[1]:
        return None
    share = float(row[0]) / float(row[1])
    codes = con.execute(
        f"SELECT status_code, count(*) AS n FROM requests WHERE {flt} AND status_code >= 400 "
        "GROUP BY 1 ORDER BY n DESC, 1 LIMIT 3"
    ).fetchall()
    which = ", ".join(f"{c} x{n}" for c, n in codes)
    where = "" if slo.route is None else f" on route {slo.route}"
    if share >= 1.0 - 1e-9:
        return (
            f"every request{where} was answered with an HTTP error ({which}): the quantile is of error answers, "
            "not of served requests, so it says nothing about the SLO (check what was sent: method, path, body)"
        )
    return (
        f"{share:.1%} of the requests{where} were answered with an HTTP error ({which}) and are latency samples: "
        "their latency is that of the error answer, not of serving the request, so the quantile can read "
        "better (fast failures) or worse (timeouts) than served requests fared"
    )


def network_expr(slo: SLO) -> str:
    """Per request, client-observed minus server time (ms): the ``network`` stage, for ``e2e`` only."""
    return "greatest(client_duration_ms - duration_ms, 0)" if slo.sli == SLI_E2E else "NULL::DOUBLE"


def sli_view(
    con: duckdb.DuckDBPyConnection, slo: SLO, name: str = "ss_sli", *, complete_sources: bool = True
) -> SLIView:
    """Create (or replace) the temp table of ``slo``'s samples and count them; with
    ``complete_sources`` a complete source that covers them gives the samples (analysis.sources)."""
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
        f"CAST(cold_start AS BOOLEAN) AS cold_start, {sampling_weight_sql(con)} AS w"
    )
    kind = f", {sampling_kind_sql(con)} AS pk"  # per-request tables: what is known of the sampling
    # materialized once: every later step (quantiles, windows, arrivals) reads this, not the inputs.
    # Per-request samples carry no trace id (the widest column by far); the breakdown reads the trace
    # ids of the requests it breaks down from ``requests`` (see attribution.build_breakdown)
    key = "" if per_request else "trace_id, "
    per_request_sql = (
        f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {key}start_unix_ns, CAST({value_expr} AS DOUBLE) "
        f"AS value_ms, {extra}{kind if per_request else ''} FROM requests WHERE {flt} AND {value_expr} IS NOT NULL"
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
            con.execute(per_request_sql)
            streams = con.execute(f"SELECT count(*) FROM {name}").fetchone()
            if streams and streams[0]:  # (no traced stream at all: nothing stands in for anything)
                warnings.append(
                    f"no per-gap inter-token samples ({ATTR_TOKEN_GAPS}) in the data: one inter-token p99 (else "
                    "mean) per stream stands in for its gaps, so the quantile is of streams, not of gaps, and can "
                    "be off either way"
                )
    srow = con.execute(
        f"SELECT count(*) FROM requests WHERE status_code = 429 AND {scope_filter(slo)}"
    ).fetchone()
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
    if (err := error_answer_warning(con, slo, flt)) is not None:
        warnings.append(err)
    view = SLIView(slo, name, flt, value_expr, per_request, 0, shed, warnings, closed)
    view.count_rows(con)
    view.trace_samples = view.count
    view.sampled_traces = view.weighted
    if complete_sources:
        from stagescope.analysis.sources import use_complete_sources

        use_complete_sources(con, view)
    return view


def neighbourhood_quantile(q: float) -> float:
    """The quantile where the neighbourhood of the SLO quantile ``q`` starts: ten times its error
    budget below it, and not below the median (0.9 for a p99, 0.5 for a p95)."""
    return max(0.5, 1.0 - 10.0 * (1.0 - q))


def quantiles(con: duckdb.DuckDBPyConnection, view: SLIView) -> dict[str, float | None]:
    """p50, p95, p99, the SLO's own quantile (key ``"q"``) and its :func:`neighbourhood_quantile`
    (key ``"near"``) of the samples, in milliseconds (one pass). p50, p95, p99 and ``q`` are
    :class:`~stagescope.analysis.intervals.Estimate` values carrying their 95 % interval (the
    interval's ends are more levels of the same pass)."""
    q = view.slo.quantile
    levels = {"p50": 0.5, "p95": 0.95, "p99": 0.99, "q": q, "near": neighbourhood_quantile(q)}
    if view.buckets is None:
        got = quantile_estimates(con, view.name, "value_ms", levels, view.count, view.weight)
    else:  # histogram_quantile, except in a bucket the traces give: their (weighted) values
        got = histogram_estimates(view.buckets, levels)
        exact = {k: x for k, x in levels.items() if quantile_bucket(view.buckets, x) in view.traced_buckets}
        if exact:
            got.update(quantile_estimates(con, view.name, "value_ms", exact, view.count, view.weight))
    out: dict[str, float | None] = dict(got)
    near = got["near"]
    out["near"] = None if near is None else float(near)  # a sample boundary, not a reported quantile
    return out


def over_threshold_share(con: duckdb.DuckDBPyConnection, view: SLIView) -> float | None:
    """Share of the requests (or gaps) slower than the SLO threshold, weighted by ``w``; where a
    histogram is the source, its ``histogram_fraction`` (histogram_source.share_over)."""
    thr = view.slo.threshold_ms
    if view.buckets is not None:
        return share_over(con, view, thr)
    row = con.execute(
        # none over the threshold is a share of 0 (a FILTER over no rows sums to NULL)
        f"SELECT coalesce(sum(w) FILTER (WHERE value_ms > {thr!r}), 0) / nullif(sum(w), 0) FROM {view.name}"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _util_sql(con: duckdb.DuckDBPyConnection) -> str | None:
    for metric in UTIL_METRICS:
        row = con.execute(
            "SELECT count(*) FROM metric_samples WHERE metric = ? AND ts_ms IS NOT NULL", [metric]
        ).fetchone()
        if row and row[0]:
            return (
                f"SELECT ts_ms, {util_pct_sql(metric)} AS value FROM metric_samples "
                f"WHERE metric = {sql_str(metric)} AND ts_ms IS NOT NULL"
            )
    return None


def windows(
    con: duckdb.DuckDBPyConnection, view: SLIView, window: str = DEFAULT_WINDOW
) -> list[dict[str, Any]]:
    """Per time window (by request start): sample count, p50, the SLO quantile and its 95 % interval,
    share of samples over the threshold, whether the window breaches, mean queue depth seen by its
    requests and mean accelerator utilization (percent, from ``metric_samples`` when present)."""
    try:
        w_s = parse_duration_s(window)
    except ValueError as exc:
        raise UserError(f"bad --window: {exc}") from None
    if not 0.001 <= w_s <= 366 * 86400:  # a window under 1 ms is 0 ns wide once rounded down
        raise UserError(f"bad --window {window!r}: must be from 1ms to 366d")
    w_ns = int(w_s * 1e9)
    q = view.slo.quantile
    thr = view.slo.threshold_ms
    util = _util_sql(con)
    util_join = (
        f"LEFT JOIN (SELECT (ts_ms * 1000000 // {w_ns}) * {w_ns} AS w, avg(value) AS util FROM ({util}) "
        "GROUP BY 1) u ON u.w = s.win"
        if util
        else ""
    )
    util_col = "u.util" if util else "NULL::DOUBLE"
    wt = view.weight
    by_window: list[dict[Any, Any]] = []
    if wt is None:
        qsel = f"quantile_cont(value_ms, [0.5, {q}]) AS qs"
    else:  # each window's weighted p50 and SLO quantile (one sorted pass each), matched by window
        src = f"(SELECT *, (start_unix_ns // {w_ns}) * {w_ns} AS win FROM {view.name} WHERE start_unix_ns IS NOT NULL)"
        by_window = [
            dict(con.execute(weighted_quantile_sql(src, "value_ms", x, "w", by="win")).fetchall())
            for x in (0.5, q)
        ]
        qsel = "[NULL::DOUBLE, NULL::DOUBLE] AS qs"
    rows = con.execute(
        f"""
        WITH s AS (
            SELECT (start_unix_ns // {w_ns}) * {w_ns} AS win, count(*) AS n, sum(w) AS nw, {qsel},
                   {mean_sql(f"CASE WHEN value_ms > {thr} THEN 1.0 ELSE 0.0 END", None, wt)} AS bad,
                   {mean_sql("queue_depth", None, wt)} AS qd, {mean_sql("batch_size", None, wt)} AS bs
            FROM {view.name} WHERE start_unix_ns IS NOT NULL GROUP BY 1
        )
        SELECT s.win, s.n, s.nw, s.qs[1], s.qs[2], s.bad, s.qd, s.bs, {util_col}
        FROM s {util_join} ORDER BY s.win
        """
    ).fetchall()
    bucket = f"(start_unix_ns // {w_ns}) * {w_ns}"
    src = f"(SELECT * FROM {view.name} WHERE start_unix_ns IS NOT NULL)"
    qhat = by_window[1] if by_window else {r[0]: r[4] for r in rows}
    ivs = window_intervals(con, src, bucket, q, qhat, wt)
    out = []
    for w, n, nw, p50, pq, bad, qd, bs, ut in rows:
        if by_window:
            p50, pq = by_window[0].get(w), by_window[1].get(w)
        lo, hi = ivs.get(w, (None, None))
        out.append(
            {
                "start_unix_ms": int(w // 1_000_000),
                "seconds": w_s,
                "samples": int(n),
                "requests": round(float(nw)),
                "p50_ms": _r(p50),
                "quantile_ms": _r(pq),
                "quantile_interval_ms": [_r(lo), _r(hi)],
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
        "over_threshold_share": over_threshold_share(con, view) if view.count else None,
        "windows": windows(con, view, window) if view.count else [],
    }
