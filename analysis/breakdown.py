"""The per-request split: each request's SLI interval cut into stages along the critical path.

Table ``ss_breakdown``, one row per request (milliseconds), built by :func:`build_breakdown` for a
per-request SLI view (analysis.attribution compares its tail and baseline rows):

* every stage span is clipped to the SLI interval ``[start, start + value]`` (for TTFT only the stages
  before the first token count: queue, prefill, feature fetch ...);
* fast path: when a request's clipped stage spans are disjoint (each stage once, and their total not
  above the interval) a stage's time is the sum of its spans;
* otherwise (parallel fetches, overlapping stages) the interval is cut at every span boundary and each
  elementary segment goes to the covering stage that **ends last**: the one the request was still
  waiting for, i.e. the critical path. A segment counts once, so stages never sum above the request;
* ``unattributed`` is the time in no stage; ``network`` (``e2e`` only) is the client-observed duration
  minus the server duration, where a load-generator CLIENT span exists;
* beside them the request's :data:`REQUEST_ATTRIBUTES`, ``sw``, its sampling weight
  (``1 / sampling_p``, analysis.weighting), and ``exact``: it was kept with probability 1.
"""

from __future__ import annotations

import duckdb

from stagescope.analysis.breach import SLIView, network_expr, sql_str
from stagescope.analysis.keys import REQUEST_KEY, has_columns, has_request_keys, trace_ref
from stagescope.analysis.kinds import StageCatalog, kinds_of_rows, row_kind_sql, stage_catalog
from stagescope.names import STAGE_NETWORK, STAGE_OVERFLOW

__all__ = ["BREAKDOWN", "REQUEST_ATTRIBUTES", "build_breakdown", "stage_columns", "with_columns"]

BREAKDOWN = "ss_breakdown"


def stage_columns(con: duckdb.DuckDBPyConnection, table: str = "stages") -> dict[str, str]:
    """Stage name -> safe column name, known stages first in vocabulary order, then any others
    (past analysis.kinds.MAX_STAGES names, the rest as one overflow stage).

    ``network`` is left out: it lies outside the server-side interval and is computed per request
    from the client and server durations instead."""
    return stage_catalog(con, table).columns


#: Per-request attributes carried into ``ss_req`` and ``ss_breakdown`` (lever models read them
#: there instead of joining ``requests`` again).
REQUEST_ATTRIBUTES = ("batch_size", "queue_depth", "cold_start", "input_tokens", "itl_mean_ms")


