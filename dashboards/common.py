"""Pieces more than one dashboard uses: the job and model variables, the SLO threshold series."""

from __future__ import annotations

from grafanalib import core as g

from stagescope import names
from stagescope.dashboards import panels as p
from stagescope.promql import eq, rx, sel

__all__ = ["job_model_variables", "slo_threshold"]


def job_model_variables() -> list[g.Template]:
    """``$job`` (Prometheus scrape job) and ``$model`` (stagescope's folded model label)."""
    count = names.METRIC_REQUEST_DURATION + "_count"
    return [
        p.query_variable("job", "Job", f"label_values({count}, job)"),
        p.query_variable("model", "Model", f"label_values({sel(count, (rx('job', '$job'),))}, model)"),
    ]


def slo_threshold(sli: str) -> p.PromTarget:
    """The latency thresholds of the ``sli`` SLOs of ``$job`` (recording rule from ``alerts/slo.yaml``)."""
    series = sel(names.RULE_SLO_THRESHOLD, (rx("job", "$job"), eq(names.LABEL_SLI, sli)))
    return p.target(f"max by ({names.LABEL_SLO}) ({series})", "SLO threshold {{slo}}")
