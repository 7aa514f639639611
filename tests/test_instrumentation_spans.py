"""Spans from instrument_app: tree, attributes, trace-context propagation, streams, sampling, modes.

Real FastAPI apps through httpx's ASGI transport, spans captured with the SDK's InMemorySpanExporter
through ``tracer_provider=`` (no OpenTelemetry mocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.app import uninstrument_app
from stagescope.instrumentation.middleware import parse_traceparent
from stagescope.instrumentation.sampling import SamplingPolicy

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture(autouse=True)
def _clean_sampler_env(clean_telemetry_env: None) -> None:
    """Every test starts with none of the sampler's, sink's or OTel's variables set (conftest)."""


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/predict/{item}")
    async def predict(item: int, request: Request) -> dict[str, Any]:
        body = await request.body()
        rec = stagescope.current_request()
        assert rec is not None
        rec.model = "ranker-v3"
        rec.set_input(body)
        rec.input_tokens, rec.output_tokens = 12, 3
        rec.batch_size, rec.queue_depth = 4, 2
        with stagescope.stage("feature_fetch"):
            await asyncio.sleep(0.002)
        async with stagescope.stage("compute"):
            await asyncio.sleep(0.003)
        with stagescope.stage("postprocess"):
            pass
        return {"item": item}

    @app.get("/sleep/{ms}")
    async def sleep(ms: int) -> dict[str, int]:
        with stagescope.stage("compute"):
            await asyncio.sleep(ms / 1000)
        return {"ms": ms}

    @app.get("/boom")
    async def boom() -> None:
        with stagescope.stage("preprocess"):
            raise RuntimeError("boom")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def tokens() -> AsyncIterator[str]:
            for _ in range(4):
                await asyncio.sleep(0.05)
                yield "tok "

        return StreamingResponse(stagescope.instrument_stream(tokens()), media_type="text/plain")

    return app


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def instrumented(**kwargs: Any) -> tuple[FastAPI, Any, InMemorySpanExporter]:
    app = make_app()
    provider, exporter = memory_provider()
    kwargs.setdefault("baseline_sample", 1.0)
    handle = stagescope.instrument_app(
        app, service_name="test-svc", models=["ranker-v3"], registry=CollectorRegistry(),
        tracer_provider=provider, **kwargs,
    )  # fmt: skip
    return app, handle, exporter


async def call(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await client.request(method, path, **kwargs)


def spans_of(handle: Any, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert handle.force_flush(10)
    return list(exporter.get_finished_spans())


def server_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.kind == SpanKind.SERVER]


def test_span_tree_and_attributes_join_the_callers_trace() -> None:
    app, handle, exporter = instrumented()
    tp = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    r = asyncio.run(call(app, "POST", "/v1/predict/7", content=b"secret prompt", headers={"traceparent": tp}))
    assert r.status_code == 200
    spans = spans_of(handle, exporter)
    (server,) = server_spans(spans)
    assert server.name == "POST /v1/predict/{item}"
    assert server.context is not None and server.parent is not None
    assert format(server.context.trace_id, "032x") == CALLER_TRACE
    assert format(server.parent.span_id, "016x") == CALLER_SPAN and server.parent.is_remote
    attrs = dict(server.attributes or {})
    assert attrs["http.route"] == "/v1/predict/{item}"
    assert attrs["http.method"] == "POST" and attrs["http.status_code"] == 200
    assert attrs[names.ATTR_MODEL] == "ranker-v3"
    assert attrs[names.ATTR_BATCH_SIZE] == 4 and attrs[names.ATTR_QUEUE_DEPTH] == 2
    assert attrs[names.GENAI_USAGE_INPUT_TOKENS] == 12 and attrs[names.GENAI_USAGE_OUTPUT_TOKENS] == 3
    assert attrs[names.ATTR_COLD_START] is False
    assert len(attrs[names.ATTR_INPUT_HASH]) == 16
    assert all("secret" not in str(v) for v in attrs.values())  # the input is hashed, never recorded
    children = [s for s in spans if s is not server]
    assert [s.name for s in children] == ["feature_fetch", "compute", "postprocess"]
    assert server.start_time is not None and server.end_time is not None
    for child in children:
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert child.context is not None and child.context.trace_id == server.context.trace_id
        assert child.kind == SpanKind.INTERNAL
        assert dict(child.attributes or {}) == {
            names.ATTR_STAGE: child.name, names.ATTR_STAGE_KIND: names.STAGE_KINDS[child.name]
        }
        assert child.start_time is not None and child.end_time is not None
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time
    compute = children[1]
    assert compute.end_time is not None and compute.start_time is not None
    assert compute.end_time - compute.start_time >= 3_000_000  # slept 3 ms inside the stage


def test_invalid_traceparent_starts_a_new_trace() -> None:
    assert parse_traceparent(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()) == (
        int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), True,
    )  # fmt: skip
    for bad in (b"00-" + b"0" * 32 + b"-" + CALLER_SPAN.encode() + b"-01", b"garbage", b"ff" + b"-" * 53):
        assert parse_traceparent(bad) is None
    app, handle, exporter = instrumented()
    asyncio.run(call(app, "GET", "/sleep/1", headers={"traceparent": "00-zz-yy-01"}))
    (server,) = server_spans(spans_of(handle, exporter))
    assert server.parent is None and server.context is not None and server.context.trace_id != 0


