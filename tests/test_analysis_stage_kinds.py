"""A team's own stages in the analysis: the stage kind decides the lever, every effect model reads
time by kind, an unknown kind gets no guessed lever, bad stage values in others' traces are named.

The incidents are the synthetic scenarios of analysis.synth_scenarios (each with a known cause), with
every built-in stage renamed to a team's own name of the same kind: verdict, lever and prediction
must be the same as with the built-in names, and the rationale must name the team's stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from stagescope import names
from stagescope.analysis import kinds as K
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest import ingest_to_parquet, load_dataset
from stagescope.analysis.report import to_html, to_text
from stagescope.analysis.synth import KIND_INTERNAL, SynthSpan, request_spans, write_otlp_lines

#: a team's own name for each built-in stage (same kind)
RENAME = {
    "feature_fetch": "retrieve", "preprocess": "tokenize", "batch_wait": "gather", "queue": "wait-gpu",
    "compute": "rerank", "postprocess": "format", "egress": "send", "cold_start": "load-wait",
    "prefill": "prompt", "decode": "generate",
}  # fmt: skip
N = 1200
CAUSED = [name for name, sc in S.SCENARIOS.items() if sc.stage is not None and sc.slo.startswith(("p", "ttft"))]


def _tables(name: str, rename: dict[str, str] | None = None, kinds: bool = True) -> duckdb.DuckDBPyConnection:
    data = S.generate(name, N, seed=3)
    con = duckdb.connect()
    S.to_tables(con, data)
    for old, new in (rename or {}).items():
        con.execute("UPDATE stages SET stage = ? WHERE stage = ?", [new, old])
    if not kinds:
        con.execute("UPDATE stages SET kind = NULL")
    return con


@pytest.mark.parametrize("name", CAUSED)
def test_renamed_stages_get_the_levers_of_their_kind(name: str) -> None:
    sc = S.SCENARIOS[name]
    base = analyze(_tables(name), sc.slo)
    rep = analyze(_tables(name, RENAME), sc.slo)
    assert sc.stage is not None
    team = RENAME[sc.stage]
    assert rep["verdict"] == {"stage": team, "lever": sc.lever}
    first, ref = rep["levers"][0], base["levers"][0]
    assert (first["stage"], first["kind"], first["lever"]) == (team, names.STAGE_KINDS[sc.stage], sc.lever)
    # every effect model reads the time by kind: the same prediction under the team's names
    assert first["predicted_p99_ms"] == pytest.approx(ref["predicted_p99_ms"], rel=1e-6)
    assert team in first["rationale"] and f"(kind {names.STAGE_KINDS[sc.stage]})" in first["rationale"]
    assert {r["stage"]: r["kind"] for r in rep["attribution"]}[team] == names.STAGE_KINDS[sc.stage]
    assert f"Stage: {team} [{names.STAGE_KINDS[sc.stage]}]" in to_text(rep)


def test_cap_batch_wait_reads_batch_wait_and_compute_kind_time() -> None:
    """The batch-wait model caps the batch_wait-kind stage and shrinks the compute-kind time; with a
    second, custom compute-kind stage carrying part of the compute the prediction holds."""
    name = "long-batch-wait"
    sc = S.SCENARIOS[name]
    ref = analyze(_tables(name), sc.slo)["levers"][0]
    con = _tables(name, {"batch_wait": "gather"})
    rep = analyze(con, sc.slo)
    lv = rep["levers"][0]
    assert (lv["stage"], lv["lever"]) == ("gather", names.LEVER_CAP_BATCH_WAIT)
    assert lv["predicted_p99_ms"] == pytest.approx(ref["predicted_p99_ms"], rel=1e-6)
    assert "batch wait capped at" in lv["rationale"]


def test_a_stage_of_unknown_kind_gets_no_lever_and_says_so() -> None:
    sc = S.SCENARIOS["slow-compute"]
    con = _tables("slow-compute", {"compute": "rerank"})
    con.execute("UPDATE stages SET kind = 'unknown' WHERE stage = 'rerank'")  # a span without a kind
    rep = analyze(con, sc.slo)
    assert rep["verdict"] == {"stage": "rerank", "lever": None}
    first = rep["levers"][0]
    assert first["lever"] is None and first["kind"] == names.KIND_UNKNOWN and first["predicted_p99_ms"] is None
    assert "kind is unknown" in first["rationale"] and "stagescope.stage('rerank', kind=...)" in first["rationale"]
    assert "no lever is guessed" in first["rationale"]
    text = to_text(rep)
    assert "Stage: rerank [unknown] (100% of the excess latency); lever: none until its kind is named\n" in text
    assert "- name its kind (rerank [unknown])" in text


def test_relations_without_a_kind_column_take_kinds_from_the_names() -> None:
    sc = S.SCENARIOS["slow-feature-store"]
    con = _tables("slow-feature-store")
    con.execute("ALTER TABLE stages DROP COLUMN kind")
    rep = analyze(con, sc.slo)
    assert rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}
    assert {r["stage"]: r["kind"] for r in rep["attribution"]}["feature_fetch"] == "fetch"
    con = _tables("slow-feature-store", {"feature_fetch": "retrieve"})
    con.execute("ALTER TABLE stages DROP COLUMN kind")  # a custom name and no kind: unknown
    assert analyze(con, sc.slo)["verdict"] == {"stage": "retrieve", "lever": None}


def test_a_name_with_several_kinds_is_unknown_with_a_warning() -> None:
    sc = S.SCENARIOS["slow-compute"]
    con = _tables("slow-compute", {"compute": "rerank"})
    con.execute("UPDATE stages SET kind = 'cpu' WHERE stage = 'rerank' AND start_unix_ns % 2 = 0")
    rep = analyze(con, sc.slo)
    assert rep["verdict"] == {"stage": "rerank", "lever": None}
    assert any("'rerank' carries several kinds (compute, cpu)" in w for w in rep["warnings"])


def test_too_many_stage_names_are_folded_with_a_warning() -> None:
    """Data that puts an id into stagescope.stage: past analysis.kinds.MAX_STAGES names the ones with
    the least time are one stage."""
    sc = S.SCENARIOS["slow-feature-store"]
    con = _tables("slow-feature-store")
    con.execute(
        "UPDATE stages SET stage = 'req-' || (hash(trace_id) % 500)::VARCHAR, kind = 'unknown' WHERE stage = 'egress'"
    )
    cat = K.stage_catalog(con)
    assert len(cat.columns) == K.MAX_STAGES and names.STAGE_OVERFLOW in cat.columns
    assert cat.kinds[names.STAGE_OVERFLOW] == names.KIND_UNKNOWN and len(cat.folded) > 300
    rep = analyze(con, sc.slo)
    assert rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}
    assert any("distinct stage names" in w and names.STAGE_OVERFLOW in w for w in rep["warnings"])
    assert len(rep["attribution"]) <= K.MAX_STAGES + 1


# --------------------------------------------------------------------------------------------------
# through the ingest: OTLP and Jaeger files from elsewhere
# --------------------------------------------------------------------------------------------------
T0 = 1_764_460_800 * 10**9


def _incident(path: Path, stage_of: Any, n: int = 400, extra: list[SynthSpan] | None = None) -> None:
    """``n`` requests: 5 ms of tokenize, 3 ms of a 'retrieve' stage (slow, 300 ms, in one in ten),
    each stage's kind attribute from ``stage_of(stage)`` (None: no attribute)."""
    spans: list[SynthSpan] = []
    for i in range(n):
        tid = f"{i + 1:032x}"
        slow = 300.0 if i % 10 == 0 else 3.0
        stages = [("tokenize", 0.0, 5.0, stage_of("tokenize")), ("retrieve", 5.0, slow, stage_of("retrieve"))]
        spans += request_spans(tid, T0 + i * 20_000_000, stages, duration_ms=5.0 + slow + 1.0)
    write_otlp_lines(path, [*spans, *(extra or [])])


