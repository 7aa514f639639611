"""Synthetic incidents over several routes, each route with its own scenario and ground truth.

Built from :mod:`stagescope.analysis.synth_scenarios` (all data SYNTHETIC, as there): for example a
slow feature store on ``/v1/score`` beside a healthy streaming ``/v1/generate``, the case where pooling
the routes under one e2e SLO blames decoding for a feature-store problem. Write the result with
``synth_scenarios.to_tables`` or ``write_otlp`` like a single scenario.
"""

from __future__ import annotations

import numpy as np

from stagescope.analysis.synth_scenarios import SynthData, generate

__all__ = ["mix"]


def mix(
    parts: dict[str, tuple[str, int]],
    *,
    seed: int = 0,
    duration_s: float = 120.0,
    t0_ns: int = 1_764_460_800 * 10**9,
) -> SynthData:
    """One incident over several routes, each with its own scenario: ``{route: (scenario, n)}``
    (for example a slow feature store on ``/v1/score`` beside a healthy streaming ``/v1/generate``).
    Requests of all routes share the time span; columns one route lacks (a predict route's TTFT, a
    stream's client span) are NULL for its requests. ``routes`` holds each route's scenario."""
    datas = []
    for i, (route, (name, n)) in enumerate(parts.items()):
        d = generate(name, n, seed=seed + 1000 * i, duration_s=duration_s, t0_ns=t0_ns)
        d.requests["route"] = np.full(n, route)
        datas.append((route, d))
    cols = list(dict.fromkeys(c for _, d in datas for c in d.requests))
    req: dict[str, np.ndarray] = {}
    for c in cols:
        pieces = [
            d.requests[c] if c in d.requests else np.full(len(d.requests["trace_id"]), None, dtype=object)
            for _, d in datas
        ]
        req[c] = np.concatenate(
            [p.astype(object) if any(c not in d.requests for _, d in datas) else p for p in pieces]
        )
    order = np.argsort(req["start_unix_ns"].astype(np.int64), kind="stable")
    req = {c: v[order] for c, v in req.items()}
    stages = {k: np.concatenate([d.stages[k] for _, d in datas]) for k in datas[0][1].stages}
    gap_parts = [d.gaps for _, d in datas if d.gaps]
    gaps = {k: np.concatenate([g[k] for g in gap_parts]) for k in ("trace_id", "gap_ms")} if gap_parts else {}
    first = datas[0][1].scenario
    out = SynthData(first, req, stages, gaps, [m for _, d in datas for m in d.metrics])
    out.routes = {route: d.scenario for route, d in datas}
    return out
