"""Triton: its trace file and its OpenTelemetry spans become requests and stages.

Data: real captures of Triton 2.51.0 (external/triton/captures/: the ``tritonserver`` of the
nvidia-pytriton 0.7.0 wheel on this machine's CPU, Python-backend models whose compute is SIMULATED
by sleeping; everything else is Triton's: see external/PROVENANCE.md), the JSON example of Triton's
docs (external/triton/upstream/server_docs_user_guide_trace.md), and the SIMULATED server of
:mod:`stagescope.analysis.synth_triton` where a ground truth is needed (cache hits, first response).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from stagescope import names as N
from stagescope.analysis import synth_triton as ST
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest import load_dataset
from stagescope.errors import UserError

REPO = Path(__file__).resolve().parents[1]
CAP = REPO / "external" / "triton" / "captures"
DOCS = REPO / "external" / "triton" / "upstream" / "server_docs_user_guide_trace.md"
V = "triton-2.51.0"
UNIX_AT_ORIGIN = 1_764_000_000_000_000_000  # Unix ns the simulated steady origin is placed at


def _stage_means(ds: Any) -> dict[str, float]:
    """Stage time per request (ms), over every request."""
    n = ds.con.execute("SELECT count(*) FROM requests").fetchone()[0]
    rows = ds.con.execute("SELECT stage, sum(duration_ms) FROM stages GROUP BY stage").fetchall()
    return {s: t / n for s, t in rows}


def _raw(path: Path) -> dict[int, dict[str, Any]]:
    """A Triton trace file read independently of the reader: id -> {model, parent, ts: name -> [ns]}."""
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    out: dict[int, dict[str, Any]] = {}
    for o in doc:
        t = out.setdefault(o["id"], {"model": None, "parent": None, "ts": {}})
        if "model_name" in o:
            t["model"], t["parent"] = o["model_name"], o.get("parent_id")
        for s in o.get("timestamps", []):
            t["ts"].setdefault(s["name"], []).append(s["ns"])
    return out


def test_docs_example_intervals(tmp_path: Path) -> None:
    """The trace of docs/user_guide/trace.md ("JSON Trace Output") and Triton's own intervals."""
    block = re.search(r'```\n(\[\n  \{"id": 1, "timestamps".*?\])\n```', DOCS.read_text(), re.S)
    assert block is not None
    p = tmp_path / "trace.json"
    p.write_text(block.group(1))
    ts = {o["timestamps"][0]["name"]: o["timestamps"][0]["ns"] for o in json.loads(block.group(1))}
    ds = load_dataset(traces=[p])
    (dur,) = ds.con.execute("SELECT duration_ms FROM requests").fetchone()
    assert dur == pytest.approx((ts["HTTP_SEND_END"] - ts["HTTP_RECV_START"]) / 1e6)
    got = dict(ds.con.execute("SELECT stage, duration_ms FROM stages").fetchall())
    want = {  # server qa/common/trace_summary.py: QUEUE, COMPUTE_INPUT / INFER / OUTPUT, HTTP_RECV
        N.STAGE_QUEUE: ts["COMPUTE_START"] - ts["QUEUE_START"],
        N.STAGE_COMPUTE_INPUT: ts["COMPUTE_INPUT_END"] - ts["COMPUTE_START"],
        N.STAGE_COMPUTE: ts["COMPUTE_OUTPUT_START"] - ts["COMPUTE_INPUT_END"],
        N.STAGE_COMPUTE_OUTPUT: ts["COMPUTE_END"] - ts["COMPUTE_OUTPUT_START"],
        N.STAGE_RECEIVE: ts["HTTP_RECV_END"] - ts["HTTP_RECV_START"],
        N.STAGE_DESERIALIZE: ts["REQUEST_START"] - ts["HTTP_RECV_END"],
        N.STAGE_EGRESS: ts["HTTP_SEND_END"] - ts["INFER_RESPONSE_COMPLETE"],
    }
    assert got == pytest.approx({k: v / 1e6 for k, v in want.items()})
    ds.close()