def test_custom_stages_from_otlp_files_carry_their_kind(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    _incident(path, {"tokenize": "cpu", "retrieve": "fetch"}.get)
    with load_dataset(traces=[path]) as ds:
        got = dict(ds.con.execute("SELECT stage, any_value(kind) FROM stages GROUP BY 1").fetchall())
        assert got == {"tokenize": "cpu", "retrieve": "fetch"}
        rep = analyze(ds, "p99<100ms")
    assert rep["verdict"] == {"stage": "retrieve", "lever": names.LEVER_CACHE_FEATURES}
    assert "retrieve (kind fetch)" in rep["levers"][0]["rationale"]
    assert "serve what retrieve reads for hot keys from a local cache" in rep["levers"][0]["rationale"]
    html = to_html(rep)
    assert "retrieve [fetch]" in html and "<td>fetch</td>" in html


def test_an_unknown_stage_name_from_elsewhere_is_a_stage_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    _incident(path, lambda stage: None)  # no kind attributes at all: another emitter, older stagescope
    with load_dataset(traces=[path]) as ds:
        rep = analyze(ds, "p99<100ms")
    kinds = {r["stage"]: r["kind"] for r in rep["attribution"]}
    assert kinds["retrieve"] == kinds["tokenize"] == names.KIND_UNKNOWN
    assert rep["verdict"] == {"stage": "retrieve", "lever": None}
    assert "Name its kind" in rep["levers"][0]["rationale"]


def test_a_kind_outside_the_vocabulary_is_named_in_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    _incident(path, {"tokenize": "cpu", "retrieve": "database"}.get, n=50)
    with load_dataset(traces=[path]) as ds:
        assert ds.con.execute("SELECT DISTINCT kind FROM stages WHERE stage = 'retrieve'").fetchall() == [
            ("unknown",)
        ]
        warns = [w for w in ds.warnings if "stagescope.stage.kind" in w]
    assert len(warns) == 1 and str(path) in warns[0] and "'database'" in warns[0] and "50 stage spans" in warns[0]


BAD_VALUES: list[tuple[Any, str]] = [
    (7, "the integer 7"), (True, "the boolean true"), (2.5, "the number 2.5"), (["a", "b"], "a list"),
    ("", "an empty string"), ("  ", "an empty string"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "described"), BAD_VALUES)
def test_a_non_string_stage_value_is_a_warning_naming_the_file(
    tmp_path: Path, value: Any, described: str
) -> None:
    path = tmp_path / "theirs.jsonl"
    tid = f"{999_999:032x}"
    bad = [SynthSpan(tid, f"{i + 1:016x}", "odd", T0, T0 + 10**6, f"{1:016x}", KIND_INTERNAL,
                     {names.ATTR_STAGE: value}) for i in range(3)]  # fmt: skip
    root = SynthSpan(tid, f"{1:016x}", "POST /x", T0, T0 + 2 * 10**6, "", 2, {"http.route": "/x"})
    lone = SynthSpan(f"{999_998:032x}", f"{9:016x}", "job", T0, T0 + 10**6, "", KIND_INTERNAL,
                     {names.ATTR_STAGE: value})  # a root span: not a request either  # fmt: skip
    _incident(path, {"tokenize": "cpu", "retrieve": "fetch"}.get, n=40, extra=[root, *bad, lone])
    with load_dataset(traces=[path]) as ds:
        staged = ds.con.execute("SELECT count(*) FROM stages WHERE trace_id IN (?, ?)", [tid, lone.trace_id])
        assert staged.fetchone() == (0,)  # not analysed as a made-up stage
        reqs = ds.con.execute("SELECT trace_id FROM requests WHERE trace_id IN (?, ?)", [tid, lone.trace_id])
        assert reqs.fetchall() == [(tid,)]  # its request is there; the bad spans are not requests
        warns = [w for w in ds.warnings if "not a non-empty string" in w]
        rep = analyze(ds, "p99<100ms")
    assert len(warns) == 1 and warns[0].startswith(f"{path}: 4 spans whose stagescope.stage")
    assert described in warns[0] and "unattributed" in warns[0]
    assert warns[0] in rep["warnings"]


@pytest.mark.parametrize(("value", "described"), BAD_VALUES)
def test_a_non_string_route_is_a_warning_naming_the_file_and_the_request_is_kept(
    tmp_path: Path, value: Any, described: str
) -> None:
    """An http.route that is no string (data from elsewhere) is not read as route "5": the request is
    kept under the route its span name gives, and a warning names the file, as for stagescope.stage."""
    path = tmp_path / "theirs.jsonl"
    tid = f"{999_999:032x}"
    root = SynthSpan(tid, f"{1:016x}", "POST /items/{id}", T0, T0 + 2 * 10**6, "", 2, {"http.route": value})
    stage = SynthSpan(tid, f"{2:016x}", "tokenize", T0, T0 + 10**6, f"{1:016x}", KIND_INTERNAL,
                      {names.ATTR_STAGE: "tokenize", names.ATTR_STAGE_KIND: "cpu"})  # fmt: skip
    _incident(path, {"tokenize": "cpu", "retrieve": "fetch"}.get, n=40, extra=[root, stage])
    with load_dataset(traces=[path]) as ds:
        got = ds.con.execute("SELECT route FROM requests WHERE trace_id = ?", [tid]).fetchall()
        routes = {r[0] for r in ds.con.execute("SELECT DISTINCT route FROM requests").fetchall()}
        warns = [w for w in ds.warnings if "http.route" in w]
        rep = analyze(ds, "p99<100ms")
    assert got == [("POST /items/{id}",)]  # kept, under its span name, not str(value)
    assert str(value) not in routes or str(value) == "POST /items/{id}"
    assert len(warns) == 1 and warns[0].startswith(f"{path}: 1 spans whose http.route is not a non-empty string")
    assert described in warns[0] and "kept" in warns[0]
    assert warns[0] in rep["warnings"]


def test_jaeger_stage_tags_of_other_types_are_named_too(tmp_path: Path) -> None:
    def span(sid: str, parent: str, name: str, start_us: int, dur_us: int, tags: list[dict[str, Any]]) -> Any:
        refs = [{"refType": "CHILD_OF", "traceID": "ab" * 8, "spanID": parent}] if parent else []
        return {"traceID": "ab" * 8, "spanID": sid, "operationName": name, "references": refs,
                "startTime": start_us, "duration": dur_us, "tags": tags, "processID": "p1"}  # fmt: skip

    t0 = T0 // 1000
    doc = {"data": [{"traceID": "ab" * 8, "processes": {"p1": {"serviceName": "ranker"}}, "spans": [
        span("00000000000000a1", "", "POST /rank", t0, 50_000,
             [{"key": "span.kind", "type": "string", "value": "server"}]),
        span("00000000000000a2", "00000000000000a1", "rerank", t0, 40_000,
             [{"key": "stagescope.stage", "type": "string", "value": "rerank"},
              {"key": "stagescope.stage.kind", "type": "string", "value": "compute"}]),
        span("00000000000000a3", "00000000000000a1", "odd", t0, 1_000,
             [{"key": "stagescope.stage", "type": "int64", "value": 3}]),
    ]}]}  # fmt: skip
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(doc))
    with load_dataset(traces=[path]) as ds:
        rows = ds.con.execute("SELECT stage, kind FROM stages").fetchall()
        warns = [w for w in ds.warnings if "not a non-empty string" in w]
    assert rows == [("rerank", "compute")]
    assert len(warns) == 1 and str(path) in warns[0] and "the integer 3" in warns[0]


def test_kinds_survive_parquet_and_old_parquet_gets_them_from_names(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    _incident(path, {"tokenize": "cpu", "retrieve": "fetch"}.get)
    out = ingest_to_parquet([path], tmp_path / "pre")
    with load_dataset(traces=[out]) as ds:
        assert analyze(ds, "p99<100ms")["verdict"] == {"stage": "retrieve", "lever": names.LEVER_CACHE_FEATURES}
    # a directory written before stage rows had a kind, read together with a new one
    old = tmp_path / "old"
    old.mkdir()
    for f in (out).iterdir():
        if f.is_file():
            (old / f.name).write_bytes(f.read_bytes())
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * EXCLUDE (kind) REPLACE ('feature_fetch' AS stage) FROM read_parquet('{out}/stages.parquet') "
        f"WHERE stage = 'retrieve') TO '{old}/stages.parquet' (FORMAT parquet)"
    )
    with load_dataset(traces=[old, out]) as ds:
        got = dict(ds.con.execute("SELECT stage, any_value(kind) FROM stages GROUP BY 1").fetchall())
        assert got == {"tokenize": "cpu", "retrieve": "fetch", "feature_fetch": None}
        assert K.stage_catalog(ds.con).kinds["feature_fetch"] == "fetch"
