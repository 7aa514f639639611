"""The SLI's latency as a line in the batch size, for the evidence: :data:`BATCH_FIT` (least squares
over every sample, weighted where the samples are; :func:`batch_fit_sql`) and, for inter-token SLIs,
:func:`step_fit` (the decode step time fitted to the median gap per running batch size).

:func:`~stagescope.analysis.attribution.attribute` computes :data:`BATCH_FIT` in its one pass over
every sample and :func:`step_fit` for gap samples; the levers read the fits from the evidence
(``batch_slope_ms``, ``batch_intercept_ms``: milliseconds per batch item and at no batch; ``batch_r2``).
"""

from __future__ import annotations

import duckdb

from stagescope.analysis.weighting import weighted_quantile_sql

__all__ = ["BATCH_FIT", "STEP_FIT_MIN_GAPS", "batch_fit_sql", "step_fit"]

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


def step_fit(con: duckdb.DuckDBPyConnection, src: str, weight: str | None = None) -> dict[str, float | None]:
    """For gap samples: the decode step time as a line in the running batch, fitted to the *median* gap at
    each running batch size (rounded to a whole stream; sizes with at least STEP_FIT_MIN_GAPS gaps),
    each gap counted ``weight`` times where the gaps are weighted (sampled streams).

    The median is the step a stream of that batch usually sees; the mean and a fit over every gap are
    pulled by the rare long gaps (another slot's prompt in the step, a stall of the machine), which on a
    real engine hide the batch's own cost (r² 0.2 for a step that is plainly linear in the batch). It
    replaces :data:`BATCH_FIT`'s least-squares values for inter-token SLIs; r² is that of the medians."""
    known = f"(SELECT * FROM {src} WHERE batch_size IS NOT NULL AND value_ms IS NOT NULL)"
    medians = weighted_quantile_sql(known, "value_ms", 0.5, weight or "1.0", by="round(batch_size)")
    row = con.execute(
        f"""WITH n AS (SELECT round(batch_size) AS b, count(*) AS c FROM {known} GROUP BY 1),
                 m AS (SELECT q.g AS b, q.value AS gap FROM ({medians}) q JOIN n ON n.b = q.g
                       WHERE n.c >= {STEP_FIT_MIN_GAPS})
            SELECT regr_slope(gap, b), regr_intercept(gap, b), regr_r2(gap, b), count(*) FROM m"""
    ).fetchone()
    if row is None or row[3] is None or row[3] < 3:
        return {}
    return {"batch_slope_ms": row[0], "batch_intercept_ms": row[1], "batch_r2": row[2]}


def batch_fit_sql(weighted: bool) -> dict[str, str]:
    """SQL of :data:`BATCH_FIT` over the SLI table, each sample counted ``w`` times where the samples
    are weighted (sampled traces)."""
    if not weighted:
        return dict(BATCH_FIT)
    f = "FILTER (WHERE value_ms IS NOT NULL AND batch_size IS NOT NULL)"
    sw, sx, sy = (f"sum({e}) {f}" for e in ("w", "w * batch_size", "w * value_ms"))
    sxx, sxy, syy = (
        f"sum({e}) {f}" for e in ("w * batch_size ^ 2", "w * batch_size * value_ms", "w * value_ms ^ 2")
    )
    cxy, cxx, cyy = (f"({a} - {b} * {c} / {sw})" for a, b, c in ((sxy, sx, sy), (sxx, sx, sx), (syy, sy, sy)))
    slope = f"({cxy} / nullif({cxx}, 0))"
    return {
        "batch_slope_ms": slope,
        "batch_intercept_ms": f"(({sy}) - {slope} * ({sx})) / nullif({sw}, 0)",
        "batch_r2": f"{cxy} * {cxy} / nullif({cxx} * {cyy}, 0)",
    }
