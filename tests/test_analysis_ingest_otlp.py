"""OTLP/JSON lines, sink directories and the external OTLP fixtures -> requests/stages/token_gaps."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import pytest

from stagescope import names
from stagescope.analysis.ingest import ingest_to_parquet, load_dataset
from stagescope.analysis.synth import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    SynthSpan,
    request_spans,
    write_otlp_lines,
)

REPO = Path(__file__).resolve().parents[1]
T0 = 1_764_000_000_000_000_000


def _tid(i: int) -> str:
    return f"{i + 1:032x}"


def _write_requests(path: Path, n: int = 20, *, client: bool = False, gz: bool = False, first: int = 0) -> None:
    spans = []
    for i in range(first, first + n):
        stages = [("feature_fetch", 0.0, 5.0), ("queue", 5.0, 10.0 + i), ("compute", 15.0 + i, 20.0)]
        spans += request_spans(
            _tid(i), T0 + i * 10**9, stages,
            attributes={"stagescope.model": "m1", "stagescope.batch_size": 4, "stagescope.queue_depth": i,
                        "stagescope.input_hash": f"h{i % 3}", "stagescope.cold_start": i == 0},
            client_ms=(60.0 + i) if client else None,
        )  # fmt: skip
    write_otlp_lines(path, spans, spans_per_line=7, compress=gz)


def _rows(ds, sql: str) -> list[tuple]:
    return ds.con.execute(sql).fetchall()


def test_otlp_lines_to_requests_and_stages(tmp_path: Path) -> None:
    f = tmp_path / "traces.jsonl"
    _write_requests(f, 20, client=True)
    ds = load_dataset(traces=[f])
    assert _rows(ds, "SELECT count(*) FROM requests") == [(20,)]
    r = _rows(ds, "SELECT route, model, status_code, is_error, duration_ms, batch_size, queue_depth, "
                  "input_hash, cold_start, client_duration_ms, source FROM requests WHERE trace_id = ?"
              .replace("?", f"'{_tid(3)}'"))  # fmt: skip
    assert r == [("/v1/predict", "m1", 200, False, 38.0, 4, 3, "h0", False, 63.0, "stagescope")]
    stages = dict(_rows(ds, f"SELECT stage, duration_ms FROM stages WHERE trace_id = '{_tid(3)}'"))
    assert stages == {"feature_fetch": 5.0, "queue": 13.0, "compute": 20.0, "network": 25.0}
    assert ds.files[0].kind == "otlp" and ds.files[0].spans == 20 * 5 and ds.files[0].has_stage_info
    assert ds.warnings == []
    ds.close()


def _has_stage_info(ds: Any, name: str) -> bool:
    return next(f.has_stage_info for f in ds.files if Path(f.path).name == name)


def test_sink_directory_recursive_gzip_and_uppercase_ids(tmp_path: Path) -> None:
    sink = tmp_path / "spans" / "worker"
    sink.mkdir(parents=True)
    _write_requests(sink / "spans-123-0.jsonl", 10)
    _write_requests(sink / "spans-123-1.jsonl.gz", 5, gz=True, first=10)
    upper = tmp_path / "spans" / "upper.json"
    upper.write_text(
        '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5B8EFFF798038103D269B633813FC60C",'
        '"spanId":"EEE19B7EC3C1B174","name":"GET /x","kind":"SPAN_KIND_SERVER",'
        f'"startTimeUnixNano":{T0},"endTimeUnixNano":"{T0 + 2_000_000}",'
        '"status":{"code":"STATUS_CODE_ERROR"}}]}]}]}\n'
    )
    ds = load_dataset(traces=[tmp_path / "spans"])
    kinds = sorted((Path(f.path).name, f.kind) for f in ds.files)
    assert kinds == [("spans-123-0.jsonl", "sink"), ("spans-123-1.jsonl.gz", "sink"), ("upper.json", "otlp")]
    # 10 + 5 requests from the sink files, one generic request
    assert _rows(ds, "SELECT source, count(*) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("generic", 1), ("stagescope", 15)]  # fmt: skip
    assert _rows(ds, "SELECT trace_id, is_error, duration_ms FROM requests WHERE source = 'generic'") == [
        ("5b8efff798038103d269b633813fc60c", True, 2.0)]  # fmt: skip
    # no stage information in upper.json: no warning from the ingest (the analysis says what it costs)
    assert not _has_stage_info(ds, "upper.json") and ds.warnings == []
    ds.close()


def test_token_gaps_and_vllm_spans(tmp_path: Path) -> None:
    f = tmp_path / "v.jsonl"
    gaps = [0.02, 0.03, 0.25]
    spans = [
        SynthSpan(_tid(1), "a" * 16, "POST /v1/generate", T0, T0 + 400_000_000, kind=KIND_SERVER,
                  attributes={"http.route": "/v1/generate", "stagescope.itl.gaps": gaps,
                              "stagescope.itl.mean": 0.1, "gen_ai.latency.time_to_first_token": 0.1,
                              "gen_ai.usage.output_tokens": 4}),
        SynthSpan(_tid(2), "b" * 16, "llm_request", T0, T0 + 1_000_000_000, kind=KIND_SERVER,
                  attributes={"gen_ai.latency.time_in_queue": 0.2, "gen_ai.latency.time_in_model_prefill": 0.3,
                              "gen_ai.latency.time_in_model_decode": 0.4, "gen_ai.latency.e2e": 0.95,
                              "gen_ai.latency.time_to_first_token": 0.5, "gen_ai.usage.completion_tokens": 5,
                              "gen_ai.usage.prompt_tokens": 100, "gen_ai.request.model": "opt"}),
    ]  # fmt: skip
    write_otlp_lines(f, spans)
    ds = load_dataset(traces=[f])
    assert sorted(g for (g,) in _rows(ds, "SELECT gap_ms FROM token_gaps")) == pytest.approx([20, 30, 250])
    v = _rows(ds, f"SELECT source, duration_ms, ttft_ms, itl_mean_ms, input_tokens, output_tokens, model "
                  f"FROM requests WHERE trace_id = '{_tid(2)}'")[0]  # fmt: skip
    assert v[0] == "vllm" and v[1:4] == pytest.approx((950.0, 500.0, 100.0)) and v[4:] == (100, 5, "opt")
    st = _rows(ds, f"SELECT stage, start_unix_ns - {T0}, duration_ms FROM stages WHERE trace_id = '{_tid(2)}' "
                   "ORDER BY 2")  # fmt: skip
    # vLLM V1: prefill ends at the first token (0.5 s), the queue before it; what is left of e2e after
    # the last token is the front end's hand-back (analysis/ingest/engines.py)
    assert [(s, o) for s, o, _ in st] == [
        ("queue", 0), ("prefill", 200_000_000), ("decode", 500_000_000), ("front_end", 900_000_000),
    ]  # fmt: skip
    assert [d for _, _, d in st] == pytest.approx([200.0, 300.0, 400.0, 50.0])
    assert _rows(ds, f"SELECT source, ttft_ms, itl_mean_ms FROM requests WHERE trace_id = '{_tid(1)}'") == [
        ("stagescope", 100.0, 100.0)]  # fmt: skip
    ds.close()


def test_every_external_otlp_file_loads() -> None:
    ds = load_dataset(traces=[REPO / "external" / "otlp"])
    by_name = {Path(f.path).name: f for f in ds.files}
    assert by_name["trace.json"].spans == 1 and not by_name["trace.json"].has_stage_info
    assert by_name["metrics.json"].spans == 0
    assert {"otlp2jaeger-in.json", "integration_example_trace.json", "otlp2jaeger-out.json",
            "uiconv_trace_success.json", "flamegraph_testTrace_ride-sharing.json"} <= set(by_name)  # fmt: skip
    assert all(f.spans > 0 for name, f in by_name.items() if "trace" in name or "jaeger" in name)
    assert not any(f.has_stage_info for f in ds.files)
    assert not any("without stage information" in w for w in ds.warnings)
    # no stage spans anywhere; the one stage row is the ride-sharing trace's network time (its load
    # generator's CLIENT span minus the server's span, see the test below)
    assert _rows(ds, "SELECT stage, trace_id FROM stages") == [("network", "84b3fad94c6112edd6af3347d06f6f1d")]
    assert _rows(ds, "SELECT count(*) FROM requests") != [(0,)]
    ds.close()


def test_a_programs_root_span_that_calls_a_server_is_not_the_request() -> None:
    """Jaeger UI's captured ride-sharing trace: the load generator's own root span ``OrderVehicle``
    (no kind, service load-generator, 1,181.6 ms) calls ``HTTP GET`` (CLIENT, 968.3 ms), whose server
    span ``BikeHandler`` (SERVER, service ride-sharing-app, 967.1 ms) is the request. The SLI is the
    server's: the request is BikeHandler with the client's span as its caller (network 1.27 ms), not
    the caller's whole program run (before: route OrderVehicle, 1,181.6 ms, 22 % too long, the
    server's name nowhere)."""
    ds = load_dataset(traces=[REPO / "external" / "otlp" / "jaeger-ui" / "flamegraph_testTrace_ride-sharing.json"])
    assert _rows(ds, "SELECT route, service, duration_ms, client_duration_ms FROM requests") == [
        ("BikeHandler", "ride-sharing-app", pytest.approx(967.066), pytest.approx(968.334))]  # fmt: skip
    assert _rows(ds, "SELECT stage, duration_ms FROM stages") == [("network", pytest.approx(1.268))]
    ds.close()


