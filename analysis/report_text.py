"""The analysis report in words: the verdict lines that the text summary and the HTML page share
(:func:`headline`, :func:`sources_line`, :func:`counter_lines`...) and the text summary itself
(:func:`to_text`). Everything is drawn from the report dict alone; the HTML page is
:mod:`~stagescope.analysis.report_html`, the entry points :mod:`~stagescope.analysis.report`.
"""

from __future__ import annotations

from typing import Any

from stagescope.analysis import report_context as RC
from stagescope.analysis.event_report import event_lines
from stagescope.analysis.plan_report import plan_lines
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
    "counter_lines",
    "headline",
    "lever_word",
    "ms_text",
    "num_text",
    "quality_lines",
    "route_lines",
    "slo_words",
    "sources_line",
    "stage_label",
    "status",
    "to_text",
]


def ms_text(x: Any) -> str:
    """A duration in milliseconds as reports print it (``12.3 ms``; ``n/a`` for None)."""
    return "n/a" if x is None else f"{float(x):.1f} ms"


def _q_name(report: dict[str, Any]) -> str:
    slo = report["slo"]
    q = f"p{slo['objective'] * 100:g}"
    return q if slo["sli"] == "e2e" else f"{slo['sli']} {q}"


def stage_label(stage: str, kind: str | None) -> str:
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
        f"{_q_name(report)} {ms_text(report.get('quantile_ms'))} against {slo['threshold_ms']:g} ms over "
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
            f"Stage: {stage_label(v['stage'], kind)} ({'n/a' if share is None else f'{share:.0%}'} of "
            f"the excess latency); lever: "
            + (v["lever"] or ("none until its kind is named" if unnamed else "measure first"))
            + (
                f"; predicted {_q_name(report)} after it: {ms_text(lev['predicted_p99_ms'])}"
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
                f"{_q_name(report)} with it: {ms_text(lv.get('predicted_p99_ms'))})"
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
                f"{num_text(r.get('tail_mean_ms')):>10}{num_text(r.get('baseline_mean_ms')):>10}{num_text(r.get('counterfactual_ms')):>13}"
            )
    if report["levers"]:
        out.append("")
        for lv in report["levers"]:
            out.append(
                f"- {lever_word(lv)} ({stage_label(lv['stage'], lv.get('kind'))}): "
                f"predicted {ms_text(lv['predicted_p99_ms'])}"
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


def lever_word(lv: dict[str, Any]) -> str:
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
    where = _SOURCE_WORDS.get(q, q)
    if q == SOURCE_METRICS and smp.get("histogram"):
        where = f"the scraped histogram {smp['histogram']}"
    if not kept:
        return f"quantiles and share over the threshold from {where}; no kept trace to split into stages"
    return (
        f"quantiles and share over the threshold from {where}; stages from {kept} "
        f"kept traces{', ' + how if how else ''}"
    )


def counter_lines(report: dict[str, Any]) -> list[str]:
    """Per-request means from the servers' own counters (Triton, vLLM, SGLang), when they were scraped."""
    lines = []
    for r in report.get("server_counters", {}).get("triton", []):
        compute = _sum(r, "compute_input_ms", "compute_infer_ms", "compute_output_ms")
        line = (
            f"Triton {r['model']} (v{r['version']}): {r['requests']:.0f} requests, per request queue "
            f"{ms_text(r.get('queue_ms'))}, compute {ms_text(compute)}"
        )
        if r.get("cache_hits") is not None:
            line += f" per executed request ({r['cache_hits']:.0f} response-cache hits, {ms_text(r.get('cache_hit_ms'))} each)"
        if r.get("first_response_ms") is not None:
            line += f", first response {ms_text(r['first_response_ms'])}"
        lines.append(line)
    for r in report.get("server_counters", {}).get("vllm", []):
        engines = int(r.get("engines") or 1)
        lines.append(
            f"vLLM {r['model']}: {r['requests']:.0f} requests"
            + (f" (summed over {engines} engine series)" if engines > 1 else "")
            + f", per request queue {ms_text(r.get('queue_ms'))}, prefill {ms_text(r.get('prefill_ms'))}, "
            f"decode {ms_text(r.get('decode_ms'))}"
        )
    for r in report.get("server_counters", {}).get("sglang", []):
        stages = ", ".join(f"{k} {ms_text(v)}" for k, v in sorted((r.get("stages") or {}).items()))
        n = f"{r['requests']:.0f} requests" if r.get("requests") is not None else "requests not counted"
        lines.append(
            f"SGLang {r['model']}: {n}, per request queue {ms_text(r.get('queue_ms'))}"
            + (f"; per stage {stages}" if stages else "")
        )
    return ["", *lines] if lines else []


def _sum(r: dict[str, Any], *keys: str) -> float | None:
    vals = [r.get(k) for k in keys]
    return None if any(v is None for v in vals) else float(sum(v for v in vals if v is not None))


def num_text(x: Any) -> str:
    """A table cell's milliseconds, no unit (``12.3``; ``-`` for None)."""
    return "-" if x is None else f"{float(x):.1f}"

