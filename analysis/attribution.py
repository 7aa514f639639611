"""Attribution: how much of the tail's excess latency each stage explains.

Per request we first split the SLI's interval (arrival to last byte for ``e2e``, arrival to first
token for ``ttft``) into stages along the **critical path**, then compare requests in the tail with a
baseline of normal requests.

Per-request split (table ``ss_breakdown``, one row per request, milliseconds):

* every stage span is clipped to the SLI interval ``[start, start + value]`` (for TTFT only the stages
  before the first token count: queue, prefill, feature fetch ...);
* fast path: when a request's clipped stage spans are disjoint (each stage once, and their total not
  above the interval) a stage's time is the sum of its spans;
* otherwise (parallel fetches, overlapping stages) the interval is cut at every span boundary and each
  elementary segment goes to the covering stage that **ends last**: the one the request was still
  waiting for, i.e. the critical path. A segment counts once, so stages never sum above the request;
* ``unattributed`` is the time in no stage; ``network`` (``e2e`` only) is the client-observed duration
  minus the server duration, where a load-generator CLIENT span exists.

Tail and baseline: the tail is the samples above the threshold when the SLO is breached (else those
at or above the SLO quantile); the baseline is the samples at or below the median and under the
threshold. ``excess_ms`` is a stage's mean in the tail minus its mean in the baseline; ``share`` is
its part of the summed positive excess (negative excess shares 0). Each row names the stage's kind
(:mod:`~stagescope.analysis.kinds`): a team's own stage is a stage of its own, and its kind decides
the lever rules that apply to it.

For inter-token SLOs the samples are gaps, all of them decode time: the excess is the tail gaps' mean
minus the baseline gaps' mean and goes to ``decode``; the evidence (running batch) is in levers.

Large inputs (over :data:`FULL_BREAKDOWN_LIMIT` samples): a stratified sample is broken down (see
:func:`_subset`): the tail candidates (all of them up to :data:`CANDIDATE_SAMPLE`), the baseline and
the requests between them, each drawn by a hash of the arrival time, which is independent of
latency, and weighted by stratum (``Attribution.weight``). Stage means are then sample means; tail
and baseline counts and mean latencies are always over every sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from stagescope.analysis.breach import SLIView, network_expr, sql_str
from stagescope.analysis.keys import REQUEST_KEY, has_request_keys, trace_ref
from stagescope.analysis.kinds import StageCatalog, kinds_of_rows, row_kind_sql, stage_catalog
from stagescope.analysis.queueing import uniform_rank_sql
from stagescope.names import (
    KIND_DECODE,
    KIND_NETWORK,
    STAGE_DECODE,
    STAGE_NETWORK,
    STAGE_OVERFLOW,
    UNATTRIBUTED,
)

__all__ = [
    "Attribution", "attribute", "build_breakdown", "stage_columns", "step_fit"]

BREAKDOWN = "ss_breakdown"


@dataclass
class Attribution:
    """Result of :func:`attribute`; ``columns`` maps stage -> column of ``ss_breakdown``."""

    rows: list[dict[str, Any]]
    tail_n: int
    baseline_n: int
    tail_condition: str
    baseline_condition: str
    columns: dict[str, str] = field(default_factory=dict)
    tail_mean_ms: float | None = None
    baseline_mean_ms: float | None = None
    #: On large inputs ``ss_breakdown`` is a stratified sample (see :func:`_subset`): ``total`` is then
    #: the number of samples in the SLI view and ``candidates`` the number of them above ``lower_ms``.
    lower_ms: float | None = None
    total: int = 0
    view: SLIView | None = None
    candidates: int = 0
    #: A table with the slowest requests left out of a sampled breakdown (for the report's list of
    #: slowest traces; never in the estimates), or None.
    extra: str | None = None
    #: SQL: how many samples each ``ss_breakdown`` row stands for (its stratum's samples over the
    #: stratum's rows in the breakdown); None when the breakdown is complete.
    weight: str | None = None
    #: :data:`BATCH_FIT` and, for per-request SLIs, :data:`SAMPLE_FACTS` and ``requests`` (the SLO's
    #: requests whether or not they have a sample), over every sample, for the evidence.
    facts: dict[str, Any] = field(default_factory=dict)
    #: stage -> kind (analysis.kinds), for every stage in ``columns`` and ``rows``
    kinds: dict[str, str] = field(default_factory=dict)
    #: what the report should say about the stages read (several kinds for one name, names folded)
    warnings: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[str]:
        """The stages of the breakdown (with a column) of ``kind``."""
        return [s for s in self.columns if self.kinds.get(s) == kind]

    @property
    def complete(self) -> bool:
        """Whether ``ss_breakdown`` holds every sample (not a stratified sample of them)."""
        return self.weight is None

    @property
    def top(self) -> str | None:
        return self.rows[0]["stage"] if self.rows and self.rows[0]["excess_ms"] > 0 else None


def stage_columns(con: duckdb.DuckDBPyConnection, table: str = "stages") -> dict[str, str]:
    """Stage name -> safe column name, known stages first in vocabulary order, then any others
    (past analysis.kinds.MAX_STAGES names, the rest as one overflow stage).

    ``network`` is left out: it lies outside the server-side interval and is computed per request
    from the client and server durations instead."""
    return stage_catalog(con, table).columns


#: Least-squares fit of each SLI sample on its request's batch size (for streams the running decode
#: batch; NULL pairs are skipped): :func:`attribute` computes it in its pass over every sample, for
#: the evidence.
BATCH_FIT = {
    "batch_slope_ms": "regr_slope(value_ms, batch_size)",
    "batch_intercept_ms": "regr_intercept(value_ms, batch_size)",
    "batch_r2": "regr_r2(value_ms, batch_size)",
}
#: Fewest gaps at one running batch size for its median to enter :func:`step_fit`.
STEP_FIT_MIN_GAPS = 5


def step_fit(con: duckdb.DuckDBPyConnection, src: str) -> dict[str, float | None]:
    """For gap samples: the decode step time as a line in the running batch, fitted to the *median* gap at
    each running batch size (rounded to a whole stream; sizes with at least STEP_FIT_MIN_GAPS gaps).

    The median is the step a stream of that batch usually sees; the mean and a fit over every gap are
    pulled by the rare long gaps (another slot's prompt in the step, a stall of the machine), which on a
    real engine hide the batch's own cost (r² 0.2 for a step that is plainly linear in the batch). It
    replaces :data:`BATCH_FIT`'s least-squares values for inter-token SLIs; r² is that of the medians."""
    row = con.execute(
        f"""WITH m AS (SELECT round(batch_size) AS b, median(value_ms) AS g FROM {src}
                       WHERE batch_size IS NOT NULL GROUP BY 1 HAVING count(*) >= {STEP_FIT_MIN_GAPS})
            SELECT regr_slope(g, b), regr_intercept(g, b), regr_r2(g, b), count(*) FROM m"""
    ).fetchone()
    if row is None or row[3] is None or row[3] < 3:
        return {}
    return {"batch_slope_ms": row[0], "batch_intercept_ms": row[1], "batch_r2": row[2]}


#: Facts about the tail and baseline requests of a per-request SLI that :func:`attribute` gathers in
#: the same pass, for the evidence (``{tail}`` and ``{base}``: the conditions).
SAMPLE_FACTS = {
    "cold_start_share_tail": "avg(cold_start::INT) FILTER (WHERE {tail})",
    "cold_start_share_baseline": "avg(cold_start::INT) FILTER (WHERE {base})",
    "batch_size_tail": "avg(batch_size) FILTER (WHERE {tail})",
    "batch_size_baseline": "avg(batch_size) FILTER (WHERE {base})",
    "batch_size_max": "max(batch_size)",
    "queue_depth_tail": "avg(queue_depth) FILTER (WHERE {tail})",
    "queue_depth_baseline": "avg(queue_depth) FILTER (WHERE {base})",
}

#: Per-request attributes carried into ``ss_req`` and ``ss_breakdown`` (lever models read them
#: there instead of joining ``requests`` again).
REQUEST_ATTRIBUTES = ("batch_size", "queue_depth", "cold_start", "input_tokens", "itl_mean_ms")


def _requests_sql(con: duckdb.DuckDBPyConnection, view: SLIView, subset: str | None) -> None:
    """Create ``ss_req``: one row per request to break down, read from ``requests`` (the SLI table
    holds no trace ids): ``trace_ref`` (the request's ``trace_key``, or its trace id where the data
    has no keys: see analysis.keys), an integer key ``tk`` (hash of trace_ref and start), SLI
    interval ``t0``-``t1`` (ns), ``value_ms``, ``network``, :data:`REQUEST_ATTRIBUTES` and
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
        f"CAST({view.value_expr} AS DOUBLE) AS value_ms, {net} AS network_ms, {', '.join(REQUEST_ATTRIBUTES)} "
        f"FROM requests WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL"
    )
    where = f"WHERE {subset}" if subset else ""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_req AS
        SELECT trace_ref, hash(trace_ref, start_unix_ns) AS tk, request_key, start_unix_ns AS t0, value_ms,
               start_unix_ns + CAST(round(value_ms * 1e6) AS BIGINT) AS t1, network_ms AS network,
               {", ".join(REQUEST_ATTRIBUTES)}
        FROM ({src}) {where}"""
    )


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
                   {", ".join(f"r.{c}" for c in REQUEST_ATTRIBUTES)}
            FROM ss_req r LEFT JOIN ss_fast f USING (tk) LEFT JOIN ss_sweep w USING (tk)
        )
        SELECT b.* EXCLUDE (network, {", ".join(REQUEST_ATTRIBUTES)}),
               greatest(b.value_ms - ({total}), 0) AS unattributed, b.network, {", ".join(REQUEST_ATTRIBUTES)}
        FROM b"""
    )
    kinds_of_rows(con, cat, "ss_st")
    for t in ("ss_fast", "ss_sweep", "ss_st"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return cols


def _conditions(
    threshold_ms: float, breached: bool, q_ms: float | None, p50_ms: float | None
) -> tuple[str, str]:
    if breached:
        tail = f"value_ms > {threshold_ms!r}"
    else:
        tail = f"value_ms >= {float(q_ms if q_ms is not None else threshold_ms)!r}"
    med = float(p50_ms) if p50_ms is not None else threshold_ms
    base = f"value_ms <= {min(med, threshold_ms)!r}"
    return tail, base


def _rows(
    excess: dict[str, float | None],
    means: dict[str, tuple[float | None, float | None]],
    kinds: dict[str, str],
) -> list[dict[str, Any]]:
    pos = sum(max(v or 0.0, 0.0) for v in excess.values())
    rows: list[dict[str, Any]] = []
    for stage, ex in excess.items():
        if ex is None:
            continue
        tail_m, base_m = means[stage]
        if not tail_m and not base_m:  # a stage that never runs within the SLI interval
            continue
        rows.append(
            {
                "stage": stage,
                "kind": kinds.get(stage),
                "excess_ms": round(ex, 3),
                "share": round(max(ex, 0.0) / pos, 4) if pos > 0 else 0.0,
                "tail_mean_ms": None if tail_m is None else round(tail_m, 3),
                "baseline_mean_ms": None if base_m is None else round(base_m, 3),
            }
        )
    rows.sort(key=lambda r: (-r["share"], -r["excess_ms"]))
    return rows


def attribute(
    con: duckdb.DuckDBPyConnection, view: SLIView, breached: bool, qs: dict[str, float | None]
) -> Attribution:
    """Excess latency per stage, tail against baseline (see the module docstring); ``qs`` are the
    SLI's quantiles (breach.quantiles)."""
    tail, base = _conditions(view.slo.threshold_ms, breached, qs["q"], qs["p50"])
    lower = _lower(view, qs) if view.per_request and view.count > FULL_BREAKDOWN_LIMIT else None
    # counts and mean values of tail and baseline, over every sample (also when the breakdown is a
    # sample); in the same pass, per-request facts for the evidence and, on large inputs, the sizes of
    # the strata and the slowest values
    stats = {
        "tail_n": f"count(*) FILTER (WHERE {tail})", "base_n": f"count(*) FILTER (WHERE {base})",
        "tail_mean": f"avg(value_ms) FILTER (WHERE {tail})", "base_mean": f"avg(value_ms) FILTER (WHERE {base})",
        **BATCH_FIT,
    }  # fmt: skip
    if view.per_request:
        stats.update({k: v.format(tail=tail, base=base) for k, v in SAMPLE_FACTS.items()})
        stats["requests"] = f"(SELECT count(*) FROM requests WHERE {view.request_filter})"
    if lower is not None:
        stats.update(
            {f"stratum{i}": f"count(*) FILTER (WHERE {c})" for i, c in enumerate(_strata(lower, base))}
        )
        stats["slowest_min"] = f"list_min(max(value_ms, {KEEP_SLOWEST}))"
    row = con.execute(f"SELECT {', '.join(stats.values())} FROM {view.name}").fetchone()
    assert row is not None
    got = dict(zip(stats, row, strict=True))
    tn, bn, tm, bm = got["tail_n"], got["base_n"], got["tail_mean"], got["base_mean"]
    facts = {k: got[k] for k in (*BATCH_FIT, *SAMPLE_FACTS, "requests") if k in got}
    if not view.per_request:
        facts.update(step_fit(con, view.name))
        ex = None if tm is None or bm is None else tm - bm
        kinds = {STAGE_DECODE: KIND_DECODE}
        rows = _rows({STAGE_DECODE: ex}, {STAGE_DECODE: (tm, bm)}, kinds)
        return Attribution(rows, int(tn), int(bn), tail, base, {}, tm, bm, facts=facts, kinds=kinds)
    sizes = tuple(got[f"stratum{i}"] for i in range(3)) if lower is not None else ()
    sub = None if lower is None else _subset(lower, base, sizes, got["slowest_min"])
    cat = stage_catalog(con)
    cols = build_breakdown(con, view, sub.condition if sub else None, cat)
    kinds = {s: cat.kinds[s] for s in cols}
    kinds[STAGE_NETWORK] = KIND_NETWORK
    extra = None
    if sub is not None and sub.forced:  # the slowest requests outside the sample: kept apart
        extra = "ss_breakdown_extra"
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {extra} AS SELECT * FROM {BREAKDOWN} WHERE NOT ({sub.sampled})"
        )
        con.execute(f"DELETE FROM {BREAKDOWN} WHERE NOT ({sub.sampled})")
    weight = _weights(con, sub) if sub is not None else None
    parts = dict(cols)
    parts[UNATTRIBUTED] = UNATTRIBUTED
    has_net = con.execute(f"SELECT count(network) FROM {BREAKDOWN}").fetchone()
    if has_net and has_net[0]:
        parts[STAGE_NETWORK] = "network"
    sel = ", ".join(
        f"avg(coalesce({c}, 0)) FILTER (WHERE {tail}), avg(coalesce({c}, 0)) FILTER (WHERE {base})"
        for c in parts.values()
    )
    row = con.execute(f"SELECT {sel} FROM {BREAKDOWN}").fetchone()
    assert row is not None
    excess: dict[str, float | None] = {}
    means: dict[str, tuple[float | None, float | None]] = {}
    for i, stage in enumerate(parts):
        t, b = row[2 * i], row[2 * i + 1]
        means[stage] = (t, b)
        excess[stage] = None if t is None or b is None else t - b
    return Attribution(
        _rows(excess, means, kinds),
        int(tn),
        int(bn),
        tail,
        base,
        cols,
        tm,
        bm,
        sub.lower if sub else None,
        view.count,
        view,
        sub.candidates if sub else 0,
        extra,
        weight,
        facts,
        kinds,
        cat.warnings,
    )