def test_a_programs_root_span_is_the_client_side_at_any_depth(tmp_path: Path) -> None:
    """The same shape built deeper and wider: a job's INTERNAL root, an INTERNAL step under it, two
    CLIENT calls from the step to two servers (one with a downstream call of its own). Each server
    span is a request with its own caller's duration; the job's root and the downstream server span
    are not requests; a job root that calls nothing stays a request (a trace of one program); a queue
    worker's CONSUMER root calling a server is the client side too (before: no request at all)."""
    t = _tid(7)
    job = [
        SynthSpan(t, "a" * 16, "nightly-job", start_ns=T0, end_ns=T0 + 900_000_000, kind=KIND_INTERNAL),
        SynthSpan(t, "b" * 16, "step", parent_span_id="a" * 16, start_ns=T0 + 10_000_000, end_ns=T0 + 800_000_000, kind=KIND_INTERNAL),
        SynthSpan(t, "c" * 16, "POST", parent_span_id="b" * 16, start_ns=T0 + 20_000_000, end_ns=T0 + 320_000_000, kind=KIND_CLIENT),
        SynthSpan(t, "d" * 16, "POST /v1/score", parent_span_id="c" * 16, start_ns=T0 + 25_000_000, end_ns=T0 + 315_000_000, kind=KIND_SERVER),
        SynthSpan(t, "e" * 16, "GET", parent_span_id="d" * 16, start_ns=T0 + 30_000_000, end_ns=T0 + 100_000_000, kind=KIND_CLIENT),
        SynthSpan(t, "f" * 16, "GET /features", parent_span_id="e" * 16, start_ns=T0 + 31_000_000, end_ns=T0 + 99_000_000, kind=KIND_SERVER),
        SynthSpan(t, "1" * 16, "POST", parent_span_id="b" * 16, start_ns=T0 + 400_000_000, end_ns=T0 + 500_000_000, kind=KIND_CLIENT),
        SynthSpan(t, "2" * 16, "POST /v1/embed", parent_span_id="1" * 16, start_ns=T0 + 402_000_000, end_ns=T0 + 496_000_000, kind=KIND_SERVER),
        SynthSpan(_tid(8), "3" * 16, "lonely-job", start_ns=T0, end_ns=T0 + 50_000_000, kind=KIND_INTERNAL),
        # a queue worker's CONSUMER span (OTLP kind 5) calling a model server: the server span is the request
        SynthSpan(_tid(10), "4" * 16, "process jobs", start_ns=T0, end_ns=T0 + 200_000_000, kind=5),
        SynthSpan(_tid(10), "5" * 16, "POST", parent_span_id="4" * 16, start_ns=T0 + 10_000_000,
                  end_ns=T0 + 190_000_000, kind=KIND_CLIENT),
        SynthSpan(_tid(10), "6" * 16, "POST /v1/classify", parent_span_id="5" * 16, start_ns=T0 + 12_000_000,
                  end_ns=T0 + 186_000_000, kind=KIND_SERVER),
    ]
    f = tmp_path / "job.jsonl"
    write_otlp_lines(f, job)
    ds = load_dataset(traces=[f])
    got = _rows(ds, "SELECT route, duration_ms, client_duration_ms FROM requests ORDER BY route")
    assert got == [
        ("POST /v1/classify", pytest.approx(174.0), pytest.approx(180.0)),
        ("POST /v1/embed", pytest.approx(94.0), pytest.approx(100.0)),
        ("POST /v1/score", pytest.approx(290.0), pytest.approx(300.0)),
        ("lonely-job", pytest.approx(50.0), None),
    ]
    # each request's network time from its own caller: 300 - 290 and 100 - 94 ms
    assert sorted(d for (d,) in _rows(ds, "SELECT duration_ms FROM stages WHERE stage = 'network'")) == [
        pytest.approx(6.0), pytest.approx(6.0), pytest.approx(10.0)]  # fmt: skip
    ds.close()


