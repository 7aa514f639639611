"""Read the PromQL back out of generated dashboard JSON, and fill in Grafana's variables.

Used by the end-to-end test (every panel query is evaluated against a real Prometheus) and handy for
checking a dashboard against a Prometheus by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PanelQuery", "VariableQuery", "fill", "panel_queries", "variable_queries"]

_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    dashboard: str
    panel: str
    ref_id: str
    legend: str
    expr: str
    instant: bool


@dataclass(frozen=True)
class VariableQuery:
    """A query variable: ``label_values(<series selector>, <label>)``."""

    dashboard: str
    name: str
    query: str
    all_value: str | None


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """Every Prometheus target of every panel of ``dashboard`` (Grafana JSON), in panel order."""
    out = []
    for panel in _panels(list(dashboard.get("panels") or [])):
        for t in panel.get("targets") or []:
            if t.get("expr") and not t.get("hide"):
                out.append(
                    PanelQuery(
                        dashboard=str(dashboard.get("uid")),
                        panel=str(panel.get("title")),
                        ref_id=str(t.get("refId")),
                        legend=str(t.get("legendFormat") or ""),
                        expr=str(t["expr"]),
                        instant=bool(t.get("instant")),
                    )
                )
    return out


def variable_queries(dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    """The ``query`` variables of ``dashboard`` (the datasource variable is not a query)."""
    out = []
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type", "query") == "query":
            q = v.get("query")
            text = q.get("query") if isinstance(q, dict) else q
            out.append(VariableQuery(str(dashboard.get("uid")), str(v["name"]), str(text), v.get("allValue")))
    return out


def fill(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` and ``${name}`` with ``values[name]`` (Grafana's built-ins included, e.g.
    ``__rate_interval``); raises ``KeyError`` naming a variable that has no value."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for variable ${name} in: {expr}")
        return values[name]

    return _VAR.sub(sub, expr)
