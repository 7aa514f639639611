"""Rendering the analysis report: pinned JSON, a short text summary, one self-contained HTML file.

The entry points (:func:`to_json`, :func:`render`) and the names readers import from here: the text
summary and the lines it shares with the page are :mod:`~stagescope.analysis.report_text`, the HTML
page (inline CSS, plots as base64 PNG, no external resources) :mod:`~stagescope.analysis.report_html`.
Everything is drawn from the report dict alone.
"""

from __future__ import annotations

import json
from typing import Any

from stagescope.analysis.report_html import to_html
from stagescope.analysis.report_text import (
    counter_lines,
    headline,
    quality_lines,
    route_lines,
    slo_words,
    sources_line,
    status,
    to_text,
)

__all__ = [
    "counter_lines",
    "headline",
    "quality_lines",
    "render",
    "route_lines",
    "slo_words",
    "sources_line",
    "status",
    "to_html",
    "to_json",
    "to_text",
]


def to_json(report: dict[str, Any]) -> str:
    """The report as indented JSON (the pinned keys plus supporting detail)."""
    return json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"


def render(report: dict[str, Any], fmt: str = "text") -> str:
    """``fmt``: ``text``, ``json`` or ``html``."""
    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        return to_html(report)
    return to_text(report)