def test_a_hand_traced_service_root_with_stages_stays_the_request(tmp_path: Path) -> None:
    """A service traced by hand: its handler's root span is INTERNAL (the OpenTelemetry default), with
    stage spans of its own (preprocess, compute) and a CLIENT call to a feature store whose SERVER
    span is in the same trace. The root is the request (its stages and all), the feature store's span
    a downstream call, not a request: a root with stages is a service at work, not a program calling
    one (the client-side walk took the feature store for the request before)."""
    t = _tid(11)
    st = names.ATTR_STAGE
    spans = [
        SynthSpan(t, "a" * 16, "predict", start_ns=T0, end_ns=T0 + 200_000_000, kind=KIND_INTERNAL),
        SynthSpan(t, "b" * 16, "preprocess", parent_span_id="a" * 16, start_ns=T0 + 1_000_000,
                  end_ns=T0 + 21_000_000, attributes={st: "preprocess"}),
        SynthSpan(t, "c" * 16, "GET", parent_span_id="a" * 16, start_ns=T0 + 22_000_000, end_ns=T0 + 72_000_000,
                  kind=KIND_CLIENT),
        SynthSpan(t, "d" * 16, "GET /features", parent_span_id="c" * 16, start_ns=T0 + 23_000_000,
                  end_ns=T0 + 71_000_000, kind=KIND_SERVER, service="feature-store"),
        SynthSpan(t, "e" * 16, "compute", parent_span_id="a" * 16, start_ns=T0 + 73_000_000,
                  end_ns=T0 + 193_000_000, attributes={st: "compute"}),
    ]
    f = tmp_path / "svc.jsonl"
    write_otlp_lines(f, spans)
    ds = load_dataset(traces=[f])
    assert _rows(ds, "SELECT route, duration_ms FROM requests") == [("predict", pytest.approx(200.0))]
    assert sorted(_rows(ds, "SELECT stage FROM stages WHERE stage IN ('preprocess', 'compute')")) == [
        ("compute",), ("preprocess",)]  # fmt: skip
    ds.close()