#: Above this many samples the breakdown covers a stratified sample (see :func:`_subset`).
FULL_BREAKDOWN_LIMIT = 200_000
# Sample sizes, fixed whatever the input's size, so the breakdown's cost stops growing with it. Their
# precision: a stratum's mean from n draws has a standard error of sd / sqrt(n), 0.7 % of the stage's
# spread at n = 20,000; the SLO quantile sits near the 90th percentile of the candidates (they start
# at the 1 - 10 * budget quantile), whose rank a sample of 20,000 puts within sqrt(0.9 * 0.1 / 20,000)
# = 0.2 % of the candidates, i.e. within 0.02 % of all samples for a p99 (between p98.98 and p99.02).
#: Baseline requests kept in the breakdown on large inputs (a deterministic hash sample).
BASELINE_SAMPLE = 20_000
#: Tail candidates kept in the breakdown on large inputs; above it a uniform sample of them.
CANDIDATE_SAMPLE = 20_000
#: Requests between the baseline and the candidates kept in the breakdown on large inputs (a sample):
#: they carry a counterfactual quantile that a lever moves below the candidates.
MIDDLE_SAMPLE = 10_000
#: The slowest requests always broken down (the report lists them), in or out of the sample.
KEEP_SLOWEST = 15


@dataclass(frozen=True)
class Subset:
    """Which requests a large input's breakdown covers: ``condition`` (SQL on ``value_ms`` and
    ``start_unix_ns``) = the ``sampled`` ones plus, when ``forced``, the slowest few. ``strata`` are
    (condition, number of samples in it) of the three disjoint strata the sample is drawn from."""

    condition: str
    sampled: str
    lower: float
    forced: bool
    strata: tuple[tuple[str, int], ...]

    @property
    def candidates(self) -> int:
        """Samples above ``lower`` (the first stratum)."""
        return self.strata[0][1]


