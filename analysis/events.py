"""Deploys, scale events, model swaps and config changes: read from an events file, from scraped
kube-state-metrics series and from stagescope's own model-load counter, for the timeline and for
attributing a window's breach to the event it follows (analysis.event_attribution).

An event (pinned JSON, ``report["events"]``)::

    {"time_unix_ms": int, "end_unix_ms": int | None, "kind": "deploy" | "scale" | "model_swap" | "config",
     "source": "events-file" | "kube-state-metrics" | "stagescope", "target": str | None,
     "description": str, "detail": {...}}

**Events file** (``analyze --events FILE``): analysis.events_file.

**kube-state-metrics** (names in ``names.KSM_*``, from kubernetes/kube-state-metrics
``docs/metrics/workload/deployment-metrics.md`` and ``pod-metrics.md``): per deployment (``namespace``, ``deployment``), a rise
of ``kube_deployment_metadata_generation`` between scrapes is a rollout (``deploy``), complete at the
first scrape where ``kube_deployment_status_observed_generation`` has caught up, every replica is
updated (``kube_deployment_status_replicas_updated``) and none unavailable; a change of
``kube_deployment_spec_replicas`` is a ``scale`` (a generation rise that only changed the replicas is
the scale, not a rollout). Pods Pending (``kube_pod_status_phase{phase="Pending"} == 1``; their
``kube_pod_created`` and ``kube_pod_status_scheduled_time`` give the time to schedule) are attached to
their deployment's event (pods are named ``<deployment>-<hash>-<hash>``), or are a ``scale`` event of
their own. An event's time is the first scrape that saw it (it happened since the scrape before).
From a snapshot without timestamps only the pods Pending at the snapshot are events (at their
creation time). **stagescope**: a rise of ``stagescope_model_loads_total`` after the first scrape is a
``model_swap`` (a model reloaded in a running service), over when ``stagescope_model_ready`` is 1 again.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.breach import sql_str
from stagescope.analysis.events_file import make_event as _event

__all__ = ["AFTERMATH_S", "aftermath", "derived_events", "fleet_facts", "utc", "when"]

#: How long after an event (after its end, where it has one: a rollout complete, a model ready again)
#: its effects are looked for: the warm-up of new pods and caches after them.
AFTERMATH_S = 120.0


def _series(con: duckdb.DuckDBPyConnection, metric: str, keys: tuple[str, ...], extra: str = "") -> dict[tuple[Any, ...], list[tuple[int | None, float]]]:  # fmt: skip
    """``(label values...) -> [(ts_ms, value)]`` sorted by time (untimestamped samples last)."""
    try:
        rows = con.execute(
            f"SELECT [labels[k] for k in ?], ts_ms, value FROM metric_samples WHERE metric = {sql_str(metric)} "
            f"AND value IS NOT NULL{extra} ORDER BY ts_ms NULLS LAST",
            [list(keys)],
        ).fetchall()
    except duckdb.Error:
        return {}
    out: dict[tuple[Any, ...], list[tuple[int | None, float]]] = defaultdict(list)
    for labels, ts, v in rows:
        out[tuple(labels)].append((None if ts is None else int(ts), float(v)))
    return out


def _changes(points: list[tuple[int | None, float]]) -> list[tuple[int, float, float]]:
    """``(ts_ms, before, after)`` where a timestamped series changes value."""
    timed = [(t, v) for t, v in points if t is not None]
    return [(t, a, b) for (_, a), (t, b) in pairwise(timed) if b != a]


def _since(points: list[tuple[int | None, float]], ts: int) -> int | None:
    """The scrape before ``ts`` (the change happened after it): the earliest the event can be."""
    got = [t for t, _ in points if t is not None and t < ts]
    return got[-1] if got else None


def _at(points: list[tuple[int | None, float]], ts: int) -> float | None:
    """The value as of ``ts`` (the last sample at or before it)."""
    got = [v for t, v in points if t is not None and t <= ts]
    return got[-1] if got else None


_DEP = (N.KSM_LABEL_NAMESPACE, N.KSM_LABEL_DEPLOYMENT)
_POD = (N.KSM_LABEL_NAMESPACE, N.KSM_LABEL_POD)


def _rollout_end(con_series: dict[str, dict[tuple[Any, ...], list[tuple[int | None, float]]]], key: tuple[Any, ...],
                 start: int, generation: float) -> int | None:  # fmt: skip
    """The first scrape at or after ``start`` where the rollout to ``generation`` is complete."""
    obs = con_series[N.KSM_DEPLOYMENT_OBSERVED_GENERATION].get(key, [])
    spec = con_series[N.KSM_DEPLOYMENT_SPEC_REPLICAS].get(key, [])
    upd = con_series[N.KSM_DEPLOYMENT_REPLICAS_UPDATED].get(key, [])
    unav = con_series[N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE].get(key, [])
    times = sorted({t for s in (obs, upd, unav) for t, _ in s if t is not None and t >= start})
    for t in times:
        o, s, u, n = _at(obs, t), _at(spec, t), _at(upd, t), _at(unav, t)
        if o is not None and o < generation:
            continue
        if s is not None and u is not None and u < s:
            continue
        if n is not None and n > 0:
            continue
        if o is None and u is None and n is None:
            return None
        return t
    return None


def _deployment_events(series: dict[str, dict[tuple[Any, ...], list[tuple[int | None, float]]]]) -> list[dict[str, Any]]:  # fmt: skip
    out: list[dict[str, Any]] = []
    gens, specs, upd = (series[m] for m in (N.KSM_DEPLOYMENT_GENERATION, N.KSM_DEPLOYMENT_SPEC_REPLICAS,
                                             N.KSM_DEPLOYMENT_REPLICAS_UPDATED))  # fmt: skip
    for key in sorted(set(gens) | set(specs), key=str):
        ns, dep = key
        target = dep if not ns else f"{ns}/{dep}"
        scale_times = set()
        for t, a, b in _changes(specs.get(key, [])):
            scale_times.add(t)
            out.append(_event(t, N.EVENT_SCALE, N.EVENT_SOURCE_KSM, target=target,
                              since_unix_ms=_since(specs.get(key, []), t),
                              description=f"{target} scaled {a:g} -> {b:g} replicas ({N.KSM_DEPLOYMENT_SPEC_REPLICAS})",
                              replicas_from=int(a), replicas_to=int(b)))  # fmt: skip
        for t, a, b in _changes(gens.get(key, [])):
            if b < a:
                continue
            updated, replicas = _at(upd.get(key, []), t), _at(specs.get(key, []), t)
            rolled = updated is not None and replicas is not None and updated < replicas
            if t in scale_times and not rolled:
                continue  # the generation rose because the replica count changed: that is the scale event
            end = _rollout_end(series, key, t, b)
            out.append(_event(t, N.EVENT_DEPLOY, N.EVENT_SOURCE_KSM, end_ms=end, target=target,
                              description=f"{target} rollout, generation {a:g} -> {b:g} ({N.KSM_DEPLOYMENT_GENERATION})"
                              + ("" if end is not None else "; not complete by the last scrape"),
                              generation_from=int(a), generation_to=int(b),
                              since_unix_ms=_since(gens.get(key, []), t)))  # fmt: skip
    return out


def _pending(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per pod Pending: ``{pod, namespace, start_ms, end_ms, created_ms, scheduled_s}``."""
    phase = _series(
        con,
        N.KSM_POD_PHASE,
        _POD,
        f" AND labels[{sql_str(N.KSM_LABEL_PHASE)}] = {sql_str(N.KSM_PHASE_PENDING)}",
    )
    created = {k: v[-1][1] for k, v in _series(con, N.KSM_POD_CREATED, _POD).items()}
    scheduled = {k: v[-1][1] for k, v in _series(con, N.KSM_POD_SCHEDULED_TIME, _POD).items()}
    out = []
    for key, pts in phase.items():
        ns, pod = key
        c = created.get(key)
        timed = [(t, v) for t, v in pts if t is not None]
        spells: list[tuple[int, int | None]] = []
        if timed:
            start: int | None = None
            for t, v in timed:
                if v >= 1 and start is None:
                    start = t
                elif v < 1 and start is not None:
                    spells.append((start, t))
                    start = None
            if start is not None:
                spells.append((start, None))
        elif any(v >= 1 for _, v in pts) and c is not None:  # a snapshot: Pending now, since its creation
            spells.append((round(c * 1000), None))
        for a, b in spells:
            s = scheduled.get(key)
            out.append({"pod": pod, "namespace": ns, "start_ms": a, "end_ms": b,
                        "created_ms": None if c is None else round(c * 1000),
                        "scheduled_s": None if s is None or c is None else round(s - c, 3)})  # fmt: skip
    return out


