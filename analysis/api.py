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
from stagescope.analysis import report_data as RD
from stagescope.analysis import routes as R
from stagescope.analysis.events import derived_events
from stagescope.analysis.nodata import no_data_reason
from stagescope.errors import UserError
from stagescope.names import (
    ATTR_STAGE,
    KIND_UNKNOWN,
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
    counters = RD.server_counters(con)
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
        "requests": RD.request_count(con, view),
        "samples": RD.sample_count(view),
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
        "sources": RD.sources(view),
        "sampling": RD.sampling(view),
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
        "tail_requests": RD.rounded(attr.facts.get("tail_w")), "baseline_requests": RD.rounded(attr.facts.get("base_w")),
        "tail_mean_ms": RD.rounded(attr.tail_mean_ms), "baseline_mean_ms": RD.rounded(attr.baseline_mean_ms),
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
    report["cdf"] = RD.cdf(con, view)
    report["timeline"] = RD.timeline(con, view, report["windows"])
    report["slowest"] = RD.slowest(con, view, attr)
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
    if verdict and verdict["stage"] == UNATTRIBUTED:
        cost = "so the verdict is measure first (add stage spans)"
    elif verdict is None or bare == tail:  # no verdict (no baseline), or no other slow request to rest on
        cost = "no stage explains any of that time, so no verdict can name one (add stage spans)"
    else:
        cost = f"{share:.0%} of the tail's excess is unattributed and the verdict rests on the others"
    return [
        f"{bare} of {tail} {which} have no stage span ({ATTR_STAGE}, or vLLM's gen_ai.latency.* attributes) "
        f"in their {view.slo.sli} interval: their time is unattributed; {cost}"
    ]


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