def _requests_sql(con: duckdb.DuckDBPyConnection, view: SLIView, subset: str | None) -> None:
    """Create ``ss_req``: one row per request to break down, read from ``requests`` (the SLI table
    holds no trace ids): ``trace_ref`` (the request's ``trace_key``, or its trace id where the data
    has no keys: see analysis.keys), an integer key ``tk`` (hash of trace_ref and start), SLI
    interval ``t0``-``t1`` (ns), ``value_ms``, ``network``, :data:`REQUEST_ATTRIBUTES`, ``sw`` (the
    sampling weight, analysis.weighting), ``exact`` (kept with probability 1, known) and
    ``request_key`` (NULL without request keys).

    Stage spans are joined to the requests of their trace and clipped to each one's interval; where
    a stage row carries its request's key (analysis.keys) only to that request. So the requests of one
    trace that follow each other (a client's retries) are broken down apart, and so are those that
    run at the same time (a fan-out), except where the data has no request keys: then they share the
    stage time they overlap."""
    net = network_expr(view.slo)
    rkey = REQUEST_KEY if has_request_keys(con) else "NULL::UBIGINT"
    src = (
        f"SELECT {trace_ref(con)} AS trace_ref, {rkey} AS request_key, start_unix_ns, "
        f"CAST({view.value_expr} AS DOUBLE) AS value_ms, {net} AS network_ms, {', '.join(REQUEST_ATTRIBUTES)}, "
        f"{view.request_weight(con)} AS sw, {_exact_sql(con)} AS exact "
        f"FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL"
    )
    where = f"WHERE {subset}" if subset else ""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_req AS
        SELECT trace_ref, hash(trace_ref, start_unix_ns) AS tk, request_key, start_unix_ns AS t0, value_ms,
               start_unix_ns + CAST(round(value_ms * 1e6) AS BIGINT) AS t1, network_ms AS network,
               {", ".join(REQUEST_ATTRIBUTES)}, sw, exact
        FROM ({src}) {where}"""
    )


def _exact_sql(con: duckdb.DuckDBPyConnection) -> str:
    """SQL: the request was kept with probability 1, as its ``th`` (or sampled_reason) says."""
    return "coalesce(sampling_p = 1, false)" if has_columns(con, "requests", "sampling_p") else "false"


def build_breakdown(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    subset: str | None = None,
    catalog: StageCatalog | None = None,
) -> dict[str, str]:
    """Create ``ss_breakdown`` for a per-request SLI view; returns stage -> column.

    ``subset`` (a condition on ``value_ms`` and ``start_unix_ns``) limits the requests broken down;
    the verdict uses it on large inputs to break down a stratified sample (see :func:`_subset`).
    ``catalog``: the stages to break down into (default: read from ``stages``); its ``kinds`` are set
    from the stage rows of the requests broken down (analysis.kinds.kinds_of_rows)."""
    cat = stage_catalog(con) if catalog is None else catalog
    cols = cat.columns
    folded = (
        f" ELSE {list(cols).index(STAGE_OVERFLOW)}" if cat.folded and STAGE_OVERFLOW in cols else ""
    )
    case = (
        "CASE s.stage " + " ".join(f"WHEN {sql_str(s)} THEN {i}" for i, s in enumerate(cols)) + f"{folded} END"
        if cols
        else "NULL::INTEGER"
    )
    k_of = {c: i for i, c in enumerate(cols.values())}
    # integer keys (``tk`` per request, ``k`` = stage index) keep the group-bys cheap
    _requests_sql(con, view, subset)
    # stage spans of those requests, clipped to each request's SLI interval (one scan of ``stages``),
    # each to its own request where the stage row knows it
    own = (
        f" AND (s.{REQUEST_KEY} IS NULL OR s.{REQUEST_KEY} = r.request_key)" if has_request_keys(con) else ""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_st AS
        SELECT r.tk, {case} AS k, greatest(s.start_unix_ns, r.t0) AS a, least(s.end_unix_ns, r.t1) AS b,
               r.t1 - r.t0 AS span, {row_kind_sql(con)} AS kind
        FROM stages s JOIN ss_req r ON s.{trace_ref(con)} = r.trace_ref{own}
        WHERE least(s.end_unix_ns, r.t1) > greatest(s.start_unix_ns, r.t0) AND s.stage <> {sql_str(STAGE_NETWORK)}"""
    )
    # Fast path. Per (request, stage): spans that share a common point (parallel fetches: max start <=
    # min end) form one block, whose length is the stage's time; otherwise ``u`` is NULL. A request whose
    # stages are all single blocks and sum to at most the interval needs no sweep.
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_fast AS
        WITH per AS (
            SELECT tk, k, CASE WHEN max(a) <= min(b) THEN (max(b) - min(a)) / 1e6 END AS u
            FROM ss_st GROUP BY tk, k
        )
        SELECT tk, {", ".join(f"sum(u) FILTER (WHERE k = {k}) AS {c}" for c, k in k_of.items()) or "NULL AS c_none"},
               count(*) - count(u) AS blocks_overlap, sum(u) AS total
        FROM per GROUP BY tk"""
    )
    # a request needs the sweep when a stage's spans form more than one block or its stages sum above
    # the interval (overlapping stages)
    con.execute(
        """CREATE OR REPLACE TEMP TABLE ss_fast AS
        SELECT f.* EXCLUDE (blocks_overlap, total),
               f.blocks_overlap > 0 OR f.total > (r.t1 - r.t0) / 1e6 + 1e-6 AS overlap
        FROM ss_fast f JOIN ss_req r USING (tk)"""
    )
    sums = (
        ", ".join(f"sum(b - a) FILTER (WHERE k = {k}) / 1e6 AS {c}" for c, k in k_of.items())
        or "NULL AS c_none"
    )
    # Critical path for the others: elementary segments go to the covering stage that ends last.
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_sweep AS
        WITH iv AS (SELECT tk, k, a, b FROM ss_st WHERE tk IN (SELECT tk FROM ss_fast WHERE overlap)),
        pts AS (SELECT tk, a AS t FROM iv UNION SELECT tk, b FROM iv),
        seg AS (SELECT tk, t AS a, lead(t) OVER (PARTITION BY tk ORDER BY t) AS b FROM pts),
        cov AS (SELECT seg.tk, seg.a, seg.b, arg_max(iv.k, iv.b) AS k
                FROM seg JOIN iv ON seg.tk = iv.tk AND iv.a <= seg.a AND iv.b >= seg.b
                WHERE seg.b IS NOT NULL GROUP BY seg.tk, seg.a, seg.b)
        SELECT tk, {sums} FROM cov GROUP BY tk"""
    )
    col_list = list(cols.values())
    picked = ", ".join(
        f"CASE WHEN f.overlap THEN coalesce(w.{c}, 0) ELSE coalesce(f.{c}, 0) END AS {c}" for c in col_list
    )
    total = " + ".join(col_list) if col_list else "0"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {BREAKDOWN} AS
        WITH b AS (
            SELECT r.trace_ref, r.t0 AS start_unix_ns, r.value_ms{", " + picked if picked else ""}, r.network,
                   {", ".join(f"r.{c}" for c in REQUEST_ATTRIBUTES)}, r.sw, r.exact
            FROM ss_req r LEFT JOIN ss_fast f USING (tk) LEFT JOIN ss_sweep w USING (tk)
        )
        SELECT b.* EXCLUDE (network, {", ".join(REQUEST_ATTRIBUTES)}, sw, exact),
               greatest(b.value_ms - ({total}), 0) AS unattributed, b.network, {", ".join(REQUEST_ATTRIBUTES)}, b.sw,
               b.exact
        FROM b"""
    )
    kinds_of_rows(con, cat, "ss_st")
    for t in ("ss_fast", "ss_sweep", "ss_st"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return cols


def with_columns(cols: str) -> str:
    """``ss_breakdown`` with columns ``cols`` computed from its per-request attributes."""
    return f"(SELECT *, {cols} FROM {BREAKDOWN})"