def _owner(pod: str, deployments: list[str]) -> str | None:
    """The deployment a pod belongs to by name (``<deployment>-<replicaset hash>-<pod hash>``)."""
    found = [d for d in deployments if pod.startswith(d + "-") and pod[len(d) + 1 :].count("-") == 1]
    return max(found, key=len) if found else None


def _attach_pending(
    events: list[dict[str, Any]], pending: list[dict[str, Any]], deployments: list[str]
) -> None:
    """Pods Pending join their deployment's latest event before them (within 10 minutes), else are a
    ``scale`` event of their own."""
    for p in sorted(pending, key=lambda x: x["start_ms"]):
        dep = _owner(p["pod"], deployments)
        target = None if dep is None else (dep if not p["namespace"] else f"{p['namespace']}/{dep}")
        near = [e for e in events if target is not None and e["target"] == target
                and e["kind"] in (N.EVENT_DEPLOY, N.EVENT_SCALE) and e["time_unix_ms"] - 60_000 <= p["start_ms"]
                <= e["time_unix_ms"] + 600_000]  # fmt: skip
        pend_s = None if p["end_ms"] is None else (p["end_ms"] - p["start_ms"]) / 1000.0
        if near:
            e = near[-1]
            pods = e["detail"].setdefault("pods_pending", [])
            pods.append({k: v for k, v in p.items() if k != "namespace"} | {"pending_s": pend_s})
            e["detail"]["pods_pending_count"] = len(pods)
            continue
        what = f"pod {p['pod']} Pending ({N.KSM_POD_PHASE})" + (
            f" for {pend_s:g} s" if pend_s is not None else ", still Pending at the last scrape"
        )
        if p["scheduled_s"] is not None:
            what += f"; scheduled {p['scheduled_s']:g} s after it was created"
        events.append(_event(p["start_ms"], N.EVENT_SCALE, N.EVENT_SOURCE_KSM,
                             end_ms=p["end_ms"], target=target or p["pod"], description=what,
                             pods_pending=[{k: v for k, v in p.items() if k != "namespace"} | {"pending_s": pend_s}],
                             pods_pending_count=1))  # fmt: skip


