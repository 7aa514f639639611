"""SYNTHETIC incidents that follow a deploy or a scale event, with the kube-state-metrics series a
cluster would show and the events file a team would write, and the truth after the right lever.

* ``rolling-update-cold-start`` (p99 < 300 ms, /v1/predict): deployment ``serving/ranker`` (4 replicas,
  maxSurge 1) rolls out generation 7 -> 8 from 125 s to ~190 s. Its readiness probe does not wait for
  the model: a quarter of the requests in the rollout reach a new pod still loading it and wait
  ~800 ms in ``cold_start``. kube-state-metrics (scraped every 15 s) shows the generation rise, the
  updated replicas climbing 0 -> 4 and one replica unavailable meanwhile. Truth: the event is the
  ``deploy``, its lever ``surge-with-readiness``; with it those requests are served like the rest.
* ``hpa-scale-pending`` (p99 < 300 ms, /v1/predict): at 182 s traffic doubles; the HPA scales
  ``serving/ranker`` 2 -> 5 replicas (seen at the 195 s scrape); the three new pods sit Pending ~50 s
  (no free GPU node), are scheduled at ~235 s and ready at ~245 s. Meanwhile the gateway in front of
  the service holds half of the extra load for ~450 ms until a pod has room, in a ``pod_pending``
  stage span. Truth: the event is the ``scale``, its lever ``prewarmed-pods`` (the stage lever too).

Each incident is deterministic for a seed; :meth:`EventIncident.true_quantile` is the SLO quantile
with the event made invisible (the requests it slowed served like the others), from the generator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth_multi import _layout  # stage spans one after another
from stagescope.analysis.synth_scenarios import PREDICT, Scenario, SynthData, _ids, _ln

__all__ = ["EVENT_INCIDENTS", "EventIncident", "generate_event_incident"]

#: name -> (SLO, the event kind the breach follows, its lever, the stage that grows, that stage's lever).
EVENT_INCIDENTS: dict[str, tuple[str, str, str, str, str]] = {
    "rolling-update-cold-start": (
        "p99<300ms", N.EVENT_DEPLOY, N.LEVER_SURGE_READINESS, N.STAGE_COLD_START, N.LEVER_PREWARM,
    ),
    "hpa-scale-pending": (
        "p99<300ms", N.EVENT_SCALE, N.LEVER_PREWARMED_PODS, N.STAGE_POD_PENDING, N.LEVER_PREWARMED_PODS,
    ),
}  # fmt: skip
NAMESPACE = "serving"
DEPLOYMENT = "ranker"
SCRAPE_S = 15.0
_T0_NS = 1_764_460_800 * 10**9  # a whole minute: the analysis's 1-minute windows start at 0 s, 60 s, ...


@dataclass
class EventIncident:
    """One incident: its synthetic data (with the kube-state-metrics samples), the events-file lines
    describing the same event, and each request's slow part the event caused (ms)."""

    data: SynthData
    event_kind: str
    lever: str
    quantile: float
    event_lines: list[dict[str, Any]]
    duration_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    caused_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def true_quantile(self) -> float:
        """The SLO quantile (ms) had the event slowed no request (the lever's truth)."""
        return float(np.quantile(self.duration_ms - self.caused_ms, self.quantile))

    def write_events(self, path: str | Path) -> Path:
        """The events file (JSON lines) a team would have written for this incident."""
        p = Path(path)
        p.write_text("".join(json.dumps(e) + "\n" for e in self.event_lines), encoding="utf-8")
        return p


