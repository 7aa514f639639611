"""How many requests each analysed row stands for, and the weighted statistics that use it.

Two things make a row stand for more than one request, and they are combined here in one weight:

* **sampling** (Horvitz-Thompson): a request whose trace was kept with probability ``p`` (the
  ingest's ``requests.sampling_p``, from OpenTelemetry's ``th``) stands for ``1 / p`` requests.
  stagescope's default keeps every slow or failed request (``p = 1``) and 1 % of the rest
  (``p = 0.01``, weight 100): unweighted, the kept requests are mostly slow ones and every quantile
  is far too high. A request of unknown probability (``sampling_p`` NULL) counts once;
* **strata**: on large inputs the breakdown covers a stratified sample of the samples (see
  attribution), and where a complete source gave the SLI samples (sources) the breakdown's traced
  requests are calibrated to it. A stratum's rows then weigh ``W / w_rows``: the stratum's weight
  in the SLI samples over its rows' sampling weights in the breakdown, so each stratum weighs exactly
  what the complete samples say it holds (a ratio estimator within each stratum).

With every weight 1 the weighted statistics equal DuckDB's own (``quantile_cont``, ``avg``,
``regr_slope``); the analysis uses those then, as they are faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb

from stagescope.analysis.keys import has_columns

__all__ = [
    "breakdown_quantile",
    "mean_sql",
    "sampling_kind_sql",
    "sampling_weight_sql",
    "stratum_weights",
    "weighted_quantile",
    "weighted_quantile_sql",
    "weighted_quantiles",
    "weighted_slope",
]


def sampling_weight_sql(con: duckdb.DuckDBPyConnection, alias: str = "") -> str:
    """SQL for a ``requests`` row's sampling weight: ``1 / sampling_p``, 1 where the probability is
    unknown or the relation has no ``sampling_p`` (built by hand, Parquet from before it existed)."""
    if not has_columns(con, "requests", "sampling_p"):
        return "1.0"
    p = f"{alias}sampling_p"
    return f"(CASE WHEN {p} > 0 THEN 1.0 / {p} ELSE 1.0 END)"


def sampling_kind_sql(con: duckdb.DuckDBPyConnection, alias: str = "") -> str:
    """SQL: 0 where a ``requests`` row's sampling probability is known, 2 where it is unknown though
    ``sampled_reason`` says it was sampled, 1 where it is unknown (no sign of sampling)."""
    if not has_columns(con, "requests", "sampling_p", "sampled_reason"):
        return "1"
    return f"(CASE WHEN {alias}sampling_p IS NOT NULL THEN 0 WHEN {alias}sampled_reason IS NOT NULL THEN 2 ELSE 1 END)"


def mean_sql(expr: str, cond: str | None, weight: str | None) -> str:
    """SQL aggregate: the mean of ``expr`` over rows where ``cond`` holds (NULLs skipped, as ``avg``
    does), each row counted ``weight`` times (None: once)."""
    flt = f" FILTER (WHERE {cond})" if cond else ""
    if weight is None:
        return f"avg({expr}){flt}"
    known = f"({cond}) AND ({expr}) IS NOT NULL" if cond else f"({expr}) IS NOT NULL"
    return f"(sum(({weight}) * ({expr})){flt} / nullif(sum({weight}) FILTER (WHERE {known}), 0))"


#: Decimal places weighted ranks are rounded to before they are compared: weights are 1/p sums
#: (1/0.2 is 5.000000000000001 in binary), and without rounding a float error in the running sum
#: moves a quantile by a whole rank. A millionth of a sample is far below any rank that matters.
_RANK_DIGITS = 6


def weighted_quantile_sql(src: str, expr: str, q: float, weight: str, by: str | None = None) -> str:
    """SQL of :func:`weighted_quantile` per group of ``by`` (columns ``g``, ``value``), or over all of
    ``src`` (one row, ``g`` NULL)."""
    return f"""WITH v AS (SELECT {by or "NULL"} AS g, {expr} AS v, {weight} AS w FROM {src}),
                 k AS (SELECT * FROM v WHERE v IS NOT NULL AND w > 0),
                 c AS (SELECT g, v, round(sum(w) OVER (PARTITION BY g ORDER BY v ROWS UNBOUNDED PRECEDING) - w,
                                          {_RANK_DIGITS}) AS r0,
                              round({q!r} * (sum(w) OVER (PARTITION BY g) - 1), {_RANK_DIGITS}) AS h FROM k),
                 b AS (SELECT g, max(v) FILTER (WHERE r0 <= floor(h)) AS lo,
                              max(v) FILTER (WHERE r0 <= floor(h) + 1) AS hi, any_value(h - floor(h)) AS frac
                       FROM c GROUP BY g)
            SELECT g, lo + frac * (coalesce(hi, lo) - lo) AS value FROM b"""


def weighted_quantile(
    con: duckdb.DuckDBPyConnection, src: str, expr: str, q: float, weight: str
) -> float | None:
    """Quantile ``q`` of ``expr`` over ``src`` where each row stands for ``weight`` samples (SQL):
    linear interpolation between the samples at ranks ``floor(h)`` and ``floor(h) + 1``,
    ``h = q * (total weight - 1)``; with every weight 1 it is ``quantile_cont``."""
    row = con.execute(f"SELECT value FROM ({weighted_quantile_sql(src, expr, q, weight)})").fetchone()
    return None if row is None or row[0] is None else round(float(row[0]), 3)


def weighted_quantiles(
    con: duckdb.DuckDBPyConnection,
    src: str,
    expr: str,
    levels: Sequence[float],
    weight: str,
    where: str | None = None,
) -> list[float | None]:
    """Several quantiles of :func:`weighted_quantile`'s kind in one sorted pass (unrounded)."""
    if not levels:
        return []
    flt = f" AND ({where})" if where else ""
    picks = ", ".join(
        f"max(v) FILTER (WHERE r0 <= floor({q!r} * (t - 1))), "
        f"max(v) FILTER (WHERE r0 <= floor({q!r} * (t - 1)) + 1), "
        f"any_value({q!r} * (t - 1) - floor({q!r} * (t - 1)))"
        for q in levels
    )
    row = con.execute(
        f"""WITH k AS (SELECT {expr} AS v, {weight} AS w FROM {src} WHERE ({expr}) IS NOT NULL{flt}),
                 c AS (SELECT v, round(sum(w) OVER (ORDER BY v ROWS UNBOUNDED PRECEDING) - w, {_RANK_DIGITS}) AS r0,
                              round(sum(w) OVER (), {_RANK_DIGITS}) AS t FROM k WHERE w > 0)
            SELECT {picks} FROM c"""
    ).fetchone()
    out: list[float | None] = []
    for i in range(len(levels)):
        lo, hi, frac = row[3 * i : 3 * i + 3] if row else (None, None, None)
        out.append(
            None
            if lo is None
            else float(lo) + float(frac or 0.0) * (float(hi if hi is not None else lo) - float(lo))
        )
    return out


