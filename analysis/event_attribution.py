"""A window's breach and the event it follows: which deploy, scale event or model swap came just before
the breached windows, how long before, what share of their samples over the threshold fell in its
aftermath, and the levers that fit (the rule table in analysis.levers, evidence in analysis.event_rules).

A **breach episode** is a run of consecutive breached windows (analysis.breach.windows). It *follows*
an event when

* a window that met the SLO comes right before it (met, then the event, then breached: a breach that
  was there before the event is not the event's, and one from the first window on has no "before");
* the event happened before the end of the episode's first window, and its aftermath
  (analysis.events.aftermath: from the event to ``AFTERMATH_S`` after its end) reaches that window;
* at least :data:`MIN_AFTERMATH_SHARE` of the episode's samples over the threshold fall in the
  aftermath (counted by their sampling weight where they carry one).

Of several such events the one whose aftermath holds most of those samples wins (the latest on a tie).
With events, each window gets ``event``: the index of the event its breach follows, or None.
An attributed episode (``report["event_breaches"]``) carries ``event`` (its index in
``report["events"]``), ``event_kind``, ``event_description``, ``after_event_s`` (its first sample over
the threshold, seconds after the event: after the scrape before the one that saw it, for an event
seen in scraped series), ``aftermath_share`` and ``levers``; one that follows no event
carries ``event`` None and ``why`` not. An attributed episode after breached windows that follow no
event carries a ``caveat``: the breach also happens without the event. Each lever's prediction: the SLO quantile had the samples in
the event's aftermath been like the rest (the quantile of the samples outside it, with its interval),
and its cost change (analysis.cost, from analysis.event_rules.capacity_effect).
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope.analysis import cost as CO
from stagescope.analysis import levers as L
from stagescope.analysis.breach import SLIView
from stagescope.analysis.events import aftermath, fleet_facts, when
from stagescope.analysis.interval_sql import quantile_estimates
from stagescope.analysis.intervals import interval_of

__all__ = ["MIN_AFTERMATH_SHARE", "attribute", "episodes"]

#: Share of an episode's samples over the threshold that must fall in an event's aftermath.
MIN_AFTERMATH_SHARE = 0.5
_T = "(start_unix_ns // 1000000)"  # a sample's arrival, Unix ms


def _rounded(iv: list[float | None] | None) -> list[float | None] | None:
    return None if iv is None else [None if v is None else round(float(v), 3) for v in iv]


def episodes(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of consecutive breached windows: ``start_unix_ms``, ``end_unix_ms``, ``windows``,
    ``first_end_unix_ms`` (the end of its first window) and ``met_before`` (the window right before it
    met the SLO)."""
    out: list[dict[str, Any]] = []
    prev_end, prev_met = None, False
    for w in windows:
        start = int(w["start_unix_ms"])
        end = start + round(float(w["seconds"]) * 1000)
        if w.get("breached"):
            if out and out[-1]["end_unix_ms"] == start and prev_end == start:
                out[-1]["end_unix_ms"] = end
                out[-1]["windows"] += 1
            else:
                out.append({"start_unix_ms": start, "end_unix_ms": end, "windows": 1, "first_end_unix_ms": end,
                            "met_before": prev_met and prev_end == start})  # fmt: skip
        prev_end, prev_met = end, not w.get("breached")
    return out


def _outside_quantile(con: duckdb.DuckDBPyConnection, view: SLIView, a: int, b: int) -> Any:
    """The SLO quantile of the samples outside ``[a, b]`` (Unix ms), with its interval."""
    src = f"(SELECT * FROM {view.name} WHERE start_unix_ns IS NOT NULL AND NOT ({_T} BETWEEN {a} AND {b}))"
    row = con.execute(f"SELECT count(*) FROM {src}").fetchone()
    n = int(row[0]) if row else 0
    if n == 0:
        return None
    return quantile_estimates(con, src, "value_ms", {"q": view.slo.quantile}, n, view.weight, digits=3)["q"]


def _summary(
    con: duckdb.DuckDBPyConnection, view: SLIView, spans: list[tuple[int, int]], w: str
) -> dict[str, Any]:
    bad = f"value_ms > {view.slo.threshold_ms!r}"
    inside = " OR ".join(f"{_T} BETWEEN {a} AND {b}" for a, b in spans) or "false"
    row = con.execute(
        f"SELECT sum({w}) FILTER (WHERE {bad}), sum({w}) FILTER (WHERE {bad} AND ({inside})) FROM {view.name}"
    ).fetchone()
    total = float(row[0] or 0.0) if row else 0.0
    got = float(row[1] or 0.0) if row else 0.0
    return {"bad_samples": round(total, 1), "in_aftermath": round(got, 1),
            "share": round(got / total, 4) if total else None}  # fmt: skip