def test_an_llm_engine_called_by_a_program_is_its_own_request(tmp_path: Path) -> None:
    """An agent's run (INTERNAL root, 900 ms) calls vLLM 300 ms in (CLIENT, 500 ms); vLLM's
    ``llm_request`` SERVER span (498 ms, TTFT 100 ms) is the request. Before, the agent's run was the
    request and vLLM its sample: e2e 900 ms, TTFT 401 ms (the agent's own 300 ms before the call
    counted as time to first token) and a 402 ms 'gateway' stage."""
    t = _tid(9)
    attrs = {names.VLLM_ATTR_QUEUE: 0.05, names.VLLM_ATTR_TTFT: 0.1, names.VLLM_ATTR_E2E: 0.498,
             names.VLLM_ATTR_PREFILL: 0.05, names.VLLM_ATTR_DECODE: 0.39, names.VLLM_ATTR_PROMPT_TOKENS: 100,
             names.VLLM_ATTR_COMPLETION_TOKENS: 40}  # fmt: skip
    spans = [
        SynthSpan(t, "a" * 16, "agent-run", start_ns=T0, end_ns=T0 + 900_000_000, kind=KIND_INTERNAL, service="agent"),
        SynthSpan(t, "b" * 16, "POST", parent_span_id="a" * 16, start_ns=T0 + 300_000_000, end_ns=T0 + 800_000_000,
                  kind=KIND_CLIENT, service="agent"),
        SynthSpan(t, "c" * 16, "llm_request", parent_span_id="b" * 16, start_ns=T0 + 301_000_000,
                  end_ns=T0 + 799_000_000, kind=KIND_SERVER, service="vllm", attributes=attrs),
    ]  # fmt: skip
    f = tmp_path / "agent.jsonl"
    write_otlp_lines(f, spans)
    ds = load_dataset(traces=[f])
    assert _rows(ds, "SELECT route, source, duration_ms, ttft_ms, client_duration_ms FROM requests") == [
        ("llm_request", "vllm", pytest.approx(498.0), pytest.approx(100.0), pytest.approx(500.0))]  # fmt: skip
    stages = dict(_rows(ds, "SELECT stage, duration_ms FROM stages"))
    assert "gateway" not in stages and stages["network"] == pytest.approx(2.0)
    assert stages["prefill"] == pytest.approx(50.0) and stages["decode"] == pytest.approx(390.0)
    ds.close()