def weighted_slope(
    con: duckdb.DuckDBPyConnection, src: str, y: str, x: str, weight: str | None
) -> float | None:
    """Least-squares slope of ``y`` on ``x`` over ``src`` (rows where both are known), each row
    standing for ``weight`` samples (SQL; None: one each, DuckDB's ``regr_slope``). A sampled
    breakdown over-represents the tail, so an unweighted fit over it would lean towards the tail."""
    if weight is None:
        row = con.execute(f"SELECT regr_slope({y}, {x}) FROM {src}").fetchone()
    else:
        row = con.execute(
            f"""WITH v AS (SELECT {y} AS y, {x} AS x, {weight} AS w FROM {src}),
                     k AS (SELECT * FROM v WHERE y IS NOT NULL AND x IS NOT NULL AND w > 0),
                     m AS (SELECT sum(w * x) / sum(w) AS mx, sum(w * y) / sum(w) AS my FROM k)
                SELECT sum(w * (x - mx) * (y - my)) / nullif(sum(w * (x - mx) * (x - mx)), 0) FROM k, m"""
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def stratum_weights(
    con: duckdb.DuckDBPyConnection,
    strata: Sequence[tuple[str, float]],
    table: str,
    row_weight: str,
    exact: str | None = None,
) -> str:
    """SQL for how many samples each row of ``table`` stands for: its ``row_weight`` (the sampling
    weight) times its stratum's factor, ``W / w_rows``: the stratum's weight ``W`` in the SLI samples
    (``strata``: (condition, W), disjoint, in order) over the rows' summed ``row_weight`` in ``table``.
    A stratum that has weight but no rows hands it to the next stratum with rows (the previous one
    for the last), so the total weight is kept.

    ``exact`` (SQL, a boolean column): rows that stand for themselves only, wherever they are (kept
    with probability 1 from a breakdown of every traced request: every slow request is there). They
    weigh 1; the stratum's other weight, ``W`` less their number, goes to its other rows."""
    ex = exact or "false"
    got = con.execute(
        "SELECT "
        + ", ".join(
            f"coalesce(sum({row_weight}) FILTER (WHERE ({c}) AND NOT {ex}), 0), count(*) FILTER (WHERE ({c}) AND {ex})"
            for c, _ in strata
        )
        + f" FROM {table}"
    ).fetchone()
    vals = [float(v) for v in got] if got else [0.0] * (2 * len(strata))
    have, fixed = vals[0::2], vals[1::2]
    want = [max(0.0, float(w) - f) for (_, w), f in zip(strata, fixed, strict=True)]
    for i in range(len(strata)):  # move weight off strata with no rows to scale
        if want[i] and not have[i]:
            j = next((k for k in range(i + 1, len(strata)) if have[k]), None)
            if j is None:
                j = next((k for k in range(i - 1, -1, -1) if have[k]), None)
            if j is not None:
                want[j] += want[i]
                want[i] = 0.0
    whens = " ".join(f"WHEN {c} THEN {w / h!r}" for (c, _), w, h in zip(strata, want, have, strict=True) if h)
    factor = f"(CASE {whens} ELSE 0.0 END)" if whens else "1.0"
    scaled = factor if row_weight == "1.0" else f"({row_weight} * {factor})"
    return scaled if exact is None else f"(CASE WHEN {exact} THEN 1.0 ELSE {scaled} END)"


def breakdown_quantile(
    con: duckdb.DuckDBPyConnection,
    src: str,
    expr: str,
    q: float,
    attr: Any = None,
    *,
    part: bool = False,
    weight: str | None = None,
) -> float | None:
    """Quantile ``q`` of ``expr`` over ``src`` (the breakdown, or ``part`` of it); ``attr`` is the
    analysis.attribution ``Attribution`` whose weights the breakdown rows carry.

    When ``attr`` says the breakdown is a sample (large inputs), every request outside the
    candidates stays at or below ``lower_ms`` (a lever only removes time), so a quantile of the whole
    breakdown that lands above ``lower_ms`` is the matching quantile of the candidates' new values:
    exact when all candidates are there, the sample's estimate otherwise. Any other quantile is
    weighted by stratum (:func:`weighted_quantile`). Where the weights vary within strata (sampled
    traces: ``attr.weighted``), or ``weight`` is given without ``attr``, the quantile is weighted."""
    if attr is not None and attr.weighted and attr.weight is not None:
        return weighted_quantile(con, src, expr, q, attr.weight)
    if attr is None and weight is not None:
        return weighted_quantile(con, src, expr, q, weight)
    if attr is not None and attr.weight is not None:
        if not part and attr.lower_ms is not None and attr.candidates > 0:
            n, m = attr.total, attr.candidates
            idx = q * (n - 1) - (n - m)  # position of the quantile among the m candidates (fractional)
            if idx >= 0:
                pos = min(1.0, idx / (m - 1)) if m > 1 else 0.0
                row = con.execute(
                    f"SELECT quantile_cont({expr}, {pos!r}) FROM {src} WHERE value_ms > {attr.lower_ms!r}"
                ).fetchone()
                if row and row[0] is not None and float(row[0]) > attr.lower_ms:
                    return round(float(row[0]), 3)
        return weighted_quantile(con, src, expr, q, attr.weight)
    row = con.execute(f"SELECT quantile_cont({expr}, {q}) FROM {src}").fetchone()
    return None if row is None or row[0] is None else round(float(row[0]), 3)