def attribute(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    windows: list[dict[str, Any]],
    events: list[dict[str, Any]],
    ev: dict[str, Any],
    cost: dict[str, Any] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The breach episodes with the event each follows and its levers, and a summary over every sample
    over the threshold (``bad_samples``, ``in_aftermath``: in any event's aftermath, ``share``)."""
    w = view.weight or "1.0"
    bad = f"value_ms > {view.slo.threshold_ms!r}"
    spans = [aftermath(e) for e in events]
    row = con.execute(f"SELECT min({_T}), max({_T}) FROM {view.name}").fetchone()
    span_ms = float(row[1] - row[0]) if row and row[0] is not None else 0.0
    out: list[dict[str, Any]] = []
    for ep in episodes(windows):
        s, e = ep["start_unix_ms"], ep["end_unix_ms"]
        in_ep = f"{_T} >= {s} AND {_T} < {e} AND {bad}"
        cands = [i for i, (a, b) in enumerate(spans) if a < ep["first_end_unix_ms"] and b >= s]
        picks = "".join(
            f", sum({w}) FILTER (WHERE {in_ep} AND {_T} BETWEEN {spans[i][0]} AND {spans[i][1]}), "
            f"min({_T}) FILTER (WHERE {in_ep} AND {_T} BETWEEN {spans[i][0]} AND {spans[i][1]})"
            for i in cands
        )
        got = con.execute(f"SELECT sum({w}) FILTER (WHERE {in_ep}){picks} FROM {view.name}").fetchone()
        n_bad = float(got[0] or 0.0) if got else 0.0
        entry: dict[str, Any] = {
            "start_unix_ms": s, "end_unix_ms": e, "windows": ep["windows"], "bad_samples": round(n_bad, 1),
            "event": None, "after_event_s": None, "aftermath_share": None, "levers": [], "why": None,
        }  # fmt: skip
        scored = [
            (float(got[1 + 2 * k] or 0.0), events[i]["time_unix_ms"], i, got[2 + 2 * k])
            for k, i in enumerate(cands)
            if got
        ]
        scored = [x for x in scored if x[0] > 0]
        best = max(scored) if scored else None
        if not ep["met_before"]:
            entry["why"] = "no window met the SLO right before it: the breach was there before any event"
        elif best is None or n_bad <= 0:
            entry["why"] = "no event's aftermath reaches its first window"
        elif best[0] / n_bad < MIN_AFTERMATH_SHARE:
            entry["why"] = (f"only {best[0] / n_bad:.0%} of its samples over the threshold came in an event's "
                            f"aftermath (at least {MIN_AFTERMATH_SHARE:.0%} needed)")  # fmt: skip
        else:
            n_in, _, i, first = best
            event = events[i]
            entry.update(
                event=i, event_kind=event["kind"], event_description=event["description"],
                event_time=when(event),
                after_event_s=round((int(first) - spans[i][0]) / 1000.0, 1),
                aftermath_share=round(n_in / n_bad, 4),
            )  # fmt: skip
            entry["levers"] = _levers(con, view, event, entry, ev, cost, span_ms)
            earlier = sum(x["windows"] for x in out if x["event"] is None)
            if earlier:
                entry["caveat"] = (f"{earlier} earlier breached window(s) follow no event: the breach also "
                                   "happens without it, so the event may not be its only cause")  # fmt: skip
        out.append(entry)
    for win in windows:  # per window: the event its breach follows (None: met, or follows none)
        t = int(win["start_unix_ms"])
        win["event"] = next((x["event"] for x in out if x["start_unix_ms"] <= t < x["end_unix_ms"]), None)
    return out, _summary(con, view, spans, w)


def _levers(
    con: duckdb.DuckDBPyConnection,
    view: SLIView,
    event: dict[str, Any],
    episode: dict[str, Any],
    ev: dict[str, Any],
    cost: dict[str, Any] | None,
    span_ms: float,
) -> list[dict[str, Any]]:
    fleet = fleet_facts(con, event, span_ms)
    evx = {**ev, "event": event, "episode": episode, "fleet": fleet}
    chosen = L.choose(event["kind"], event["kind"], evx)
    if chosen is None:
        return []
    lever, why = chosen
    if lever is None:
        return [
            {
                "lever": None,
                "predicted_p99_ms": None,
                "interval_ms": None,
                "rationale": why,
                "cost_delta": None,
            }
        ]
    a, b = aftermath(event)
    pred = _outside_quantile(con, view, a, b)
    effect = CO.lever_effect(con, view, None, evx, lever)
    return [
        {
            "lever": lever,
            "predicted_p99_ms": None if pred is None else float(pred),
            "interval_ms": _rounded(interval_of(pred)),
            "rationale": f"{why} Predicted: the samples in the event's aftermath served like the rest.",
            "cost_delta": CO.lever_cost_delta(cost, effect),
        }
    ]
