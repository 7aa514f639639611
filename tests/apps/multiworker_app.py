"""A small instrumented app for multi-worker tests: ``uvicorn --workers 2 --app-dir tests/apps multiworker_app:app``.

Configuration comes from the environment, as in production: ``STAGESCOPE_SPANS_DIR`` (embedded sink,
one file set per worker process), ``OTEL_TRACES_SAMPLER``, ``PROMETHEUS_MULTIPROC_DIR`` (metrics
aggregated across workers at ``/metrics``). ``GET /pid`` answers the serving worker's process id after
recording two stages.
"""

from __future__ import annotations

import os

from fastapi import FastAPI

import stagescope

app = FastAPI()
instrumentation = stagescope.instrument_app(app, service_name="multiworker", models=["m1"])


@app.get("/pid")
async def pid() -> dict[str, int]:
    rec = stagescope.current_request()
    if rec is not None:
        rec.model = "m1"
    with stagescope.stage("preprocess"):
        pass
    with stagescope.stage("compute"):
        pass
    return {"pid": os.getpid()}