def test_streamed_response_span_covers_the_whole_stream() -> None:
    app, handle, exporter = instrumented()
    r = asyncio.run(call(app, "GET", "/stream"))
    assert r.text == "tok " * 4
    (server,) = server_spans(spans_of(handle, exporter))
    assert server.end_time is not None and server.start_time is not None
    duration_s = (server.end_time - server.start_time) / 1e9
    assert duration_s >= 0.2  # 4 tokens, 50 ms apart: the span ends with the last chunk
    attrs = dict(server.attributes or {})
    ttft = attrs[names.VLLM_ATTR_TTFT]
    assert 0.045 <= ttft < duration_s  # TTFT recorded on its own, not read off the span
    assert attrs[names.VLLM_ATTR_E2E] == pytest.approx(duration_s, abs=0.002)
    gaps = list(attrs[names.ATTR_TOKEN_GAPS])
    assert len(gaps) == 3 and all(g >= 0.045 for g in gaps)
    assert attrs[names.ATTR_ITL_MAX] == max(gaps)
    assert attrs[names.ATTR_ITL_MEAN] == pytest.approx(sum(gaps) / 3)


def test_error_keeps_its_trace_with_error_status() -> None:
    app, handle, exporter = instrumented(baseline_sample=0.0)
    r = asyncio.run(call(app, "GET", "/boom"))
    assert r.status_code == 500
    spans = spans_of(handle, exporter)
    (server,) = server_spans(spans)
    assert server.status.status_code == StatusCode.ERROR
    attrs = dict(server.attributes or {})
    assert attrs[names.ATTR_ERROR_TYPE] == "RuntimeError"
    assert attrs[names.ATTR_SAMPLED_REASON] == "error"
    assert [s.name for s in spans if s is not server] == ["preprocess"]


def test_tail_sampling_keeps_slow_requests_and_a_baseline_share() -> None:
    app, handle, exporter = instrumented(baseline_sample=0.0, slow_threshold_ms=150)

    async def run() -> None:
        await call(app, "GET", "/sleep/1")  # warm-up (first-call imports can be slow)
        handle.force_flush(10)
        exporter.clear()
        for _ in range(20):
            await call(app, "GET", "/sleep/1")
        await call(app, "GET", "/sleep/200")

    asyncio.run(run())
    kept = server_spans(spans_of(handle, exporter))
    # the 200 ms request is kept as slow; a 1 ms one only when a loaded machine stalled it past the
    # threshold (by its own recorded duration), never otherwise
    assert {dict(s.attributes or {})[names.ATTR_SAMPLED_REASON] for s in kept} == {"slow"}
    assert "/sleep/200" in {dict(s.attributes or {})["http.target"] for s in kept}
    lasted_ms = [((s.end_time or 0) - (s.start_time or 0)) / 1e6 for s in kept]
    assert min(lasted_ms) >= 150, lasted_ms
    # every request is still in the metrics
    assert (
        handle.metrics.registry.get_sample_value(
            names.METRIC_REQUEST_DURATION + "_count",
            {"route": "/sleep/{ms}", "model": "", "status_class": "2xx"},
        )
        == 22
    )


