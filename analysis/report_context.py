"""Rendering the keys analysis.context adds to a report (confidence intervals, cost), for the text and
HTML reports of analysis.report: drawn from the report dict alone, every helper tolerant of reports
written before the keys existed (they render nothing, or "n/a")."""

from __future__ import annotations

from typing import Any

__all__ = ["cost_delta_text", "cost_lines", "interval_text", "latency_words", "quantile_interval_line", "window_rows", "window_text_lines"]

#: Breached windows the text report lists one by one (the HTML lists every window).
MAX_TEXT_WINDOWS = 12


def interval_text(iv: Any) -> str:
    """``[480.1, 560.2] ms`` for an interval ``[lo, hi]`` (``...`` for an unbounded end); ``""`` for none."""
    if not iv or len(iv) != 2 or (iv[0] is None and iv[1] is None):
        return ""
    lo = "..." if iv[0] is None else f"{float(iv[0]):.1f}"
    hi = "..." if iv[1] is None else f"{float(iv[1]):.1f}"
    return f"[{lo}, {hi}] ms"


def latency_words(report: dict[str, Any], sep: str = "  ") -> str:
    """``p50 12.0 ms [11.5, 12.6] ms  p95 ...``: the p50, p95 and p99 with their intervals."""
    lat = report.get("latency_ms") or {}
    ivs = report.get("latency_interval_ms") or {}
    parts = []
    for k in ("p50", "p95", "p99"):
        v = lat.get(k)
        iv = interval_text(ivs.get(k))
        parts.append(f"{k} {'n/a' if v is None else f'{float(v):.1f} ms'}" + (f" {iv}" if iv else ""))
    return sep.join(parts)


def quantile_interval_line(report: dict[str, Any]) -> str | None:
    """The SLO quantile's interval in words, and whether it settles the verdict; None without one.
    A quantile whose interval is unbounded at both ends (a single sample) is still called
    inconclusive: the fewer the samples, the more the verdict needs the word."""
    qi = report.get("quantile_interval")
    iv = interval_text(report.get("quantile_interval_ms"))
    if not qi or not (iv or qi.get("conclusive") is False):
        return None
    iv = iv or "unbounded"
    conf = float(report.get("confidence") or 0.95)
    samples = qi.get("samples")
    n = "" if samples is None else f", {float(samples):,.0f} effective samples"
    line = f"{conf:.0%} interval of the quantile: {iv} ({qi.get('method')}{n})"
    if qi.get("conclusive") is False and qi.get("why"):
        line += f"; inconclusive: {qi['why']}"
    return line


def _window_cells(w: dict[str, Any]) -> list[Any]:
    q = w.get("quantile_ms")
    return [
        w.get("start_unix_ms"),
        w.get("samples"),
        "n/a" if q is None else f"{float(q):.1f}",
        interval_text(w.get("quantile_interval_ms")) or "-",
        "yes" if w.get("breached") else "no",
    ]


def window_text_lines(report: dict[str, Any]) -> list[str]:
    """One line per breached window (up to :data:`MAX_TEXT_WINDOWS`) with its quantile's interval."""
    bad = [w for w in report.get("windows", []) if w.get("breached")]
    out = []
    for w in bad[:MAX_TEXT_WINDOWS]:
        start, n, q, iv, _ = _window_cells(w)
        out.append(f"  window at {start} (Unix ms): {n} samples, quantile {q} ms {iv}")
    if len(bad) > MAX_TEXT_WINDOWS:
        out.append(f"  ... and {len(bad) - MAX_TEXT_WINDOWS} more (see the JSON report)")
    return out


def window_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The HTML table of every window: headers and rows."""
    conf = float(report.get("confidence") or 0.95)
    headers = ["start (Unix ms)", "samples", "quantile ms", f"{conf:.0%} interval", "breached"]
    return headers, [_window_cells(w) for w in report.get("windows", [])]


def cost_lines(report: dict[str, Any]) -> list[str]:
    """The cost block in words: accelerator-seconds per request and its basis, and with a price the
    cost per 1,000 requests and per million output tokens; ``[]`` without a cost block."""
    c = report.get("cost")
    if not c:
        return []
    out = [
        f"Accelerator time: {float(c['accelerator_seconds_per_request']) * 1000:.2f} ms per request "
        f"(basis {c['basis']}: {c['basis_detail']})"
    ]
    price = c.get("accelerator_price_per_hour")
    if price is None:
        out.append("No accelerator_price_per_hour in the SLO file: no cost in money.")
        return out
    line = f"Cost at {price:g} per accelerator-hour: {float(c['cost_per_1k_requests']):.4f} per 1,000 requests"
    if c.get("fleet_cost_per_1k_requests") is not None:
        line += f" ({float(c['fleet_cost_per_1k_requests']):.4f} with the idle time of the fleet)"
    if c.get("cost_per_million_output_tokens") is not None:
        line += f", {float(c['cost_per_million_output_tokens']):.2f} per million output tokens"
    out.append(line)
    return out


def cost_delta_text(cd: Any) -> str:
    """``cost +100% (+0.0694 per 1,000 requests)`` for a lever's ``cost_delta``; ``""`` for none."""
    if not cd:
        return ""
    rel = cd.get("relative")
    if rel is None:
        return f"cost {cd.get('sign', '0')} (size unknown)"
    out = f"cost {float(rel):+.0%}"
    if cd.get("per_1k_requests") is not None:
        out += f" ({float(cd['per_1k_requests']):+.4f} per 1,000 requests"
        if cd.get("per_million_output_tokens") is not None:
            out += f", {float(cd['per_million_output_tokens']):+.2f} per million output tokens"
        out += ")"
    return out
