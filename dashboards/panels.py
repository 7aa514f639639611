"""Panel helpers: the only module that touches grafanalib's panel classes.

Dashboards are values built by small functions. Keeping every grafanalib call here means a move to
grafana-foundation-sdk touches one file. grafanalib 0.7.1 has no ``exemplar`` field on targets:
:class:`PromTarget` adds it (and the datasource reference every target needs).
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Sequence
from typing import Any

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from stagescope.dashboards import defaults as d

__all__ = [
    "PromTarget",
    "dashboard",
    "datasource_variable",
    "heatmap",
    "layout",
    "query_variable",
    "render",
    "stat",
    "table",
    "target",
    "textbox_variable",
    "timeseries",
]


_Target: Any = g.Target  # untyped upstream class: typed as Any so mypy's attrs plugin does not guess


@attr.s(init=False)
class PromTarget(_Target):
    """A Prometheus query target with Grafana's ``exemplar`` switch and a datasource reference."""

    exemplar: bool = attr.ib(default=False)

    def __init__(self, *, exemplar: bool = False, **fields: Any) -> None:
        super().__init__(**fields)
        self.exemplar = exemplar

    def but(self, **changes: Any) -> PromTarget:
        """A copy with ``changes`` applied (``refId``, ``format``, ``instant``, ...)."""
        evolve: Any = attr.evolve
        copy: PromTarget = evolve(self, **changes)
        return copy

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = super().to_json_data()
        for unused in ("target", "metric", "step", "query"):
            data.pop(unused, None)
        data["datasource"] = d.DATASOURCE
        data["exemplar"] = self.exemplar
        data["range"] = not self.instant
        return data


def target(
    expr: str, legend: str = "", *, exemplar: bool = False, instant: bool = False, fmt: str = "time_series"
) -> PromTarget:
    """One PromQL query. ``exemplar=True`` shows exemplars (trace links) on its series."""
    return PromTarget(
        expr=expr, legendFormat=legend, exemplar=exemplar, instant=instant, format=fmt, intervalFactor=1
    )


def _with_ref_ids(targets: Sequence[PromTarget]) -> list[PromTarget]:
    letters = string.ascii_uppercase
    return [t.but(refId=letters[i]) for i, t in enumerate(targets)]


def _dashed(regex: str) -> dict[str, Any]:
    """Override drawing the series whose name matches ``regex`` as a dashed, unfilled line."""
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.stacking", "value": {"group": "A", "mode": "none"}},
        ],
    }


def _right_axis(regex: str, unit: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [{"id": "custom.axisPlacement", "value": "right"}, {"id": "unit", "value": unit}],
    }


def timeseries(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    stack: bool = False,
    bars: bool = False,
    dashed: Iterable[str] = (),
    right_axis: tuple[str, str] | None = None,
) -> g.TimeSeries:
    """A time series panel. ``dashed``: series-name regexes drawn dashed (SLO thresholds, totals);
    ``right_axis``: (series-name regex, unit) plotted on a second axis."""
    overrides = [_dashed(r) for r in dashed]
    if right_axis is not None:
        overrides.append(_right_axis(*right_axis))
    return g.TimeSeries(
        title=title,
        description=description,
        dataSource=d.DATASOURCE,
        targets=_with_ref_ids(targets),
        unit=unit,
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
        fillOpacity=40 if stack else (80 if bars else 10),
        drawStyle="bars" if bars else "line",
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        overrides=overrides,
    )


def stat(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    steps: Sequence[tuple[str, float | None]],
) -> g.Stat:
    """A stat panel coloured by ``steps``: (colour, lower bound) pairs, the first bound ``None``."""
    return g.Stat(
        title=title,
        description=description,
        dataSource=d.DATASOURCE,
        targets=_with_ref_ids(targets),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="background",
        thresholds=[{"color": c, "value": v} for c, v in steps],
    )


def heatmap(title: str, description: str, query: PromTarget, unit: str) -> g.Heatmap:
    """A heatmap of a classic histogram's buckets (``query`` returns per-``le`` rates, format heatmap)."""
    return g.Heatmap(
        title=title,
        description=description,
        dataSource=d.DATASOURCE,
        targets=_with_ref_ids([query.but(format="heatmap", legendFormat="{{le}}")]),
        dataFormat="tsbuckets",
        hideZeroBuckets=True,
        extraJson={
            "options": {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5, "steps": 64},
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
                "filterValues": {"le": 1e-9},
                "legend": {"show": True},
                "rowsFrame": {"layout": "auto"},
                "tooltip": {"show": True, "yHistogram": True},
                "yAxis": {"axisPlacement": "left", "unit": unit},
            },
        },
    )


def table(title: str, description: str, targets: Sequence[PromTarget]) -> g.Table:
    """A table of instant query results (one row per series)."""
    instant = [t.but(instant=True, format="table") for t in targets]
    return g.Table(
        title=title, description=description, dataSource=d.DATASOURCE, targets=_with_ref_ids(instant)
    )


def layout(sections: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> list[Any]:
    """Place panels on Grafana's grid: each section is a row title and rows of panels of equal width."""
    panels: list[Any] = []
    y = 0
    for title, rows in sections:
        panels.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=d.WIDTH, x=0, y=y)))
        y += 1
        for row in rows:
            w = d.WIDTH // len(row)
            for i, panel in enumerate(row):
                panels.append(attr.evolve(panel, gridPos=g.GridPos(h=d.PANEL_HEIGHT, w=w, x=i * w, y=y)))
            y += d.PANEL_HEIGHT
    return panels


def datasource_variable() -> g.Template:
    """The ``$datasource`` variable: any Prometheus datasource of the Grafana."""
    return g.Template(
        name=d.DATASOURCE_VAR, label="Prometheus", query="prometheus", type="datasource", default="Prometheus"
    )


def query_variable(name: str, label: str, query: str) -> g.Template:
    """A multi-value variable filled from ``label_values(...)``, defaulting to All (``.*``)."""
    template = g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=d.DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=d.ALL_VALUE,
        refresh=2,  # on time range change: new jobs and models appear without a reload
        sort=1,
    )
    template._current = {"selected": True, "text": ["All"], "value": ["$__all"]}  # what Grafana writes
    return template


def textbox_variable(name: str, label: str, default: str) -> g.Template:
    """A free-text variable (a number the user types, e.g. a price), ``default`` until changed."""
    template = g.Template(name=name, label=label, query=default, default=default, type="textbox")
    template._current = {"selected": False, "text": default, "value": default}
    return template


def dashboard(
    slug: str, title: str, description: str, panels: list[Any], variables: Sequence[g.Template]
) -> g.Dashboard:
    """A dashboard with house defaults: ``$datasource`` first, then ``variables``; ids assigned."""
    return g.Dashboard(
        title=title,
        uid=f"{d.UID_PREFIX}{slug}",
        description=description,
        tags=list(d.TAGS),
        panels=panels,
        templating=g.Templating(list=[datasource_variable(), *variables]),
        time=g.Time(d.TIME_FROM, "now"),
        refresh=d.REFRESH,
        schemaVersion=d.SCHEMA_VERSION,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        timezone="utc",
    ).auto_panel_ids()


def render(dash: g.Dashboard) -> str:
    """The dashboard as Grafana JSON: sorted keys, two-space indent, trailing newline (stable diffs)."""
    data = json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
