"""Bad input files: a UserError naming file and line, or with skip_bad a warning and the rest read."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.synth import request_spans, write_otlp_lines
from stagescope.errors import UserError

T0 = 1_764_000_000_000_000_000


def _good_lines(n: int = 3, first: int = 0) -> list[str]:
    """``n`` OTLP lines, each one request (server span + 2 stage spans), trace ids from ``first + 1``
    (files meant to hold different requests need different ids: repeated spans are counted once)."""
    out = []
    for i in range(first, first + n):
        buf = io.BytesIO()
        spans = request_spans(f"{i + 1:032x}", T0 + i * 10**9, [("queue", 0.0, 5.0), ("compute", 5.0, 10.0)])
        write_otlp_lines(buf, spans, spans_per_line=100)
        out.append(buf.getvalue().decode().strip())
    return out


def _mutate_span(line: str, **changes: object) -> str:
    doc = json.loads(line)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    for k, v in changes.items():
        if v is None:
            span.pop(k, None)
        else:
            span[k] = v
    return json.dumps(doc)


def _lines_with(bad_line: str, at: int = 2) -> bytes:
    lines = _good_lines(3)
    lines.insert(at - 1, bad_line)
    return ("\n".join(lines) + "\n").encode()


G = _good_lines(1)[0]
Writer = Callable[[Path], Path]


def _file(name: str, data: bytes) -> Writer:
    def w(d: Path) -> Path:
        p = d / name
        p.write_bytes(data)
        return p

    return w


def _parquet(name: str, table: pa.Table) -> Writer:
    def w(d: Path) -> Path:
        p = d / name
        pq.write_table(table, p)
        return p

    return w


def _lines_and(make: Callable[[], str]) -> Writer:
    def w(d: Path) -> Path:
        p = d / "t.jsonl"
        p.write_bytes(_lines_with(make(), at=2))
        return p

    return w


# (id, kind of input, writer, line expected in the message, substring expected in the message)
# fmt: off
TRACE_CASES: list[tuple[str, Writer, int | None, str]] = [
    ("truncated-last-line", _file("t.jsonl", (G + "\n" + G[: len(G) // 2]).encode()), 2, "malformed JSON"),
    ("truncated-document", _file("t.json", json.dumps(json.loads(G), indent=1)[:300].encode()), None, "malformed JSON"),
    ("empty-file", _file("t.jsonl", b""), 1, "empty file"),
    ("whitespace-only", _file("t.jsonl", b"\n \n\t\n"), 1, "empty file"),
    ("binary-garbage", _file("t.jsonl", bytes(range(256)) * 4), 1, "not JSON"),
    ("gz-not-gzip", _file("t.jsonl.gz", (G + "\n").encode()), None, "not gzip"),
    ("corrupt-gzip", _file("t.jsonl.gz", gzip.compress((G + "\n").encode())[:40]), None, "gzip"),
    ("wrong-shape-object", _file("t.json", b'{"foo": [1, 2, 3]}\n'), 1, "unknown shape"),
    ("wrong-shape-array", _file("t.json", b"[1, 2, 3]\n"), 1, "unknown shape"),
    ("resourceSpans-not-list", _lines_and(lambda: '{"resourceSpans": {"a": 1}}'), 2, "resourceSpans"),
    ("spans-not-list", _lines_and(lambda: '{"resourceSpans": [{"scopeSpans": [{"spans": 7}]}]}'), 2, "spans list"),
    ("missing-traceId", _lines_and(lambda: _mutate_span(G, traceId=None)), 2, "without traceId"),
    ("missing-spanId", _lines_and(lambda: _mutate_span(G, spanId=None)), 2, "without spanId"),
    ("traceId-number", _lines_and(lambda: _mutate_span(G, traceId=12345)), 2, "traceId"),
    ("traceId-not-hex", _lines_and(lambda: _mutate_span(G, traceId="zz" * 16)), 2, "not 32 hex"),
    ("missing-start", _lines_and(lambda: _mutate_span(G, startTimeUnixNano=None)), 2, "startTimeUnixNano"),
    ("start-not-number", _lines_and(lambda: _mutate_span(G, startTimeUnixNano="yesterday")), 2, "not an integer"),
    ("mixed-iso-timestamp", _lines_and(lambda: _mutate_span(G, startTimeUnixNano="2026-11-30T03:00:00Z")), 2, "not an integer"),
    ("ms-timestamps", _lines_and(lambda: _mutate_span(G, startTimeUnixNano=str(T0 // 10**6), endTimeUnixNano=str(T0 // 10**6 + 5))), 2, "milliseconds"),
    ("seconds-float-timestamps", _lines_and(lambda: _mutate_span(G, startTimeUnixNano=1764000000.5, endTimeUnixNano=1764000001.5)), 2, "looks like seconds"),
    ("end-before-start", _lines_and(lambda: _mutate_span(G, endTimeUnixNano=str(T0 - 1))), 2, "ends before it starts"),
    ("line-is-array", _lines_and(lambda: "[" + G + "]"), 2, "got list"),
    ("jaeger-bad-start", _file("j.json", json.dumps({"data": [{"traceID": "ab" * 8, "processes": {}, "spans": [
        {"traceID": "ab" * 8, "spanID": "cd" * 8, "operationName": "x", "startTime": "noon", "duration": 5}]}]},
        indent=1).encode()), None, "startTime"),
    ("jaeger-truncated", _file("j.json", b'{"data": [{"traceID": "abab", "spans": [\n{"traceID": "ab"'), 2, "malformed JSON"),
    ("jaeger-ms-times", _file("j.json", json.dumps([{"traceID": "ab" * 8, "spanID": "cd" * 8, "operationName": "x",
        "startTime": 1_764_000_000_000, "duration": 5}]).encode()), 1, "milliseconds"),
]
# fmt: on


# fmt: off
METRIC_CASES: list[tuple[str, Writer, int | None, str]] = [
    ("prom-garbage-line", _file("m.prom", b"# TYPE a gauge\na 1\nthis is not a sample line at all ok\n"), 3, "not a Prometheus"),
    ("prom-value-not-number", _file("m.prom", b'a{x="1"} 1\nb{x="2"} twelve\n'), 2, "not a number"),
    ("prom-unclosed-label", _file("m.prom", b'a{x="1} 1\n'), 1, "labels"),
    ("prom-binary", _file("m.prom", b"\x00\x01\x02garbage"), 1, "binary"),
    ("prom-empty", _file("m.prom", b""), 1, "empty"),
    ("prom-not-utf8", _file("m.prom", b"a 1\nb\xff\xfe 2\n"), 2, "UTF-8"),
]
# fmt: on

RESULT_CASES: list[tuple[str, Writer, int | None, str]] = [
    (
        "results-not-parquet",
        _file("r.parquet", b"request_id,latency_ms\n1,2\n"),
        None,
        "not a readable Parquet",
    ),
    ("results-missing-columns", _parquet("r.parquet", pa.table({"foo": [1, 2]})), None, "missing column"),
]


@pytest.mark.parametrize(("case", "write", "line", "text"), TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_bad_trace_file_names_file_and_line(
    tmp_path: Path, case: str, write: Writer, line: int | None, text: str
) -> None:
    path = write(tmp_path)
    with pytest.raises(UserError) as exc:
        load_dataset(traces=[path])
    msg = str(exc.value)
    assert msg.startswith(str(path)), msg
    assert text in msg, msg
    if line is not None:
        assert msg.startswith(f"{path}:{line}: "), msg
    assert "\n" not in msg


@pytest.mark.parametrize(("case", "write", "line", "text"), METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_bad_metric_file(tmp_path: Path, case: str, write: Writer, line: int | None, text: str) -> None:
    path = write(tmp_path)
    with pytest.raises(UserError, match=rf"^{path}:{line}: .*{text}"):
        load_dataset(metrics=[path])
    ds = load_dataset(metrics=[path], skip_bad=True)
    assert any(text in w for w in ds.warnings) and ds.files[0].skipped
    ds.close()


@pytest.mark.parametrize(("case", "write", "line", "text"), RESULT_CASES, ids=[c[0] for c in RESULT_CASES])
def test_bad_results_file(tmp_path: Path, case: str, write: Writer, line: int | None, text: str) -> None:
    path = write(tmp_path)
    with pytest.raises(UserError, match=rf"^{path}: .*{text}"):
        load_dataset(results=[path])


def test_one_bad_file_among_good_ones(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"good{i}.jsonl").write_text("\n".join(_good_lines(2, first=10 * (i + 1))) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_lines_with(_mutate_span(G, startTimeUnixNano="2026-11-30 03:00:00"), at=1))
    with pytest.raises(UserError, match=rf"^{bad}:1: "):
        load_dataset(traces=[tmp_path])
    ds = load_dataset(traces=[tmp_path], skip_bad=True)
    # the good files, and the bad file's three good lines, are all read
    assert ds.con.execute("SELECT count(*) FROM requests").fetchall() == [(3 * 2 + 3,)]
    assert [w for w in ds.warnings if "skipped" in w] == [
        f"skipped bad lines: {bad}:1: startTimeUnixNano '2026-11-30 03:00:00' is not an integer of Unix "
        "nanoseconds; the other lines were read (requests and stages on the bad lines are missing from "
        "the analysis)"
    ]
    ds.close()


@pytest.mark.parametrize(("case", "write", "line", "text"), TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_skip_bad_keeps_the_rest(
    tmp_path: Path, case: str, write: Writer, line: int | None, text: str
) -> None:
    path = write(tmp_path)
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(_good_lines(2)) + "\n")
    ds = load_dataset(traces=[path, good], skip_bad=True)
    assert any(str(path) in w and text in w for w in ds.warnings), ds.warnings
    (n,) = ds.con.execute("SELECT count(*) FROM requests").fetchall()[0]
    assert n >= 2  # the good file, plus whatever good lines the bad one had
    ds.close()


def test_malformed_file_among_many_is_found_and_the_rest_read(tmp_path: Path) -> None:
    """DuckDB rejects the whole group: the bad file is found by bisection, the others still load."""
    for i in range(7):
        (tmp_path / f"spans-1-{i}.jsonl").write_text("\n".join(_good_lines(2, first=10 * (i + 1))) + "\n")
    bad = tmp_path / "spans-1-7.jsonl"
    bad.write_text("\n".join(_good_lines(3)) + "\n" + G[:100] + "\n")
    with pytest.raises(UserError, match=rf"^{bad}:4: malformed JSON"):
        load_dataset(traces=[tmp_path])
    with load_dataset(traces=[tmp_path], skip_bad=True) as ds:
        assert ds.con.execute("SELECT count(*) FROM requests").fetchall() == [(7 * 2 + 3,)]
        assert {f.kind for f in ds.files} == {"sink"} and sum(f.spans for f in ds.files) == (7 * 2 + 3) * 3


def test_bad_first_line_of_json_lines_keeps_the_others(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_bytes(_lines_with(G[:50], at=1))
    with pytest.raises(UserError, match=rf"^{f}:1: malformed JSON"):
        load_dataset(traces=[f])
    with load_dataset(traces=[f], skip_bad=True) as ds:
        assert ds.con.execute("SELECT count(*) FROM requests").fetchall() == [(3,)]
