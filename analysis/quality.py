"""What a service measured about its model variants, read from its exported metrics.

A service that can switch its model to the variant a lever would serve (INT8 weights for
``quantize``, a graph-optimized runtime for ``compile-runtime``) may export what it measured about
each variant (the reference service does when it loads, see its ``variants`` module; any service
can export the same families): the variant's accuracy on the model's held-out eval set and the
median CPU time of one batch at a few batch sizes. This module reads them from ``metric_samples``
(the latest scrape wins) and answers two questions for the lever models and rules:

* :func:`speed_curve`: how much faster the lever's variant runs a batch, per measured batch size;
  a request's compute is scaled by the ratio of the measured batch whose time is nearest its own
  (:func:`ratio_sql`), so a prediction is the service's measurement, not an assumed speed-up;
* :func:`gate`: whether the lever's accuracy cost stays within the SLO's ``quality_budget``
  (points of accuracy); beyond it the lever is not acceptable whatever it saves.

The same holds for a fleet-changing lever: :func:`service_ratio` reads one request's service time
with every executor busy as served and with the lever's fleet (``scale-out``'s added servers), so
the scale-out model uses the added servers' measured speed instead of assuming they are as fast.

Without the families there is no effect model (the caller says "measure after applying"), and the
quality gate is unknown (the rationale says to validate on an eval set).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import duckdb

from stagescope import names as N

__all__ = ["describe_curve", "gate", "model_facts", "nearest_ratio", "ratio_sql", "service_ratio", "speed_curve"]


def model_facts(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """``{"model", "accuracy": {variant: share}, "eval_samples", "batch_ms": {variant: {rows: ms}}}``
    from the last scrape of each series, or ``{}`` when no such family was scraped. With several
    models, the one with the most batch-time series is described."""
    try:
        rows = con.execute(
            """SELECT metric, labels[?] AS model, labels[?] AS variant, labels[?] AS nrows, arg_max(value, coalesce(ts_ms, 0))
                FROM metric_samples WHERE metric IN (?, ?, ?) AND value IS NOT NULL GROUP BY ALL""",
            [N.LABEL_MODEL, N.LABEL_VARIANT, N.LABEL_ROWS, N.METRIC_MODEL_EVAL_ACCURACY,
             N.METRIC_MODEL_EVAL_SAMPLES, N.METRIC_MODEL_VARIANT_BATCH],
        ).fetchall()  # fmt: skip
    except duckdb.Error:
        return {}
    per_model: dict[str, dict[str, Any]] = {}
    for metric, model, variant, nrows, value in rows:
        if model is None or variant is None or value is None or not math.isfinite(float(value)):
            continue
        m = per_model.setdefault(model, {"model": model, "accuracy": {}, "eval_samples": None, "batch_ms": {}})
        if metric == N.METRIC_MODEL_EVAL_ACCURACY:
            m["accuracy"][variant] = round(float(value), 6)
        elif metric == N.METRIC_MODEL_EVAL_SAMPLES and variant == N.VARIANT_SERVING:
            m["eval_samples"] = int(value)
        elif metric == N.METRIC_MODEL_VARIANT_BATCH and nrows is not None and nrows.isdigit():
            m["batch_ms"].setdefault(variant, {})[int(nrows)] = round(float(value) * 1000.0, 4)
    if not per_model:
        return {}
    return max(per_model.values(), key=lambda m: (sum(len(v) for v in m["batch_ms"].values()), m["model"]))


def speed_curve(facts: dict[str, Any], lever: str) -> list[tuple[float, float, int]]:
    """``(serving ms, new / old, rows)`` per batch size the service measured both as served and with
    ``lever``'s variant, fastest first; empty when it exported no such pair."""
    serving = (facts.get("batch_ms") or {}).get(N.VARIANT_SERVING) or {}
    other = (facts.get("batch_ms") or {}).get(lever) or {}
    pts = [(serving[r], other[r] / serving[r], r) for r in serving if r in other and serving[r] > 0 and other[r] > 0]
    return sorted(pts)


def ratio_sql(curve: list[tuple[float, float, int]], compute_sql: str) -> str:
    """SQL: the ratio of the measured batch whose serving time is nearest (log scale) to the request's
    own compute time ``compute_sql`` (ms), so a large batch gets a large batch's measured ratio."""
    if len(curve) == 1:
        return f"CAST({curve[0][1]!r} AS DOUBLE)"
    parts = []
    for (a, ra, _), (b, _, _) in itertools.pairwise(curve):
        parts.append(f"WHEN {compute_sql} < {math.sqrt(a * b)!r} THEN CAST({ra!r} AS DOUBLE)")
    return f"(CASE {' '.join(parts)} ELSE CAST({curve[-1][1]!r} AS DOUBLE) END)"


def nearest_ratio(curve: list[tuple[float, float, int]], compute_ms: float | None) -> tuple[float, int]:
    """(ratio, rows) of the measured batch whose serving time is nearest ``compute_ms`` (the largest
    measured batch when it is unknown)."""
    if not compute_ms or compute_ms <= 0:
        return curve[-1][1], curve[-1][2]
    best = min(curve, key=lambda p: abs(math.log(p[0] / compute_ms)))
    return best[1], best[2]


def describe_curve(curve: list[tuple[float, float, int]], lever: str) -> str:
    """One line: the measured ratios, largest batch first."""
    pts = ", ".join(f"x{r:.2f} at {rows} rows ({ms:.1f} ms)" for ms, r, rows in reversed(curve))
    return (
        f"compute scaled by the ratio of {lever}'s to the served model's batch CPU time that the service "
        f"measured at the batch size nearest each request's compute: {pts}"
    )


def gate(facts: dict[str, Any], lever: str, budget_points: float | None) -> dict[str, Any] | None:
    """The quality gate of a model-changing ``lever``: accuracy as served and with the lever (shares),
    the drop in points, the budget and whether it holds (``acceptable`` None: no budget set). None
    when the service exported no accuracy for that variant."""
    acc = facts.get("accuracy") or {}
    before, after = acc.get(N.VARIANT_SERVING), acc.get(lever)
    if before is None or after is None:
        return None
    drop = round((before - after) * 100.0, 4)
    return {
        "lever": lever,
        "accuracy_before": before,
        "accuracy_after": after,
        "drop_points": drop,
        "budget_points": budget_points,
        "eval_samples": facts.get("eval_samples"),
        "acceptable": None if budget_points is None else drop <= budget_points + 1e-9,
    }


def service_ratio(con: duckdb.DuckDBPyConnection, lever: str) -> tuple[float, float, float] | None:
    """``(lever's / served, served ms, lever's ms)``: one request's time holding an executor with every
    executor busy, as the service measured it with ``lever``'s fleet (``scale-out``: the added
    servers, which on a machine without a free core for them run slower) and as served
    (``stagescope_executor_service_seconds{variant}``, the latest scrape); None without both."""
    try:
        rows = con.execute(
            """SELECT labels[?] AS variant, arg_max(value, coalesce(ts_ms, 0)) FROM metric_samples
                WHERE metric = ? AND value IS NOT NULL GROUP BY 1""",
            [N.LABEL_VARIANT, N.METRIC_EXECUTOR_SERVICE],
        ).fetchall()
    except duckdb.Error:
        return None
    got = {v: float(x) for v, x in rows if v is not None and x is not None and math.isfinite(float(x)) and x > 0}
    if N.VARIANT_SERVING not in got or lever not in got:
        return None
    s, t = got[N.VARIANT_SERVING], got[lever]
    return t / s, s * 1000.0, t * 1000.0
