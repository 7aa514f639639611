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


def _vllm_e2e_openmetrics() -> str:
    """vLLM's e2e histogram buckets every 15 s over two minutes from two engines, one stored with
    vLLM's colons and one escaped (``vllm_...``, prometheus_client 0.26 OpenMetrics), typed unknown
    to keep the ``_bucket`` names; counted from a server up long before."""
    engines = (
        (N.VLLM_E2E.replace(":", "_"), "a:8000", {"0.1": 10, "0.5": 16, "1.0": 19, "+Inf": 20}),
        (N.VLLM_E2E, "b:8000", {"0.1": 0, "0.5": 5, "1.0": 8, "+Inf": 10}),
    )
    lines = []
    for name, inst, per_step in engines:
        lines.append(f"# TYPE {name}_bucket unknown")
        for i in range(0, 121, STEP):
            for le, n in per_step.items():
                lab = f'instance="{inst}",{N.VLLM_LABEL_MODEL}="m",le="{le}"'
                lines.append(f"{name}_bucket{{{lab}}} {1000 * n + (i // STEP) * n} {T0 + i}")
    return "\n".join(lines) + "\n# EOF\n"


def test_histogram_buckets_from_real_prometheus_give_its_own_histogram_quantile(tmp_path: Path) -> None:
    """``--prometheus`` reads the ``_bucket`` series under both spellings of vLLM's names, and the
    quantiles it answers with (no traces) are the real Prometheus' own ``histogram_quantile`` of the
    window's increase (``x - x offset 120s``, summed by ``le``)."""
    import httpx

    from stagescope.analysis.api import analyze

    with backfilled_prometheus(tmp_path, _vllm_e2e_openmetrics()) as url, load_dataset(
        prometheus=url, window=(T0 * 10**9, (T0 + 120) * 10**9), prometheus_step_s=STEP
    ) as ds:
        rep = analyze(ds, "p99<600ms")
        assert rep["sampling"]["histogram"] == N.VLLM_E2E and rep["requests"] == 8 * 30
        sel = f'{{__name__=~"{N.VLLM_E2E}_bucket|{N.VLLM_E2E.replace(":", "_")}_bucket"}}'
        for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            expr = f"histogram_quantile({q}, sum by (le) ({sel}) - sum by (le) ({sel} offset 120s))"
            got = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": str(T0 + 120)}, timeout=10)
            (res,) = got.json()["data"]["result"]
            assert rep["latency_ms"][key] == pytest.approx(float(res["value"][1]) * 1e3, abs=1e-3), key
        # histogram_fraction(0.6 s, +Inf) of 80 / 168 / 216 / 240 (Prometheus 2.42 has it for native
        # histograms only): 1 - (168 + 48 * 100 / 500) / 240
        assert rep["over_threshold_share"] == pytest.approx(1 - (168 + 48 * 0.2) / 240, abs=1e-5)
