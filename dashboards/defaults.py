"""House defaults for every stagescope dashboard, in one place.

Units, time range, refresh, panel sizes, the datasource reference and the variables' "All" value live
here; the dashboard modules only say what to plot. The Prometheus datasource is the ``$datasource``
variable, so the same JSON works against any Prometheus a Grafana has.
"""

from __future__ import annotations

from typing import Any, Final

from stagescope.promql import Matcher, rx

__all__ = [
    "ALL_VALUE",
    "DATASOURCE",
    "DATASOURCE_VAR",
    "PANEL_HEIGHT",
    "RATE",
    "REFRESH",
    "SCHEMA_VERSION",
    "TAGS",
    "TIME_FROM",
    "UID_PREFIX",
    "WIDTH",
    "scope",
]

#: Grafana's window for rate(): at least four scrape intervals (set per datasource in Grafana).
RATE: Final = "$__rate_interval"
DATASOURCE_VAR: Final = "datasource"
DATASOURCE: Final[dict[str, Any]] = {"type": "prometheus", "uid": f"${{{DATASOURCE_VAR}}}"}
#: What a variable set to "All" expands to (a regex matching every value, and the empty value).
ALL_VALUE: Final = ".*"
UID_PREFIX: Final = "stagescope-"
TAGS: Final[tuple[str, ...]] = ("stagescope",)
TIME_FROM: Final = "now-1h"
REFRESH: Final = "30s"
#: grafanalib 0.7.1 writes schemaVersion 12; the panels here are written in the current shape
#: (timeseries, stat, table, heatmap with `options`, datasource objects), so say so.
SCHEMA_VERSION: Final = 39
WIDTH: Final = 24  # Grafana's grid width
PANEL_HEIGHT: Final = 8


def scope(*extra: Matcher, job: bool = True, model: bool = True) -> tuple[Matcher, ...]:
    """Matchers for stagescope's own series: the ``$job`` and ``$model`` variables plus ``extra``."""
    out: list[Matcher] = []
    if job:
        out.append(rx("job", "$job"))
    if model:
        out.append(rx("model", "$model"))
    return (*out, *extra)