def test_sampling_policy_honours_otel_env() -> None:
    # OpenTelemetry's consistent rule keeps a trace when its randomness (low 56 bits) >= the threshold
    low = int("0" * 16 + "00ffffffffffffff", 16)  # randomness at its largest: inside any ratio > 0
    high = int("0" * 16 + "ff000000000000ff", 16)  # randomness tiny: outside any ratio < 1
    on = SamplingPolicy.resolve(env={"OTEL_TRACES_SAMPLER": "always_on"})
    assert on.keeps_everything and on.decide(high, None, 0, False) == "baseline"
    off = SamplingPolicy.resolve(env={"OTEL_TRACES_SAMPLER": "always_off"})
    assert off.decide(low, True, 10**12, True) is None
    ratio = SamplingPolicy.resolve(
        env={
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
            names.ENV_SLOW_THRESHOLD_MS: "100",
        }
    )
    assert ratio.decide(low, None, 0, False) == "baseline"
    assert ratio.decide(high, None, 0, False) is None
    assert ratio.decide(high, None, 100_000_000, False) == "slow"
    assert ratio.decide(high, None, 0, True) == "error"
    pb = SamplingPolicy.resolve(env={"OTEL_TRACES_SAMPLER": "parentbased_always_off"})
    assert pb.decide(high, True, 0, False) == "baseline" and pb.decide(high, None, 0, False) is None
    assert (
        SamplingPolicy.resolve(baseline_sample=0.25, env={"OTEL_TRACES_SAMPLER": "always_on"}).ratio == 0.25
    )
    assert SamplingPolicy.resolve(env={names.ENV_BASELINE_SAMPLE: "0.1"}).ratio == 0.1
    with pytest.raises(ValueError, match=names.ENV_SLOW_THRESHOLD_MS):
        SamplingPolicy.resolve(env={names.ENV_SLOW_THRESHOLD_MS: "fast"})
    with pytest.raises(ValueError, match="baseline_sample"):
        SamplingPolicy.resolve(baseline_sample=2.0)


def test_always_on_env_keeps_every_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    app, handle, exporter = instrumented(baseline_sample=None)

    async def run() -> None:
        for _ in range(50):
            await call(app, "GET", "/sleep/0")

    asyncio.run(run())
    assert len(server_spans(spans_of(handle, exporter))) == 50


HTTP_KEYS_IGNORED = {names.ATTR_SAMPLED_REASON, names.ATTR_COLD_START, names.ATTR_MODEL}


def _http_view(span: ReadableSpan) -> tuple[str, SpanKind, dict[str, Any]]:
    attrs = {k: v for k, v in (span.attributes or {}).items() if not k.startswith(("stagescope.", "gen_ai."))}
    return span.name, span.kind, attrs


@pytest.mark.parametrize("semconv", ["", "http/dup"])
def test_fast_and_otel_fastapi_modes_make_the_same_server_span(
    semconv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if semconv:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", semconv)
        from opentelemetry.instrumentation import _semconv

        monkeypatch.setattr(_semconv._OpenTelemetrySemanticConventionStability, "_initialized", False)
    views: dict[str, list[tuple[str, SpanKind, dict[str, Any]]]] = {}
    for mode in ("fast", "otel-fastapi"):
        app, handle, exporter = instrumented(mode=mode)

        async def run(app: FastAPI = app) -> None:
            headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "user-agent": "tests/1.0"}
            await call(app, "POST", "/v1/predict/3?q=x%20y", content=b"{}", headers=headers)
            await call(app, "GET", "/no/such/route", headers={"user-agent": "tests/1.0"})
            await call(app, "GET", "/boom")

        asyncio.run(run())
        spans = spans_of(handle, exporter)
        servers = sorted(server_spans(spans), key=lambda s: s.start_time or 0)
        views[mode] = [_http_view(s) for s in servers]
        # stage spans hang under that mode's server span in both modes
        first = servers[0]
        assert first.context is not None
        stage_spans = [s for s in spans if s.parent is not None and s.parent.span_id == first.context.span_id]
        assert [s.name for s in stage_spans] == ["feature_fetch", "compute", "postprocess"]
        assert format(first.context.trace_id, "032x") == CALLER_TRACE
        assert dict(first.attributes or {})[names.ATTR_MODEL] == "ranker-v3"
        uninstrument_app(app)
    fast, stock = views["fast"], views["otel-fastapi"]
    assert [v[:2] for v in fast] == [v[:2] for v in stock]
    assert fast[0][0] == "POST /v1/predict/{item}" and fast[1][0] == "GET"
    for (_, _, a), (_, _, b) in zip(fast, stock, strict=True):
        assert a == b