def _ksm(
    t0_ms: int, dur_s: float, state: Any, pods: Sequence[tuple[str, float, float | None, float | None]]
) -> list[tuple[str, dict[str, str], float, int]]:
    """kube-state-metrics samples every :data:`SCRAPE_S` seconds: ``state(t_s)`` gives the deployment's
    ``{metric: value}``; ``pods``: ``(name, created_s, scheduled_s, running_s)`` (None: not yet)."""
    dep = {N.KSM_LABEL_NAMESPACE: NAMESPACE, N.KSM_LABEL_DEPLOYMENT: DEPLOYMENT}
    out: list[tuple[str, dict[str, str], float, int]] = []
    for t in np.arange(0.0, dur_s + SCRAPE_S, SCRAPE_S):
        ts = t0_ms + round(t * 1000)
        for metric, value in state(float(t)).items():
            out.append((metric, dep, float(value), ts))
        for i, (pod, created, sched, running) in enumerate(pods):
            if t < created:
                continue
            lab = {N.KSM_LABEL_NAMESPACE: NAMESPACE, N.KSM_LABEL_POD: pod, "uid": f"00000000-0000-0000-0000-{i:012d}"}
            pending = running is None or t < running
            for phase in ("Pending", "Running"):
                out.append((N.KSM_POD_PHASE, {**lab, N.KSM_LABEL_PHASE: phase},
                            float(pending == (phase == "Pending")), ts))  # fmt: skip
            out.append((N.KSM_POD_CREATED, lab, t0_ms / 1000.0 + created, ts))
            if sched is not None and t >= sched:
                out.append((N.KSM_POD_SCHEDULED_TIME, lab, t0_ms / 1000.0 + sched, ts))
    return out


def _base(rng: np.random.Generator, t: np.ndarray) -> dict[str, np.ndarray]:
    n = len(t)
    return {
        N.STAGE_FEATURE_FETCH: _ln(rng, 4, 0.3, n), N.STAGE_PREPROCESS: _ln(rng, 3, 0.3, n),
        N.STAGE_POD_PENDING: np.zeros(n), N.STAGE_COLD_START: np.zeros(n),
        N.STAGE_BATCH_WAIT: rng.uniform(0, 5, n), N.STAGE_QUEUE: rng.exponential(2, n),
        N.STAGE_COMPUTE: _ln(rng, 20, 0.15, n), N.STAGE_POSTPROCESS: _ln(rng, 1, 0.2, n),
        N.STAGE_EGRESS: _ln(rng, 1, 0.2, n),
    }  # fmt: skip


def _rolling(rng: np.random.Generator, n: int, t0_ms: int, dur_s: float) -> tuple[Any, ...]:
    t = np.sort(rng.uniform(0, dur_s, n))
    d = _base(rng, t)
    start, done = 125.0, 190.0
    cold = (t >= start) & (t < done) & (rng.random(n) < 0.25)
    d[N.STAGE_COLD_START][cold] = _ln(rng, 800, 0.15, int(cold.sum()))

    def state(s: float) -> dict[str, float]:
        rolled = s >= start
        upd = 0.0 if not rolled else min(4.0, np.floor((s - start) / 15.0) + 1.0)
        busy = rolled and s < done
        return {
            N.KSM_DEPLOYMENT_GENERATION: 8.0 if rolled else 7.0,
            N.KSM_DEPLOYMENT_OBSERVED_GENERATION: 8.0 if rolled else 7.0,
            N.KSM_DEPLOYMENT_SPEC_REPLICAS: 4.0, N.KSM_DEPLOYMENT_MAX_SURGE: 1.0,
            N.KSM_DEPLOYMENT_REPLICAS: 5.0 if busy else 4.0,
            N.KSM_DEPLOYMENT_REPLICAS_UPDATED: 4.0 if not rolled or s >= done else upd,
            N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE: 1.0 if busy else 0.0,
            N.KSM_DEPLOYMENT_REPLICAS_AVAILABLE: 3.0 if busy else 4.0,
        }  # fmt: skip

    iso = _iso(t0_ms, start)
    lines = [{"time": iso, "end": _iso(t0_ms, done), "kind": N.EVENT_DEPLOY, "target": f"{NAMESPACE}/{DEPLOYMENT}",
              "description": "ranker v7 -> v8 (rolling update)", "from": "v7", "to": "v8"}]  # fmt: skip
    return t, d, d[N.STAGE_COLD_START].copy(), _ksm(t0_ms, dur_s, state, []), lines, cold


