"""Rendering the analysis report: pinned JSON, a short text summary, one self-contained HTML file.

The HTML has inline CSS and its plots as base64 PNG ``<img>`` elements (no external resources), so
it opens offline and in headless browsers. Everything is drawn from the report dict alone.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from stagescope.analysis import report_context as RC
from stagescope.analysis.event_report import event_html, event_lines
from stagescope.analysis.plan_report import plan_html, plan_lines
from stagescope.names import (
    KIND_UNKNOWN,
    SOURCE_CLIENT_RESULTS,
    SOURCE_METRICS,
    SOURCE_TRACES,
    STAGE_KINDS,
    STATUS_BREACHED,
    STATUS_MET,
    STATUS_NO_DATA,
)

__all__ = [
    "headline",
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


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.1f} ms"


def _q_name(report: dict[str, Any]) -> str:
    slo = report["slo"]
    q = f"p{slo['objective'] * 100:g}"
    return q if slo["sli"] == "e2e" else f"{slo['sli']} {q}"


def _stage_label(stage: str, kind: str | None) -> str:
    """A stage as reports name it: a team's own stage with its kind (``rerank [compute]``)."""
    return stage if kind is None or stage in STAGE_KINDS else f"{stage} [{kind}]"


def status(report: dict[str, Any]) -> str:
    """``breached``, ``met`` or ``no_data`` (reports written before ``status`` existed: from ``breached``)."""
    if "status" in report:
        return str(report["status"])
    return STATUS_BREACHED if report.get("breached") else STATUS_MET


def slo_words(report: dict[str, Any]) -> str:
    """``SLO p99<300ms on route /v1/score`` (an SLO file's SLO by its name and spec)."""
    slo = report["slo"]
    name = slo["spec"] if slo.get("name") in (None, slo["spec"]) else f"{slo['name']} ({slo['spec']})"
    route = report.get("route", slo.get("route"))
    return f"SLO {name}" + ("" if route is None else f" on route {route}")


def headline(report: dict[str, Any]) -> list[str]:
    """The verdict in a few lines (shared by text and HTML), naming the SLO and the route. No data is
    never a verdict: a report without samples says NO DATA and why, not "met"."""
    slo = report["slo"]
    if status(report) == STATUS_NO_DATA:
        reason = report.get("no_data_reason") or "no reason recorded"
        return [f"{slo_words(report)}: NO DATA -- 0 samples: {reason}"]
    lines = [
        f"{slo_words(report)}: {'BREACHED' if status(report) == STATUS_BREACHED else 'met'} -- "
        f"{_q_name(report)} {_ms(report.get('quantile_ms'))} against {slo['threshold_ms']:g} ms over "
        f"{report['samples']} samples"
    ]
    if (qline := RC.quantile_interval_line(report)) is not None:
        lines.append(qline)
    v = report.get("verdict")
    if v:
        row: dict[str, Any] = next((r for r in report["attribution"] if r["stage"] == v["stage"]), {})
        share, kind = row.get("share"), row.get("kind")
        lev = next((x for x in report["levers"] if x["lever"] == v["lever"]), None)
        unnamed = kind == KIND_UNKNOWN
        lines.append(
            f"Stage: {_stage_label(v['stage'], kind)} ({'n/a' if share is None else f'{share:.0%}'} of "
            f"the excess latency); lever: "
            + (v["lever"] or ("none until its kind is named" if unnamed else "measure first"))
            + (
                f"; predicted {_q_name(report)} after it: {_ms(lev['predicted_p99_ms'])}"
                + (f" {iv}" if (iv := RC.interval_text(lev.get("interval_ms"))) else "")
                if lev and v["lever"]
                else ""
            )
        )
    return lines + quality_lines(report)