def test_instrument_is_idempotent_and_uninstrument_restores_the_app() -> None:
    app, handle, exporter = instrumented()
    assert stagescope.instrument_app(app, service_name="again") is handle
    routes_before = len(app.router.routes)
    assert asyncio.run(call(app, "GET", "/metrics")).status_code == 200
    uninstrument_app(app)
    uninstrument_app(app)  # a no-op the second time
    assert len(app.router.routes) == routes_before - 1
    assert not any("Stagescope" in m.cls.__name__ for m in app.user_middleware)  # type: ignore[attr-defined]
    assert asyncio.run(call(app, "GET", "/metrics")).status_code == 404
    exporter.clear()
    assert asyncio.run(call(app, "GET", "/sleep/0")).status_code == 200
    assert exporter.get_finished_spans() == ()
    # and it can be instrumented again
    provider, exporter2 = memory_provider()
    handle2 = stagescope.instrument_app(
        app, service_name="x", registry=CollectorRegistry(), tracer_provider=provider, baseline_sample=1.0
    )
    asyncio.run(call(app, "GET", "/sleep/0"))
    assert len(server_spans(spans_of(handle2, exporter2))) == 1


def test_telemetry_failures_never_fail_a_request() -> None:
    def bad_hook(record: Any) -> None:
        raise ValueError("user hook bug")

    app, handle, exporter = instrumented(record_hook=bad_hook)

    class BrokenMetrics:
        def __getattr__(self, name: str) -> Any:
            def fail(*args: Any, **kwargs: Any) -> None:
                raise RuntimeError("metrics backend broken")

            return fail

    handle.state.metrics = BrokenMetrics()
    for _ in range(3):
        r = asyncio.run(call(app, "POST", "/v1/predict/1", content=b"x"))
        assert r.status_code == 200 and r.json() == {"item": 1}
    assert len(server_spans(spans_of(handle, exporter))) == 3


def test_429_is_counted_as_shed_and_routes_stay_bounded() -> None:
    app = FastAPI()

    @app.get("/busy/{x}")
    async def busy(x: str) -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": "full"}, status_code=429, headers={"Retry-After": "1"})

    registry = CollectorRegistry()
    stagescope.instrument_app(app, service_name="s", registry=registry, baseline_sample=0.0)

    async def run() -> None:
        for i in range(5):
            await call(app, "GET", f"/busy/{i}")
            await call(app, "GET", f"/random/{i}")

    asyncio.run(run())
    shed = registry.get_sample_value(names.METRIC_REQUESTS_SHED, {"route": "/busy/{x}", "model": ""})
    assert shed == 5
    unmatched = registry.get_sample_value(
        names.METRIC_REQUEST_DURATION + "_count",
        {"route": names.UNMATCHED_ROUTE, "model": "", "status_class": "4xx"},
    )
    assert unmatched == 5


def test_no_cross_talk_between_records() -> None:
    """Each request's stages land in its own record even when the event loop interleaves them."""
    app, handle, exporter = instrumented()

    async def run() -> None:
        await asyncio.gather(*(call(app, "GET", f"/sleep/{i % 5}") for i in range(40)))

    asyncio.run(run())
    spans = spans_of(handle, exporter)
    servers = server_spans(spans)
    assert len(servers) == 40
    by_parent: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        if s.parent is not None and s.kind == SpanKind.INTERNAL:
            by_parent.setdefault(s.parent.span_id, []).append(s)
    for server in servers:
        assert server.context is not None
        (child,) = by_parent[server.context.span_id]
        assert child.context is not None and child.context.trace_id == server.context.trace_id


def _iter_attrs(spans: list[ReadableSpan]) -> Iterator[dict[str, Any]]:
    for s in spans:
        yield dict(s.attributes or {})


def test_otel_fastapi_mode_user_hooks_cannot_fail_a_request() -> None:
    calls: list[str] = []

    def bad_server_hook(span: Any, scope: Any) -> None:
        calls.append("server")
        raise RuntimeError("hook bug")

    app, handle, exporter = instrumented(
        mode="otel-fastapi", otel_fastapi_options={"server_request_hook": bad_server_hook}
    )
    r = asyncio.run(call(app, "POST", "/v1/predict/5", content=b"{}"))
    assert r.status_code == 200 and r.json() == {"item": 5}
    assert calls == ["server"]
    spans = spans_of(handle, exporter)
    assert [s.name for s in server_spans(spans)] == ["POST /v1/predict/{item}"]
    assert {s.name for s in spans if s.kind == SpanKind.INTERNAL} == {
        "feature_fetch",
        "compute",
        "postprocess",
    }
    uninstrument_app(app)