def _scale(rng: np.random.Generator, n: int, t0_ms: int, dur_s: float) -> tuple[Any, ...]:
    burst, ready = 182.0, 245.0
    extra = int(n * (ready - burst) / dur_s)  # the rate doubles during the burst
    t = np.sort(np.concatenate([rng.uniform(0, dur_s, n), rng.uniform(burst, ready, extra)]))
    d = _base(rng, t)
    held = (t >= burst + 3.0) & (t < ready) & (rng.random(len(t)) < 0.25)
    d[N.STAGE_POD_PENDING][held] = _ln(rng, 450, 0.25, int(held.sum()))

    def state(s: float) -> dict[str, float]:
        up = s >= 195.0
        return {
            N.KSM_DEPLOYMENT_GENERATION: 4.0 if up else 3.0, N.KSM_DEPLOYMENT_OBSERVED_GENERATION: 4.0 if up else 3.0,
            N.KSM_DEPLOYMENT_SPEC_REPLICAS: 5.0 if up else 2.0, N.KSM_DEPLOYMENT_MAX_SURGE: 1.0,
            N.KSM_DEPLOYMENT_REPLICAS: 5.0 if up else 2.0,
            N.KSM_DEPLOYMENT_REPLICAS_UPDATED: 5.0 if up else 2.0,
            N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE: 3.0 if up and s < ready else 0.0,
            N.KSM_DEPLOYMENT_REPLICAS_AVAILABLE: 2.0 if s < ready else 5.0,
        }  # fmt: skip

    pods = [(f"{DEPLOYMENT}-6c9d7f8b54-{k}", 186.0 + i, 233.0 + 2 * i, 243.0 + i)
            for i, k in enumerate(("x7k2p", "m4q9z", "t2w8c"))]  # fmt: skip
    old = [(f"{DEPLOYMENT}-6c9d7f8b54-{k}", -600.0, -598.0, -560.0) for k in ("a1b2c", "d3e4f")]
    lines = [{"time": _iso(t0_ms, 186.0), "kind": N.EVENT_SCALE, "target": f"{NAMESPACE}/{DEPLOYMENT}",
              "description": "HPA scaled ranker 2 -> 5 (cpu 92% of target)", "replicas_from": 2, "replicas_to": 5}]  # fmt: skip
    return t, d, d[N.STAGE_POD_PENDING].copy(), _ksm(t0_ms, dur_s, state, old + pods), lines, held


def _iso(t0_ms: int, s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t0_ms / 1000.0 + s, tz=UTC).isoformat().replace("+00:00", "Z")


def generate_event_incident(
    name: str, n: int = 3000, *, seed: int = 0, duration_s: float = 300.0, t0_ns: int = _T0_NS
) -> EventIncident:
    """Synthesize incident ``name`` (a key of :data:`EVENT_INCIDENTS`): ``n`` requests over
    ``duration_s`` seconds (more during the scale incident's burst)."""
    slo, kind, lever, stage, stage_lever = EVENT_INCIDENTS[name]
    rng = np.random.default_rng(seed)
    t0_ms = t0_ns // 1_000_000
    build = _rolling if name == "rolling-update-cold-start" else _scale
    t, d, caused, metrics, lines, hit = build(rng, n, t0_ms, duration_s)
    m = len(t)
    start_ns = t0_ns + (t * 1e9).astype(np.int64)
    duration = np.sum(np.stack(list(d.values())), axis=0) + 0.3
    trace, span = _ids(rng, m)
    req = {
        "trace_id": trace, "span_id": span, "route": np.full(m, PREDICT), "model": np.full(m, "resnet"),
        "status_code": np.full(m, 200), "start_unix_ns": start_ns, "duration_ms": duration,
        "batch_size": rng.integers(8, 17, m).astype(float), "queue_depth": rng.poisson(3, m).astype(float),
        "input_hash": np.array([f"h{i:08x}" for i in rng.integers(0, 2**31, m)]),
        "cold_start": hit if stage == N.STAGE_COLD_START else np.zeros(m, bool),
    }  # fmt: skip
    data = SynthData(Scenario(name, PREDICT, slo, stage, stage_lever), req, _layout(trace, start_ns, list(d.items())))
    data.metrics.extend(metrics)
    q = float(slo.split("<")[0].split("p")[-1]) / 100.0
    return EventIncident(data, kind, lever, q, lines, duration, caused)
