"""What the report says around its verdict: how sure each quantile is (confidence intervals) and
what the service's requests and each lever cost.

Pinned report keys added here (every per-route report too):

* ``confidence`` (0.95); ``quantile_interval_ms`` (``[lo, hi]`` beside ``quantile_ms``, ``None`` ends
  where unbounded); ``quantile_interval`` (``method``, ``samples`` (effective), ``conclusive``: whether
  the interval lies on one side of the threshold, ``why`` not); ``latency_interval_ms``
  (``{"p50": [lo, hi], "p95": ..., "p99": ...}``);
* per window ``quantile_interval_ms`` (analysis.breach); per attribution row
  ``counterfactual_interval_ms``; per lever ``interval_ms`` beside ``predicted_p99_ms`` and
  ``cost_delta`` (analysis.cost.lever_cost_delta);
* ``cost`` (analysis.cost.cost_report, or None when the data holds no basis for it);
* ``event_breaches`` and ``event_summary`` (analysis.event_attribution: the breach episodes, the
  deploy, scale event or model swap each follows, its levers) beside ``events`` (analysis.events).

Intervals respect the samples' weights where the analysis weights them (analysis.intervals:
Woodruff's effective sample size); with every weight 1 they are the order-statistic intervals.
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope.analysis import cost as CO
from stagescope.analysis import intervals as I
from stagescope.analysis.attribution import Attribution
from stagescope.analysis.breach import SLIView
from stagescope.analysis.event_attribution import attribute as attribute_events

__all__ = ["annotate", "empty_fields", "quantile_fields"]


def empty_fields() -> dict[str, Any]:
    """The keys of :func:`quantile_fields` and :func:`annotate` for a report without samples."""
    return {
        "confidence": I.CONFIDENCE,
        "quantile_interval_ms": None,
        "quantile_interval": None,
        "latency_interval_ms": {"p50": None, "p95": None, "p99": None},
        "cost": None,
    }


def _ms(x: Any) -> list[float | None] | None:
    iv = I.interval_of(x)
    return None if iv is None else [None if v is None else round(float(v), 3) for v in iv]


def quantile_fields(qs: dict[str, Any], view: SLIView) -> dict[str, Any]:
    """The interval keys of the SLO quantile and the p50/p95/p99 (see the module docstring)."""
    q = qs.get("q")
    iv = _ms(q)
    ok, why = I.conclusive(q, iv, view.slo.threshold_ms, view.slo.quantile, float(getattr(q, "samples", 0.0)))
    return {
        "confidence": I.CONFIDENCE,
        "quantile_interval_ms": iv,
        "quantile_interval": None
        if q is None
        else {
            "method": getattr(q, "method", I.METHOD_ORDER),
            "samples": getattr(q, "samples", view.count),
            "conclusive": ok,
            "why": why,
        },
        "latency_interval_ms": {k: _ms(qs.get(k)) for k in ("p50", "p95", "p99")},
    }


def _plain(x: Any) -> float | None:
    return None if x is None else float(x)


def annotate(
    con: duckdb.DuckDBPyConnection,
    report: dict[str, Any],
    view: SLIView,
    attr: Attribution | None,
    ev: dict[str, Any],
    events: list[dict[str, Any]] | None = None,
) -> None:
    """Add the intervals of the stage counterfactuals and the lever predictions (their values made
    plain floats for the JSON), the cost and each lever's cost change, and the breaches that follow
    ``events`` with their levers, to ``report`` (in place)."""
    for r in report.get("attribution", []):
        cf = r.get("counterfactual_ms")
        r["counterfactual_interval_ms"] = _ms(cf)
        r["counterfactual_ms"] = _plain(cf)
    cost = CO.cost_report(con, view, attr, view.slo.accelerator_price_per_hour)
    report["cost"] = cost
    for lv in report.get("levers", []):
        pred = lv.get("predicted_p99_ms")
        lv["interval_ms"] = _ms(pred)
        lv["predicted_p99_ms"] = _plain(pred)
        lever = lv.get("lever")
        lv["cost_delta"] = (
            None if lever is None else CO.lever_cost_delta(cost, CO.lever_effect(con, view, attr, ev, lever))
        )
    if events and report.get("windows"):
        report["event_breaches"], report["event_summary"] = attribute_events(
            con, view, report["windows"], events, ev, cost
        )
