"""Deploys and Pending pods from kube-state-metrics series in Debian's real Prometheus (issue 18 d4).

``promtool tsdb create-blocks-from openmetrics`` backfills a rollout of ``serving/ranker`` (its generation
rises, its updated replicas climb, one replica unavailable meanwhile), a new pod Pending for 45 s and an
unrelated pod Running throughout; Prometheus serves the block; ``load_dataset(prometheus=...)``
range-queries it (only the Pending pods' series, analysis/ingest/promql.py:ksm_pod_queries) and
analysis.events derives the event. Names and labels as kube-state-metrics' docs give them
(docs/metrics/workload/deployment-metrics.md, pod-metrics.md). Skipped where prometheus/promtool are absent.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_support import backfilled_prometheus

from stagescope import names as N
from stagescope.analysis.events import derived_events
from stagescope.analysis.ingest import load_dataset

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")), reason="prometheus/promtool not installed"
)
T0 = 1_764_000_000  # Unix s
STEP = 15
ROLL = 60  # the rollout starts after the 45 s scrape and is seen at the 60 s one


def _openmetrics() -> str:
    dep = '{namespace="serving",deployment="ranker"}'
    new = 'namespace="serving",pod="ranker-5d8f7c9b4-q7x2m",uid="u-new"'
    old = 'namespace="serving",pod="ranker-5d8f7c9b4-a1b2c",uid="u-old"'
    fam: dict[str, list[str]] = {m: [] for m in (
        N.KSM_DEPLOYMENT_GENERATION, N.KSM_DEPLOYMENT_OBSERVED_GENERATION, N.KSM_DEPLOYMENT_SPEC_REPLICAS,
        N.KSM_DEPLOYMENT_REPLICAS_UPDATED, N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE, N.KSM_POD_PHASE,
        N.KSM_POD_CREATED, N.KSM_POD_SCHEDULED_TIME)}  # fmt: skip
    for i in range(0, 241, STEP):
        t = T0 + i
        rolled = i >= ROLL
        fam[N.KSM_DEPLOYMENT_GENERATION].append(f"{N.KSM_DEPLOYMENT_GENERATION}{dep} {8 if rolled else 7} {t}")
        fam[N.KSM_DEPLOYMENT_OBSERVED_GENERATION].append(
            f"{N.KSM_DEPLOYMENT_OBSERVED_GENERATION}{dep} {8 if rolled else 7} {t}"
        )
        fam[N.KSM_DEPLOYMENT_SPEC_REPLICAS].append(f"{N.KSM_DEPLOYMENT_SPEC_REPLICAS}{dep} 4 {t}")
        upd = 4 if not rolled or i >= 150 else 1 + (i - ROLL) // 30
        fam[N.KSM_DEPLOYMENT_REPLICAS_UPDATED].append(f"{N.KSM_DEPLOYMENT_REPLICAS_UPDATED}{dep} {upd} {t}")
        unav = 1 if rolled and i < 150 else 0
        fam[N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE].append(f"{N.KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE}{dep} {unav} {t}")
        for pod, pending in ((old, False), (new, ROLL <= i < ROLL + 45)):
            if pod == new and i < ROLL:
                continue
            for phase in ("Pending", "Running"):
                fam[N.KSM_POD_PHASE].append(
                    f'{N.KSM_POD_PHASE}{{{pod},phase="{phase}"}} {int(pending == (phase == "Pending"))} {t}'
                )
            created = T0 - 3600 if pod == old else T0 + ROLL - 5
            fam[N.KSM_POD_CREATED].append(f"{N.KSM_POD_CREATED}{{{pod}}} {created} {t}")
            if pod == old or i >= ROLL + 30:
                fam[N.KSM_POD_SCHEDULED_TIME].append(f"{N.KSM_POD_SCHEDULED_TIME}{{{pod}}} {created + 35} {t}")
    lines = [line for name, rows in fam.items() for line in (f"# TYPE {name} gauge", *rows)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    with backfilled_prometheus(tmp_path, _openmetrics()) as url:
        yield url


def test_rollout_and_pending_pod_from_a_live_prometheus(prometheus: str) -> None:
    ds = load_dataset(prometheus=prometheus, window=(T0 * 10**9, (T0 + 240) * 10**9), prometheus_step_s=STEP)
    # only the pod that was Pending came back, under its own metric name
    pods = ds.con.execute(
        "SELECT DISTINCT metric, labels['pod'] FROM metric_samples WHERE metric LIKE 'kube_pod_%' ORDER BY 1"
    ).fetchall()
    assert {p for _, p in pods} == {"ranker-5d8f7c9b4-q7x2m"}
    assert {m for m, _ in pods} == {N.KSM_POD_PHASE, N.KSM_POD_CREATED, N.KSM_POD_SCHEDULED_TIME}
    (ev,) = derived_events(ds.con)
    assert (ev["kind"], ev["target"], ev["source"]) == (N.EVENT_DEPLOY, "serving/ranker", N.EVENT_SOURCE_KSM)
    assert ev["time_unix_ms"] == (T0 + ROLL) * 1000 and ev["detail"]["since_unix_ms"] == (T0 + ROLL - STEP) * 1000
    assert ev["end_unix_ms"] == (T0 + 150) * 1000  # every replica updated, none unavailable
    (pod,) = ev["detail"]["pods_pending"]
    assert pod["pod"] == "ranker-5d8f7c9b4-q7x2m" and pod["pending_s"] == 45.0 and pod["scheduled_s"] == 35.0
    ds.close()
