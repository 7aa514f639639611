"""The events (analysis.events) and the breaches that follow them (analysis.event_attribution) in the
text and HTML reports: one line per event, then per breach episode the event it follows and its lever."""

from __future__ import annotations

import html
from typing import Any

from stagescope.analysis.events import utc
from stagescope.analysis.report_context import cost_delta_text, interval_text

__all__ = ["MAX_EVENT_LINES", "event_html", "event_lines"]

#: Events listed at most (the rest are counted).
MAX_EVENT_LINES = 20


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.1f} ms"


def _event(e: dict[str, Any]) -> str:
    end = f" until {utc(e['end_unix_ms'])}" if e.get("end_unix_ms") else ""
    return f"{utc(e['time_unix_ms'])}{end}  {e['kind']}  {e['description']} ({e['source']})"


def _episode(report: dict[str, Any], eb: dict[str, Any]) -> list[str]:
    when = f"windows {utc(eb['start_unix_ms'])} - {utc(eb['end_unix_ms'])}"
    if eb.get("event") is None:
        return [f"breach in {when}: follows no event ({eb.get('why') or 'none before it'})"]
    out = [
        f"breach in {when} follows {eb['event_kind']} {eb['event_description']!r} {eb['event_time']} "
        f"(first sample over the threshold {eb['after_event_s']:g} s after it; "
        f"{eb['aftermath_share']:.0%} of the {eb['bad_samples']:g} over it in its aftermath)"
        + (f"; caveat: {eb['caveat']}" if eb.get("caveat") else "")
    ]
    for lv in eb.get("levers") or []:
        if lv["lever"] is None:
            out.append(f"  no lever: {lv['rationale']}")
            continue
        txt = f"  lever {lv['lever']}: predicted {_ms(lv['predicted_p99_ms'])}"
        if iv := interval_text(lv.get("interval_ms")):
            txt += f" {iv}"
        if cd := cost_delta_text(lv.get("cost_delta")):
            txt += f"; {cd}"
        out += [txt, f"    {lv['rationale']}"]
    return out


def event_lines(report: dict[str, Any]) -> list[str]:
    """Text lines: the events on the timeline and each breach episode's event; [] without events."""
    events = report.get("events") or []
    if not events:
        return []
    out = ["", f"Events ({len(events)}: deploys, scale events, model swaps, config changes):"]
    out += [f"  {_event(e)}" for e in events[:MAX_EVENT_LINES]]
    if len(events) > MAX_EVENT_LINES:
        out.append(f"  and {len(events) - MAX_EVENT_LINES} more")
    for eb in report.get("event_breaches") or []:
        out += [f"  {x}" for x in _episode(report, eb)]
    return out


def event_html(report: dict[str, Any]) -> str:
    """An HTML section: the events as a table, then each breach episode's event and lever; ''
    without events."""
    events = report.get("events") or []
    if not events:
        return ""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(utc(ev['time_unix_ms']))}</td><td>{e(ev['kind'])}</td><td>{e(ev['description'])}</td>"
        f"<td>{e(ev['source'])}</td></tr>"
        for ev in events[:MAX_EVENT_LINES]
    )
    eps = "".join(
        "<li>" + "<br>".join(e(x.strip()) for x in _episode(report, eb)) + "</li>"
        for eb in report.get("event_breaches") or []
    )
    return (
        "<h2>Deploys and scale events</h2><table id='events'><tr><th>time</th><th>kind</th><th>event</th>"
        f"<th>source</th></tr>{rows}</table>" + (f"<ul id='event-breaches'>{eps}</ul>" if eps else "")
    )
