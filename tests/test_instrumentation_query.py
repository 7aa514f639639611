"""Query strings on server spans: not recorded by default (a GET query can hold a prompt), recorded on
request (``record_query=True`` / ``STAGESCOPE_RECORD_QUERY``), in fast and otel-fastapi mode, old and new
HTTP semconv. Real FastAPI apps through httpx's ASGI transport, spans from the SDK's in-memory exporter
and from the embedded sink's files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.app import uninstrument_app

PROMPT = "my secret prompt"
QUERY = "q=my%20secret%20prompt&max_tokens=16"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", names.ENV_SLOW_THRESHOLD_MS,
                names.ENV_BASELINE_SAMPLE, names.ENV_SPANS_DIR, "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_SEMCONV_STABILITY_OPT_IN", names.ENV_RECORD_QUERY):  # fmt: skip
        monkeypatch.delenv(key, raising=False)


def _semconv(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    if value:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", value)
    from opentelemetry.instrumentation import _semconv as sc  # the stock instrumentor reads it once

    monkeypatch.setattr(sc._OpenTelemetrySemanticConventionStability, "_initialized", False)


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/complete")
    async def complete(q: str = "", max_tokens: int = 0) -> dict[str, int]:
        with stagescope.stage("compute"):
            pass
        return {"chars": len(q), "max_tokens": max_tokens}

    return app


def run_once(mode: str, path: str, **kwargs: Any) -> tuple[httpx.Response, list[ReadableSpan]]:
    app = make_app()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handle = stagescope.instrument_app(
        app, service_name="q-svc", registry=CollectorRegistry(), tracer_provider=provider,
        baseline_sample=1.0, mode=mode, **kwargs,
    )  # fmt: skip

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.get(path)

    try:
        response = asyncio.run(go())
        assert handle.force_flush(10)
        return response, list(exporter.get_finished_spans())
    finally:
        uninstrument_app(app)


def server_attrs(spans: list[ReadableSpan]) -> dict[str, Any]:
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    return dict(server.attributes or {})


def values(spans: list[ReadableSpan]) -> str:
    return json.dumps([[s.name, dict(s.attributes or {})] for s in spans], default=str)


@pytest.mark.parametrize("semconv", ["", "http", "http/dup"])
@pytest.mark.parametrize("mode", ["fast", "otel-fastapi"])
def test_query_is_not_recorded_by_default(mode: str, semconv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _semconv(monkeypatch, semconv)
    response, spans = run_once(mode, f"/v1/complete?{QUERY}")
    assert response.json() == {"chars": len(PROMPT), "max_tokens": 16}  # the app still sees its query
    text = values(spans)
    assert "secret" not in text and "max_tokens" not in text, text
    attrs = server_attrs(spans)
    assert attrs["http.route"] == "/v1/complete"
    if semconv in ("", "http/dup"):
        assert attrs["http.url"] == f"http://testserver/v1/complete?{names.QUERY_REDACTED}"
        assert attrs["http.target"] == "/v1/complete"
    if semconv in ("http", "http/dup"):
        assert attrs["url.query"] == names.QUERY_REDACTED
        assert attrs["url.path"] == "/v1/complete"


@pytest.mark.parametrize("mode", ["fast", "otel-fastapi"])
def test_a_request_without_a_query_gets_no_marker(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _semconv(monkeypatch, "http/dup")
    _, spans = run_once(mode, "/v1/complete")
    attrs = server_attrs(spans)
    assert attrs["http.url"] == "http://testserver/v1/complete" and "url.query" not in attrs


@pytest.mark.parametrize("how", ["argument", "environment"])
@pytest.mark.parametrize("mode", ["fast", "otel-fastapi"])
def test_query_is_recorded_on_request(mode: str, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _semconv(monkeypatch, "http/dup")
    kwargs: dict[str, Any] = {}
    if how == "argument":
        monkeypatch.setenv(names.ENV_RECORD_QUERY, "0")  # the argument wins over the environment
        kwargs["record_query"] = True
    else:
        monkeypatch.setenv(names.ENV_RECORD_QUERY, "true")
    _, spans = run_once(mode, f"/v1/complete?{QUERY}", **kwargs)
    attrs = server_attrs(spans)
    assert attrs["url.query"] == QUERY
    assert attrs["http.url"] == f"http://testserver/v1/complete?q={PROMPT}&max_tokens=16"  # as the stock one


def test_user_server_hook_still_runs_and_sees_the_redacted_span(monkeypatch: pytest.MonkeyPatch) -> None:
    _semconv(monkeypatch, "")
    seen: list[str] = []

    def hook(span: Any, scope: Any) -> None:
        seen.append(dict(span.attributes)["http.url"])
        span.set_attribute("team.tag", "x")

    _, spans = run_once("otel-fastapi", f"/v1/complete?{QUERY}", otel_fastapi_options={"server_request_hook": hook})
    assert seen == [f"http://testserver/v1/complete?{names.QUERY_REDACTED}"]
    assert server_attrs(spans)["team.tag"] == "x"


def test_the_span_sink_writes_no_query(tmp_path: Path) -> None:
    app = make_app()
    handle = stagescope.instrument_app(
        app, service_name="q-svc", registry=CollectorRegistry(), spans_dir=tmp_path, baseline_sample=1.0
    )

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            assert (await client.get(f"/v1/complete?{QUERY}")).status_code == 200

    try:
        asyncio.run(go())
        assert handle.force_flush(10)
        handle.drain()
    finally:
        uninstrument_app(app)
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "/v1/complete" in written and names.QUERY_REDACTED in written
    assert "secret" not in written


@pytest.mark.parametrize("bad", ["maybe", "2"])
def test_a_bad_record_query_setting_is_refused_when_instrumenting(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable's reader refuses it (stagescope serve: one line, exit 2); in a user's service it is
    one warning and the private default, not a service that does not start (session 11)."""
    from stagescope.instrumentation.tracing import resolve_record_query

    monkeypatch.setenv(names.ENV_RECORD_QUERY, bad)
    with pytest.raises(ValueError, match=names.ENV_RECORD_QUERY):
        resolve_record_query()
    app = make_app()
    inst = stagescope.instrument_app(app, service_name="q-svc", registry=CollectorRegistry())
    try:
        assert inst.state.builder.record_query is False
    finally:
        uninstrument_app(app)
    with pytest.raises(ValueError, match="record_query"):
        stagescope.instrument_app(make_app(), service_name="q-svc", registry=CollectorRegistry(), record_query=1)  # type: ignore[arg-type]