def test_ingest_to_parquet_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    _write_requests(f, 12, client=True)
    prom = tmp_path / "m.prom"
    prom.write_text(f'{names.METRIC_QUEUE_DEPTH}{{model="m"}} 3 1764000000000\n')
    out = ingest_to_parquet([f], tmp_path / "pq", metrics=[prom])
    shutil.rmtree(tmp_path / "pq" / ".work", ignore_errors=True)
    ds = load_dataset(traces=[out])
    assert _rows(ds, "SELECT count(*) FROM requests") == [(12,)]
    assert _rows(ds, "SELECT count(*) FROM stages WHERE stage = 'network'") == [(12,)]
    assert ds.files and ds.files[0].path == str(f)
    assert _rows(ds, "SELECT metric, value, ts_ms FROM metric_samples") == [
        (names.METRIC_QUEUE_DEPTH, 3.0, 1764000000000)]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [
        "metric_samples.parquet", "requests.parquet", "spans.parquet", "stages.parquet",
        "stagescope-ingest.json", "token_gaps.parquet"]  # fmt: skip
    ds.close()


def test_pretty_printed_gzip_document(tmp_path: Path) -> None:
    src = REPO / "external" / "otlp" / "opentelemetry-proto" / "trace.json"
    f = tmp_path / "trace.json.gz"
    f.write_bytes(gzip.compress(src.read_bytes()))
    ds = load_dataset(traces=[f])
    assert _rows(ds, "SELECT trace_id, span_id, duration_ms, service FROM requests") == [
        ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", 1000.0, "my.service")]  # fmt: skip
    ds.close()


def test_relations_have_the_pinned_schema() -> None:
    """The column names and types pinned in the plan ("Analysis tables"), even with no input, with the
    sampling probability (issue 14) and the integer keys (analysis.keys) at the end."""
    ds = load_dataset()
    schema = {
        rel: _rows(ds, f"DESCRIBE {rel}") for rel in ("requests", "stages", "token_gaps", "metric_samples")
    }
    assert [(c[0], c[1]) for c in schema["requests"]] == [
        ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"), ("service", "VARCHAR"), ("name", "VARCHAR"),
        ("route", "VARCHAR"), ("model", "VARCHAR"), ("status_code", "INTEGER"), ("is_error", "BOOLEAN"),
        ("start_unix_ns", "BIGINT"), ("duration_ms", "DOUBLE"), ("ttft_ms", "DOUBLE"), ("itl_mean_ms", "DOUBLE"),
        ("itl_p99_ms", "DOUBLE"), ("itl_max_ms", "DOUBLE"), ("input_tokens", "BIGINT"), ("output_tokens", "BIGINT"),
        ("batch_size", "BIGINT"), ("queue_depth", "BIGINT"), ("input_hash", "VARCHAR"), ("cold_start", "BOOLEAN"),
        ("client_duration_ms", "DOUBLE"), ("source", "VARCHAR"), ("sampled_reason", "VARCHAR"),
        ("sampling_p", "DOUBLE"), ("trace_key", "UBIGINT"), ("input_key", "UBIGINT"), ("request_key", "UBIGINT"),
        ("escalated", "BOOLEAN"),  # stagescope.escalated (issue 18's cascade lever), at the end
    ]  # fmt: skip
    assert [(c[0], c[1]) for c in schema["stages"]] == [
        ("trace_id", "VARCHAR"), ("stage", "VARCHAR"), ("start_unix_ns", "BIGINT"), ("end_unix_ns", "BIGINT"),
        ("duration_ms", "DOUBLE"), ("trace_key", "UBIGINT"), ("request_key", "UBIGINT"), ("kind", "VARCHAR"),
    ]  # fmt: skip
    # running: the gap's own running decode batch where the server counted it (issue 17, at the end)
    assert [(c[0], c[1]) for c in schema["token_gaps"]] == [
        ("trace_id", "VARCHAR"), ("gap_ms", "DOUBLE"), ("running", "DOUBLE")]  # fmt: skip
    assert [(c[0], c[1]) for c in schema["metric_samples"]] == [
        ("metric", "VARCHAR"), ("labels", "MAP(VARCHAR, VARCHAR)"), ("value", "DOUBLE"), ("ts_ms", "BIGINT"),
        ("source", "VARCHAR"),
    ]  # fmt: skip
    assert _rows(ds, "SELECT count(*) FROM client_results") == [(0,)]
    ds.close()


def test_file_named_twice_is_read_once_and_empty_dirs_are_reported(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    _write_requests(f, 4)
    (tmp_path / "empty").mkdir()
    with load_dataset(traces=[f, tmp_path, tmp_path / "empty"]) as ds:
        assert _rows(ds, "SELECT count(*) FROM requests") == [(4,)]
        assert [Path(x.path).name for x in ds.files] == ["t.jsonl"]
        assert any("empty: no .json/.jsonl/.ndjson files" in w for w in ds.warnings)


def test_client_root_without_flag_and_generic_downstream_servers(tmp_path: Path) -> None:
    """A CLIENT root with a SERVER child counts as the load generator (network = client - server);
    a SERVER span called by another service's span is a downstream call, not a request."""
    from stagescope.analysis.synth import KIND_CLIENT

    tid = _tid(7)
    spans = [
        SynthSpan(tid, "c" * 16, "GET /a", T0, T0 + 50_000_000, kind=KIND_CLIENT, service="curl"),
        SynthSpan(
            tid, "a" * 16, "GET /a", T0 + 5_000_000, T0 + 45_000_000, "c" * 16, KIND_SERVER, service="front"
        ),
        SynthSpan(
            tid, "d" * 16, "call b", T0 + 6_000_000, T0 + 30_000_000, "a" * 16, KIND_CLIENT, service="front"
        ),
        SynthSpan(
            tid, "b" * 16, "GET /b", T0 + 7_000_000, T0 + 29_000_000, "d" * 16, KIND_SERVER, service="back"
        ),
    ]
    f = tmp_path / "t.jsonl"
    write_otlp_lines(f, spans)
    with load_dataset(traces=[f]) as ds:
        assert _rows(ds, "SELECT span_id, service, duration_ms, client_duration_ms, source FROM requests") == [
            ("a" * 16, "front", 40.0, 50.0, "generic")]  # fmt: skip
        assert _rows(ds, "SELECT stage, duration_ms FROM stages") == [("network", 10.0)]


def test_export_request_longer_than_duckdbs_default_bound(tmp_path: Path) -> None:
    """One line of ~33 MiB (beyond the 2 x 16 MiB DuckDB buffers by default) is read with a widened bound."""
    f = tmp_path / "big-line.jsonl"
    spans = request_spans(_tid(1), T0, [("compute", 0.0, 5.0)], attributes={"big": "x" * (33 * 2**20)})
    write_otlp_lines(f, spans)
    with load_dataset(traces=[f]) as ds:
        assert _rows(ds, "SELECT count(*) FROM requests") == [(1,)]
        assert _rows(ds, "SELECT stage FROM stages") == [("compute",)]


def _strip_keys(d: Path) -> None:
    """Rewrite a pre-ingested directory as written before the integer keys existed."""
    import duckdb

    con = duckdb.connect()
    for rel, keys in (("requests", "trace_key, input_key, request_key"), ("stages", "trace_key, request_key")):
        f = d / f"{rel}.parquet"
        con.execute(f"COPY (SELECT * EXCLUDE ({keys}) FROM read_parquet('{f}')) TO '{f}.new' (FORMAT parquet)")
        Path(f"{f}.new").replace(f)
    con.close()


def test_parquet_without_integer_keys_is_still_read_and_analysed(tmp_path: Path) -> None:
    from stagescope.analysis.api import analyze
    from stagescope.analysis.keys import trace_ref

    f, g = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_requests(f, 12)
    _write_requests(g, 8)
    old = ingest_to_parquet([f], tmp_path / "old")
    new = ingest_to_parquet([g], tmp_path / "new")
    _strip_keys(old)
    # old files alone, and old beside new: views without the keys (joins on trace ids)
    for dirs, n in (([old], 12), ([old, new], 20)):
        ds = load_dataset(traces=dirs)
        assert trace_ref(ds.con) == "trace_id"
        rep = analyze(ds, "p99<40ms")
        assert rep["requests"] == n and rep["attribution"][0]["stage"] == "queue"
        assert all(s["trace_id"] for s in rep["slowest"])
        ds.close()
    # old files appended to newly parsed traces: the keys the old files lack are computed
    ds = load_dataset(traces=[g, old])
    assert trace_ref(ds.con) == "trace_key"
    assert _rows(ds, "SELECT count(*), count(trace_key), count(input_key) FROM requests") == [(20, 20, 20)]
    assert _rows(ds, "SELECT count(*) = count(trace_key) FROM stages") == [(True,)]
    assert _rows(ds, "SELECT count(*) FROM requests WHERE trace_key <> md5_number_lower(trace_id)") == [(0,)]
    assert _rows(ds, "SELECT count(request_key) FROM requests") == [(20,)]
    # an old stage row cannot name its request (no parent span id): it is matched by time
    assert _rows(ds, "SELECT count(request_key) FROM stages WHERE stage <> 'network'") == [(8 * 3,)]
    assert analyze(ds, "p99<40ms")["attribution"][0]["stage"] == "queue"
    ds.close()


def test_spans_repeated_across_and_within_files_are_counted_once(tmp_path: Path) -> None:
    """An exporter that retried a delivered batch, or a rotated file beside its copy, repeats spans:
    each request is still one sample, and the dataset counts the repeats (no warning: once
    de-duplicated they cost the analysis nothing)."""
    f = tmp_path / "a.jsonl"
    _write_requests(f, 10)
    lines = f.read_text().splitlines(keepends=True)
    (tmp_path / "copy.jsonl").write_text("".join(lines))  # the whole file again
    (tmp_path / "retry.jsonl").write_text(lines[0])  # its first export request again
    counts = {}
    for name in ("a.jsonl", "retry.jsonl"):
        alone = load_dataset(traces=[tmp_path / name])
        counts[name] = _rows(alone, "SELECT count(*) FROM spans")[0][0]
        assert alone.repeated_spans == 0
        alone.close()
    assert 0 < counts["retry.jsonl"] < counts["a.jsonl"]
    ds = load_dataset(traces=[tmp_path])
    assert _rows(ds, "SELECT count(*) FROM requests") == [(10,)]
    assert _rows(ds, "SELECT count(*) FROM spans") == [(counts["a.jsonl"],)]
    assert _rows(ds, "SELECT count(*) FROM stages") == [(30,)]
    assert ds.repeated_spans == counts["a.jsonl"] + counts["retry.jsonl"] and ds.warnings == []
    ds.close()


def test_concurrent_requests_of_one_trace_keep_their_own_stages(tmp_path: Path) -> None:
    """A client fans out two calls in one trace. Each request's stage spans are its children, so each
    is broken down with its own stages (request_key); matched by time alone, the short request would
    take the long one's compute, which overlaps it and ends later."""
    from stagescope.analysis.api import analyze, frames
    from stagescope.analysis.synth import KIND_CLIENT, SynthSpan

    tid, ms = _tid(7), 1_000_000
    server = {"http.route": "/v1/predict", "http.response.status_code": 200}
    spans = [
        SynthSpan(tid, "c" * 16, "fan-out", T0, T0 + 120 * ms, kind=KIND_CLIENT),  # the calling client
        SynthSpan(tid, "a" * 16, "POST /v1/predict", T0, T0 + 100 * ms, "c" * 16, KIND_SERVER, server),
        SynthSpan(tid, "a" * 15 + "1", "compute", T0, T0 + 90 * ms, "a" * 16, attributes={"stagescope.stage": "compute"}),
        SynthSpan(tid, "b" * 16, "POST /v1/predict", T0 + 10 * ms, T0 + 60 * ms, "c" * 16, KIND_SERVER, server),
        SynthSpan(tid, "b" * 15 + "1", "feature_fetch", T0 + 10 * ms, T0 + 55 * ms, "b" * 16,
                  attributes={"stagescope.stage": "feature_fetch"}),
    ]  # fmt: skip
    f = tmp_path / "fan-out.jsonl"
    write_otlp_lines(f, spans)
    ds = load_dataset(traces=[f])
    assert _rows(ds, "SELECT count(*) FROM requests") == [(2,)]
    analyze(ds, "p99<300ms")
    got = {r["value_ms"]: r for r in frames(ds)["ss_breakdown"].to_dicts()}
    assert got[100.0]["compute"] == pytest.approx(90.0) and not got[100.0].get("feature_fetch")
    assert got[50.0]["feature_fetch"] == pytest.approx(45.0) and not got[50.0].get("compute")
    assert got[50.0]["unattributed"] == pytest.approx(5.0)
    ds.close()


def test_one_request_per_span_id_whatever_instrumentation_wrote_it(tmp_path: Path) -> None:
    """The identity rule: a request is one span id. (a) The same request span written by the service's
    own tracer provider (FastAPI's span, no stage spans) and by stagescope's sink (the same ids, its
    stage spans) is one request, broken down by its own stages; (b) a second SERVER span opened in the
    same process directly under the request span (two instrumentations) is not a second request, and
    the stages under it are the outer request's."""
    user_side, sink_side, nested = [], [], []
    for i in range(6):
        tid, t0 = _tid(i), T0 + i * 10**9
        ours = request_spans(tid, t0, [("feature_fetch", 1.0, 20.0 + i), ("compute", 21.0 + i, 4.0)],
                             attributes={"stagescope.cold_start": False})  # fmt: skip
        server = ours[0]
        sink_side += ours
        user_side.append(SynthSpan(tid, server.span_id, server.name, t0 - 200_000, server.end_ns + 300_000,
                                   kind=KIND_SERVER, attributes={"http.route": "/v1/predict"}))  # fmt: skip
        outer = SynthSpan(_tid(100 + i), "a" * 15 + str(i), "POST /v1/predict", t0, t0 + 40 * 10**6,
                          kind=KIND_SERVER, attributes={"http.route": "/v1/predict"})  # fmt: skip
        inner = SynthSpan(outer.trace_id, "b" * 15 + str(i), "POST /v1/predict", t0 + 10**5, t0 + 39 * 10**6,
                          parent_span_id=outer.span_id, kind=KIND_SERVER)  # fmt: skip
        stage = SynthSpan(outer.trace_id, "c" * 15 + str(i), "compute", t0 + 10**6, t0 + 31 * 10**6,
                          parent_span_id=inner.span_id, attributes={names.ATTR_STAGE: "compute"})  # fmt: skip
        nested += [outer, inner, stage]
    write_otlp_lines(tmp_path / "user.jsonl", user_side)
    write_otlp_lines(tmp_path / "sink.jsonl", sink_side)
    write_otlp_lines(tmp_path / "nested.jsonl", nested)
    ds = load_dataset(traces=[tmp_path])
    assert _rows(ds, "SELECT count(*), count(DISTINCT trace_id) FROM requests") == [(12, 12)]
    # the copy kept is the longer one (the user side's: the outermost measurement of the span)
    assert _rows(ds, f"SELECT duration_ms FROM requests WHERE trace_id = '{_tid(0)}'") == [(25.5,)]
    assert _rows(ds, "SELECT count(*), count(request_key) FROM stages") == [(18, 18)]
    own = _rows(
        ds, "SELECT count(*) FROM stages s JOIN requests r USING (request_key) WHERE s.trace_id = r.trace_id"
    )
    assert own == [(18,)]
    assert ds.repeated_spans == 6  # the six request spans written on both sides
    ds.close()
