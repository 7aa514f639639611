"""SLO burn-rate alerts and recording rules, as Prometheus rule groups (plain dicts, YAML-ready).

Multi-window, multi-burn-rate alerting after the Google SRE Workbook (chapter 5) and Sloth's names:

* ``slo:sli_error:ratio_rate<w>`` for w in 5m, 30m, 1h, 2h, 6h, 1d, 3d: share of the SLI's samples
  slower than the threshold over w; one series per SLO, labelled ``slo``, ``sli`` and ``job``;
* ``LatencySLOFastBurn`` (``severity="page"``): 1h and 5m both above 14.4 x budget (2% of a 30-day
  budget in an hour), or 6h and 30m both above 6 x (5% in six hours);
* ``LatencySLOSlowBurn`` (``severity="ticket"``): 1d and 2h both above 3 x (10% in a day), or 3d and
  6h both above 1 x (10% in three days).

The short window (long / 12) makes an alert stop soon after the burn stops; both windows must burn,
so there is no ``for:`` clause. Budget = 1 - objective. Metadata series (objective, budget, latency
threshold, budget remaining over the SLO period) feed the SLO dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stagescope import names
from stagescope.alerts.sli import SliQuery, sli_query
from stagescope.promql import eq, histogram_quantile, mean_from_histogram, rate, sel, sum_by
from stagescope.slo import SLO

__all__ = [
    "BURN_RULES",
    "DEFAULT_RUNBOOK",
    "BurnRule",
    "alert_rules",
    "slo_rule_groups",
    "stage_rule_groups",
]

DEFAULT_RUNBOOK = "alerts/RUNBOOK.md"
_PROM_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


@dataclass(frozen=True)
class BurnRule:
    """One condition of an alert: ``long`` and ``short`` windows both above ``factor`` x budget."""

    long: str
    short: str
    factor: float


#: alert name -> (severity, its conditions, what it means)
BURN_RULES: dict[str, tuple[str, tuple[BurnRule, ...], str]] = {
    names.ALERT_FAST_BURN: (
        names.SEVERITY_PAGE,
        (BurnRule("1h", "5m", 14.4), BurnRule("6h", "30m", 6.0)),
        "2% of a 30-day error budget spent in 1 hour, or 5% in 6 hours",
    ),
    names.ALERT_SLOW_BURN: (
        names.SEVERITY_TICKET,
        (BurnRule("1d", "2h", 3.0), BurnRule("3d", "6h", 1.0)),
        "10% of a 30-day error budget spent in 1 day, or in 3 days",
    ),
}


def _ratio(window: str) -> str:
    return names.RULE_SLI_ERROR_RATIO_FORMAT.format(window=window)


def _labels(slo: SLO) -> dict[str, str]:
    out = {names.LABEL_SLO: slo.name, names.LABEL_SLI: slo.sli}
    if slo.service:
        out["job"] = slo.service
    return out


def _budget(slo: SLO) -> str:
    """The error budget as a short decimal (0.01, not 0.010000000000000009)."""
    return f"{slo.error_budget:.10g}"


def _sli_rules(slo: SLO, q: SliQuery) -> list[dict[str, Any]]:
    labels = _labels(slo)
    return [{"record": _ratio(w), "expr": q.error_ratio(w), "labels": labels} for w in names.SLO_WINDOWS]


def _meta_rules(slo: SLO, q: SliQuery) -> list[dict[str, Any]]:
    labels = _labels(slo)
    this = (eq(names.LABEL_SLO, slo.name),)
    rules: list[dict[str, Any]] = [
        {"record": names.RULE_SLO_OBJECTIVE, "expr": f"vector({slo.objective:.10g})", "labels": labels},
        {"record": names.RULE_SLO_ERROR_BUDGET, "expr": f"vector({_budget(slo)})", "labels": labels},
        {"record": names.RULE_SLO_THRESHOLD, "expr": f"vector({q.bound:g})", "labels": labels},
    ]
    period = _ratio(slo.window)
    if slo.window not in names.SLO_WINDOWS:  # average of the 5m ratios over the SLO period (Sloth's way)
        five = sel(_ratio("5m"), this)
        rules.append(
            {
                "record": period,
                "expr": f"{rate(five, slo.window, 'sum_over_time')}\n/\n{rate(five, slo.window, 'count_over_time')}",
                "labels": labels,
            }
        )
    rules.append(
        {
            "record": names.RULE_SLO_BUDGET_REMAINING,
            "expr": f"1 - {sel(period, this)} / {sel(names.RULE_SLO_ERROR_BUDGET, this)}",
            "labels": labels,
        }
    )
    return rules


def _condition(slo: SLO, rule: BurnRule) -> str:
    this = (eq(names.LABEL_SLO, slo.name),)
    limit = f"({rule.factor:g} * {_budget(slo)})"
    return (
        f"(\n    {sel(_ratio(rule.long), this)} > {limit}\n  and\n"
        f"    {sel(_ratio(rule.short), this)} > {limit}\n)"
    )


def alert_rules(slo: SLO, q: SliQuery, runbook: str = DEFAULT_RUNBOOK) -> list[dict[str, Any]]:
    """``LatencySLOFastBurn`` and ``LatencySLOSlowBurn`` for one SLO (no ``for:``: both windows must burn)."""
    out = []
    where = f" on {slo.route}" if slo.route else ""
    for alert, (severity, conds, meaning) in BURN_RULES.items():
        windows = " or ".join(f"{c.long}&{c.short} > {c.factor:g}x" for c in conds)
        description = (
            f"{slo.service or 'the service'}{where}: more than the error budget allows of {slo.sli} samples "
            f"are slower than {slo.threshold_ms:g} ms ({slo.spec}, objective {slo.objective:.10g} over "
            f"{slo.window}; burn-rate windows {windows}: {meaning}). "
            "Long-window error ratio now: {{ $value | humanizePercentage }}. "
            f"Find the stage that ate the time: stagescope analyze --slo '{slo.spec}'."
        )
        if q.ignored:
            description += f" Not filtered in PromQL (no such label on {q.metric}): {', '.join(q.ignored)}."
        out.append(
            {
                "alert": alert,
                "expr": "\nor\n".join(_condition(slo, c) for c in conds),
                "labels": {**_labels(slo), names.LABEL_SEVERITY: severity},
                "annotations": {
                    "summary": f"SLO {slo.name} ({slo.spec}) is burning its error budget "
                    f"{'fast' if severity == names.SEVERITY_PAGE else 'slowly'}",
                    "description": description,
                    "runbook_url": f"{runbook}#{alert.lower()}",
                },
            }
        )
    return out


def _check_window(slo: SLO) -> None:
    if not _PROM_DURATION.match(slo.window):
        raise ValueError(f"window {slo.window!r} is not a Prometheus duration (e.g. 30d, 4w)")


def slo_rule_groups(slos: Sequence[SLO], runbook: str = DEFAULT_RUNBOOK) -> list[dict[str, Any]]:
    """One group per SLO: SLI error ratios, metadata, then the alerts. Raises ``ValueError`` on a bad SLO.

    One group, not three: rules of a group run in order at each evaluation, so the alerts read the
    error ratios of the same evaluation (groups run independently, and an alert in another group would
    see ratios one interval old, or fresh ones, depending on scheduling).
    """
    groups: list[dict[str, Any]] = []
    for slo in slos:
        _check_window(slo)
        q = sli_query(slo)
        rules = [*_sli_rules(slo, q), *_meta_rules(slo, q), *alert_rules(slo, q, runbook)]
        groups.append({"name": f"slo-{slo.name}", "rules": rules})
    return groups


def stage_rule_groups() -> list[dict[str, Any]]:
    """Per-stage p99 and mean, per-route p99, and the queue-depth series autoscalers read."""
    # kind is a function of the stage name: grouping by it adds no series and keeps the label, so
    # rules and dashboards can select stages by kind
    by_stage = ("job", names.LABEL_MODEL, names.LABEL_STAGE, names.LABEL_KIND)
    return [
        {
            "name": "stagescope-stages",
            "rules": [
                {
                    "record": names.RULE_STAGE_P99,
                    "expr": histogram_quantile(0.99, names.METRIC_STAGE_DURATION, (), "5m", by_stage),
                },
                {
                    "record": names.RULE_STAGE_MEAN,
                    "expr": mean_from_histogram(names.METRIC_STAGE_DURATION, (), "5m", by_stage),
                },
                {
                    "record": names.RULE_REQUEST_P99,
                    "expr": histogram_quantile(
                        0.99, names.METRIC_REQUEST_DURATION, (), "5m", ("job", names.LABEL_ROUTE)
                    ),
                },
            ],
        },
        {
            "name": "stagescope-autoscaling",
            "rules": [
                {
                    "record": names.RULE_QUEUE_DEPTH,
                    "expr": sum_by(
                        rate(sel(names.METRIC_QUEUE_DEPTH), "1m", "avg_over_time"), ("job", names.LABEL_MODEL)
                    ),
                },
            ],
        },
    ]
