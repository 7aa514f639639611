"""The analysis library entry point: ``analyze(dataset, slo) -> dict`` (the pinned report JSON) and
polars frames for notebooks.

``dataset`` is the ingest's ``Dataset`` (anything with a ``.con`` DuckDB connection and optional
``.warnings``) or a DuckDB connection holding the pinned relations. All latencies are milliseconds.
Routes are never pooled (analysis.routes): each (SLO, route) checked is a report of its own in
``routes``, worst first, and the top level is the first of them. ``status`` is ``breached``, ``met``
or ``no_data`` (0 samples: ``breached`` is None and ``no_data_reason`` says why, see analysis.nodata).
For TTFT and inter-token SLOs the report's ``latency_ms``, ``attribution`` and ``predicted_p99_ms``
describe that quantity, and ``p99`` keys hold the SLO's own quantile where they predict.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb

from stagescope.analysis import attribution as A
from stagescope.analysis import breach as B
from stagescope.analysis import context as CX
from stagescope.analysis import counterfactual as C
from stagescope.analysis import evidence as E
from stagescope.analysis import keys as K
from stagescope.analysis import levers as L
from stagescope.analysis import plan as P
from stagescope.analysis import routes as R
from stagescope.analysis.events import derived_events
from stagescope.analysis.nodata import no_data_reason
from stagescope.errors import UserError
from stagescope.names import (
    ATTR_STAGE,
    KIND_UNKNOWN,
    SOURCE_METRICS,
    SOURCE_TRACES,
    STATUS_BREACHED,
    STATUS_MET,
    STATUS_NO_DATA,
    UNATTRIBUTED,
)
from stagescope.slo import SLO, parse_slo

__all__ = ["analyze", "connection", "frames"]

#: Stages with less than this share of the excess get no lever entry.
MIN_LEVER_SHARE = 0.05
#: Unattributed time above this share of the excess means: measure first.
UNATTRIBUTED_VERDICT_SHARE = 0.5
SLOWEST_N = A.KEEP_SLOWEST
CDF_POINTS = 100
TIMELINE_POINTS = 40
#: Warnings in a report at most (each said once; the last line counts the rest).
MAX_WARNINGS = 30


def connection(dataset: Any) -> duckdb.DuckDBPyConnection:
    """The DuckDB connection of a Dataset (``.con``) or the connection itself."""
    con = getattr(dataset, "con", dataset)
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise TypeError("analyze() needs an ingest Dataset or a DuckDB connection")
    return con


def _slos(slo: str | SLO | list[SLO]) -> list[SLO]:
    if isinstance(slo, SLO):
        return [slo]
    if isinstance(slo, str):
        return parse_slo(slo)
    return list(slo)


def _cdf(con: duckdb.DuckDBPyConnection, view: B.SLIView) -> list[list[float]]:
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


def _timeline(
    con: duckdb.DuckDBPyConnection, view: B.SLIView, windows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """About :data:`TIMELINE_POINTS` windows over the incident for the plot: the breach windows
    themselves when they are already between half and three times that many."""
    if TIMELINE_POINTS // 2 <= len(windows) <= 3 * TIMELINE_POINTS:
        return windows
    row = con.execute(f"SELECT (max(start_unix_ns) - min(start_unix_ns)) / 1e9 FROM {view.name}").fetchone()
    span = float(row[0] or 0.0) if row else 0.0
    return B.windows(con, view, f"{max(1, round(span / TIMELINE_POINTS))}s")


def _slowest(con: duckdb.DuckDBPyConnection, view: B.SLIView, attr: A.Attribution) -> list[dict[str, Any]]:
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
    ids = _trace_ids(con, [r[0] for r in rows])
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


def _trace_ids(con: duckdb.DuckDBPyConnection, refs: list[Any]) -> dict[Any, str]:
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


def analyze(
    dataset: Any,
    slo: str | SLO | list[SLO],
    *,
    route: str | None = None,
    window: str = B.DEFAULT_WINDOW,
    warnings: list[str] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Analyse one incident: the pinned report dict (see the module docstring and the README).

    ``route`` checks only that route (the SLOs without a route, and those for it). Otherwise each
    SLO is checked on each route it applies to, on its own (see analysis.routes): the report's
    ``routes`` lists one report per (SLO, route) and the top level is the worst of them.
    ``events``: deploys, scale events, model swaps and config changes (analysis.events_file), put on
    the timeline with those the scraped metrics show (analysis.events) and matched to the breaches."""
    con = connection(dataset)
    # the analysis orders whatever it reports itself; unordered intermediate tables are built faster
    row = con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()
    con.execute("SET preserve_insertion_order = false")
    try:
        with K.remembering():
            return _analyze(con, dataset, slo, route, window, warnings, events)
    finally:
        con.execute(f"SET preserve_insertion_order = {bool(row and row[0])}")


