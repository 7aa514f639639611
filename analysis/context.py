"""What the report says around its verdict: how sure each quantile is (confidence intervals).

Pinned report keys added here (every per-route report too):

* ``confidence`` (0.95); ``quantile_interval_ms`` (``[lo, hi]`` beside ``quantile_ms``, ``None`` ends
  where unbounded); ``quantile_interval`` (``method``, ``samples`` (effective), ``conclusive``: whether
  the interval lies on one side of the threshold, ``why`` not); ``latency_interval_ms``
  (``{"p50": [lo, hi], "p95": ..., "p99": ...}``);
* per window ``quantile_interval_ms`` (analysis.breach); per attribution row
  ``counterfactual_interval_ms``; per lever ``interval_ms`` beside ``predicted_p99_ms``.

Intervals respect the samples' weights where the analysis weights them (analysis.intervals:
Woodruff's effective sample size); with every weight 1 they are the order-statistic intervals.
"""

from __future__ import annotations

from typing import Any

from stagescope.analysis import intervals as I
from stagescope.analysis.breach import SLIView

__all__ = ["annotate", "empty_fields", "quantile_fields"]


def empty_fields() -> dict[str, Any]:
    """The keys of :func:`quantile_fields` and :func:`annotate` for a report without samples."""
    return {
        "confidence": I.CONFIDENCE,
        "quantile_interval_ms": None,
        "quantile_interval": None,
        "latency_interval_ms": {"p50": None, "p95": None, "p99": None},
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


def annotate(report: dict[str, Any]) -> None:
    """Add the intervals of the stage counterfactuals and the lever predictions to ``report`` (in
    place), and make their values plain floats for the JSON."""
    for r in report.get("attribution", []):
        cf = r.get("counterfactual_ms")
        r["counterfactual_interval_ms"] = _ms(cf)
        r["counterfactual_ms"] = _plain(cf)
    for lv in report.get("levers", []):
        pred = lv.get("predicted_p99_ms")
        lv["interval_ms"] = _ms(pred)
        lv["predicted_p99_ms"] = _plain(pred)
