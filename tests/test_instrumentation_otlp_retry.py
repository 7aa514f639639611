"""The OTLP/HTTP exporter retries what the OTLP specification says to retry, and nothing else.

A real OTLP/HTTP receiver on 127.0.0.1 (tests/apps/otlp_receiver.py) answers the first requests with
an error (and a ``Retry-After`` header) and then accepts; its arrival times show when the exporter came
back. Specification (opentelemetry-proto ``docs/specification.md``, OTLP/HTTP Response): 429, 502,
503 and 504 are retryable, every other 4xx/5xx is not; ``Retry-After`` is honoured, else exponential
backoff; a partial success is not retried.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from prometheus_client import CollectorRegistry

from stagescope import names
from stagescope.instrumentation.export import BATCH_SPANS, BackgroundSpanExporter
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.otlp_http import OtlpHttpClient, OtlpHttpConfig, parse_retry_after

sys.path.insert(0, str(Path(__file__).parent / "apps"))
import itertools

from otlp_receiver import OtlpReceiver

_RES = Resource.create({"service.name": "retry-test"})


def _spans(n: int, start: int = 1) -> list[ReadableSpan]:
    return [
        ReadableSpan(
            name="GET /x",
            context=SpanContext(start + i, start + i, is_remote=False, trace_flags=TraceFlags(1)),
            resource=_RES,
            kind=SpanKind.SERVER,
            start_time=1_000_000_000,
            end_time=1_002_000_000,
        )
        for i in range(n)
    ]


@pytest.fixture
def receiver() -> object:
    r = OtlpReceiver()
    yield r
    r.close()


def _exporter(receiver: OtlpReceiver, **kw: object) -> tuple[BackgroundSpanExporter, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = StageMetrics(registry=registry)
    client = OtlpHttpClient(OtlpHttpConfig(url=receiver.endpoint + "/v1/traces", timeout_s=1.0))
    return BackgroundSpanExporter(client, label="otlp_http", metrics=metrics, interval_s=0.05, **kw), registry  # type: ignore[arg-type]


def _dropped(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value(names.METRIC_SPANS_DROPPED, {"exporter": "otlp_http", "reason": reason})
        or 0
    )


def _wait(pred: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_seconds_is_honoured(receiver: OtlpReceiver, code: int) -> None:
    receiver.set_mode(f"fail:{code}:2:1")
    exporter, registry = _exporter(receiver)
    try:
        exporter.export(_spans(10))
        assert exporter.force_flush(20_000)
        assert receiver.spans_received == 10
        arrivals = receiver.arrivals
        assert len(arrivals) == 3
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert all(g >= 0.95 for g in gaps), gaps  # waited the 1 s the collector asked for, each time
        assert _dropped(registry, "export_failed") == 0
    finally:
        exporter.shutdown()


def test_retry_after_http_date(receiver: OtlpReceiver) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)
    assert 1.5 < (parse_retry_after(when) or 0) <= 3.0
    assert parse_retry_after("3") == 3.0 and parse_retry_after("-1") == 0.0
    assert (
        parse_retry_after("inf") is None
        and parse_retry_after("soon") is None
        and parse_retry_after(None) is None
    )
    receiver.set_mode(f"fail:503:1:{when}")
    exporter, _ = _exporter(receiver)
    try:
        exporter.export(_spans(3))
        assert exporter.force_flush(20_000) and receiver.spans_received == 3
        a = receiver.arrivals
        assert len(a) == 2 and a[1] - a[0] >= 1.0, a  # waited until (about) the date, whole seconds
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("code", [502, 504, 429])
def test_backoff_without_retry_after(receiver: OtlpReceiver, code: int) -> None:
    receiver.set_mode(f"fail:{code}:3")
    exporter, registry = _exporter(receiver, initial_backoff_s=0.2)
    try:
        exporter.export(_spans(5))
        assert exporter.force_flush(20_000)
        assert receiver.spans_received == 5
        a = receiver.arrivals
        gaps = [y - x for x, y in itertools.pairwise(a)]
        assert len(a) == 4 and gaps[0] >= 0.15 and gaps[1] >= 0.3 and gaps[2] >= 0.6, (
            gaps
        )  # 0.2, 0.4, 0.8 s +-20%
        assert exporter.counter.exported == 5 and _dropped(registry, "export_failed") == 0
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("code", [400, 401, 404, 413, 500, 501])
def test_other_errors_are_not_retried(receiver: OtlpReceiver, code: int) -> None:
    receiver.set_mode(f"fail:{code}:1")
    exporter, registry = _exporter(receiver)
    try:
        exporter.export(_spans(7))
        assert exporter.force_flush(10_000)
        assert len(receiver.arrivals) == 1 and receiver.spans_received == 0
        assert _dropped(registry, names.DROP_REJECTED) == 7
        exporter.export(_spans(3, start=100))  # the next batch goes through
        assert exporter.force_flush(10_000) and receiver.spans_received == 3
    finally:
        exporter.shutdown()


def test_retries_are_bounded_then_counted(receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.set_mode("fail:503:1000")
    exporter, registry = _exporter(receiver, initial_backoff_s=0.05, max_backoff_s=0.1, max_attempts=4)
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(3):
                exporter.export(_spans(BATCH_SPANS, start=1000 * (i + 1)))
            assert exporter.force_flush(20_000)
        assert len(receiver.arrivals) == 3 * 4  # three batches, four attempts each
        assert _dropped(registry, names.DROP_EXPORT_FAILED) == 3 * BATCH_SPANS
        assert receiver.spans_received == 0
        lines = [r for r in caplog.records if "stagescope" in r.getMessage()]
        assert 1 <= len(lines) <= 2 and not any(r.exc_info for r in lines)  # one line a minute, no traceback
    finally:
        exporter.shutdown()


def test_partial_success_is_not_retried(receiver: OtlpReceiver) -> None:
    receiver.set_mode("reject:4")
    exporter, registry = _exporter(receiver)
    try:
        exporter.export(_spans(10))
        assert exporter.force_flush(10_000)
        assert len(receiver.arrivals) == 1
        assert exporter.counter.exported == 6 and _dropped(registry, names.DROP_REJECTED) == 4
    finally:
        exporter.shutdown()


def test_a_timed_out_batch_is_retried(receiver: OtlpReceiver) -> None:
    receiver.set_mode("hang")
    exporter, _ = _exporter(receiver, initial_backoff_s=0.1)
    try:
        exporter.export(_spans(4))
        _wait(lambda: len(receiver.arrivals) >= 1)
        time.sleep(1.2)  # the 1 s timeout passes: the attempt failed
        receiver.set_mode("ok")
        assert exporter.force_flush(20_000)
        assert receiver.spans_received >= 4  # resent (a collector that got it while hanging may see it twice)
        assert exporter.counter.exported == 4
    finally:
        exporter.shutdown()


def test_drain_gives_up_at_its_deadline(receiver: OtlpReceiver) -> None:
    receiver.set_mode("hang")
    exporter, registry = _exporter(receiver)
    try:
        exporter.export(_spans(5))
        exporter.export(_spans(5, start=50))
        _wait(lambda: len(receiver.arrivals) >= 1)
        t0 = time.monotonic()
        dropped = exporter.drain(time.monotonic() + 0.5)
        took = time.monotonic() - t0
        assert dropped == 10 and _dropped(registry, names.DROP_SHUTDOWN) == 10
        assert took < 0.5 + 0.5, took  # the request in flight was aborted, not waited out
        receiver.set_mode("ok")
        exporter.export(_spans(2, start=500))  # still running after a drain
        assert exporter.force_flush(10_000) and receiver.spans_received == 2
    finally:
        exporter.shutdown()


def test_the_client_sets_tcp_nodelay(receiver: OtlpReceiver) -> None:
    client = OtlpHttpClient(OtlpHttpConfig(url=receiver.endpoint + "/v1/traces"))
    assert client.send(client.encode(_spans(1))).ok
    assert client._conn is not None and client._conn.sock is not None
    assert client._conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    client.close()


def test_config_from_the_standard_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x-tenant=t1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    cfg = OtlpHttpConfig.from_env(timeout_s=2.0)
    assert cfg.url == "http://collector:4318/v1/traces" and cfg.timeout_s == 2.0 and cfg.compression == "gzip"
    assert cfg.headers == {"api-key": "a b", "x-tenant": "t1"}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9999/custom")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    cfg = OtlpHttpConfig.from_env(timeout_s=2.0)
    assert cfg.url == "http://other:9999/custom" and cfg.timeout_s == 7.0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "nan")
    assert OtlpHttpConfig.from_env(timeout_s=2.0).timeout_s == 2.0  # logged, default kept (as the SDK does)