def _analyze(
    con: duckdb.DuckDBPyConnection,
    dataset: Any,
    slo: str | SLO | list[SLO],
    route: str | None,
    window: str,
    warnings: list[str] | None,
    events: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    warns = list(getattr(dataset, "warnings", []) or []) + list(warnings or [])
    targets, skipped = R.expand(con, R.restrict(_slos(slo), route))
    counters = _server_counters(con)
    timeline = sorted([*(events or []), *derived_events(con)], key=lambda e: e["time_unix_ms"])
    warns += counters.pop("warnings", [])
    reports = []
    for i, target in enumerate(targets):
        reports.append(_analyze_one(con, dataset, target, window, counters, timeline))
        if len(targets) > 1:  # keep each route's breakdown: frames() gives the top level's
            _rename(con, A.BREAKDOWN, f"{A.BREAKDOWN}_{i}")
    top = R.worst(reports)
    if len(targets) > 1:
        _rename(con, f"{A.BREAKDOWN}_{top}", A.BREAKDOWN)
        for i in range(len(targets)):
            con.execute(f"DROP TABLE IF EXISTS {A.BREAKDOWN}_{i}")
    for rep in reports:
        label = f"route {rep['route']}: " if len(reports) > 1 and rep["route"] is not None else ""
        warns += [f"{label}{w}" for w in rep["warnings"]]
    report = {**reports[top], "warnings": _bounded(warns)}
    report["routes"] = [reports[i] for i in R.order(reports)]  # worst first: routes[0] is the top level
    report["routes_skipped"] = skipped
    return report


def _bounded(warns: list[str]) -> list[str]:
    """Each warning once, at most :data:`MAX_WARNINGS` (the last line counts the rest)."""
    once = list(dict.fromkeys(warns))
    if len(once) <= MAX_WARNINGS:
        return once
    return [*once[: MAX_WARNINGS - 1], f"and {len(once) - MAX_WARNINGS + 1} more warnings"]


def _rename(con: duckdb.DuckDBPyConnection, old: str, new: str) -> None:
    if con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND temporary", [old]
    ).fetchall()[0][0]:
        con.execute(f"DROP TABLE IF EXISTS {new}")
        con.execute(f"ALTER TABLE {old} RENAME TO {new}")