def test_real_trace_file_ensembles_bls_cache_grpc_and_streams() -> None:
    path = CAP / f"{V}_trace-file_models.json"
    raw = _raw(path)
    ds = load_dataset(traces=[path])
    routes = dict(ds.con.execute("SELECT route, count(*) FROM requests GROUP BY route").fetchall())
    # one request per root trace: the composing models and the BLS child attach to their parent
    assert routes == {
        "ensemble_pipeline": 6,
        "bls_caller": 6,
        "cached_5ms": 6,
        "sleep_8ms": 4,
        "decoupled_stream": 3,
    }
    assert sum(routes.values()) == sum(1 for t in raw.values() if t["parent"] is None)
    rows = ds.con.execute(
        "SELECT r.route, s.stage, count(*), sum(s.duration_ms) FROM stages s JOIN requests r USING (request_key) "
        "GROUP BY ALL"
    ).fetchall()
    count = {(r, s): c for r, s, c, _ in rows}
    total = {(r, s): t for r, s, _, t in rows}
    assert count[("ensemble_pipeline", N.STAGE_COMPUTE)] == 12  # preprocess_1ms + sleep_8ms, per request
    assert (
        count[("ensemble_pipeline", N.STAGE_QUEUE)] == 12
        and ("ensemble_pipeline", N.STAGE_COMPUTE_INPUT) in count
    )
    # BLS: its compute is cut around the child's REQUEST_START..END, the child's own stages show
    bls_own = child = 0.0
    for t in raw.values():
        if t["model"] == "bls_caller":
            ts = t["ts"]
            kid = next(k for k in raw.values() if k["parent"] is not None and raw.get(k["parent"]) is t)
            child_iv = kid["ts"]["REQUEST_END"][0] - kid["ts"]["REQUEST_START"][0]
            bls_own += ts["COMPUTE_OUTPUT_START"][0] - ts["COMPUTE_INPUT_END"][0] - child_iv
            child += kid["ts"]["COMPUTE_OUTPUT_START"][0] - kid["ts"]["COMPUTE_INPUT_END"][0]
    assert count[("bls_caller", N.STAGE_COMPUTE)] == 6 * 2 + 6
    assert total[("bls_caller", N.STAGE_COMPUTE)] == pytest.approx((bls_own + child) / 1e6)
    # response cache: 2 misses computed, 4 hits answered from the cache (no compute, no queue wait)
    assert count[("cached_5ms", N.STAGE_COMPUTE)] == 2 and count[("cached_5ms", N.STAGE_EGRESS)] == 6
    # gRPC: no receive hook; parsing from GRPC_WAITREAD_END
    assert ("sleep_8ms", N.STAGE_RECEIVE) not in count and count[("sleep_8ms", N.STAGE_DESERIALIZE)] == 4
    # a decoupled stream: one GRPC_SEND pair per response -> time to first response and 4 gaps each
    streams = [t["ts"] for t in raw.values() if t["model"] == "decoupled_stream"]
    ttft = ds.con.execute(
        "SELECT ttft_ms FROM requests WHERE route = 'decoupled_stream' ORDER BY 1"
    ).fetchall()
    want = sorted((min(s["GRPC_SEND_END"]) - s["GRPC_WAITREAD_END"][0]) / 1e6 for s in streams)
    assert [r[0] for r in ttft] == pytest.approx(want)
    assert ds.con.execute("SELECT count(*) FROM token_gaps").fetchone() == (3 * 4,)
    ds.close()


def test_real_otel_spans_give_the_same_requests_and_stages() -> None:
    """Triton's OpenTelemetry mode (InferRequest > model > compute, all SERVER, timestamps as events)
    on the same requests' shapes as the trace file: one request per InferRequest, same stage rows."""
    otel = load_dataset(traces=[CAP / f"{V}_otel_models.jsonl"])
    spans = dict(
        otel.con.execute("SELECT kind, count(*) FROM spans WHERE stage IS NULL GROUP BY kind").fetchall()
    )
    # InferRequest stays SERVER; the 43 model spans (25 + 12 ensemble steps + 6 BLS calls) and 33
    # compute spans (the ensembles themselves have none, 4 cache hits neither) are now INTERNAL
    assert spans == {2: 25, 1: 43 + 33}
    assert otel.con.execute("SELECT count(*), count(DISTINCT name) FROM requests").fetchone() == (25, 1)
    q = ("SELECT r.route, s.stage, count(*) FROM stages s JOIN requests r USING (request_key) GROUP BY ALL "
         "ORDER BY ALL")  # fmt: skip
    shape = {(r, s): n for r, s, n in otel.con.execute(q).fetchall()}
    otel.close()
    tf = load_dataset(traces=[CAP / f"{V}_trace-file_models.json"])
    want = {(r, s): n for r, s, n in tf.con.execute(q).fetchall()}
    tf.close()
    bls = ("bls_caller", N.STAGE_COMPUTE)
    assert {k: v for k, v in shape.items() if k != bls} == {k: v for k, v in want.items() if k != bls}
    # a BLS compute is two pieces around its child, one where the child was released after the
    # parent's COMPUTE_OUTPUT_START (one request of this run)
    assert want[bls] - 1 <= shape[bls] <= want[bls]


