"""Dashboard 4, "SLO": error budget remaining, burn rate per window, alerts firing.

Reads the recording rules ``stagescope alerts build`` generates from ``alerts/slo.yaml``
(``slo:sli_error:ratio_rate<window>``, ``slo:error_budget:ratio``,
``slo:period_error_budget_remaining:ratio``), so it shows every SLO of the file without being
regenerated when the file changes. Burn rate = error ratio / error budget: 1 spends the budget
exactly over the SLO period; the alerts page at 14.4 (1h and 5m) or 6 (6h and 30m) and open a
ticket at 3 (1d and 2h) or 1 (3d and 6h).
"""

from __future__ import annotations

from typing import Any

from stagescope import names
from stagescope.dashboards import panels as p
from stagescope.dashboards.common import job_model_variables
from stagescope.promql import Matcher, eq, rx, sel, sum_by

__all__ = ["dashboard"]

SLO_SCOPE: tuple[Matcher, ...] = (rx("job", "$job"), rx(names.LABEL_SLO, "$slo"))
ALERTS = "ALERTS"  # Prometheus' synthetic series of pending and firing alerts


def _ratio(window: str) -> str:
    return sel(names.RULE_SLI_ERROR_RATIO_FORMAT.format(window=window), SLO_SCOPE)


def _burn(window: str) -> p.PromTarget:
    budget = sel(names.RULE_SLO_ERROR_BUDGET, SLO_SCOPE)
    return p.target(f"{_ratio(window)}\n/ on ({names.LABEL_SLO})\n{budget}", f"{{{{slo}}}} {window}")


def _budget() -> list[Any]:
    firing = sel(ALERTS, (eq("alertstate", "firing"), *SLO_SCOPE))
    return [
        p.stat(
            "Error budget remaining",
            "Share of the SLO period's error budget left: 1 - (average error ratio over the period) / budget. "
            "Below 0: the budget is spent.",
            [p.target(sel(names.RULE_SLO_BUDGET_REMAINING, SLO_SCOPE), "{{slo}}")],
            "percentunit",
            [("red", None), ("orange", 0.0), ("green", 0.25)],
        ),
        p.stat(
            "Alerts firing now",
            "Number of LatencySLOFastBurn (page) and LatencySLOSlowBurn (ticket) alerts firing for these SLOs.",
            [p.target(f"count({firing}) or vector(0)", "firing")],
            "none",
            [("green", None), ("red", 1.0)],
        ),
        p.table(
            "SLOs",
            "Objective, error budget and latency threshold of each SLO (from alerts/slo.yaml).",
            [
                p.target(sel(names.RULE_SLO_OBJECTIVE, SLO_SCOPE), "objective"),
                p.target(sel(names.RULE_SLO_THRESHOLD, SLO_SCOPE), "threshold (s)"),
            ],
        ),
    ]


def _burn_rates() -> list[Any]:
    return [
        p.timeseries(
            "Burn rate, page windows (1h/5m > 14.4, 6h/30m > 6)",
            "Error ratio / error budget per window. LatencySLOFastBurn fires when 1h and 5m both exceed "
            "14.4, or 6h and 30m both exceed 6.",
            [_burn(w) for w in ("5m", "30m", "1h", "6h")],
            "short",
            dashed=[".* (5m|30m)"],
        ),
        p.timeseries(
            "Burn rate, ticket windows (1d/2h > 3, 3d/6h > 1)",
            "LatencySLOSlowBurn fires when 1d and 2h both exceed 3, or 3d and 6h both exceed 1.",
            [_burn(w) for w in ("2h", "1d", "3d")],
            "short",
            dashed=[".* 2h"],
        ),
        p.timeseries(
            "SLI error ratio against the budget",
            "Share of samples slower than the SLO threshold (5m and 1h windows), and the error budget (dashed).",
            [p.target(_ratio("5m"), "{{slo}} 5m"), p.target(_ratio("1h"), "{{slo}} 1h"),
             p.target(sel(names.RULE_SLO_ERROR_BUDGET, SLO_SCOPE), "budget {{slo}}")],
            "percentunit",
            dashed=["budget.*"],
        ),
    ]  # fmt: skip


def _alerts() -> list[Any]:
    active = sel(ALERTS, (rx("alertstate", "firing|pending"), *SLO_SCOPE))
    return [
        p.timeseries(
            "Burn-rate alerts over time",
            "1 while an alert is pending or firing, per alert, severity and SLO (Prometheus' ALERTS series).",
            [p.target(sum_by(active, ("alertname", names.LABEL_SEVERITY, names.LABEL_SLO, "alertstate")),
                      "{{alertname}} {{severity}} {{slo}} {{alertstate}}")],
            "none",
            bars=True,
        ),
        p.table(
            "Alerts firing",
            "Every burn-rate alert firing now, with its labels.",
            [p.target(sel(ALERTS, (eq("alertstate", "firing"), *SLO_SCOPE)), "")],
        ),
    ]  # fmt: skip


def dashboard() -> Any:
    """The SLO dashboard (uid ``stagescope-slo``)."""
    budget = names.RULE_SLO_ERROR_BUDGET
    variables = [
        *job_model_variables(),
        p.query_variable(
            "slo", "SLO", f"label_values({sel(budget, (rx('job', '$job'),))}, {names.LABEL_SLO})"
        ),
    ]
    panels = p.layout(
        [("Error budget", [_budget()]), ("Burn rate", [_burn_rates()]), ("Alerts", [_alerts()])]
    )
    return p.dashboard(
        "slo",
        "stagescope / SLO",
        "Error budget remaining, burn rate per window and the burn-rate alerts, per SLO of alerts/slo.yaml.",
        panels,
        variables,
    )
