"""Prometheus snapshots, Triton/vLLM per-request breakdowns, the live range-query client, results."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagescope import names as N
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.ingest.counters import triton_breakdown, vllm_stage_means
from stagescope.analysis.ingest.prom import parse_exposition
from stagescope.analysis.ingest.promql import (
    BATCH_SIZE_MEAN,
    BUCKET_METRICS,
    RAW_METRICS,
    name_query,
    query_range,
)
from stagescope.errors import UserError

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "external" / "prometheus"
GROUND_TRUTH = REPO / "external" / "ground_truth" / "triton_tutorial_part2_perf_analyzer_outputs.txt"


def _otlp_file(path: Path, spans: list[dict[str, Any]]) -> Path:
    """``spans`` (OTLP/JSON span objects) written to ``path`` as one ExportTraceServiceRequest."""
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}]}))
    return path


def test_external_scrapes_load_with_their_quirks() -> None:
    ds = load_dataset(metrics=[PROM])
    counts = {Path(f.path).name: f.samples for f in ds.files}
    # sample counts stated in external/PROVENANCE.md
    assert counts["datadog_vllm_metrics.txt"] == 185
    assert counts["datadog_triton_metrics.txt"] == 377  # no trailing newline: last sample kept
    assert counts["datadog_dcgm_metrics.txt"] == 38  # NOTE lines skipped, label-less dummies kept
    assert "triton_server_docs_user_guide_metrics.md" not in counts  # not an exposition file
    rows = ds.con.execute(
        "SELECT labels, value FROM metric_samples WHERE metric = 'DCGM_FI_DEV_MEMORY_TEMP' ORDER BY value NULLS FIRST"
    ).fetchall()
    # README excerpt: space after the comma, blank sentinel -> NULL; DataDog fixture: label-less dummy 0
    assert rows[0] == ({"gpu": "0", "UUID": "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"}, None)
    assert ({}, 0.0) in rows
    last = ds.con.execute(
        "SELECT value FROM metric_samples WHERE metric = 'nv_inference_compute_output_summary_us' "
        "AND labels['model'] = 'simple' AND labels['quantile'] = '0.999'"
    ).fetchall()
    assert last == [(3.0,)]
    assert ds.con.execute("SELECT count(*) FROM metric_samples WHERE ts_ms IS NOT NULL").fetchall() == [(0,)]
    ds.close()


def test_exposition_edge_cases() -> None:
    text = (
        '# HELP x\n# NOTE free text\nx{a="1",b="q\\"uote",} 1.5e-3 1700000000000\n'
        'y +Inf\nz{le="0.5", model_name="m"} NaN\nDCGM_FI_DEV_FB_USED{gpu="0"} 2147483632\n'
        "w 9.223372036854776e+18\n# EOF"
    )
    got = list(parse_exposition(text, "t.prom"))
    assert got[0] == ("x", {"a": "1", "b": 'q"uote'}, 0.0015, 1700000000000)
    assert got[1] == ("y", {}, float("inf"), None)
    assert got[2] == ("z", {"le": "0.5", "model_name": "m"}, None, None)
    assert got[3][2] is None and got[4][2] is None  # dcgm int32 blank, int64 blank as float
    with pytest.raises(UserError, match=r"^t\.prom:2: "):
        list(parse_exposition("a 1\nb{c=1} 2\n", "t.prom"))


def test_triton_densenet_breakdown_from_the_snapshot() -> None:
    ds = load_dataset(metrics=[PROM / "triton" / "datadog_triton_metrics.txt"])
    rows = {r["model"]: r for r in triton_breakdown(ds.con)}
    d = rows["densenet_onnx"]
    # PROVENANCE.md: 3 requests, queue 145 us, compute_infer 1,326,831 us, request 1,327,965 us
    assert d["requests"] == 3
    assert d["queue_ms"] == pytest.approx(145 / 3 / 1000)
    assert d["compute_infer_ms"] == pytest.approx(1_326_831 / 3 / 1000)
    assert d["request_ms"] == pytest.approx(1_327_965 / 3 / 1000)
    assert d["overhead_ms"] == pytest.approx((1_327_965 - 145 - 626 - 1_326_831 - 61) / 3 / 1000)  # ~302 us
    assert rows["simple"]["requests"] == 0 and rows["simple"]["queue_ms"] is None
    ds.close()


def _ground_truth_runs() -> Iterator[dict[str, float]]:
    text = GROUND_TRUTH.read_text()
    pat = re.compile(
        r"Successful request count: (\d+)\s+Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec"
        r" \+ compute input (\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)"
    )
    for m in pat.finditer(text):
        n, req, over, q, ci, inf, co = map(int, m.groups())
        yield {"n": n, "request": req, "overhead": over, "queue": q, "ci": ci, "infer": inf, "co": co}


def test_triton_rates_reproduce_perf_analyzer_ground_truth(tmp_path: Path) -> None:
    """Two timestamped scrapes whose counter increases are perf_analyzer's counts x averages: the
    rate helper returns perf_analyzer's per-request breakdown (to the microsecond it reports)."""
    runs = list(_ground_truth_runs())
    assert len(runs) == 2  # no dynamic batching; dynamic batching
    for i, run in enumerate(runs):
        lines = []
        base = {
            "success": 1000,
            "request": 5_000_000,
            "queue": 3_000_000,
            "ci": 9_000,
            "infer": 800_000,
            "co": 500,
        }
        names = {
            "success": N.TRITON_REQUEST_SUCCESS, "request": N.TRITON_REQUEST_DURATION_US,
            "queue": N.TRITON_QUEUE_DURATION_US, "ci": N.TRITON_COMPUTE_INPUT_US,
            "infer": N.TRITON_COMPUTE_INFER_US, "co": N.TRITON_COMPUTE_OUTPUT_US,
        }  # fmt: skip
        for key, metric in names.items():
            inc = run["n"] if key == "success" else run["n"] * run[key]
            lab = '{model="text_recognition",version="1"}'
            lines.append(f"{metric}{lab} {base[key]} 1700000000000")
            lines.append(f"{metric}{lab} {base[key] + inc} 1700000060000")
        f = tmp_path / f"run{i}.prom"
        f.write_text("\n".join(lines) + "\n")
        ds = load_dataset(metrics=[f])
        (row,) = triton_breakdown(ds.con)
        assert row["requests"] == run["n"]
        assert row["queue_ms"] * 1000 == pytest.approx(run["queue"])
        assert row["compute_infer_ms"] * 1000 == pytest.approx(run["infer"])
        assert row["request_ms"] * 1000 == pytest.approx(run["request"])
        # perf_analyzer prints each average rounded to the microsecond: the overhead it derives from the
        # unrounded values can differ from "request minus parts" of the rounded ones by a few us
        assert row["overhead_ms"] * 1000 == pytest.approx(run["overhead"], abs=3)
        ds.close()