def _lower(view: SLIView, qs: dict[str, float | None]) -> float:
    """Where the tail candidates start: the lowest of the threshold, the SLO quantile and its
    neighbourhood quantile (breach.neighbourhood_quantile): the tail and everything that could be in
    the SLO quantile's neighbourhood."""
    thr = view.slo.threshold_ms
    return min(thr, *(float(v) for v in (qs["q"], qs["near"]) if v is not None))


def _strata(lower: float, base: str) -> tuple[str, str, str]:
    """The conditions of the three disjoint strata: tail candidates, baseline, between them."""
    return f"value_ms > {lower!r}", base, f"value_ms <= {lower!r} AND NOT ({base})"


def _subset(lower: float, base: str, sizes: tuple[Any, ...], slowest_min: float | None) -> Subset:
    """On large inputs, a sample in three strata (:func:`_strata`): the tail candidates (everything
    above ``lower``), all of them up to :data:`CANDIDATE_SAMPLE`, the baseline
    (:data:`BASELINE_SAMPLE`) and the requests between them (:data:`MIDDLE_SAMPLE`); ``sizes`` are
    the strata's numbers of samples. Each is drawn by a hash of the arrival time, which is
    independent of latency, so means over a stratum are unbiased; counterfactual quantiles are the
    matching quantile of the candidates, or a quantile weighted by stratum (see counterfactual).
    When the candidates are sampled, the :data:`KEEP_SLOWEST` slowest (from ``slowest_min`` up) are
    broken down too."""
    strata = tuple((cond, int(n)) for cond, n in zip(_strata(lower, base), sizes, strict=True))
    rank = uniform_rank_sql("start_unix_ns")
    parts = []
    for (cond, n), limit in zip(strata, (CANDIDATE_SAMPLE, BASELINE_SAMPLE, MIDDLE_SAMPLE), strict=True):
        rate = min(1.0, limit / max(n, 1))
        parts.append(f"({cond})" + (f" AND {rank} < {rate!r}" if rate < 1.0 else ""))
    sampled = " OR ".join(f"({p})" for p in parts)
    if strata[0][1] <= CANDIDATE_SAMPLE:
        return Subset(sampled, sampled, lower, False, strata)
    forced = f"value_ms >= {float(slowest_min)!r}" if slowest_min is not None else "false"
    return Subset(f"{sampled} OR {forced}", sampled, lower, True, strata)


def _weights(con: duckdb.DuckDBPyConnection, sub: Subset) -> str:
    """SQL for the number of samples each breakdown row stands for: its stratum's samples over the
    stratum's rows in the breakdown, so each stratum weighs exactly as many samples as it has."""
    got = con.execute(
        "SELECT " + ", ".join(f"count(*) FILTER (WHERE {c})" for c, _ in sub.strata) + f" FROM {BREAKDOWN}"
    ).fetchone()
    assert got is not None
    whens = " ".join(f"WHEN {c} THEN {n / k!r}" for (c, n), k in zip(sub.strata, got, strict=True) if k)
    return f"(CASE {whens} ELSE 0.0 END)" if whens else "1.0"
