"""instrument_stream: TTFT and every inter-token gap against a generator with known delays."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from stagescope import names
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.record import RequestRecord, reset_current_request, set_current_request
from stagescope.instrumentation.streaming import instrument_stream

DELAYS_MS = [45, 20, 35, 20, 60, 25, 30]
TOLERANCE_S = 0.002


async def _tokens(emitted: list[int], delays_ms: list[int] = DELAYS_MS) -> AsyncIterator[str]:
    """Sleeps, then timestamps each token right before handing it out (its own clock)."""
    for i, d in enumerate(delays_ms):
        await asyncio.sleep(d / 1000)
        emitted.append(time.perf_counter_ns())
        yield f"tok{i} "


def test_ttft_and_every_gap_match_the_generators_own_timestamps() -> None:
    reg = CollectorRegistry()
    metrics = StageMetrics(reg, models=["llm"])
    emitted: list[int] = []

    async def main() -> tuple[RequestRecord, str]:
        rec = RequestRecord(route="/v1/generate", model="llm")
        token = set_current_request(rec)
        try:
            stream = instrument_stream(_tokens(emitted))
        finally:
            reset_current_request(token)
        text = "".join([chunk async for chunk in stream])
        rec.end_ns = time.perf_counter_ns()
        rec.status_code = 200
        return rec, text

    rec, text = asyncio.run(main())
    assert text == "".join(f"tok{i} " for i in range(len(DELAYS_MS)))
    assert len(rec.token_ns) == len(emitted) == len(DELAYS_MS)
    assert rec.output_tokens == len(DELAYS_MS)
    ttft_true = (emitted[0] - rec.start_ns) / 1e9
    assert rec.ttft_s == pytest.approx(ttft_true, abs=TOLERANCE_S)
    true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(emitted)]
    assert rec.token_gaps_s() == pytest.approx(true_gaps, abs=TOLERANCE_S)
    # and the histograms get exactly those values: TTFT once, one sample per gap
    metrics.request_started()
    metrics.request_finished(rec, None)
    lbl = {"model": "llm"}
    assert reg.get_sample_value(f"{names.METRIC_GENAI_TTFT}_count", lbl) == 1
    assert reg.get_sample_value(f"{names.METRIC_GENAI_TTFT}_sum", lbl) == pytest.approx(
        ttft_true, abs=TOLERANCE_S
    )
    assert reg.get_sample_value(f"{names.METRIC_INTER_TOKEN}_count", lbl) == len(true_gaps)
    assert reg.get_sample_value(f"{names.METRIC_INTER_TOKEN}_sum", lbl) == pytest.approx(
        sum(true_gaps), abs=TOLERANCE_S
    )
    tpot = (emitted[-1] - emitted[0]) / 1e9 / (len(emitted) - 1)
    assert reg.get_sample_value(f"{names.METRIC_GENAI_TPOT}_sum", lbl) == pytest.approx(tpot, abs=TOLERANCE_S)
    # the 60 ms gap lands above the 0.05 bucket, the 20 ms ones at or below 0.025
    le = f"{names.METRIC_INTER_TOKEN}_bucket"
    assert reg.get_sample_value(le, {**lbl, "le": "0.05"}) == sum(g <= 0.05 for g in true_gaps)


def test_multi_token_chunks_keep_alives_and_explicit_record() -> None:
    chunks: list[dict[str, object] | str] = [
        {"tokens": ["a", "b", "c"]},
        "",
        {"tokens": ["d"]},
        {"tokens": ["e", "f"]},
    ]

    async def gen() -> AsyncIterator[dict[str, object] | str]:
        for c in chunks:
            await asyncio.sleep(0.005)
            yield c

    def count(chunk: dict[str, object] | str) -> int:
        return len(chunk["tokens"]) if isinstance(chunk, dict) else 0  # type: ignore[arg-type]

    rec = RequestRecord()

    async def main() -> list[dict[str, object] | str]:
        return [c async for c in instrument_stream(gen(), record=rec, tokens_per_chunk=count)]

    assert asyncio.run(main()) == chunks  # chunks pass through unchanged
    assert len(rec.token_ns) == 3  # one hand-off per non-empty chunk, no invented gaps inside a chunk
    assert rec.output_tokens == 6


def test_record_captured_at_call_even_if_iterated_in_another_context() -> None:
    rec = RequestRecord()
    emitted: list[int] = []

    async def main() -> None:
        token = set_current_request(rec)
        try:
            stream = instrument_stream(_tokens(emitted, [5, 5, 5]))
        finally:
            reset_current_request(token)

        async def consume() -> None:
            async for _ in stream:
                pass

        await asyncio.create_task(consume(), context=contextvars.Context())

    asyncio.run(main())
    assert len(rec.token_ns) == 3 and rec.output_tokens == 3


def test_outside_a_request_chunks_pass_through_and_early_close_closes_the_source() -> None:
    closed: list[bool] = []

    async def gen() -> AsyncIterator[str]:
        try:
            for i in range(100):
                await asyncio.sleep(0)
                yield str(i)
        finally:
            closed.append(True)

    async def main(record: RequestRecord | None) -> list[str]:
        out = []
        stream = instrument_stream(gen(), record=record)
        async for c in stream:
            out.append(c)
            if len(out) == 3:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return out

    assert asyncio.run(main(None)) == ["0", "1", "2"]
    rec = RequestRecord()
    assert asyncio.run(main(rec)) == ["0", "1", "2"]
    assert closed == [True, True]
    assert len(rec.token_ns) == 3 and rec.output_tokens == 3


def test_through_an_instrumented_fastapi_app(clean_telemetry_env: None) -> None:
    """The same accuracy end to end: real FastAPI StreamingResponse under instrument_app's middleware."""
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    import stagescope

    emitted: list[int] = []
    records: list[RequestRecord] = []
    app = FastAPI()

    @app.get("/v1/generate")
    async def generate() -> StreamingResponse:
        rec = stagescope.current_request()
        assert rec is not None
        rec.model = "llm"
        return StreamingResponse(instrument_stream(_tokens(emitted)), media_type="text/plain")

    reg = CollectorRegistry()
    stagescope.instrument_app(app, service_name="t", models=["llm"], registry=reg, record_hook=records.append)

    async def main() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return (await c.get("/v1/generate")).text

    assert asyncio.run(main()).startswith("tok0 tok1 ")
    (rec,) = records
    assert rec.ttft_s == pytest.approx((emitted[0] - rec.start_ns) / 1e9, abs=TOLERANCE_S)
    true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(emitted)]
    assert rec.token_gaps_s() == pytest.approx(true_gaps, abs=TOLERANCE_S)
    assert rec.end_ns is not None and rec.end_ns >= rec.token_ns[-1]  # the request covers the whole stream
    assert reg.get_sample_value(f"{names.METRIC_INTER_TOKEN}_count", {"model": "llm"}) == len(true_gaps)


