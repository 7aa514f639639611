"""The live path against Debian's real Prometheus: backfilled samples, range queries, per-request rates.

``promtool tsdb create-blocks-from openmetrics`` writes known samples into a TSDB block; Prometheus
serves it on a free 127.0.0.1 port; ``load_dataset(prometheus=...)`` range-queries the window and the
Triton helper turns the counters into per-request means. Skipped where prometheus/promtool are absent.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_support import backfilled_prometheus

from stagescope import names as N
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.ingest.counters import triton_breakdown

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")), reason="prometheus/promtool not installed"
)
T0 = 1_764_000_000  # Unix s
STEP = 15


def _openmetrics() -> str:
    """Samples every 15 s over two minutes, grouped by family as OpenMetrics requires."""
    lab = '{model="densenet_onnx",version="1"}'
    families: dict[str, tuple[str, list[str]]] = {
        N.METRIC_QUEUE_DEPTH: ("gauge", []),
        N.DCGM_GPU_UTIL: ("gauge", []),
        # Triton's cumulative counters carry no _total suffix: typed "unknown" to keep their names
        N.TRITON_REQUEST_SUCCESS: ("unknown", []),
        N.TRITON_QUEUE_DURATION_US: ("unknown", []),
        N.TRITON_COMPUTE_INFER_US: ("unknown", []),
    }
    for i in range(0, 121, STEP):
        t = T0 + i
        n = 1000 + 4 * i  # 4 requests/s; each waits 250 us in the queue and computes 2 ms
        families[N.METRIC_QUEUE_DEPTH][1].append(f'{N.METRIC_QUEUE_DEPTH}{{model="resnet"}} {i // STEP} {t}')
        families[N.DCGM_GPU_UTIL][1].append(f'{N.DCGM_GPU_UTIL}{{gpu="0"}} {50 + i // STEP} {t}')
        families[N.TRITON_REQUEST_SUCCESS][1].append(f"{N.TRITON_REQUEST_SUCCESS}{lab} {n} {t}")
        families[N.TRITON_QUEUE_DURATION_US][1].append(f"{N.TRITON_QUEUE_DURATION_US}{lab} {n * 250} {t}")
        families[N.TRITON_COMPUTE_INFER_US][1].append(f"{N.TRITON_COMPUTE_INFER_US}{lab} {n * 2000} {t}")
    lines = [line for name, (typ, rows) in families.items() for line in (f"# TYPE {name} {typ}", *rows)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    with backfilled_prometheus(tmp_path, _openmetrics()) as url:
        yield url


def test_range_queries_against_real_prometheus(prometheus: str) -> None:
    with load_dataset(
        prometheus=prometheus, window=(T0 * 10**9, (T0 + 120) * 10**9), prometheus_step_s=STEP
    ) as ds:
        depth = ds.con.execute(
            f"SELECT ts_ms, value, labels['model'] FROM metric_samples WHERE metric = '{N.METRIC_QUEUE_DEPTH}' "
            "ORDER BY ts_ms"
        ).fetchall()
        assert depth == [((T0 + i * STEP) * 1000, float(i), "resnet") for i in range(9)]
        util = ds.con.execute(
            f"SELECT avg(value) FROM metric_samples WHERE metric = '{N.DCGM_GPU_UTIL}'"
        ).fetchall()
        assert util == [(54.0,)]
        (row,) = triton_breakdown(ds.con)
        assert row["model"] == "densenet_onnx" and row["requests"] == 480
        assert row["queue_ms"] == pytest.approx(0.25) and row["compute_infer_ms"] == pytest.approx(2.0)
        assert all(f.kind == "prometheus" for f in ds.files) and not ds.warnings
