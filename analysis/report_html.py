"""The analysis report as one self-contained HTML page.

The page has inline CSS and its plots as base64 PNG ``<img>`` elements (no external resources), so
it opens offline and in headless browsers. Everything is drawn from the report dict alone; the lines
it shares with the text summary come from :mod:`~stagescope.analysis.report_text`.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from stagescope.analysis import report_context as RC
from stagescope.analysis.event_report import event_html
from stagescope.analysis.plan_report import plan_html
from stagescope.analysis.report_text import (
    counter_lines,
    headline,
    lever_word,
    ms_text,
    num_text,
    sources_line,
    stage_label,
    status,
)
from stagescope.names import STATUS_BREACHED, STATUS_MET, STATUS_NO_DATA

__all__ = ["to_html"]


_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.verdict{padding:12px 16px;border-radius:6px;margin:12px 0;font-size:15px}
.breached{background:#fdecea;border-left:6px solid #d62728} .met{background:#e8f5e9;border-left:6px solid #2ca02c}
.nodata{background:#eeeeee;border-left:6px solid #777777}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child,td.text{text-align:left} .plot{margin:10px 0} .plot img{max-width:100%;border:1px solid #eee}
.small{color:#666;font-size:12px} .grid{display:flex;flex-wrap:wrap;gap:12px}
"""


def _img(png: bytes | None, alt: str, cls: str) -> str:
    if png is None:
        return f'<p class="small">{html.escape(alt)}: nothing to plot</p>'
    b64 = base64.b64encode(png).decode("ascii")
    return f'<div class="plot"><img class="{cls}" alt="{html.escape(alt)}" src="data:image/png;base64,{b64}"></div>'


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='text'>{html.escape(str(c))}</td>"
            if len(str(c)) > 40
            else f"<td>{html.escape(str(c))}</td>"
            for c in r
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def to_html(report: dict[str, Any]) -> str:
    """One self-contained HTML page: verdict, breakdown, CDF, timeline, levers, slowest traces."""
    from stagescope.analysis import plots

    e = html.escape
    cls = {STATUS_BREACHED: "breached", STATUS_NO_DATA: "nodata"}.get(status(report), "met")
    verdict = "<br>".join(e(x) for x in headline(report))
    attr_rows = [
        [r["stage"], r.get("kind") or "-", f"{r['excess_ms']:.1f}", f"{r['share']:.0%}", num_text(r.get("tail_mean_ms")),
         num_text(r.get("baseline_mean_ms")), num_text(r.get("counterfactual_ms"))]
        for r in report["attribution"]
    ]  # fmt: skip
    lever_rows = [
        [lever_word(lv), stage_label(lv["stage"], lv.get("kind")), ms_text(lv["predicted_p99_ms"]),
         RC.interval_text(lv.get("interval_ms")) or "-", RC.cost_delta_text(lv.get("cost_delta")) or "-",
         lv["rationale"]]
        for lv in report["levers"]
    ]
    slow_rows = [
        [s["trace_id"], f"{s['value_ms']:.1f}",
         ", ".join(f"{k} {v:.0f}" for k, v in sorted(s["stages"].items(), key=lambda kv: -kv[1])[:5])]
        for s in report.get("slowest", [])
    ]  # fmt: skip
    head = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>stagescope report: {e(report['slo']['spec'])}</title><style>{_CSS}</style></head><body>",
        "<h1>stagescope breach analysis</h1>",
        f"<div class='verdict {cls}' id='verdict'>{verdict}</div>",
    ]
    if status(report) == STATUS_NO_DATA:  # nothing to break down or plot: the reason and the warnings
        return "\n".join([*head, *_routes_html(report), *_warnings_html(report), "</body></html>\n"])
    parts = [
        *head,
        f"<p class='small'>{e(RC.latency_words(report, ' · '))} · "
        f"{report['requests']} requests, {report['samples']} samples</p>",
        f"<p class='small' id='sources'>{e(sources_line(report))}</p>" if sources_line(report) else "",
        *_routes_html(report),
        "<h2>Where the tail's time went</h2>",
        _img(plots.breakdown_png(report), "stage breakdown, tail vs baseline", "plot-breakdown"),
        _table(
            ["stage", "kind", "excess ms", "share", "tail mean ms", "baseline mean ms", "p-quantile if baseline"],
            attr_rows,
        ),
        "<h2>Levers</h2>",
        _table(["lever", "stage", "predicted", "95% interval", "cost change", "rationale"], lever_rows)
        if lever_rows
        else f"<p>{_no_lever(report)}</p>",
        plan_html(report),
        "<h2>Latency distribution</h2>",
        _img(plots.cdf_png(report), "latency CDF with threshold", "plot-cdf"),
        "<h2>Over time</h2>",
        _img(
            plots.timeline_png(report), "quantile over time with queue depth and utilization", "plot-timeline"
        ),
        _table(*RC.window_rows(report)),
        event_html(report),
        "<h2>Slowest traces</h2>",
        _img(plots.slowest_png(report), "slowest requests by stage", "plot-slowest"),
        _table(["trace id", "ms", "largest stages (ms)"], slow_rows),
    ]
    if cost := RC.cost_lines(report):
        parts.append("<h2>Cost</h2><ul id='cost'>" + "".join(f"<li>{e(x)}</li>" for x in cost) + "</ul>")
    counters = [x for x in counter_lines(report) if x]
    if counters:
        parts.append("<h2>Server counters</h2><ul>" + "".join(f"<li>{e(x)}</li>" for x in counters) + "</ul>")
    parts += _warnings_html(report)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _routes_html(report: dict[str, Any]) -> list[str]:
    """The routes checked (one verdict each, worst first; the page details the first) and those not."""
    out: list[str] = []
    entries = report.get("routes") or []
    if len(entries) > 1:
        rows = []
        why = any(r.get("no_data_reason") for r in entries)
        for r in entries:
            v = r.get("verdict") or {}
            lev = next((x for x in r.get("levers", []) if x["lever"] == v.get("lever")), None)
            rows.append([
                r.get("route") or "(all)", r["slo"]["spec"], status(r).replace("_", " "),
                ms_text(r.get("quantile_ms")), r["samples"], v.get("stage") or "-",
                (v.get("lever") or "measure first") if v else "-", ms_text(lev["predicted_p99_ms"]) if lev else "-",
                *([r.get("no_data_reason") or ""] if why else []),
            ])  # fmt: skip
        out += [
            f"<h2>Routes checked ({len(entries)}, worst first; this page details the first)</h2>",
            _table(
                ["route", "SLO", "status", "quantile", "samples", "stage", "lever", "predicted"]
                + (["no data because"] if why else []),
                rows,
            ),
        ]
    skipped = report.get("routes_skipped") or []
    if skipped:
        out += [
            "<h2>Routes not checked</h2>",
            _table(
                ["route", "requests", "why"],
                [[s["route"] or "(none)", s["requests"], s["why"]] for s in skipped],
            ),
        ]
    return out


def _warnings_html(report: dict[str, Any]) -> list[str]:
    if not report.get("warnings"):
        return []
    return [
        "<h2>Warnings</h2><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in report["warnings"]) + "</ul>"
    ]


def _no_lever(report: dict[str, Any]) -> str:
    st = status(report)
    if st == STATUS_NO_DATA:
        return "No lever: no samples to analyse."
    if st == STATUS_MET:
        return "No lever: the SLO is met."
    return "No lever: no rule matched the stages that own the excess latency."
