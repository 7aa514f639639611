"""End to end: a service instrumented by stagescope writes its embedded sink; ingest reads it back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.analysis.ingest import load_dataset
from stagescope.instrumentation.app import uninstrument_app


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", names.ENV_SLOW_THRESHOLD_MS,
                names.ENV_BASELINE_SAMPLE, names.ENV_SPANS_DIR, "OTEL_EXPORTER_OTLP_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/predict")
    async def predict() -> dict[str, str]:
        rec = stagescope.current_request()
        assert rec is not None
        rec.model = "ranker"
        rec.set_input(b"same input")
        rec.batch_size, rec.queue_depth = 4, 2
        with stagescope.stage(names.STAGE_FEATURE_FETCH):
            await asyncio.sleep(0.004)
        with stagescope.stage(names.STAGE_COMPUTE):
            await asyncio.sleep(0.006)
        return {"ok": "yes"}

    @app.get("/v1/generate")
    async def generate() -> StreamingResponse:
        async def tokens() -> AsyncIterator[str]:
            for _ in range(4):
                await asyncio.sleep(0.02)
                yield "tok "

        return StreamingResponse(stagescope.instrument_stream(tokens()), media_type="text/plain")

    return app


def test_sink_written_by_instrumented_service_loads(tmp_path: Path) -> None:
    app = _app()
    handle = stagescope.instrument_app(
        app, service_name="e2e-svc", models=["ranker"], spans_dir=str(tmp_path), baseline_sample=1.0,
        registry=CollectorRegistry(),
    )  # fmt: skip

    async def drive() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for _ in range(3):
                assert (await client.post("/v1/predict")).status_code == 200
            assert (await client.get("/v1/generate")).status_code == 200

    try:
        asyncio.run(drive())
        assert handle.force_flush(10)
    finally:
        uninstrument_app(app)
    files = sorted(tmp_path.glob("spans-*.jsonl"))
    assert files, "the sink wrote nothing"
    ds = load_dataset(traces=[tmp_path])
    assert {f.kind for f in ds.files} == {"sink"}
    rows = ds.con.execute(
        "SELECT route, model, status_code, batch_size, queue_depth, input_hash IS NOT NULL, service, source, "
        "duration_ms FROM requests ORDER BY route, start_unix_ns"
    ).fetchall()
    assert [r[:8] for r in rows] == [
        ("/v1/generate", None, 200, None, None, False, "e2e-svc", "stagescope"),
        *[("/v1/predict", "ranker", 200, 4, 2, True, "e2e-svc", "stagescope")] * 3,
    ]
    stages = ds.con.execute(
        "SELECT r.route, s.stage, count(*), min(s.duration_ms) FROM stages s JOIN requests r USING (trace_id) "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    by = {(route, stage): (n, dmin) for route, stage, n, dmin in stages}
    assert (
        by[("/v1/predict", names.STAGE_FEATURE_FETCH)][0] == 3
        and by[("/v1/predict", names.STAGE_FEATURE_FETCH)][1] >= 3.5
    )
    assert (
        by[("/v1/predict", names.STAGE_COMPUTE)][0] == 3
        and by[("/v1/predict", names.STAGE_COMPUTE)][1] >= 5.5
    )
    # the stream: TTFT and one inter-token gap per token after the first, from stagescope.itl.gaps
    ttft, itl_mean = ds.con.execute(
        "SELECT ttft_ms, itl_mean_ms FROM requests WHERE route = '/v1/generate'"
    ).fetchall()[0]
    assert ttft is not None and ttft >= 15
    gaps = [g for (g,) in ds.con.execute("SELECT gap_ms FROM token_gaps").fetchall()]
    assert len(gaps) in (3, 4) and all(g >= 15 for g in gaps[-3:])
    assert itl_mean == pytest.approx(sum(gaps) / len(gaps), rel=0.05)
    ds.close()