def quality_lines(report: dict[str, Any]) -> list[str]:
    """The served model's eval-set accuracy beside each model-changing lever's, as the service exported
    them, and the levers the quality gate rejected."""
    mq = report.get("model_quality") or {}
    acc = mq.get("accuracy") or {}
    if not acc:
        return []
    serving = acc.get("serving")
    others = [
        f"{v} {a:.2%} ({(a - serving) * 100:+.2f} points)" for v, a in sorted(acc.items())
        if v != "serving" and serving is not None
    ]  # fmt: skip
    budget = mq.get("quality_budget_points")
    line = (
        f"Model accuracy on its held-out eval set ({mq.get('eval_samples') or 'n/a'} samples): "
        f"{'n/a' if serving is None else f'{serving:.2%}'} as served"
        + (f"; {', '.join(others)}" if others else "")
        + ("" if budget is None else f"; quality budget {budget:g} points")
    )
    out = [line]
    for lv in report.get("levers", []):
        if lv.get("acceptable") is False:
            q = lv.get("quality") or {}
            out.append(
                f"Lever {lv['lever']} not acceptable: {q.get('drop_points', float('nan')):.2f} points of accuracy "
                f"lost, over the {q.get('budget_points', float('nan')):g}-point budget (predicted "
                f"{_q_name(report)} with it: {_ms(lv.get('predicted_p99_ms'))})"
            )
    return out


def to_text(report: dict[str, Any]) -> str:
    """A short terminal summary."""
    out = headline(report)
    if status(report) != STATUS_NO_DATA:
        out.append(f"{RC.latency_words(report)}  requests {report['requests']}")
        src = sources_line(report)
        if src:
            out.append(src)
    if report["attribution"]:
        out.append("")
        width = max(16, *(len(r["stage"]) + 2 for r in report["attribution"]))
        out.append(
            f"{'stage':<{width}}{'kind':<12}{'excess ms':>11}{'share':>8}{'tail ms':>10}{'base ms':>10}"
            f"{'if baseline':>13}"
        )
        for r in report["attribution"]:
            out.append(
                f"{r['stage']:<{width}}{r.get('kind') or '-':<12}{r['excess_ms']:>11.1f}{r['share']:>8.0%}"
                f"{_num(r.get('tail_mean_ms')):>10}{_num(r.get('baseline_mean_ms')):>10}{_num(r.get('counterfactual_ms')):>13}"
            )
    if report["levers"]:
        out.append("")
        for lv in report["levers"]:
            out.append(
                f"- {_lever_word(lv)} ({_stage_label(lv['stage'], lv.get('kind'))}): "
                f"predicted {_ms(lv['predicted_p99_ms'])}"
                + (f" {iv}" if (iv := RC.interval_text(lv.get("interval_ms"))) else "")
                + (f"; {cd}" if (cd := RC.cost_delta_text(lv.get("cost_delta"))) else "")
                + (" [not acceptable: quality budget]" if lv.get("acceptable") is False else "")
            )
            out.append(f"  {lv['rationale']}")
    if cost := RC.cost_lines(report):
        out += ["", *cost]
    out += plan_lines(report)
    out += event_lines(report)
    out += counter_lines(report)
    out += route_lines(report)
    bad = [w for w in report.get("windows", []) if w["breached"]]
    if report.get("windows"):
        out.append("")
        out.append(f"windows breached: {len(bad)} of {len(report['windows'])}")
        out += RC.window_text_lines(report)
    for w in report.get("warnings", []):
        out.append(f"warning: {w}")
    return "\n".join(out) + "\n"


def route_lines(report: dict[str, Any]) -> list[str]:
    """One verdict per route checked, worst first, when there were several; and the routes not
    checked, with the reason."""
    entries = report.get("routes") or []
    lines: list[str] = []
    if len(entries) > 1:
        lines += ["", f"Routes checked ({len(entries)}, worst first; the report above is about the first):"]
        for entry in entries:
            lines += [("  " if k == 0 else "    ") + x for k, x in enumerate(headline(entry))]
    skipped = report.get("routes_skipped") or []
    if skipped:
        lines += ["", "Routes not checked:"]
        several = len({s.get("slo") for s in skipped} | {report["slo"]["name"]}) > 1
        lines += [
            f"  {s['route'] or '(none)'} ({s['requests']} requests"
            + (f", SLO {s.get('slo')}" if several else "")
            + f"): {s['why']}"
            for s in skipped
        ]
    return lines