def test_a_sync_generator_from_a_sync_handler(clean_telemetry_env: None) -> None:
    """A ``def`` handler streaming a sync generator (an engine's own, ``llama-cpp-python``'s, a
    ``TextIteratorStreamer``): Starlette iterates it in its threadpool, and ``instrument_stream`` wraps it
    as a sync iterator with the same accuracy. Before, it took only async iterables: the stream failed
    after its headers (``TypeError: 'generator' object is not an async iterable``), the telemetry
    breaking the request."""
    from collections.abc import Iterator

    import httpx
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    import stagescope

    emitted: list[int] = []
    records: list[RequestRecord] = []
    app = FastAPI()

    def tokens() -> Iterator[str]:
        for i, d in enumerate(DELAYS_MS):
            time.sleep(d / 1000)
            emitted.append(time.perf_counter_ns())
            yield f"tok{i} "

    @app.get("/v1/generate")
    def generate() -> StreamingResponse:  # sync: runs in the threadpool, as does the iteration
        return StreamingResponse(instrument_stream(tokens()), media_type="text/plain")

    stagescope.instrument_app(app, service_name="t", registry=CollectorRegistry(), record_hook=records.append)

    async def main() -> tuple[int, str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.get("/v1/generate")
            return r.status_code, r.text

    status, text = asyncio.run(main())
    assert status == 200 and text == "".join(f"tok{i} " for i in range(len(DELAYS_MS)))
    (rec,) = records
    assert rec.error_type is None and rec.output_tokens == len(DELAYS_MS)
    assert rec.ttft_s == pytest.approx((emitted[0] - rec.start_ns) / 1e9, abs=TOLERANCE_S)
    true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(emitted)]
    assert rec.token_gaps_s() == pytest.approx(true_gaps, abs=TOLERANCE_S)
    # outside a request a sync iterable passes through as it is
    assert list(instrument_stream(iter(["a", "b"]))) == ["a", "b"]