def _analyze_one(
    con: duckdb.DuckDBPyConnection,
    dataset: Any,
    target: R.Target,
    window: str,
    counters: dict[str, Any],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report of one SLO on one route (``target.slo.route``; None: every request in the SLO's
    scope); its samples are those of ``target.filtered``."""
    slo = target.slo
    warns: list[str] = []
    ev_res = B.evaluate(con, target.filtered, window)
    view: B.SLIView = ev_res["view"]
    warns += view.warnings
    qs = ev_res["quantiles"]
    breached = ev_res["breached"]
    share = ev_res["over_threshold_share"]
    report: dict[str, Any] = {
        "slo": slo.to_dict(),
        "route": slo.route,
        "status": STATUS_BREACHED if breached else STATUS_MET,
        "no_data_reason": None,
        "requests": _request_count(con, view),
        "samples": view.count,
        "breached": breached,
        "latency_ms": {k: (None if qs[k] is None else round(qs[k], 3)) for k in ("p50", "p95", "p99")},
        "quantile_ms": None if qs["q"] is None else round(qs["q"], 3),
        "over_threshold_share": None if share is None else round(share, 5),
        "attribution": [],
        "verdict": None,
        "levers": [],
        "plan": [],
        "plan_status": None,
        "windows": ev_res["windows"],
        "warnings": warns,
        "sources": _sources(view),
        "sampling": _sampling(view),
        "events": events,  # analysis.events; event_breaches and event_summary: analysis.context
        "event_breaches": [],
        "event_summary": None,
        **(CX.quantile_fields(qs, view) if view.count else CX.empty_fields()),
    }
    if "client_latency_ms" in view.sampling:
        report["client_latency_ms"] = view.sampling["client_latency_ms"]
    if counters:
        report["server_counters"] = counters
    if view.count == 0:  # no data is never a verdict
        report["status"], report["breached"] = STATUS_NO_DATA, None
        report["no_data_reason"] = no_data_reason(
            con, slo, files=getattr(dataset, "files", None), inputs=getattr(dataset, "trace_inputs", None)
        )
        return report
    if view.trace_samples == 0:  # the figures come from a complete source; no trace to split
        warns.append(
            f"no trace of SLO {slo.spec}'s requests was kept (its figures come from the "
            f"{view.source.replace('_', ' ')}): nothing to split into stages"
        )
        return report
    attr = A.attribute(con, view, breached, qs)
    warns += attr.warnings
    if attr.baseline_n == 0:
        warns.append(
            "no baseline: every sample is over the threshold, so no normal request to compare the stages "
            "with: no stage attribution and no verdict (the whole distribution is slow, not its tail)"
        )
    ev = E.gather(con, view, attr)
    ev["shares"] = {r["stage"]: r["share"] for r in attr.rows}
    ev["excess"] = {r["stage"]: r["excess_ms"] for r in attr.rows}
    ev["kinds"] = dict(attr.kinds)
    ev["batch_wait_cap_ms"] = C.batch_wait_cap_ms(ev)
    cf = C.stage_counterfactuals(con, view, attr, ev)
    for r in attr.rows:
        r["counterfactual_ms"] = cf.get(r["stage"])
    report["attribution"] = attr.rows
    report["tail"] = {
        "condition": attr.tail_condition, "baseline_condition": attr.baseline_condition,
        "tail_samples": attr.tail_n, "baseline_samples": attr.baseline_n,
        "tail_requests": _r(attr.facts.get("tail_w")), "baseline_requests": _r(attr.facts.get("base_w")),
        "tail_mean_ms": _r(attr.tail_mean_ms), "baseline_mean_ms": _r(attr.baseline_mean_ms),
    }  # fmt: skip
    if ev.get("model"):  # the served model's eval-set accuracy and its variants', as the service exported
        report["model_quality"] = {**ev["model"], "quality_budget_points": ev.get("quality_budget_points")}
    if breached:
        report["levers"] = _levers(con, view, attr, ev)
        report["verdict"] = _verdict(attr, report["levers"])
        report["plan"], report["plan_status"], left = P.build_plan(con, view, attr, ev, report["levers"])
        if left is not None:
            report["plan_left"] = left
        warns += _unstaged(con, view, attr, report["verdict"])
    # after the levers: their predictions add the settings they are for (reduce-batch-tokens: running_cap)
    report["evidence"] = {k: v for k, v in ev.items() if k not in ("shares", "excess", "model", "kinds")}
    CX.annotate(con, report, view, attr, ev, events)
    report["cdf"] = _cdf(con, view)
    report["timeline"] = _timeline(con, view, report["windows"])
    report["slowest"] = _slowest(con, view, attr)
    return report


def _unstaged(
    con: duckdb.DuckDBPyConnection, view: B.SLIView, attr: A.Attribution, verdict: dict[str, Any] | None
) -> list[str]:
    """A warning when slow requests of a breached SLO have no stage span in their SLI interval: their
    time is unattributed, and what that costs the verdict. Slow requests only: a file of health
    checks or a load generator's CLIENT spans (the network stage) cost the verdict nothing."""
    if not view.per_request or attr.tail_n == 0:
        return []
    cols = [*attr.columns.values()]
    staged = " + ".join(f"coalesce({c}, 0)" for c in cols) if cols else "0"
    row = con.execute(
        f"SELECT count(*) FILTER (WHERE {staged} <= 0), count(*) FROM {A.BREAKDOWN} WHERE {attr.tail_condition}"
    ).fetchone()
    bare, tail = (int(row[0]), int(row[1])) if row else (0, 0)
    if not bare:
        return []
    which = "slow requests" if attr.complete else "slow requests broken down (a sample)"
    share = next((r["share"] for r in attr.rows if r["stage"] == UNATTRIBUTED), 0.0)
    cost = (
        "so the verdict is measure first (add stage spans)"
        if verdict and verdict["stage"] == UNATTRIBUTED
        else f"{share:.0%} of the tail's excess is unattributed and the verdict rests on the others"
    )
    return [
        f"{bare} of {tail} {which} have no stage span ({ATTR_STAGE}, or vLLM's gen_ai.latency.* attributes) "
        f"in their {view.slo.sli} interval: their time is unattributed; {cost}"
    ]


def _server_counters(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
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


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def _request_count(con: duckdb.DuckDBPyConnection, view: B.SLIView) -> int:
    """Requests the samples stand for (for gap SLIs: streams)."""
    if view.per_request:
        return round(view.weight_total)
    row = con.execute(
        f"SELECT sum(w) FROM (SELECT any_value(w) AS w FROM {view.name} WHERE trace_id IS NOT NULL GROUP BY trace_id)"
    ).fetchone()
    return round(float(row[0])) if row and row[0] is not None else 0


def _sources(view: B.SLIView) -> dict[str, str]:
    """Which input gave each figure of the report (``names.SOURCE_*``): the quantiles, shares and
    request counts come from the view's source; the windows too, except that a histogram has no
    times (its calibrated traces give them); the split of the time is always the traces'."""
    src = view.source
    return {
        "latency_ms": src, "quantile_ms": src, "over_threshold_share": src, "requests": src,
        "windows": SOURCE_TRACES if src == SOURCE_METRICS else src,
        "attribution": SOURCE_TRACES, "levers": SOURCE_TRACES, "evidence": SOURCE_TRACES,
    }  # fmt: skip


def _sampling(view: B.SLIView) -> dict[str, Any]:
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


def _levers(
    con: duckdb.DuckDBPyConnection, view: B.SLIView, attr: A.Attribution, ev: dict[str, Any]
) -> list[dict[str, Any]]:
    out = []
    for r in attr.rows:
        if r["share"] < MIN_LEVER_SHARE:
            continue
        kind = r.get("kind")
        for bad, bad_why in L.rejected(r["stage"], kind, ev):  # failed the quality gate: listed, never chosen
            pred, model = C.lever_prediction(con, view, attr, ev, bad, r["stage"])
            out.append({"lever": bad, "stage": r["stage"], "kind": kind, "predicted_p99_ms": pred,
                        "rationale": f"{bad_why} Predicted: {model}.", "acceptable": False,
                        "quality": L.quality(ev, bad)})  # fmt: skip
        chosen = L.choose(r["stage"], kind, ev)
        if chosen is None:
            continue
        lever, why = chosen
        entry = {"lever": lever, "stage": r["stage"], "kind": r.get("kind")}
        if lever is None:
            out.append({**entry, "predicted_p99_ms": None, "rationale": why})
            continue
        pred, model = C.lever_prediction(con, view, attr, ev, lever, r["stage"])
        done: dict[str, Any] = {**entry, "predicted_p99_ms": pred, "rationale": f"{why} Predicted: {model}."}
        if (q := L.quality(ev, lever)) is not None:
            done.update(acceptable=True, quality=q)
        out.append(done)
    return out


def _verdict(attr: A.Attribution, levers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The stage and lever the report leads with: time in no stage when it is most of the excess;
    else the first stage (largest share first) with a lever, unless a stage of unknown kind comes
    before it (then that stage, with no lever: name its kind first)."""
    shares = {r["stage"]: r["share"] for r in attr.rows}
    if shares.get(UNATTRIBUTED, 0.0) > UNATTRIBUTED_VERDICT_SHARE:
        return {"stage": UNATTRIBUTED, "lever": None}
    for lv in levers:
        if (lv["lever"] is not None and lv.get("acceptable") is not False) or (
            lv["lever"] is None and lv.get("kind") == KIND_UNKNOWN
        ):
            return {"stage": lv["stage"], "lever": lv["lever"]}
    return None


def frames(dataset: Any) -> dict[str, Any]:
    """Polars frames of the latest analysis on this connection: ``breakdown`` (per request: stage
    columns in ms and the request's batch size, queue depth, cold start, prompt tokens;
    call after :func:`analyze`; on large inputs the analysed sample), ``requests``, ``stages`` and
    ``metric_samples`` (as loaded)."""
    con = connection(dataset)
    out: dict[str, Any] = {}
    tables = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views()"
        ).fetchall()
    }
    for name in ("requests", "stages", "metric_samples"):
        if name in tables:
            out[name] = con.sql(f"SELECT * FROM {name}").pl()
    if A.BREAKDOWN in tables:  # with each row's trace id (the table keeps the integer key only)
        out[A.BREAKDOWN] = con.sql(
            f"""SELECT r.trace_id, b.* EXCLUDE (trace_ref) FROM {A.BREAKDOWN} b LEFT JOIN
                (SELECT {K.trace_ref(con)} AS trace_ref, start_unix_ns, any_value(trace_id) AS trace_id
                 FROM requests GROUP BY ALL) r USING (trace_ref, start_unix_ns)"""
        ).pl()
        try:
            cols = A.stage_columns(con)
        except duckdb.Error:
            cols = {}
        out[A.BREAKDOWN] = out[A.BREAKDOWN].rename(
            {c: s for s, c in cols.items() if c in out[A.BREAKDOWN].columns}
        )
    if not out:
        raise UserError("no analysis tables in this connection")
    return out