def test_counter_reset_counts_as_restart(tmp_path: Path) -> None:
    lab = '{model="m",version="1"}'
    f = tmp_path / "reset.prom"
    f.write_text(
        f"{N.TRITON_REQUEST_SUCCESS}{lab} 10 1000\n{N.TRITON_REQUEST_SUCCESS}{lab} 20 2000\n"
        f"{N.TRITON_REQUEST_SUCCESS}{lab} 5 3000\n"
        f"{N.TRITON_QUEUE_DURATION_US}{lab} 100 1000\n{N.TRITON_QUEUE_DURATION_US}{lab} 1100 2000\n"
        f"{N.TRITON_QUEUE_DURATION_US}{lab} 500 3000\n"
    )
    ds = load_dataset(metrics=[f])
    (row,) = triton_breakdown(ds.con)
    assert row["requests"] == 15 and row["queue_ms"] == pytest.approx(1500 / 15 / 1000)
    ds.close()


def test_vllm_stage_means_from_histograms() -> None:
    ds = load_dataset(metrics=[PROM / "vllm" / "datadog_vllm_metrics.txt"])
    (row,) = vllm_stage_means(ds.con)
    # PROVENANCE.md: 6 requests; prefill_sum 0.21400 s, decode_sum 0.62374 s, inference = prefill + decode
    assert row["model"] == "facebook/opt-125m" and row["requests"] == 6
    assert row["prefill_ms"] == pytest.approx(214.0041133388877 / 6)
    assert row["decode_ms"] == pytest.approx(623.7391703762114 / 6)
    assert row["inference_ms"] == pytest.approx(row["prefill_ms"] + row["decode_ms"], rel=1e-3)
    assert row["queue_ms"] == pytest.approx(7.358146831393242e-05 * 1e3 / 6)
    ds.close()


#: The fake Prometheus' vLLM e2e bucket series: (name, instance, per-step increase per le), counted
#: from 1000 steps' worth (a server up long before the window).
_FAKE_E2E_BUCKETS = (
    (N.VLLM_E2E.replace(":", "_"), "a:8000", {"0.1": 10, "0.5": 16, "1.0": 19, "+Inf": 20}),
    (N.VLLM_E2E, "b:8000", {"0.1": 0, "0.5": 5, "1.0": 8, "+Inf": 10}),
)


