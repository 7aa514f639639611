"""The embedded sink: OTLP/JSON lines files per process, rotation, bounded queue, flush, drops counted."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.export import make_span_exporter
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.sink import JsonLinesSpanExporter

REPO = Path(__file__).resolve().parents[1]
RESOURCE = Resource.create({"service.name": "sink-test"})


def span(i: int, *, parent: int | None = None, attrs: dict[str, Any] | None = None) -> ReadableSpan:
    return ReadableSpan(
        name=f"span-{i}",
        context=SpanContext(0xABC0 + i, 0x10 + i, is_remote=False, trace_flags=TraceFlags(1)),
        parent=SpanContext(0xABC0 + i, parent, is_remote=True) if parent else None,
        resource=RESOURCE,
        attributes=attrs or {},
        kind=SpanKind.SERVER,
        status=Status(StatusCode.ERROR, "bad") if i % 2 else Status(StatusCode.UNSET),
        start_time=1_700_000_000_000_000_000 + i,
        end_time=1_700_000_000_000_000_000 + i + 5_000_000,
        instrumentation_scope=InstrumentationScope("stagescope", "0.1.0"),
    )


def read_lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in sorted(directory.glob("spans-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_otlp_json_lines_shape(tmp_path: Path) -> None:
    exporter = JsonLinesSpanExporter(tmp_path)
    attrs = {"s": "x", "i": 2**40, "f": 0.25, "b": True, "gaps": [0.01, 0.02], "codes": [1, 2]}
    exporter.export([span(1, parent=0x99, attrs=attrs), span(2)])
    assert exporter.force_flush(5000)
    (req,) = read_lines(tmp_path)
    assert [p.name for p in tmp_path.glob("*.jsonl")] == [f"spans-{os.getpid()}-0.jsonl"]
    (rs,) = req["resourceSpans"]
    res_attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
    assert res_attrs["service.name"] == {"stringValue": "sink-test"}
    (ss,) = rs["scopeSpans"]
    assert ss["scope"] == {"name": "stagescope", "version": "0.1.0"}
    s1, s2 = ss["spans"]
    assert s1["traceId"] == format(0xABC1, "032x") and s1["spanId"] == format(0x11, "016x")
    assert s1["parentSpanId"] == format(0x99, "016x") and "parentSpanId" not in s2
    assert s1["kind"] == 2 and s1["name"] == "span-1"
    assert s1["startTimeUnixNano"] == str(1_700_000_000_000_000_001)  # 64-bit ints: decimal strings
    assert s1["status"] == {"code": 2, "message": "bad"} and s2["status"] == {}
    a = {x["key"]: x["value"] for x in s1["attributes"]}
    assert a["s"] == {"stringValue": "x"} and a["i"] == {"intValue": str(2**40)}
    assert a["f"] == {"doubleValue": 0.25} and a["b"] == {"boolValue": True}
    assert a["gaps"] == {"arrayValue": {"values": [{"doubleValue": 0.01}, {"doubleValue": 0.02}]}}
    assert a["codes"] == {"arrayValue": {"values": [{"intValue": "1"}, {"intValue": "2"}]}}
    exporter.shutdown()


def test_same_keys_as_the_otlp_example(tmp_path: Path) -> None:
    """Our lines use the span keys of opentelemetry-proto's canonical OTLP/JSON example."""
    example = json.loads((REPO / "external/otlp/opentelemetry-proto/trace.json").read_text())
    ex_span = example["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    exporter = JsonLinesSpanExporter(tmp_path)
    exporter.export([span(1, parent=0x99, attrs={"k": "v"})])
    exporter.shutdown()
    ours = read_lines(tmp_path)[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    shared = {"traceId", "spanId", "parentSpanId", "name", "kind", "startTimeUnixNano", "endTimeUnixNano",
              "attributes"}  # fmt: skip
    assert shared <= set(ex_span) and shared <= set(ours)
    assert set(ours) - set(ex_span) <= {"status", "flags", "events", "links", "traceState"}
    assert type(ours["kind"]) is type(ex_span["kind"]) is int


def test_rotation_by_size_keeps_every_span(tmp_path: Path) -> None:
    exporter = JsonLinesSpanExporter(tmp_path, max_bytes=4000)
    for i in range(60):
        exporter.export([span(i)])
        if i % 5 == 4:
            exporter.force_flush(5000)
    exporter.shutdown()
    files = sorted(tmp_path.glob(f"spans-{os.getpid()}-*.jsonl"))
    assert len(files) > 3
    assert all(f.stat().st_size <= 4000 for f in files)
    names_seen = [
        s["name"] for req in read_lines(tmp_path) for s in req["resourceSpans"][0]["scopeSpans"][0]["spans"]
    ]
    assert sorted(names_seen) == sorted(f"span-{i}" for i in range(60))


def test_bounded_queue_drops_are_counted_and_shutdown_flushes(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = StageMetrics(registry=registry)
    exporter = JsonLinesSpanExporter(tmp_path, max_queue_spans=10, flush_interval_s=60, metrics=metrics)
    exporter.export([span(i) for i in range(8)])  # queued (the writer sleeps: no size trigger yet)
    exporter.export([span(i) for i in range(8, 13)])  # 8 + 5 > 10: dropped, counted
    dropped = registry.get_sample_value(
        names.METRIC_SPANS_DROPPED, {"exporter": "jsonl", "reason": "queue_full"}
    )
    assert dropped == 5
    exporter.shutdown()  # flushes what was queued
    assert len(read_lines(tmp_path)[0]["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 8
    assert registry.get_sample_value(names.METRIC_SPANS_EXPORTED, {"exporter": "jsonl"}) == 8
    exporter.export([span(99)])  # after shutdown: dropped, counted, never raises
    assert (
        registry.get_sample_value(names.METRIC_SPANS_DROPPED, {"exporter": "jsonl", "reason": "shutdown"})
        == 1
    )


def test_make_span_exporter_picks_sink_from_arg_then_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv(names.ENV_SPANS_DIR, raising=False)
    with pytest.raises(ValueError, match=names.ENV_SPANS_DIR):
        make_span_exporter()
    monkeypatch.setenv(names.ENV_SPANS_DIR, str(tmp_path / "env"))
    e1 = make_span_exporter()
    e2 = make_span_exporter(tmp_path / "arg")
    assert isinstance(e1, JsonLinesSpanExporter) and e1.directory == tmp_path / "env"
    assert isinstance(e2, JsonLinesSpanExporter) and e2.directory == tmp_path / "arg"
    e1.shutdown()
    e2.shutdown()


def test_instrumented_app_writes_its_spans_to_the_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    app = FastAPI()

    @app.get("/work")
    async def work() -> dict[str, bool]:
        with stagescope.stage("preprocess"):
            pass
        with stagescope.stage("compute"):
            await asyncio.sleep(0.001)
        return {"ok": True}

    registry = CollectorRegistry()
    handle = stagescope.instrument_app(app, service_name="sink-app", spans_dir=tmp_path, registry=registry)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for _ in range(30):
                assert (await client.get("/work")).status_code == 200

    asyncio.run(run())
    assert handle.force_flush(10)
    spans = [
        s
        for req in read_lines(tmp_path)
        for rs in req["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    servers = [s for s in spans if s["kind"] == 2]
    assert len(servers) == 30 and len(spans) == 90
    server_ids = {s["spanId"] for s in servers}
    assert {s["parentSpanId"] for s in spans if s["kind"] == 1} <= server_ids
    assert registry.get_sample_value(names.METRIC_SPANS_EXPORTED, {"exporter": "jsonl"}) == 90
    handle.shutdown()


def test_direct_otlp_encoding_matches_the_readable_span_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink's fast path (record -> OTLP/JSON) writes exactly what encoding ReadableSpans writes."""
    from opentelemetry.sdk.trace import TracerProvider

    from stagescope.instrumentation.otlp_json import span_to_otlp

    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    records: list[Any] = []
    app = FastAPI()

    @app.post("/items/{i}")
    async def item(i: int) -> dict[str, int]:
        rec = stagescope.current_request()
        assert rec is not None
        rec.model, rec.input_tokens, rec.output_tokens, rec.batch_size = "m", 3, 4, 2
        rec.set_input(b"x")
        with stagescope.stage("preprocess"):
            pass
        for _ in range(3):
            rec.mark_token()
        if i == 0:
            raise RuntimeError("boom")
        return {"i": i}

    handle = stagescope.instrument_app(
        app, service_name="enc", registry=CollectorRegistry(), tracer_provider=TracerProvider(),
        baseline_sample=1.0, record_hook=records.append,
    )  # fmt: skip

    async def run() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            await client.post("/items/1?q=a b", headers={"traceparent": tp})
            await client.post("/items/0")

    asyncio.run(run())
    builder = handle.state.builder
    assert len(records) == 2
    for rec in records:
        direct = builder.otlp_spans(rec)
        via_sdk = [span_to_otlp(s) for s in builder.build(rec)]
        for a, b in zip(direct[1:], via_sdk[1:], strict=True):  # stage span ids are drawn per build
            a.pop("spanId"), b.pop("spanId")
        assert direct == via_sdk
    handle.shutdown()