@pytest.mark.parametrize("capture", ["trace-file", "otel"])
def test_real_queue_bound_incident(capture: str) -> None:
    """Acceptance: a queue-bound incident captured from Triton: queue named, scale-out, and the
    counters of the same run agree with the traces within 10%."""
    trace = CAP / (
        f"{V}_trace-file_incident.json.gz" if capture == "trace-file" else f"{V}_otel_incident.jsonl.gz"
    )
    ds = load_dataset(traces=[trace], metrics=[CAP / f"{V}_{capture}_incident_metrics_after.prom"])
    report = analyze(ds, "p99<300ms")
    assert report["breached"] and report["verdict"] == {"stage": N.STAGE_QUEUE, "lever": N.LEVER_SCALE_OUT}
    assert report["attribution"][0]["stage"] == N.STAGE_QUEUE and report["attribution"][0]["share"] > 0.95
    (row,) = [r for r in report["server_counters"]["triton"] if r["model"] == "sleep_8ms"]
    means = _stage_means(ds)
    assert means[N.STAGE_QUEUE] == pytest.approx(row["queue_ms"], rel=0.10)
    assert means[N.STAGE_COMPUTE] == pytest.approx(row["compute_infer_ms"], rel=0.10)
    # the trace file holds every 4th request (rate=4); in OpenTelemetry mode the client's traceparent
    # made Triton trace them all: only the first says that rates read from the traces are too low
    coverage = [w for w in report["warnings"] if "requests its counters count" in w]
    if capture == "trace-file":
        assert (
            row["traced_requests"] == 617
            and coverage
            and "617 of the 2,468" in coverage[0]
            and "4.0x" in coverage[0]
        )
    else:
        assert row["traced_requests"] == 2468 and not coverage
    ds.close()


def _sim(tmp_path: Path, **kw: Any) -> tuple[ST.TritonSim, list[ST.SimRequest], Path, Path, Path]:
    cfg = ST.TritonSim(**kw)
    reqs = ST.simulate(cfg)
    tf, ot, m = tmp_path / "trace.json", tmp_path / "otel.jsonl", tmp_path / "metrics.prom"
    ST.write_trace_file(cfg, reqs, tf)
    ST.write_otel(cfg, reqs, ot, offset_ns=UNIX_AT_ORIGIN - ST.STEADY_ORIGIN_NS)
    if not cfg.children:
        ST.write_metrics(cfg, reqs, m)
    return cfg, reqs, tf, ot, m


@pytest.mark.parametrize("fmt", ["trace-file", "otel"])
def test_cache_hits_do_not_dilute_compute_and_first_response_agrees(tmp_path: Path, fmt: str) -> None:
    """SIMULATED ground truth, a third of the requests answered by the response cache: compute per
    executed request from the counters is the traces' (not diluted by the hits), and so is the
    first-response histogram's mean."""
    _cfg, reqs, tf, ot, m = _sim(tmp_path, cache_hit_ratio=0.33, trace_rate=3, seed=4)
    ds = load_dataset(traces=[tf if fmt == "trace-file" else ot], metrics=[m])
    (row,) = [r for r in analyze(ds, "p99<60ms")["server_counters"]["triton"] if r["requests"]]
    hits = sum(r.cached for r in reqs)
    assert row["cache_hits"] == hits and row["executed"] == len(reqs) - hits
    (per_exec,) = ds.con.execute(
        "SELECT sum(duration_ms) / count(DISTINCT request_key) FROM stages WHERE stage = 'compute'"
    ).fetchone()
    assert row["compute_infer_ms"] == pytest.approx(per_exec, rel=0.10)
    diluted = row["compute_infer_ms"] * row["executed"] / row["requests"]  # over every request
    assert abs(diluted / per_exec - 1) > 0.10  # the count with the hits in it would be off
    (ttft,) = ds.con.execute("SELECT avg(ttft_ms) FROM requests").fetchone()
    assert row["first_response_ms"] == pytest.approx(ttft, rel=0.10)
    ds.close()


