"""Pieces more than one dashboard uses: the job, model and stage variables, the SLO threshold series."""

from __future__ import annotations

from grafanalib import core as g

from stagescope import names
from stagescope.dashboards import defaults as d
from stagescope.dashboards import panels as p
from stagescope.promql import Matcher, eq, rx, sel

__all__ = ["job_model_variables", "slo_threshold", "stage_scope", "stage_variable"]


def job_model_variables() -> list[g.Template]:
    """``$job`` (Prometheus scrape job) and ``$model`` (stagescope's folded model label)."""
    count = names.METRIC_REQUEST_DURATION + "_count"
    return [
        p.query_variable("job", "Job", f"label_values({count}, job)"),
        p.query_variable("model", "Model", f"label_values({sel(count, (rx('job', '$job'),))}, model)"),
    ]


def stage_variable() -> g.Template:
    """``$stage``: every stage name the selected jobs and models report (built-in ones and a team's
    own, read from the stage histogram's label values, so no panel lists stage names)."""
    count = names.METRIC_STAGE_DURATION + "_count"
    return p.query_variable(
        "stage", "Stage", f"label_values({sel(count, (rx('job', '$job'), rx('model', '$model')))}, stage)"
    )


def stage_scope(*extra: Matcher) -> tuple[Matcher, ...]:
    """Matchers for the stage histogram: ``$job``, ``$model``, ``$stage`` plus ``extra`` (a kind)."""
    return d.scope(rx(names.LABEL_STAGE, "$stage"), *extra)


def slo_threshold(sli: str) -> p.PromTarget:
    """The latency thresholds of the ``sli`` SLOs of ``$job`` (recording rule from ``alerts/slo.yaml``)."""
    series = sel(names.RULE_SLO_THRESHOLD, (rx("job", "$job"), eq(names.LABEL_SLI, sli)))
    return p.target(f"max by ({names.LABEL_SLO}) ({series})", "SLO threshold {{slo}}")