def _model_swaps(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    loads = _series(con, N.METRIC_MODEL_LOADS, (N.LABEL_MODEL,))
    ready = _series(con, N.METRIC_MODEL_READY, (N.LABEL_MODEL,))
    out = []
    for key, pts in loads.items():
        (model,) = key
        for t, a, b in _changes(pts):
            if b <= a:
                continue  # a reset (restart) is not a reload seen by this series
            back = [rt for rt, v in ready.get(key, []) if rt is not None and rt >= t and v >= 1]
            out.append(_event(t, N.EVENT_MODEL_SWAP, N.EVENT_SOURCE_STAGESCOPE, end_ms=back[0] if back else None,
                              target=model, description=f"model {model} (re)loaded ({N.METRIC_MODEL_LOADS} "
                              f"{a:g} -> {b:g})", loads=int(b - a), since_unix_ms=_since(pts, t)))  # fmt: skip
    return out


def derived_events(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The events in the scraped metrics: kube-state-metrics rollouts, scale changes and Pending pods,
    stagescope's model reloads (see the module docstring), by time."""
    series = {m: _series(con, m, _DEP) for m in (
        N.KSM_DEPLOYMENT_GENERATION, N.KSM_DEPLOYMENT_OBSERVED_GENERATION, N.KSM_DEPLOYMENT_SPEC_REPLICAS,
        N.KSM_DEPLOYMENT_REPLICAS_UPDATED, N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE)}  # fmt: skip
    events = _deployment_events(series)
    deployments = sorted({k[1] for s in series.values() for k in s if k[1]})
    _attach_pending(events, _pending(con), deployments)
    events += _model_swaps(con)
    events.sort(key=lambda e: (e["time_unix_ms"], e["kind"]))
    return events


def fleet_facts(
    con: duckdb.DuckDBPyConnection, event: dict[str, Any] | None, span_ms: float
) -> dict[str, Any]:
    """What the cost of a capacity lever needs (analysis.cost_levers): the target deployment's mean
    desired ``replicas``, its largest ``scale_step`` up, its rollout ``surge`` (maxSurge) and the
    event's aftermath share of the incident's ``span_ms`` (``event_share``)."""
    out: dict[str, Any] = {}
    target = None if event is None else event.get("target")
    specs = _series(con, N.KSM_DEPLOYMENT_SPEC_REPLICAS, _DEP)
    surge = _series(con, N.KSM_DEPLOYMENT_MAX_SURGE, _DEP)
    keys = [k for k in specs if target in (k[1], f"{k[0]}/{k[1]}")] or (
        list(specs) if len(specs) == 1 else []
    )
    if keys:
        vals = [v for _, v in specs[keys[0]]]
        out["replicas"] = round(sum(vals) / len(vals), 2)
        steps = [b - a for _, a, b in _changes(specs[keys[0]]) if b > a]
        if steps:
            out["scale_step"] = int(max(steps))
        if surge.get(keys[0]):
            out["surge"] = max(1, int(surge[keys[0]][-1][1]))
    if event is not None:
        d = event.get("detail") or {}
        if d.get("replicas_to") is not None and d.get("replicas_from") is not None:
            out.setdefault("scale_step", max(1, int(d["replicas_to"]) - int(d["replicas_from"])))
            out.setdefault("replicas", float(d["replicas_from"]) or None)
        a, b = aftermath(event)
        if span_ms > 0:
            out["event_share"] = min(1.0, max(0.0, (b - a) / span_ms))
    return out


def aftermath(event: dict[str, Any]) -> tuple[int, int]:
    """The event's aftermath (Unix ms): from its time (for an event seen in scrapes, the scrape before
    the one that saw it: ``detail.since_unix_ms``) to :data:`AFTERMATH_S` after its end (or its time,
    when it has no end)."""
    t = int(event["time_unix_ms"])
    since = (event.get("detail") or {}).get("since_unix_ms")
    end = event.get("end_unix_ms")
    start = t if since is None else min(t, int(since))
    return start, int((t if end is None else max(t, int(end))) + AFTERMATH_S * 1000)


def when(event: dict[str, Any]) -> str:
    """``at T``, or ``between S and T`` for an event seen in scrapes (it happened after the scrape S)."""
    since = (event.get("detail") or {}).get("since_unix_ms")
    t = int(event["time_unix_ms"])
    return f"at {utc(t)}" if since is None or int(since) >= t else f"between {utc(int(since))} and {utc(t)}"


def utc(ms: int) -> str:
    """``2026-11-20 12:00:05 UTC`` for a Unix-ms time."""
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
