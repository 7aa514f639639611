"""stagescope's open-loop load generator: replays real arrival traces and does not hide the tail.

Each request is sent at its *intended* time whether or not earlier ones were answered, so a server
stall shows in the percentiles instead of pausing the client (coordinated omission). Latency is
reported from the intended send (corrected) and from the actual send (naive).

Library use (asyncio)::

    from stagescope.loadgen import build_schedule, run_load
    schedule = build_schedule(trace="external/llm_traces/azure2023/AzureLLMInferenceTrace_conv.csv",
                              rate=20.0, duration_s=30.0)
    run = await run_load("http://127.0.0.1:8000", schedule, out="results.parquet", spans_dir="spans")
    run.summary.latency_ms["p99"], run.table  # corrected p99 (ms), the pinned results table

Command line: ``stagescope load`` (see :mod:`stagescope.loadgen.cli`). The names are imported on first
use, so that ``stagescope --help`` works without the ``loadgen`` extra (numpy, pyarrow).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below are imported on first use: `stagescope load --help` needs no extra
    from stagescope.loadgen.api import LoadRun, build_schedule, check_url, default_route, load, run_load
    from stagescope.loadgen.closed import run_closed_loop
    from stagescope.loadgen.results import (
        RESULTS_SCHEMA,
        RequestResult,
        Summary,
        results_table,
        write_results,
    )
    from stagescope.loadgen.runner import ProgressSnapshot
    from stagescope.loadgen.schedule import Schedule, synthetic_schedule
    from stagescope.loadgen.traces import read_trace

_LAZY = {
    "LoadRun": "api", "build_schedule": "api", "check_url": "api", "default_route": "api", "load": "api",
    "run_load": "api", "run_closed_loop": "closed", "RESULTS_SCHEMA": "results", "RequestResult": "results",
    "Summary": "results", "results_table": "results", "write_results": "results",
    "ProgressSnapshot": "runner", "Schedule": "schedule", "synthetic_schedule": "schedule",
    "read_trace": "traces",
}  # fmt: skip
__all__ = [
    "RESULTS_SCHEMA",
    "LoadRun",
    "ProgressSnapshot",
    "RequestResult",
    "Schedule",
    "Summary",
    "build_schedule",
    "check_url",
    "default_route",
    "load",
    "read_trace",
    "results_table",
    "run_closed_loop",
    "run_load",
    "synthetic_schedule",
    "write_results",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stagescope.loadgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stagescope.loadgen.{module}"), name)
    globals()[name] = value
    return value
