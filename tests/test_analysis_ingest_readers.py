"""Format detection (one function, one reader per format), Jaeger v2's API v3 and Zipkin v2 JSON.

Shapes come from the upstream files copied in ``external/`` (see external/PROVENANCE.md): Jaeger's
own api_v3 snapshots (jaegertracing/jaeger cmd/jaeger/internal/extension/jaegerquery/internal/
apiv3/snapshots/), the Zipkin v2 spec (openzipkin/zipkin-api zipkin2-api.yaml, its ``Span`` example),
Triton's trace file (a capture of Triton 2.51.0, external/triton/captures/).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.ingest.files import sniff
from stagescope.analysis.ingest.readers import READERS, Head, detect
from stagescope.analysis.synth import request_spans, write_otlp_lines
from stagescope.errors import UserError

REPO = Path(__file__).resolve().parents[1]
EXT = REPO / "external"
JAEGER = EXT / "otlp" / "jaeger"
V3 = EXT / "jaeger_apiv3"
ZIPKIN_SPEC = EXT / "zipkin" / "zipkin2-api.yaml"
TRITON = EXT / "triton" / "captures"
T0 = 1_764_000_000_000_000_000


def _otlp_doc(n: int = 2, first: int = 1) -> dict:
    import io

    buf = io.BytesIO()
    spans = [s for i in range(first, first + n)
             for s in request_spans(f"{i:032x}", T0 + i * 10**9, [("queue", 0.0, 5.0), ("compute", 5.0, 10.0)])]  # fmt: skip
    write_otlp_lines(buf, spans, spans_per_line=1000)
    return json.loads(buf.getvalue())


def _zipkin_example() -> dict:
    """The ``Span`` example of zipkin2-api.yaml, as the spec writes it."""
    spec = yaml.safe_load(ZIPKIN_SPEC.read_text())
    return dict(spec["definitions"]["Span"]["example"])


# (kind expected, file name, bytes)
DETECT_CASES = [
    ("otlp", "a.json", json.dumps(_otlp_doc()).encode()),
    ("sink", "spans-12-0.jsonl", (json.dumps(_otlp_doc()) + "\n").encode()),
    ("jaeger-v3", "getTrace.json", (V3 / "apiv3_GetTrace.json").read_bytes()),
    ("jaeger-v3", "stream.json", b"".join(json.dumps({"result": _otlp_doc(1, i)}).encode() + b"\n" for i in (1, 2))),
    ("jaeger-v3", "err.json", b'{"error": {"httpCode": 404, "message": "No traces found"}}'),
    ("zipkin", "z.json", json.dumps([_zipkin_example()]).encode()),
    ("zipkin", "traces.json", json.dumps([[_zipkin_example()]]).encode()),
    ("triton-trace", "trace.json", (TRITON / "triton-2.51.0_trace-file_models.json").read_bytes()),
    ("triton-trace", "trace.json.3", (TRITON / "triton-2.51.0_trace-file_models.json").read_bytes()[:-1]),
    ("jaeger", "j.json", (JAEGER / "otlp2jaeger-out.json").read_bytes()),
    ("jaeger", "ui.json", (JAEGER / "uiconv_trace_success.json").read_bytes()),
    ("otlp", "logs.json", (EXT / "otlp" / "opentelemetry-proto" / "logs.json").read_bytes()),
    ("unknown", "x.json", b'{"foo": [1, 2, 3]}'),
    ("unknown", "y.json", b"[1, 2, 3]"),
]


@pytest.mark.parametrize(("kind", "name", "data"), DETECT_CASES, ids=[f"{c[0]}-{c[1]}" for c in DETECT_CASES])
def test_one_function_detects_every_format(tmp_path: Path, kind: str, name: str, data: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    sf = sniff(p)
    assert sf.kind == kind
    assert sf.reader is detect(Head(p, data.lstrip(), sf.lines))
    if sf.reader is not None:  # exactly one reader is the first to claim it; each names its upstream
        assert sf.reader in READERS and sf.reader.upstream


def test_readers_each_name_an_upstream_file() -> None:
    assert len({r.kind + r.title for r in READERS}) == len(READERS)
    assert all("/" in r.upstream for r in READERS)


def test_jaeger_v3_snapshot_and_streamed_results(tmp_path: Path) -> None:
    ds = load_dataset(traces=[V3 / "apiv3_GetTrace.json"], skip_bad=True)
    # the snapshot's one span has no times (gogo jsonpb leaves zeros out): named, not analysed
    assert any("apiv3_GetTrace.json:13: span 0000000000000002 without startTimeUnixNano" in w for w in ds.warnings)
    ds.close()
    stream = tmp_path / "traces.json"
    stream.write_bytes(b"".join(json.dumps({"result": _otlp_doc(2, i)}).encode() + b"\n" for i in (1, 3, 5)))
    pretty = tmp_path / "one.json"
    pretty.write_text(json.dumps({"result": _otlp_doc(2, 7)}, indent=2))
    ds = load_dataset(traces=[stream, pretty])
    assert ds.con.execute("SELECT count(*) FROM requests").fetchone() == (8,)
    assert {f.kind for f in ds.files} == {"jaeger-v3"}
    assert ds.con.execute("SELECT count(DISTINCT stage) FROM stages").fetchone() == (2,)
    ds.close()


def test_jaeger_v3_error_answer_and_bad_line_are_named(tmp_path: Path) -> None:
    err = tmp_path / "err.json"
    err.write_bytes(b'{"error": {"httpCode": 404, "message": "No traces found"}}')
    with pytest.raises(UserError, match=r"err\.json:1: a query API error answer, not traces \(HTTP 404: No traces found\)"):
        load_dataset(traces=[err])
    lines = tmp_path / "lines.json"
    good = json.dumps({"result": _otlp_doc(1, 1)})
    lines.write_text(good + "\n" + '{"result": {"resourceSpans": 7}}\n' + json.dumps({"result": _otlp_doc(1, 2)}) + "\n")
    with pytest.raises(UserError, match=r"lines\.json:2: .*resourceSpans"):
        load_dataset(traces=[lines])
    ds = load_dataset(traces=[lines], skip_bad=True)
    assert ds.con.execute("SELECT count(*) FROM requests").fetchone() == (2,)
    ds.close()


def test_zipkin_spec_example_and_its_rules(tmp_path: Path) -> None:
    ex = _zipkin_example()
    client = {**ex, "id": ex["parentId"], "kind": "CLIENT", "localEndpoint": {"serviceName": "frontend"},
              "timestamp": ex["timestamp"] - 200, "duration": ex["duration"] + 400}  # fmt: skip
    client.pop("parentId")
    shared = {**ex, "id": ex["parentId"], "shared": True, "kind": "SERVER", "name": "get /api shared",
              "tags": {"gen_ai.latency.time_to_first_token": "0.0123", "error": "boom"},
              "annotations": [{"timestamp": ex["timestamp"] + 10, "value": "ws"}]}  # fmt: skip
    shared.pop("parentId")
    incomplete = {"traceId": ex["traceId"], "id": "00000000000000aa", "name": "late tags"}
    p = tmp_path / "zipkin.json"
    p.write_text(json.dumps([client, ex, shared, incomplete]))
    ds = load_dataset(traces=[p])
    rows = ds.con.execute(
        "SELECT name, kind, trace_id, span_id, parent_span_id, start_ns, end_ns, service, otel_status, ttft_s, "
        "events FROM spans ORDER BY start_ns, name"
    ).fetchall()
    by = {r[0]: r for r in rows}
    srv = by["get /api"]
    # spec: 64-bit traceId left-padded, SERVER, timestamp/duration in microseconds, localEndpoint service
    assert srv[1:3] == (2, "0" * 16 + ex["traceId"]) and srv[7] == "backend"
    assert (srv[5], srv[6]) == (ex["timestamp"] * 1000, (ex["timestamp"] + ex["duration"]) * 1000)
    sh = by["get /api shared"]
    assert sh[4] == ex["parentId"] and sh[3] != ex["parentId"]  # own id, child of the client half
    assert sh[8] == 2 and sh[9] == pytest.approx(0.0123)  # error tag; string tag converted
    assert sh[10] == [{"name": "ws", "ns": (ex["timestamp"] + 10) * 1000}]
    assert any("1 Zipkin spans without a timestamp" in w for w in ds.warnings)
    ds.close()


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        ([{"traceId": "xyz", "id": "a" * 16, "timestamp": 1, "duration": 1}], "traceId 'xyz' is not 16 or 32 hex"),
        ([{"traceId": "a" * 16, "id": "a" * 16, "timestamp": 1_764_000_000_000, "duration": 1}], "looks like milliseconds"),
        ([{"traceId": "a" * 16, "id": "a" * 16, "timestamp": 1_764_000_000_000_000, "kind": "BOSS"}], "kind 'BOSS'"),
        ([{"traceId": "a" * 16, "id": "a" * 16, "timestamp": 1_764_000_000_000_000, "duration": -3}], "duration -3"),
    ],
)
def test_bad_zipkin_spans_name_file_and_reason(tmp_path: Path, doc: list, text: str) -> None:
    p = tmp_path / "z.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"z\.json:1: .*" + text.replace("(", r"\(").replace(")", r"\)")):
        load_dataset(traces=[p])


def test_triton_indexed_files_are_taken_from_a_directory(tmp_path: Path) -> None:
    data = gzip.decompress((TRITON / "triton-2.51.0_trace-file_incident.json.gz").read_bytes())
    (tmp_path / "trace.json.0").write_bytes(data)
    (tmp_path / "notes.txt").write_text("not a trace")
    ds = load_dataset(traces=[tmp_path])
    assert [Path(f.path).name for f in ds.files] == ["trace.json.0"]
    assert ds.con.execute("SELECT count(*) FROM requests").fetchone() == (617,)
    ds.close()
