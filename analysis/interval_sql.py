"""The confidence intervals of analysis.intervals computed over DuckDB relations: several quantiles
with their intervals in one pass, weighted quantiles, and per-window intervals.

Unweighted samples get order-statistic intervals at no extra pass: ``quantile_cont`` at level
``(k - 1) / (n - 1)`` is exactly the ``k``-th order statistic, so the interval's ends are extra levels
of the same aggregate. Weighted samples get Woodruff's effective sample size (one more pass) and the
weighted quantiles at its levels. Per time window, the order statistics come from a bounded heap of
each window's largest values (``max(value_ms, K)``), not from sorting the windows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from stagescope.analysis.intervals import (
    METHOD_ORDER,
    METHOD_WEIGHTED,
    Estimate,
    effective_n,
    estimate,
    levels,
    rank_bounds,
    woodruff_sum_sql,
)
from stagescope.analysis.weighting import breakdown_quantile, weighted_quantiles

__all__ = ["breakdown_estimate", "quantile_estimates", "window_intervals"]


def _interval_levels(
    qs: Mapping[str, float], n_eff: Mapping[str, float]
) -> dict[str, tuple[float | None, float | None]]:
    return {k: levels(n_eff[k], q) for k, q in qs.items()}


def _pick(
    got: Mapping[float, float | None], ends: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    lo, hi = ends
    return (None if lo is None else got.get(lo), None if hi is None else got.get(hi))


def quantile_estimates(
    con: duckdb.DuckDBPyConnection,
    src: str,
    expr: str,
    qs: Mapping[str, float],
    n: int,
    weight: str | None = None,
    digits: int | None = None,
) -> dict[str, Estimate | None]:
    """Each named quantile level of ``qs`` of ``expr`` over ``src`` (``n`` non-null rows) as an
    :class:`Estimate` with its interval. Unweighted: one ``quantile_cont`` pass whose extra levels
    are the order statistics of the interval's ends. Weighted: the weighted quantiles, Woodruff's
    effective sample sizes (one pass) and the weighted quantiles at their levels. ``digits``: round
    to that many decimals (None: as computed)."""
    keys = list(qs)
    if n <= 0 or not keys:
        return dict.fromkeys(keys)
    if weight is None:
        ends = _interval_levels(qs, {k: float(n) for k in keys})
        flat = sorted({qs[k] for k in keys} | {x for e in ends.values() for x in e if x is not None})
        row = con.execute(f"SELECT quantile_cont({expr}, {flat!r}) FROM {src}").fetchone()
        got = dict(zip(flat, row[0] if row and row[0] else [None] * len(flat), strict=True))
        return {k: estimate(got[qs[k]], _pick(got, ends[k]), METHOD_ORDER, n, digits) for k in keys}
    vals = dict(zip(keys, weighted_quantiles(con, src, expr, [qs[k] for k in keys], weight), strict=True))
    sums = [f"sum(CAST(({weight}) AS DOUBLE))"] + [
        "NULL" if (v := vals[k]) is None else woodruff_sum_sql(expr, weight, qs[k], float(v)) for k in keys
    ]
    row = con.execute(f"SELECT {', '.join(sums)} FROM {src} WHERE ({expr}) IS NOT NULL").fetchone()
    total = float(row[0] or 0.0) if row else 0.0
    n_eff = {
        k: effective_n(total, float(row[i + 1] or 0.0) if row else 0.0, qs[k]) for i, k in enumerate(keys)
    }
    ends = _interval_levels(qs, n_eff)
    flat = sorted({x for e in ends.values() for x in e if x is not None})
    at = dict(zip(flat, weighted_quantiles(con, src, expr, flat, weight), strict=True))
    return {
        k: estimate(vals[k], _pick(at, ends[k]), METHOD_WEIGHTED, round(n_eff[k], 1), digits) for k in keys
    }


def window_intervals(
    con: duckdb.DuckDBPyConnection,
    src: str,
    bucket: str,
    q: float,
    qhat: Mapping[Any, float | None],
    weight: str | None = None,
) -> dict[Any, tuple[float | None, float | None]]:
    """Per window (``bucket``: SQL giving each row's window), the interval of the ``q`` quantile of
    ``value_ms`` over ``src``; ``qhat`` holds each window's estimate (needed for the weighted case).

    Unweighted: the window's order statistics, read from the ``K`` largest values of each window
    (``max(value_ms, K)``, a bounded heap, with ``K`` the deepest rank any window needs), or the
    smallest for a quantile below the median: one pass, no sort of the whole window. Weighted:
    Woodruff's effective sample size per window and the weighted quantiles at its levels."""
    if weight is None:
        counts = dict(con.execute(f"SELECT {bucket} AS w, count(*) FROM {src} GROUP BY 1").fetchall())
        ranks = {w: rank_bounds(int(n), q) for w, n in counts.items()}
        top = q >= 0.5
        depth = [
            (int(counts[w]) - r + 1) if top else r
            for w, (lo, hi) in ranks.items()
            for r in ((lo, hi) if top else (hi, lo))
            if r is not None
        ]
        if not depth:
            return {w: (None, None) for w in counts}
        k = max(depth)
        agg = f"max(value_ms, {k})" if top else f"min(value_ms, {k})"
        lists = dict(con.execute(f"SELECT {bucket} AS w, {agg} FROM {src} GROUP BY 1").fetchall())
        out: dict[Any, tuple[float | None, float | None]] = {}
        for w, (lo, hi) in ranks.items():
            xs, n = lists.get(w) or [], int(counts[w])

            def at(r: int | None, xs: list[float] = xs, n: int = n) -> float | None:
                if r is None:
                    return None
                i = n - r if top else r - 1  # position of the r-th smallest in the list
                return float(xs[i]) if 0 <= i < len(xs) else None

            out[w] = (at(lo), at(hi))
        return out
    vals = ", ".join(f"({w!r}, {float(v)!r})" for w, v in qhat.items() if v is not None)
    if not vals:
        return {w: (None, None) for w in qhat}
    z = f"(CASE WHEN s.value_ms <= h.qv THEN {1.0 - q!r} ELSE {-q!r} END)"
    rows = con.execute(
        f"""WITH h(w, qv) AS (VALUES {vals}),
                 s AS (SELECT {bucket} AS w, value_ms, CAST({weight} AS DOUBLE) AS wt FROM {src})
            SELECT s.w, sum(s.wt), sum(s.wt * (s.wt - 1.0) * {z} * {z}) FROM s JOIN h USING (w) GROUP BY 1"""
    ).fetchall()
    lv = {w: levels(effective_n(float(t or 0.0), float(d or 0.0), q), q) for w, t, d in rows}
    spec = ", ".join(
        f"({w!r}, {(-1.0 if a is None else a)!r}, {(-1.0 if b is None else b)!r})" for w, (a, b) in lv.items()
    )
    if not spec:
        return {w: (None, None) for w in qhat}
    picks = []
    for col in ("a", "b"):
        h = f"(l.{col} * (c.t - 1))"
        picks.append(
            f"max(c.v) FILTER (WHERE l.{col} >= 0 AND c.r0 <= floor({h})), "
            f"max(c.v) FILTER (WHERE l.{col} >= 0 AND c.r0 <= floor({h}) + 1), any_value({h} - floor({h}))"
        )
    got = con.execute(
        f"""WITH l(w, a, b) AS (VALUES {spec}),
                 k AS (SELECT {bucket} AS w, value_ms AS v, {weight} AS wt FROM {src} WHERE ({weight}) > 0),
                 c AS (SELECT w, v, sum(wt) OVER (PARTITION BY w ORDER BY v ROWS UNBOUNDED PRECEDING) - wt AS r0,
                              sum(wt) OVER (PARTITION BY w) AS t FROM k)
            SELECT c.w, {", ".join(picks)} FROM c JOIN l USING (w) GROUP BY 1"""
    ).fetchall()
    res: dict[Any, tuple[float | None, float | None]] = {w: (None, None) for w in qhat}
    for w, *x in got:
        ends = []
        for i in (0, 3):
            lo_v, hi_v, frac = x[i : i + 3]
            ends.append(
                None
                if lo_v is None
                else float(lo_v)
                + float(frac or 0.0) * (float(hi_v if hi_v is not None else lo_v) - float(lo_v))
            )
        res[w] = (ends[0], ends[1])
    return res


def breakdown_estimate(
    con: duckdb.DuckDBPyConnection,
    src: str,
    expr: str,
    q: float,
    attr: Any = None,
    *,
    part: bool = False,
    weight: str | None = None,
) -> Estimate | None:
    """analysis.weighting.breakdown_quantile (same arguments, same value) as an :class:`Estimate`
    with its 95 % interval: the order statistics of ``expr``'s values where every row counts once
    (the effect model's fitted parameters held fixed), else the same estimator at the levels of
    Woodruff's effective sample size for the rows' weights (the breakdown's strata, or sampling)."""
    wt = weight if attr is None else getattr(attr, "weight", None)
    if wt is None:
        row = con.execute(f"SELECT count({expr}) FROM {src}").fetchone()
        n = int(row[0]) if row else 0
        return None if n == 0 else quantile_estimates(con, src, expr, {"q": q}, n, digits=3)["q"]
    value = breakdown_quantile(con, src, expr, q, attr, part=part, weight=weight)
    if value is None:
        return None
    row = con.execute(
        f"SELECT sum(CAST(({wt}) AS DOUBLE)) FILTER (WHERE ({expr}) IS NOT NULL), "
        f"{woodruff_sum_sql(expr, wt, q, value)} FROM {src}"
    ).fetchone()
    n_eff = effective_n(float(row[0] or 0.0), float(row[1] or 0.0), q) if row else 0.0
    lo, hi = levels(n_eff, q)
    ends = [None if x is None else breakdown_quantile(con, src, expr, x, attr, part=part, weight=weight) for x in (lo, hi)]
    return estimate(value, (ends[0], ends[1]), METHOD_WEIGHTED, round(n_eff, 1))
