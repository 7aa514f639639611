"""The descriptive parts of a report (analysis.api assembles it): what it draws (the weighted CDF, the
timeline's windows, the slowest requests with their stages and trace ids) and what it says about its
inputs (which source gave each figure, the traces' sampling, the servers' own counters). Latencies in
milliseconds.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb

from stagescope.analysis import attribution as A
from stagescope.analysis import breach as B
from stagescope.analysis import keys as K
from stagescope.names import SOURCE_METRICS, SOURCE_TRACES, UNATTRIBUTED

__all__ = [
    "CDF_POINTS", "SLOWEST_N", "TIMELINE_POINTS", "cdf", "request_count", "rounded", "sampling", "server_counters",
    "slowest", "sources", "timeline", "trace_ids",
]  # fmt: skip

SLOWEST_N = A.KEEP_SLOWEST
CDF_POINTS = 100
TIMELINE_POINTS = 40


def cdf(con: duckdb.DuckDBPyConnection, view: B.SLIView) -> list[list[float]]:
    """The empirical CDF (weighted: the requests the samples stand for) as ``[value_ms, share at or
    below it]`` pairs, exact at
    :data:`CDF_POINTS` log-spaced values between the smallest and the largest sample (one counting
    pass; the plot's x axis is logarithmic)."""
    row = con.execute(f"SELECT min(value_ms), max(value_ms), sum(w) FROM {view.name}").fetchone()
    if not row or row[0] is None or not row[2]:
        return []
    lo, hi, n = max(float(row[0]), 1e-3), float(row[1]), float(row[2])
    if hi <= lo:
        return [[round(hi, 3), 1.0]]
    step = math.log(hi / lo) / CDF_POINTS
    counts = dict(
        con.execute(
            f"""SELECT least({CDF_POINTS}, CAST(ceil(ln(greatest(value_ms, {lo!r}) / {lo!r}) / {step!r}) AS INTEGER)) AS b,
                       sum(w) FROM {view.name} GROUP BY 1"""
        ).fetchall()
    )
    out, seen = [], 0.0
    for b in range(CDF_POINTS + 1):  # bucket b holds the samples in (x[b-1], x[b]]
        seen += float(counts.get(b, 0))
        x = hi if b == CDF_POINTS else lo * math.exp(step * b)
        out.append([round(x, 3), round(seen / n, 6)])
    return out


def timeline(
    con: duckdb.DuckDBPyConnection, view: B.SLIView, windows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """About :data:`TIMELINE_POINTS` windows over the incident for the plot: the breach windows
    themselves when they are already between half and three times that many."""
    if TIMELINE_POINTS // 2 <= len(windows) <= 3 * TIMELINE_POINTS:
        return windows
    row = con.execute(f"SELECT (max(start_unix_ns) - min(start_unix_ns)) / 1e9 FROM {view.name}").fetchone()
    span = float(row[0] or 0.0) if row else 0.0
    return B.windows(con, view, f"{max(1, round(span / TIMELINE_POINTS))}s")


def slowest(con: duckdb.DuckDBPyConnection, view: B.SLIView, attr: A.Attribution) -> list[dict[str, Any]]:
    if not view.per_request:
        rows = con.execute(
            f"SELECT trace_id, max(value_ms) v, count(*) FROM {view.name} GROUP BY 1 ORDER BY v DESC LIMIT {SLOWEST_N}"
        ).fetchall()
        return [{"trace_id": t, "value_ms": round(v, 3), "stages": {}, "gaps": int(n)} for t, v, n in rows]
    cols = [*list(attr.columns.items()), (UNATTRIBUTED, UNATTRIBUTED)]
    sel = ", ".join(c for _, c in cols)
    src = (
        A.BREAKDOWN
        if attr.extra is None
        else f"(SELECT * FROM {A.BREAKDOWN} UNION ALL SELECT * FROM {attr.extra})"
    )
    rows = con.execute(
        f"SELECT trace_ref, start_unix_ns, value_ms, {sel} FROM {src} ORDER BY value_ms DESC LIMIT {SLOWEST_N}"
    ).fetchall()
    ids = trace_ids(con, [r[0] for r in rows])
    out = []
    for r in rows:
        stages = {s: round(float(v), 3) for (s, _), v in zip(cols, r[3:], strict=True) if v}
        out.append(
            {
                "trace_id": ids.get(r[0]),
                "start_unix_ms": int(r[1] // 1_000_000),
                "value_ms": round(r[2], 3),
                "stages": stages,
            }
        )
    return out


def trace_ids(con: duckdb.DuckDBPyConnection, refs: list[Any]) -> dict[Any, str]:
    """The trace ids of a few breakdown rows' ``trace_ref`` (the breakdown keeps the integer key only:
    see analysis.keys). Looked up in the stage rows, whose dictionary-encoded trace ids read faster
    than the requests' unique ones, then in the requests for any trace without stages."""
    if K.trace_ref(con) == "trace_id":  # the ref is the trace id
        return {r: r for r in refs}
    got: dict[Any, str] = {}
    for rel in ("stages", "requests"):
        want = [int(r) for r in refs if r not in got]
        if not want:
            break
        rows = con.execute(
            f"SELECT DISTINCT {K.TRACE_KEY}, trace_id FROM {rel} WHERE {K.TRACE_KEY} IN ({', '.join(map(str, want))})"
        ).fetchall()
        got.update(dict(rows))
    return got


def server_counters(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Mean queue / compute (Triton), queue / prefill / decode (vLLM) and per-stage (SGLang) time per
    request from the servers' cumulative counters in ``metric_samples`` (ms), summed over engines,
    ranks and instances, when scraped; see ingest.counters and ingest.engine_metrics. Under
    ``warnings``: where Triton's traces hold far fewer requests than its counters (its trace rate)."""
    try:
        from stagescope.analysis.ingest.counters import trace_coverage, triton_breakdown
        from stagescope.analysis.ingest.engine_metrics import sglang_stage_means, vllm_stage_means
    except ImportError:  # pragma: no cover - the ingest part ships with the package
        return {}
    out: dict[str, Any] = {}
    try:
        triton = [r for r in triton_breakdown(con) if r.get("requests")]
        vllm = [r for r in vllm_stage_means(con) if r.get("requests")]
        sglang = [r for r in sglang_stage_means(con) if r.get("requests") or r.get("stages")]
    except duckdb.Error:
        return {}
    if triton:
        out["triton"] = triton
        out["warnings"] = trace_coverage(con, triton)  # popped by the caller: report warnings
    if vllm:
        out["vllm"] = vllm
    if sglang:
        out["sglang"] = sglang
    return out


def rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def request_count(con: duckdb.DuckDBPyConnection, view: B.SLIView) -> int:
    """Requests the samples stand for (for gap SLIs: streams)."""
    if view.per_request:
        return round(view.weight_total)
    row = con.execute(
        f"SELECT sum(w) FROM (SELECT any_value(w) AS w FROM {view.name} WHERE trace_id IS NOT NULL GROUP BY trace_id)"
    ).fetchone()
    return round(float(row[0])) if row and row[0] is not None else 0


def sample_count(view: B.SLIView) -> int:
    """The samples the quantiles are of: the view's rows, or the observations of the histogram that
    gave them (every one it counted; the rows then also hold spread points standing for them)."""
    if view.buckets is not None:
        return round(sum(c for _, c in view.buckets))
    return view.count


def sources(view: B.SLIView) -> dict[str, str]:
    """Which input gave each figure of the report (``names.SOURCE_*``): the quantiles, shares and
    request counts come from the view's source; the windows too, except that a histogram has no
    times (its calibrated traces give them); the split of the time is always the traces'."""
    src = view.source
    return {
        "latency_ms": src, "quantile_ms": src, "over_threshold_share": src, "requests": src,
        "windows": SOURCE_TRACES if src == SOURCE_METRICS else src,
        "attribution": SOURCE_TRACES, "levers": SOURCE_TRACES, "evidence": SOURCE_TRACES,
    }  # fmt: skip


def sampling(view: B.SLIView) -> dict[str, Any]:
    """What the traces say about their sampling and how the samples were weighted."""
    f = view.sampling
    out: dict[str, Any] = {
        "traced_requests": f.get("requests", view.trace_samples),
        "with_probability": f.get("known", 0),
        "kept_below_probability_1": f.get("below_1", 0),
        "unknown_probability": f.get("unknown", 0),
        "sampled": bool(f.get("evidence") or f.get("below_1")),
        "min_probability": f.get("min_p"),
        "estimated_requests": f.get("estimated_requests"),
        "weighted": view.weighted,
    }
    for k in ("network_ms", "histogram"):
        if k in f:
            out[k] = f[k]
    return out
