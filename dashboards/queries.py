"""Read the PromQL back out of generated dashboard JSON, and fill in Grafana's variables.

Used by the end-to-end test (every panel query is evaluated against a real Prometheus) and handy for
checking a dashboard against a Prometheus by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PanelQuery",
    "VariableQuery",
    "fill",
    "metric_names",
    "panel_queries",
    "text_values",
    "variable_queries",
]

_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_NOT_METRICS = frozenset(
    {
        "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "vector",
        "scalar", "by", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
        "avg_over_time", "sum_over_time", "count_over_time", "max_over_time", "min_over_time", "round",
        "abs", "clamp_min", "clamp_max", "absent", "label_replace", "topk", "bottomk", "e6", "inf", "nan",
        "floor", "ceil",
    }
)  # fmt: skip


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


def text_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """The default values of ``dashboard``'s textbox and constant variables (a price the user types),
    as Grafana fills them until changed."""
    out = {}
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type") in ("textbox", "constant"):
            out[str(v["name"])] = str((v.get("current") or {}).get("value") or v.get("query") or "")
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (a lexical approximation that is exact for the
    expressions stagescope generates: strings, matchers, ranges and label lists are removed first). A
    ``__name__=~"vllm[:_]x"`` matcher (promql.sel's any_spelling) reads ``vllm:x``."""
    either = {m.replace("[:_]", ":") for m in re.findall(r'__name__=~"([A-Za-z0-9_:\[\]]+)"', expr)}
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = _VAR.sub("1", text)  # a variable outside a matcher (a price) is a number, not a metric
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    tokens = re.findall(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text)
    return either | {t for t in tokens if t.lower() not in _NOT_METRICS}


def fill(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` and ``${name}`` with ``values[name]`` (Grafana's built-ins included, e.g.
    ``__rate_interval``); raises ``KeyError`` naming a variable that has no value."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for variable ${name} in: {expr}")
        return values[name]

    return _VAR.sub(sub, expr)