def _lever_word(lv: dict[str, Any]) -> str:
    """A lever entry's lever, or what to do instead (a stage of unknown kind: name its kind)."""
    return lv["lever"] or ("name its kind" if lv.get("kind") == KIND_UNKNOWN else "measure first")


_SOURCE_WORDS = {
    SOURCE_TRACES: "the traces",
    SOURCE_CLIENT_RESULTS: "the load generator's results (server-side: network taken out)",
    SOURCE_METRICS: "the scraped request-duration histograms",
}


def sources_line(report: dict[str, Any]) -> str:
    """Where the figures came from, and how the kept traces were weighted (one line; empty for
    complete, unweighted traces, which is what the report always was)."""
    src = report.get("sources") or {}
    smp = report.get("sampling") or {}
    q = src.get("quantile_ms")
    if q is None or (q == SOURCE_TRACES and not smp.get("weighted")):
        return ""
    kept = smp.get("traced_requests")
    how = "each weighted by 1/sampling probability" if smp.get("weighted") or smp.get("sampled") else ""
    return (
        f"quantiles and share over the threshold from {_SOURCE_WORDS.get(q, q)}; stages from {kept} "
        f"kept traces{', ' + how if how else ''}"
    )


def counter_lines(report: dict[str, Any]) -> list[str]:
    """Per-request means from the servers' own counters (Triton, vLLM, SGLang), when they were scraped."""
    lines = []
    for r in report.get("server_counters", {}).get("triton", []):
        compute = _sum(r, "compute_input_ms", "compute_infer_ms", "compute_output_ms")
        line = (
            f"Triton {r['model']} (v{r['version']}): {r['requests']:.0f} requests, per request queue "
            f"{_ms(r.get('queue_ms'))}, compute {_ms(compute)}"
        )
        if r.get("cache_hits") is not None:
            line += f" per executed request ({r['cache_hits']:.0f} response-cache hits, {_ms(r.get('cache_hit_ms'))} each)"
        if r.get("first_response_ms") is not None:
            line += f", first response {_ms(r['first_response_ms'])}"
        lines.append(line)
    for r in report.get("server_counters", {}).get("vllm", []):
        engines = int(r.get("engines") or 1)
        lines.append(
            f"vLLM {r['model']}: {r['requests']:.0f} requests"
            + (f" (summed over {engines} engine series)" if engines > 1 else "")
            + f", per request queue {_ms(r.get('queue_ms'))}, prefill {_ms(r.get('prefill_ms'))}, "
            f"decode {_ms(r.get('decode_ms'))}"
        )
    for r in report.get("server_counters", {}).get("sglang", []):
        stages = ", ".join(f"{k} {_ms(v)}" for k, v in sorted((r.get("stages") or {}).items()))
        n = f"{r['requests']:.0f} requests" if r.get("requests") is not None else "requests not counted"
        lines.append(
            f"SGLang {r['model']}: {n}, per request queue {_ms(r.get('queue_ms'))}"
            + (f"; per stage {stages}" if stages else "")
        )
    return ["", *lines] if lines else []


def _sum(r: dict[str, Any], *keys: str) -> float | None:
    vals = [r.get(k) for k in keys]
    return None if any(v is None for v in vals) else float(sum(v for v in vals if v is not None))


def _num(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


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
        [r["stage"], r.get("kind") or "-", f"{r['excess_ms']:.1f}", f"{r['share']:.0%}", _num(r.get("tail_mean_ms")),
         _num(r.get("baseline_mean_ms")), _num(r.get("counterfactual_ms"))]
        for r in report["attribution"]
    ]  # fmt: skip
    lever_rows = [
        [_lever_word(lv), _stage_label(lv["stage"], lv.get("kind")), _ms(lv["predicted_p99_ms"]),
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
                _ms(r.get("quantile_ms")), r["samples"], v.get("stage") or "-",
                (v.get("lever") or "measure first") if v else "-", _ms(lev["predicted_p99_ms"]) if lev else "-",
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


def render(report: dict[str, Any], fmt: str = "text") -> str:
    """``fmt``: ``text``, ``json`` or ``html``."""
    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        return to_html(report)
    return to_text(report)
