"""The plan (analysis.plan) as numbered steps, for the text and HTML reports."""

from __future__ import annotations

import html
from typing import Any

from stagescope.analysis.report_context import cost_delta_text, interval_text
from stagescope.names import PLAN_MET, PLAN_NOT_MET

__all__ = ["plan_html", "plan_lines"]


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.1f} ms"


def _steps(report: dict[str, Any]) -> list[str]:
    out = []
    for i, s in enumerate(report.get("plan") or [], 1):
        txt = f"{i}. {s['lever']} ({s['stage']})"
        if s.get("setting"):
            txt += f": {s['setting']}"
        txt += f"; predicted after it {_ms(s['predicted_quantile_ms'])}"
        if iv := interval_text(s.get("interval_ms")):
            txt += f" {iv}"
        if cd := cost_delta_text(s.get("cost_delta")):
            txt += f"; {cd}"
        if s.get("cheaper_than"):
            txt += "; cheaper than " + ", ".join(
                f"{b['lever']} ({b['stage']}, which also meets the SLO: {_ms(b['predicted_quantile_ms'])})"
                for b in s["cheaper_than"]
            )
        out.append(txt)
    return out


def _outcome(report: dict[str, Any]) -> str:
    thr = report["slo"]["threshold_ms"]
    if report.get("plan_status") == PLAN_MET:
        return f"With every step the SLO is predicted met ({thr:g} ms)."
    left = report.get("plan_left") or {}
    txt = "The levers run out before the SLO is met"
    if left.get("gap_ms") is not None:
        txt += f": {left['gap_ms']:.1f} ms over the {thr:g} ms threshold remain"
    if left.get("stage"):
        txt += f", most of it in {left['stage']} ({_ms(left.get('stage_excess_ms'))} " + (
            "per request over the threshold; no request under it to compare with)"
            if left.get("baseline") is False
            else "above its baseline median)"
        )
    if left.get("reason"):
        txt += f" ({left['reason']})"
    txt += "."
    if left.get("skipped"):
        txt += " Not composable: " + "; ".join(left["skipped"]) + "."
    return txt


def plan_lines(report: dict[str, Any]) -> list[str]:
    """Text lines: the plan's numbered steps and its outcome; [] when no plan is needed."""
    if report.get("plan_status") not in (PLAN_MET, PLAN_NOT_MET):
        return []
    return ["", "Plan (no single lever meets the SLO; each step on the previous one's outcome):",
            *(f"  {x}" for x in _steps(report)), f"  {_outcome(report)}"]  # fmt: skip


def plan_html(report: dict[str, Any]) -> str:
    """An HTML section with the plan's steps as an ordered list; '' when no plan is needed."""
    if report.get("plan_status") not in (PLAN_MET, PLAN_NOT_MET):
        return ""
    e = html.escape
    items = "".join(f"<li>{e(x.split('. ', 1)[1])}</li>" for x in _steps(report))
    return (
        "<h2>Plan</h2><p>No single lever meets the SLO; each step is predicted on the previous one's outcome.</p>"
        f"<ol id='plan'>{items}</ol><p>{e(_outcome(report))}</p>"
    )