def test_otel_mode_through_jaeger_and_zipkin_and_under_a_gateway(tmp_path: Path) -> None:
    """The events survive Jaeger (span logs, field ``event``) and Zipkin (annotations); under a
    traced gateway the gateway's span is the request and Triton's stages still explain it."""
    _, _reqs, tf, ot, _ = _sim(tmp_path, requests=600, trace_rate=2, seed=9, burst=(2.0, 5.0, 160.0))
    base = load_dataset(traces=[tf])
    want = _stage_means(base)
    base.close()
    docs = [json.loads(line) for line in ot.read_text().splitlines()]
    spans = [
        (rs["resource"], sp)
        for d in docs
        for rs in d["resourceSpans"]
        for ss in rs["scopeSpans"]
        for sp in ss["spans"]
    ]
    kinds = {2: "server", 1: "internal"}

    def tag(a: dict[str, Any]) -> dict[str, Any]:
        v = a["value"]
        return {"key": a["key"], "value": v.get("stringValue", v.get("intValue"))}

    jaeger = [{"traceID": sp["traceId"], "spanID": sp["spanId"], "operationName": sp["name"],
               "references": [{"refType": "CHILD_OF", "spanID": sp["parentSpanId"]}] if sp.get("parentSpanId") else [],
               "startTime": int(sp["startTimeUnixNano"]) // 1000,
               "duration": (int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) // 1000,
               "tags": [{"key": "span.kind", "value": kinds[sp["kind"]]}, *map(tag, sp["attributes"])],
               "logs": [{"timestamp": int(e["timeUnixNano"]) // 1000, "fields": [{"key": "event", "value": e["name"]}]}
                        for e in sp.get("events", [])],
               "process": {"serviceName": "triton-inference-server"}} for _, sp in spans]  # fmt: skip
    zipkin = [{"traceId": sp["traceId"], "id": sp["spanId"], "parentId": sp.get("parentSpanId"), "name": sp["name"],
               "kind": "SERVER", "timestamp": int(sp["startTimeUnixNano"]) // 1000,
               "duration": (int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) // 1000,
               "localEndpoint": {"serviceName": "triton-inference-server"},
               "tags": {a["key"]: str(tag(a)["value"]) for a in sp["attributes"]},
               "annotations": [{"timestamp": int(e["timeUnixNano"]) // 1000, "value": e["name"]}
                               for e in sp.get("events", [])]} for _, sp in spans]  # fmt: skip
    for z in zipkin:
        if z["parentId"] is None:
            del z["parentId"]
    for name, doc in (
        ("jaeger.json", {"data": [{"traceID": "x", "spans": jaeger, "processes": {}}]}),
        ("zipkin.json", zipkin),
    ):
        p = tmp_path / name
        p.write_text(json.dumps(doc))
        ds = load_dataset(traces=[p])
        assert ds.con.execute("SELECT count(*) FROM requests").fetchone() == (300,), name
        got = _stage_means(ds)
        assert got.keys() == want.keys() and all(
            got[k] == pytest.approx(want[k], rel=0.01, abs=0.002) for k in want
        ), name
        ds.close()
    # a gateway SERVER span above each InferRequest (the client propagated its context)
    for d in docs:
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                roots = [sp for sp in ss["spans"] if sp["name"] == N.TRITON_SPAN_ROOT]
                for sp in roots:
                    gw = {**sp, "spanId": sp["spanId"][::-1], "name": "POST /v2/models/resnet50/infer", "events": [],
                          "attributes": [], "startTimeUnixNano": str(int(sp["startTimeUnixNano"]) - 2_000_000),
                          "endTimeUnixNano": str(int(sp["endTimeUnixNano"]) + 1_000_000)}  # fmt: skip
                    sp["parentSpanId"] = gw["spanId"]
                    ss["spans"].append(gw)
    gw_file = tmp_path / "gateway.jsonl"
    gw_file.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    ds = load_dataset(traces=[gw_file])
    assert ds.con.execute("SELECT count(*), min(name) FROM requests").fetchone() == (
        300,
        "POST /v2/models/resnet50/infer",
    )
    report = analyze(ds, "p99<200ms")
    assert report["verdict"]["stage"] == N.STAGE_QUEUE
    ds.close()


def test_clock_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cfg, reqs, tf, _, _ = _sim(tmp_path, requests=50, burst=None)
    last = max(t for r in reqs for t in r.ts.values())
    mtime = 1_770_000_000_123_456_789
    os.utime(tf, ns=(mtime, mtime))
    ds = load_dataset(traces=[tf])
    (start,) = ds.con.execute("SELECT min(start_unix_ns) FROM requests").fetchone()
    first = min(r.ts[N.TRITON_TS_HTTP_RECV_START] for r in reqs)
    assert start == mtime - (last - first)  # the last timestamp at the file's modification time
    assert any("steady clock" in w and N.ENV_TRITON_CLOCK_OFFSET_NS in w for w in ds.warnings)
    ds.close()
    monkeypatch.setenv(N.ENV_TRITON_CLOCK_OFFSET_NS, str(UNIX_AT_ORIGIN - ST.STEADY_ORIGIN_NS))
    ds = load_dataset(traces=[tf])
    (start,) = ds.con.execute("SELECT min(start_unix_ns) FROM requests").fetchone()
    assert (
        start == UNIX_AT_ORIGIN + min(r.ts[N.TRITON_TS_HTTP_RECV_START] for r in reqs) - ST.STEADY_ORIGIN_NS
    )
    assert not any("steady clock" in w for w in ds.warnings)
    ds.close()
    monkeypatch.setenv(N.ENV_TRITON_CLOCK_OFFSET_NS, "soon")
    with pytest.raises(UserError, match=f"{N.ENV_TRITON_CLOCK_OFFSET_NS}='soon': not an integer"):
        load_dataset(traces=[tf])


def test_unterminated_file_from_a_running_server(tmp_path: Path) -> None:
    """The array's ``]`` is written at shutdown only (server src/tracer.cc ``~TraceFile``)."""
    cfg, reqs, tf, _, _ = _sim(tmp_path, requests=80, burst=None)
    open_file = tmp_path / "running.json"
    ST.write_trace_file(cfg, reqs, open_file, closed=False)
    a, b = load_dataset(traces=[tf]), load_dataset(traces=[open_file])
    q = "SELECT stage, count(*), round(sum(duration_ms), 6) FROM stages GROUP BY ALL ORDER BY ALL"
    assert a.con.execute(q).fetchall() == b.con.execute(q).fetchall()
    a.close()
    b.close()


BAD = [
    ('[{"id":1,"model_name":"m","model_version":1},\n{"model_name":"m"}]', 2, "without an integer id"),
    ('[{"id":1,"model_name":"m","model_version":1},\n{"id":1,"timestamps":[{"name":"QUEUE_START","ns":"noon"}]}]', 2,
     "not a {name, ns} pair"),
    ('[{"id":1,"model_name":"m","model_version":1,"parent_id":"x"}]', 1, "parent_id 'x' is not an integer"),
    ('[{"id":1,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":"i","data":"1","shape":"1","dtype":"FP32"}}]', 1,
     "no timestamps"),
    ('[{"id":1,"model_name":"m","model_version":1},\n{"id":1,"timestamps":[{"name":"QUEUE_ST', 2, "malformed JSON"),
    ('[{"id":1,"model_name":"m","model_version":1},\n{"id":1,"color":"red"}]', 2, "neither model_name"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "reason"), BAD, ids=[b[2] for b in BAD])
def test_bad_triton_files_name_file_and_line(tmp_path: Path, text: str, line: int, reason: str) -> None:
    p = tmp_path / "trace.json"
    p.write_text(text)
    with pytest.raises(UserError, match=rf"trace\.json:{line}: .*{re.escape(reason)}"):
        load_dataset(traces=[p])
    ds = load_dataset(traces=[p], skip_bad=True)
    assert any(reason in w for w in ds.warnings) and ds.con.execute(
        "SELECT count(*) FROM spans"
    ).fetchone() == (0,)
    ds.close()


def test_triton_gpu_utilization_is_a_rate_not_a_percent(tmp_path: Path) -> None:
    """Triton's ``nv_gpu_utilization`` is 0.0-1.0 (server docs/user_guide/metrics.md "GPU
    Utilization"), dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` 0-100: the same GPU at 93 % reads 93 %
    either way (Triton's was read as 0.93 %)."""
    uuid = "GPU-951eeeeb-d284-d263-688e-d98a5306389b"
    scrapes = {
        N.TRITON_GPU_UTILIZATION: f'{N.TRITON_GPU_UTILIZATION}{{gpu_uuid="{uuid}"}} 0.93\n',
        N.DCGM_GPU_UTIL: f'{N.DCGM_GPU_UTIL}{{gpu="0",UUID="{uuid}"}} 93\n',
    }
    for metric, text in scrapes.items():
        gpu = tmp_path / f"{metric}.prom"
        gpu.write_text(text)
        ds = load_dataset(
            traces=[CAP / f"{V}_trace-file_incident.json.gz"],
            metrics=[CAP / f"{V}_trace-file_incident_metrics_after.prom", gpu],
        )
        ev = analyze(ds, "p99<300ms")["evidence"]
        assert ev["utilization_metric"] == metric and ev["utilization_pct"] == pytest.approx(93.0)
        ds.close()