class _FakePrometheus(BaseHTTPRequestHandler):
    """Answers /api/v1/query_range like Prometheus: one series per metric, values at each step."""

    queries: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        type(self).queries.append(q)
        if u.path != "/api/v1/query_range":
            self._send(404, {"status": "error", "errorType": "not_found", "error": "no such path"})
            return
        if q["query"] == "broken(":
            self._send(400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 8"})
            return
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        ts = [start + i * step for i in range(int((end - start) // step) + 1)]
        result = []
        if q["query"] == name_query(N.VLLM_NUM_WAITING):  # stored escaped (OpenMetrics, prometheus_client 0.26)
            metric = {"__name__": N.VLLM_NUM_WAITING.replace(":", "_"), N.VLLM_LABEL_MODEL: "m"}
            result.append({"metric": metric, "values": [[t, "3"] for t in ts]})
        elif q["query"] in (N.METRIC_QUEUE_DEPTH, N.DCGM_GPU_UTIL):
            metric = {"__name__": q["query"], "model": "resnet"} if q["query"] == N.METRIC_QUEUE_DEPTH else {
                "__name__": q["query"], "gpu": "0"}  # fmt: skip
            result.append({"metric": metric, "values": [[t, str(i * 2)] for i, t in enumerate(ts)]})
        elif q["query"] == name_query(f"{N.VLLM_E2E}_bucket"):  # two engines, one stored escaped
            for name, inst, per_step in _FAKE_E2E_BUCKETS:
                for le, n in per_step.items():
                    metric = {"__name__": name, "instance": inst, N.VLLM_LABEL_MODEL: "m", "le": le}
                    result.append({"metric": metric, "values": [[t, str(1000 * n + i * n)] for i, t in enumerate(ts)]})
        elif q["query"].startswith("sum by (model) (rate("):
            result.append(
                {
                    "metric": {"model": "resnet"},
                    "values": [[t, "NaN" if i == 0 else "7.5"] for i, t in enumerate(ts)],
                }
            )
        self._send(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakePrometheus.queries = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_live_prometheus_range_queries(prometheus: str) -> None:
    t0 = 1_764_000_000
    ds = load_dataset(prometheus=prometheus, window=(t0 * 10**9, (t0 + 60) * 10**9), prometheus_step_s=15)
    asked = [q["query"] for q in _FakePrometheus.queries]
    # the raw series, kube-state-metrics' pod series for Pending pods (analysis/events.py), the batch mean
    # (vLLM's and SGLang's names under either spelling: colons, or the underscores of escaped OpenMetrics)
    assert asked[: len(RAW_METRICS)] == [name_query(m) for m in RAW_METRICS]
    assert asked[len(RAW_METRICS) : len(RAW_METRICS) + len(BUCKET_METRICS)] == [name_query(m) for m in BUCKET_METRICS]
    assert len(asked) == len(RAW_METRICS) + len(BUCKET_METRICS) + 3 + 1
    assert all(
        q["start"] == f"{t0}.000" and q["end"] == f"{t0 + 60}.000" and q["step"] == "15"
        for q in _FakePrometheus.queries
    )
    rows = ds.con.execute(
        "SELECT metric, labels, value, ts_ms, source FROM metric_samples ORDER BY metric, ts_ms"
    ).fetchall()
    depth = [r for r in rows if r[0] == N.METRIC_QUEUE_DEPTH]
    assert [(r[2], r[3]) for r in depth] == [(2.0 * i, (t0 + 15 * i) * 1000) for i in range(5)]
    assert depth[0][1] == {"model": "resnet"} and depth[0][4] == prometheus
    bs = [r for r in rows if r[0] == BATCH_SIZE_MEAN]
    assert [r[2] for r in bs] == [None, 7.5, 7.5, 7.5, 7.5]
    assert {r[0] for r in rows} == {
        N.METRIC_QUEUE_DEPTH, N.DCGM_GPU_UTIL, BATCH_SIZE_MEAN, N.VLLM_NUM_WAITING, f"{N.VLLM_E2E}_bucket"}  # fmt: skip
    waiting = [r for r in rows if r[0] == N.VLLM_NUM_WAITING]  # the escaped series, under vLLM's name
    assert [r[2] for r in waiting] == [3.0] * 5 and waiting[0][1] == {N.VLLM_LABEL_MODEL: "m"}
    ds.close()


def test_live_prometheus_histogram_buckets_are_a_complete_source(prometheus: str) -> None:
    """``--prometheus`` range-queries the ``_bucket`` series of the histograms read as complete
    sources (both spellings of vLLM's names), to the first step at or after the window's end, and the
    analysis reads them as it reads scrape files: Prometheus' figures for the window, without traces."""
    from stagescope.analysis.api import analyze

    t0 = 1_764_000_000
    ds = load_dataset(prometheus=prometheus, window=(t0 * 10**9, (t0 + 50) * 10**9), prometheus_step_s=15)
    ends = {q["query"]: q["end"] for q in _FakePrometheus.queries}
    assert all(ends[name_query(m)] == f"{t0 + 60}.000" for m in BUCKET_METRICS)  # 50 s -> 4 steps
    assert ends[name_query(N.METRIC_QUEUE_DEPTH)] == f"{t0 + 50}.000"
    rep = analyze(ds, "p99<600ms")
    assert rep["sampling"]["histogram"] == N.VLLM_E2E and rep["sources"]["quantile_ms"] == "metrics"
    # independent: 4 steps of both engines' increases, cumulative 40 / 84 / 108 / 120 at 0.1 / 0.5 /
    # 1 s / +Inf (not the 1000 steps before the window); histogram_quantile: p50 rank 60 in 100..500 ms,
    # p99 rank 118.8 in +Inf -> 1 s; histogram_fraction(0.6 s, +Inf): 1 - (84 + 24 * 100 / 500) / 120
    assert rep["requests"] == 120
    assert rep["latency_ms"]["p50"] == pytest.approx(100 + 400 * 20 / 44, abs=1e-3)
    assert rep["latency_ms"]["p99"] == pytest.approx(1000.0, abs=1e-3)
    assert rep["over_threshold_share"] == pytest.approx(0.26, abs=1e-5)
    ds.close()


def test_live_prometheus_errors(prometheus: str) -> None:
    with pytest.raises(UserError, match="parse error at char 8"):
        query_range(prometheus, "broken(", 0, 60, 15)
    with pytest.raises(UserError, match=r"HTTP 404|not_found|no such path"):
        query_range(prometheus + "/nope", "up", 0, 60, 15)
    with pytest.raises(UserError, match="cannot query Prometheus"):
        query_range("http://127.0.0.1:9", "up", 0, 60, 15, timeout_s=2)


def test_results_parquet_to_client_results(tmp_path: Path) -> None:
    f = tmp_path / "results.parquet"
    pq.write_table(
        pa.table({
            "request_id": [0, 1], "trace_id": ["AB" * 16, "cd" * 16], "route": ["/v1/predict"] * 2,
            "intended_unix_ns": [10, 20], "sent_unix_ns": [11, 21], "first_byte_unix_ns": [None, 25],
            "end_unix_ns": [None, 30], "status": [0, 200], "error": ["connection refused", None],
            "latency_ms": [None, 1e-5], "naive_latency_ms": [None, 9e-6],
        }),
        f,
    )  # fmt: skip
    ds = load_dataset(results=[f])
    rows = ds.con.execute(
        "SELECT request_id, trace_id, status, error, latency_ms, ttft_ms FROM client_results"
    ).fetchall()
    assert rows == [
        (0, "ab" * 16, 0, "connection refused", None, None),
        (1, "cd" * 16, 200, None, 1e-5, None),
    ]
    assert ds.files[0].kind == "results" and ds.files[0].samples == 2
    ds.close()


def test_openmetrics_scrape_with_exemplars_created_and_second_timestamps(tmp_path: Path) -> None:
    """An OpenMetrics scrape (prometheus/docs docs/specs/om/open_metrics_spec.md "Text format"; the
    exemplar and ``_created`` lines as prometheus_client's openmetrics exposition writes them; vLLM V1
    labels ``model_name`` and ``engine``, loggers.py): exemplars are dropped, not read as the sample,
    ``_created`` is its own metric, and timestamps are seconds. Two engines of one model are summed,
    the other model is not pooled with them."""
    t0, t1 = 1_764_000_000.25, 1_764_000_015.25  # Unix seconds, as OpenMetrics writes them
    e2e, queue = N.VLLM_E2E, N.VLLM_QUEUE_TIME
    lines = [f"# TYPE {e2e} histogram", f"# TYPE {queue} histogram"]
    # (model, engine) -> (count, e2e sum s, queue sum s) at t0 and at t1
    series = {("a", "0"): ((4, 2.0, 0.4), (10, 8.0, 1.0)), ("a", "1"): ((1, 0.5, 0.1), (3, 2.5, 0.3)),
              ("b", "0"): ((0, 0.0, 0.0), (5, 50.0, 25.0))}  # fmt: skip
    for t, i in ((t0, 0), (t1, 1)):
        for (model, engine), pts in series.items():
            n, s_e2e, s_q = pts[i]
            lab = f'engine="{engine}",model_name="{model}"'
            trace = f' # {{trace_id="{i:032x}"}} 0.42 {t - 0.1}' if n else ""
            lines += [
                f'{e2e}_bucket{{{lab},le="0.5"}} {float(n)} {t}{trace}',
                f'{e2e}_bucket{{{lab},le="+Inf"}} {float(n)} {t}',
                f"{e2e}_count{{{lab}}} {float(n)} {t}", f"{e2e}_sum{{{lab}}} {s_e2e} {t}",
                f"{e2e}_created{{{lab}}} 1.7639e+09 {t}",
                f"{queue}_count{{{lab}}} {float(n)} {t}", f"{queue}_sum{{{lab}}} {s_q} {t}",
            ]  # fmt: skip
    f = tmp_path / "scrape.om.txt"
    f.write_text("\n".join([*lines, "# EOF"]) + "\n")
    ds = load_dataset(metrics=[f])
    stamps = {t for (t,) in ds.con.execute("SELECT DISTINCT ts_ms FROM metric_samples").fetchall()}
    assert stamps == {round(t0 * 1000), round(t1 * 1000)}
    assert ds.con.execute(
        f"SELECT count(*) FROM metric_samples WHERE metric = '{e2e}_created'"
    ).fetchone() == (6,)
    rows = {r["model"]: r for r in vllm_stage_means(ds.con)}
    # independent: per model, sum over engines of (t1 - t0)
    assert rows["a"]["requests"] == (10 - 4) + (3 - 1) and rows["a"]["engines"] == 2
    assert rows["a"]["e2e_ms"] == pytest.approx(((8.0 - 2.0) + (2.5 - 0.5)) / 8 * 1e3)
    assert rows["a"]["queue_ms"] == pytest.approx(((1.0 - 0.4) + (0.3 - 0.1)) / 8 * 1e3)
    assert rows["b"]["requests"] == 5 and rows["b"]["e2e_ms"] == pytest.approx(10_000.0)
    ds.close()


def test_openmetrics_timestamps_and_bad_ones() -> None:
    text = 'a 1 1700000000\nb{x="}#"} 2 1700000000000 # {trace_id="ab"} 0.5\n# EOF\n'
    got = list(parse_exposition(text, "t.om"))
    assert got[0] == ("a", {}, 1.0, 1_700_000_000_000)  # integer OpenMetrics timestamp: seconds
    assert got[1] == ("b", {"x": "}#"}, 2.0, 1_700_000_000_000)  # ms, as stamped by a recorder
    assert next(iter(parse_exposition("c 3 1700000000000\n")))[3] == 1_700_000_000_000  # text format: ms
    with pytest.raises(UserError, match=r"^t\.prom:1: timestamp 'soon' is not a number"):
        list(parse_exposition("c 3 soon\n", "t.prom"))


def test_triton_counters_over_a_directory_of_scrapes_and_instances(tmp_path: Path) -> None:
    """Triton counters scraped into one file per scrape (stagescope's recorder, a cron'd curl) are one
    time series per label set, not one snapshot per file; two instances of one model in one file are
    two series summed, not one zig-zag series; batch size = inferences / executions (Triton server
    docs/user_guide/metrics.md "Count")."""
    d = tmp_path / "scrapes"
    d.mkdir()
    lab = 'model="m",version="1"'
    pts = [
        (100, 300, 50, 10_000),
        (160, 540, 80, 16_000),
        (220, 780, 110, 40_000),
    ]  # success, count, exec, queue
    for i, (n, infer, execs, q) in enumerate(pts):
        t = 1_700_000_000_000 + i * 15_000
        (d / f"scrape-{i:05d}.prom").write_text(
            f"{N.TRITON_REQUEST_SUCCESS}{{{lab}}} {n} {t}\n{N.TRITON_INFERENCE_COUNT}{{{lab}}} {infer} {t}\n"
            f"{N.TRITON_EXEC_COUNT}{{{lab}}} {execs} {t}\n{N.TRITON_QUEUE_DURATION_US}{{{lab}}} {q} {t}\n"
        )
    ds = load_dataset(metrics=[d])
    (row,) = triton_breakdown(ds.con)
    assert row["requests"] == 220 - 100
    assert row["queue_ms"] == pytest.approx((40_000 - 10_000) / 120 / 1000)
    assert row["executions"] == 60 and row["batch_size"] == pytest.approx((780 - 300) / (110 - 50))
    ds.close()
    f = tmp_path / "two.prom"
    f.write_text(
        "".join(
            f'{N.TRITON_REQUEST_SUCCESS}{{instance="{h}",{lab}}} {v} {t}\n'
            for t, a, b in ((1_700_000_000_000, 100, 1000), (1_700_000_015_000, 130, 1050))
            for h, v in (("a", a), ("b", b))
        )
    )
    ds = load_dataset(metrics=[f])
    (row,) = triton_breakdown(ds.con)
    assert row["requests"] == (130 - 100) + (1050 - 1000)
    ds.close()


def test_triton_before_and_after_snapshots_give_their_difference(tmp_path: Path) -> None:
    """Two untimestamped snapshots (the captures' ``_metrics_before`` / ``_metrics_after``): the
    window's counts are after minus before, as for vLLM (engine_metrics)."""
    after = (
        REPO / "external" / "triton" / "captures" / "triton-2.51.0_trace-file_models_metrics_after.prom"
    ).read_text()
    before = re.sub(
        r'^(nv_inference_\w+\{model="sleep_8ms",version="1"\}) (\d+)$',
        lambda m: f"{m.group(1)} {int(m.group(2)) // 4}",
        after,
        flags=re.M,
    )
    (tmp_path / "before.prom").write_text(before)
    (tmp_path / "after.prom").write_text(after)
    full = {r["model"]: r for r in triton_breakdown(load_dataset(metrics=[tmp_path / "after.prom"]).con)}
    ds = load_dataset(metrics=[tmp_path / "before.prom", tmp_path / "after.prom"])
    rows = {r["model"]: r for r in triton_breakdown(ds.con)}
    assert len(rows) == len(full)  # one row per model, not one per file
    q = re.search(r'^nv_inference_queue_duration_us\{model="sleep_8ms",version="1"\} (\d+)$', after, re.M)
    assert q is not None
    assert rows["sleep_8ms"]["requests"] == 16 - 16 // 4
    assert rows["sleep_8ms"]["queue_ms"] == pytest.approx(
        (int(q.group(1)) - int(q.group(1)) // 4) / 12 / 1000
    )
    assert full["bls_caller"]["requests"] == 6 and rows["bls_caller"]["requests"] == 0  # none in between
    ds.close()


def test_histogram_source_reads_before_and_after_snapshots_as_their_difference(tmp_path: Path) -> None:
    """The e2e histogram read as a complete source from an untimestamped ``before`` and ``after``
    scrape in one directory counts the requests in between (after minus before, per bucket), not
    every request since the server started."""
    from types import SimpleNamespace

    from stagescope.analysis.histogram_source import _bucket_counts

    def scrape(counts: tuple[int, int, int]) -> str:
        les = ("0.5", "1.0", "+Inf")
        return "".join(
            f'{N.VLLM_E2E}_bucket{{le="{le}",model_name="m"}} {c}.0\n'
            for le, c in zip(les, counts, strict=True)
        )

    (tmp_path / "before.prom").write_text(scrape((100, 180, 200)))
    (tmp_path / "after.prom").write_text(scrape((130, 250, 290)))
    ds = load_dataset(metrics=[tmp_path / "before.prom", tmp_path / "after.prom"])
    view = SimpleNamespace(slo=SimpleNamespace(route=None, model=None))
    got = _bucket_counts(ds.con, view, N.VLLM_E2E, None, N.VLLM_LABEL_MODEL)  # type: ignore[arg-type]
    assert got is not None
    assert got[0] == [(500.0, 30.0), (1000.0, 40.0), (float("inf"), 20.0)]  # independent: after - before
    ds.close()


def test_histogram_buckets_are_one_whatever_the_spelling_of_le(tmp_path: Path) -> None:
    """Prometheus 3 normalises ``le="1"`` to ``le="1.0"`` (and a scraper may write ``+Inf`` as
    ``inf``): one series whose bound is spelled two ways across the scrapes is one bucket, whose
    increase is the later count minus the earlier, not each spelling's count since the server started."""
    from types import SimpleNamespace

    from stagescope.analysis.histogram_source import _bucket_counts

    def scrape(les: tuple[str, str, str], counts: tuple[int, int, int], ts: int) -> str:
        return "".join(
            f'{N.VLLM_E2E}_bucket{{le="{le}",model_name="m"}} {c}.0 {ts}\n'
            for le, c in zip(les, counts, strict=True)
        )

    t0 = 1_764_000_000_000
    (tmp_path / "a.prom").write_text(scrape(("0.5", "1", "+Inf"), (100, 180, 200), t0))
    (tmp_path / "b.prom").write_text(scrape(("0.50", "1.0", "inf"), (130, 250, 290), t0 + 60_000))
    ds = load_dataset(metrics=[tmp_path / "a.prom", tmp_path / "b.prom"])
    view = SimpleNamespace(slo=SimpleNamespace(route=None, model=None))
    got = _bucket_counts(ds.con, view, N.VLLM_E2E, None, N.VLLM_LABEL_MODEL)  # type: ignore[arg-type]
    assert got is not None
    assert got[0] == [(500.0, 30.0), (1000.0, 40.0), (float("inf"), 20.0)]  # independent: b - a per bound
    ds.close()


def _vllm_spans(path: Path, n: int = 20) -> Path:
    """``n`` vLLM ``llm_request`` spans (vllm/tracing attributes, seconds) of 11 tokens in 100 ms of
    decode: no per-gap samples, one inter-token figure per stream (10 ms)."""
    spans = []
    for i in range(n):
        st = 1_764_000_000_000_000_000 + i * 200_000_000
        attrs = {"gen_ai.latency.time_in_queue": 0.01, "gen_ai.latency.time_to_first_token": 0.05,
                 "gen_ai.latency.e2e": 0.15, "gen_ai.latency.time_in_model_prefill": 0.03,
                 "gen_ai.latency.time_in_model_decode": 0.1}  # fmt: skip
        kv = [{"key": k, "value": {"doubleValue": v}} for k, v in attrs.items()]
        kv += [{"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "11"}}]
        spans.append({"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": N.VLLM_SPAN_NAME, "kind": 2,
                      "startTimeUnixNano": str(st), "endTimeUnixNano": str(st + 150_000_000), "attributes": kv})  # fmt: skip
    return _otlp_file(path, spans)


def test_older_vllm_inter_token_histogram_is_read_under_its_old_name(tmp_path: Path) -> None:
    """vLLM before the rename wrote the per-token gaps as ``vllm:time_per_output_token_seconds``
    (docs/design/metrics.md; REFERENCE.md section 7): that histogram gives the ITL quantiles as the new
    name's does, instead of being ignored (the streams' 10 ms means then said p99 10 ms, met); where
    both names were scraped the new one is read."""
    from stagescope.analysis.api import analyze

    spans = _vllm_spans(tmp_path / "spans.json")
    buckets = [("0.005", 0), ("0.01", 120), ("0.025", 190), ("0.05", 198), ("0.1", 200), ("+Inf", 200)]

    def scrape(name: str, scale: int = 1) -> str:
        lines = [f'{name}_bucket{{le="{le}",model_name="m"}} {c * scale}.0' for le, c in buckets]
        return "\n".join(
            [*lines, f'{name}_count{{model_name="m"}} {200 * scale}.0', f'{name}_sum{{model_name="m"}} 2.0']
        )

    reports = {}
    for label, text in (("new", scrape(N.VLLM_ITL)), ("old", scrape(N.VLLM_TPOT_LEGACY)),
                        ("both", scrape(N.VLLM_ITL) + "\n" + scrape(N.VLLM_TPOT_LEGACY, 1000))):  # fmt: skip
        f = tmp_path / f"{label}.prom"
        f.write_text(text + "\n")
        ds = load_dataset(traces=[spans], metrics=[f])
        reports[label] = analyze(ds, "itl:p99<60ms")
        ds.close()
    assert reports["new"]["sampling"]["histogram"] == N.VLLM_ITL
    assert reports["old"]["sampling"]["histogram"] == N.VLLM_TPOT_LEGACY
    assert reports["both"]["sampling"]["histogram"] == N.VLLM_ITL
    # histogram_quantile(0.99) of these buckets is 50 ms (rank 198 ends the 25-50 ms bucket)
    assert reports["old"]["latency_ms"] == reports["new"]["latency_ms"] == reports["both"]["latency_ms"]
    # exactly Prometheus' figures (promql/quantile.go bucketQuantile): rank q * 200, linear in the
    # bucket; p50: rank 100 of the 120 in 5..10 ms -> 5 + 5 * 100 / 120 (the traces' 10 ms gaps are
    # streams' means, none in a bucket that the histogram does not also count)
    assert reports["new"]["latency_ms"]["p99"] == 50.0
    assert reports["new"]["latency_ms"]["p50"] == pytest.approx(5 + 5 * 100 / 120, abs=1e-3)
    assert reports["new"]["samples"] == 200  # the gaps the histogram counted


def test_share_over_the_threshold_is_histogram_fraction_but_traced_buckets_use_the_traces(tmp_path: Path) -> None:
    """With the e2e histogram as the source, the share over the threshold is Prometheus'
    ``histogram_fraction(t, +Inf)`` (linear inside the bucket holding ``t``); where every request of
    that bucket was traced (the 20 spans of 150 ms fill 100..200 ms), the traces' own share, as for
    the quantiles."""
    from stagescope.analysis.api import analyze
    from stagescope.analysis.histogram_source import bucket_fraction

    spans = _vllm_spans(tmp_path / "spans.json")
    cum = [(100.0, 0), (200.0, 20), (500.0, 100), (float("inf"), 100)]  # ms, cumulative
    scrape = tmp_path / "e2e.prom"
    scrape.write_text(
        "".join(
            f'{N.VLLM_E2E}_bucket{{le="{"+Inf" if le == float("inf") else repr(le / 1e3)}",model_name="m"}} {c}.0\n'
            for le, c in cum
        )
    )
    ds = load_dataset(traces=[spans], metrics=[scrape])
    # 300 ms: in 200..500, which no trace fell in: 80 * (500 - 300) / 300 of its 80 over, of 100
    rep = analyze(ds, "p99<300ms")
    assert rep["sampling"]["histogram"] == N.VLLM_E2E and rep["requests"] == 100
    assert rep["over_threshold_share"] == pytest.approx(80 * 200 / 300 / 100, abs=1e-5)
    # 160 ms: in the traced bucket, all 20 at 150 ms (not over), plus the 80 above: 0.8, where
    # interpolation would say (20 * 40 / 100 + 80) / 100 = 0.88
    assert analyze(ds, "p99<160ms")["over_threshold_share"] == pytest.approx(0.8, abs=1e-5)
    assert analyze(ds, "p99<140ms")["over_threshold_share"] == pytest.approx(1.0, abs=1e-5)
    ds.close()
    per_bucket = [(100.0, 0.0), (200.0, 20.0), (500.0, 80.0), (float("inf"), 0.0)]
    assert bucket_fraction(per_bucket, 160.0, float("inf")) == pytest.approx(0.88)
    assert bucket_fraction(per_bucket, 0.0, 160.0) == pytest.approx(0.12)
    # a bound is inclusive above: nothing of 200..500 below 200; +Inf gets nothing below a finite end
    assert bucket_fraction(per_bucket, 0.0, 200.0) == pytest.approx(0.2)
    assert bucket_fraction([(1.0, 1.0), (float("inf"), 3.0)], 0.0, 5.0) == pytest.approx(0.25)
    # a lowest bucket at or below 0 starts at -Inf and is taken whole, not interpolated
    lowest = [(0.0, 2.0), (10.0, 2.0), (float("inf"), 0.0)]
    assert bucket_fraction(lowest, float("-inf"), 5.0) == pytest.approx(0.75)
    assert bucket_fraction(lowest, -5.0, 5.0) == pytest.approx(0.25)  # (Go: the lower end takes it all)
    assert bucket_fraction([(1.0, 0.0), (float("inf"), 0.0)], 0.0, 1.0) is None  # no observations
    assert bucket_fraction([(1.0, 1.0)], 0.0, 1.0) is None  # no +Inf bucket
    assert bucket_fraction(per_bucket, 300.0, 300.0) == 0.0


def test_histogram_without_an_inf_bucket_is_not_used_and_none_over_is_a_share_of_0(tmp_path: Path) -> None:
    """A histogram with no ``+Inf`` bucket (a cut scrape) or only that one has no quantile
    (Prometheus' histogram_quantile is NaN): it is not used, said so, and the traces answer; before,
    its None quantiles reached the attribution as a TypeError. None of the 20 traced 150 ms requests
    is over 300 ms: a share of 0, not none (a FILTER over no rows sums to NULL)."""
    from stagescope.analysis.api import analyze

    spans = _vllm_spans(tmp_path / "spans.json")
    for label, les in (("cut", (("0.1", 0), ("0.2", 20), ("0.5", 100))), ("inf-only", (("+Inf", 100),))):
        scrape = tmp_path / f"{label}.prom"
        scrape.write_text("".join(f'{N.VLLM_E2E}_bucket{{le="{le}",model_name="m"}} {c}.0\n' for le, c in les))
        ds = load_dataset(traces=[spans], metrics=[scrape])
        rep = analyze(ds, "p99<300ms")
        assert "histogram" not in rep["sampling"] and rep["sources"]["quantile_ms"] == "traces", label
        assert any(N.VLLM_E2E in w and "+Inf" in w and "not used" in w for w in rep["warnings"]), label
        assert rep["quantile_ms"] == 150.0 and rep["requests"] == 20 and rep["over_threshold_share"] == 0.0
        ds.close()


def test_sglang_latency_histograms_are_complete_sources(tmp_path: Path) -> None:
    """SGLang's own e2e and TTFT histograms (collector.py TokenizerMetricsCollector) correct the
    quantiles of its traced requests as vLLM's do; before, they were not read at all."""
    from stagescope.analysis.api import analyze

    spans = []
    for i in range(20):  # SGLang request roots (trace.py: f"{role} Req {rid[:8]}"), 150 ms each
        st = 1_764_000_000_000_000_000 + i * 200_000_000
        attrs = {"gen_ai.latency.time_to_first_token": 0.05, "gen_ai.latency.e2e": 0.15,
                 "gen_ai.latency.time_in_model_prefill": 0.04, "gen_ai.latency.time_in_model_decode": 0.1}  # fmt: skip
        kv = [{"key": k, "value": {"doubleValue": v}} for k, v in attrs.items()]
        spans.append({"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": f"Req {i:08x}", "kind": 2,
                      "startTimeUnixNano": str(st), "endTimeUnixNano": str(st + 150_000_000), "attributes": kv})  # fmt: skip
    trace = _otlp_file(tmp_path / "sglang.json", spans)
    scrape = tmp_path / "sglang.prom"
    lines = []
    for fam, buckets in ((N.SGLANG_E2E, [("0.1", 0), ("0.2", 150), ("1.0", 199), ("+Inf", 200)]),
                         (N.SGLANG_TTFT, [("0.04", 0), ("0.06", 150), ("0.5", 199), ("+Inf", 200)])):  # fmt: skip
        for rank in ("0", "1"):  # two tensor-parallel ranks publishing, summed
            lab = f'model_name="m",tp_rank="{rank}"'
            lines += [f'{fam}_bucket{{{lab},le="{le}"}} {c // 2}.0' for le, c in buckets]
    scrape.write_text("\n".join(lines) + "\n")
    ds = load_dataset(traces=[trace], metrics=[scrape])
    for slo, fam in (("p99<300ms", N.SGLANG_E2E), ("ttft:p99<300ms", N.SGLANG_TTFT)):
        rep = analyze(ds, slo)
        assert rep["sampling"].get("histogram") == fam and rep["requests"] == 200
        # histogram_quantile exactly. The two ranks' buckets sum to 0 / 150 / 198 / 200 (199 // 2 = 99
        # per rank), so rank 0.99 * 200 = 198 is the last of the 48 in the bucket above the traces'
        # (200..1000 ms; 60..500 ms for TTFT): its upper bound. p50 interpolates in the bucket the 20
        # traces fell in (rank 100 of its 150), as Prometheus does, not at the traces' own value.
        lo, hi, b_lo, b_hi = (200.0, 1000.0, 100.0, 200.0) if fam == N.SGLANG_E2E else (60.0, 500.0, 40.0, 60.0)
        assert rep["latency_ms"]["p99"] == pytest.approx(lo + (hi - lo) * 48 / 48, abs=1e-3)
        assert rep["latency_ms"]["p50"] == pytest.approx(b_lo + (b_hi - b_lo) * 100 / 150, abs=1e-3)
        assert rep["samples"] == 200 and rep["quantile_interval"]["samples"] == 200
    ds.close()


def test_openmetrics_from_prometheus_client_with_escaped_colons() -> None:
    """A vLLM registry written by prometheus_client's OpenMetrics exposition (what a scraper that
    negotiates OpenMetrics gets from vLLM's /metrics): 0.26 escapes the samples' colons
    (``vllm_e2e_...``) under ``# TYPE vllm:e2e_...`` and adds exemplars and ``_created``; the
    families read under their own names, with the figures the registry holds."""
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.openmetrics.exposition import generate_latest

    reg = CollectorRegistry()
    labels = [N.VLLM_LABEL_MODEL, N.VLLM_LABEL_ENGINE]
    e2e = Histogram(N.VLLM_E2E, "e2e", labels, buckets=[0.3, 0.5, 1.0, 2.5], registry=reg)
    queue = Histogram(N.VLLM_QUEUE_TIME, "queue", labels, buckets=[0.01, 0.1], registry=reg)
    pre = Counter(N.VLLM_NUM_PREEMPTIONS.removesuffix("_total"), "preemptions", labels, registry=reg)
    for i, s in enumerate([0.2, 0.4, 0.45, 0.9, 2.0]):
        e2e.labels("m", str(i % 2)).observe(s, exemplar={"trace_id": f"{i + 1:032x}"})
        queue.labels("m", str(i % 2)).observe(s / 100)
    pre.labels("m", "0").inc(3)
    text = generate_latest(reg).decode()
    got = list(parse_exposition(text, "om.txt"))
    names_ = {n for n, _, _, _ in got}
    assert f"{N.VLLM_E2E}_bucket" in names_ and N.VLLM_NUM_PREEMPTIONS in names_
    assert not any(n.startswith("vllm_") for n in names_)
    ds = load_dataset()
    from stagescope.analysis.ingest.prom import insert_samples

    insert_samples(ds, got, "om.txt")
    (row,) = vllm_stage_means(ds.con)
    assert row["requests"] == 5 and row["engines"] == 2
    assert row["e2e_ms"] == pytest.approx((0.2 + 0.4 + 0.45 + 0.9 + 2.0) / 5 * 1e3)
    buckets = dict(
        ds.con.execute(
            f"SELECT labels['le'], sum(value) FROM metric_samples WHERE metric = '{N.VLLM_E2E}_bucket' GROUP BY 1"
        ).fetchall()
    )
    assert buckets == {"0.3": 1.0, "0.5": 3.0, "1.0": 4.0, "2.5": 5.0, "+Inf": 5.0}
    ds.close()


def test_sglang_requests_aborted_before_their_first_token_stay_on_route_req(tmp_path: Path) -> None:
    """SGLang sets each ``gen_ai.latency`` key only when both its timestamps exist (req_time_stats.py
    ``convert_to_gen_ai_span_attrs``): a request aborted before its first token carries ``e2e`` alone.
    It is still one of SGLang's requests, on route ``Req``, not a route of its own named after its
    request id (which made every aborted request a route of one)."""
    spans = []
    for i in range(10):
        st = 1_764_000_000_000_000_000 + i * 200_000_000
        attrs = {"gen_ai.latency.e2e": 0.15}
        if i % 3:  # two in three finished normally
            attrs |= {"gen_ai.latency.time_to_first_token": 0.05, "gen_ai.latency.time_in_model_prefill": 0.04,
                      "gen_ai.latency.time_in_model_decode": 0.1}  # fmt: skip
        kv = [{"key": k, "value": {"doubleValue": v}} for k, v in attrs.items()]
        spans.append({"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": f" Req {i:08x}", "kind": 1,
                      "startTimeUnixNano": str(st), "endTimeUnixNano": str(st + 150_000_000), "attributes": kv})  # fmt: skip
    trace = _otlp_file(tmp_path / "sglang.json", spans)
    ds = load_dataset(traces=[trace])
    rows = ds.con.execute(
        "SELECT route, source, count(*), count(ttft_ms) FROM requests GROUP BY ALL"
    ).fetchall()
    assert rows == [("Req", N.SOURCE_SGLANG, 10, 6)]
    ds.close()
