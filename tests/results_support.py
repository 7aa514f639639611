"""A SYNTHETIC vLLM run whose long prompts repeat, as the load generator would record it: the spans
(OTLP/JSON lines) and ``results.parquet`` with the prompts' input hashes, for the tests that read the
repeats from the load generator's results because vLLM's spans carry no input hash.

Not a test module (no ``test_`` prefix); imported by tests/test_levers_fleet.py and
tests/test_analysis_engines.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stagescope import names as N
from stagescope.analysis.synth import write_otlp_lines
from stagescope.analysis.synth_engines import vllm_spans

__all__ = ["LONG_PREFILL_S", "SHARED_PROMPT", "write_shared_prompt_run"]

#: A request whose prefill is longer than this (seconds) sends the shared prompt.
LONG_PREFILL_S = 0.5
#: The input hash every long request's results row carries (each other request's is its own).
SHARED_PROMPT = "shared-doc"


def write_shared_prompt_run(tl: Any, out: Path) -> tuple[Path, Path]:
    """Write the vLLM spans of timelines ``tl`` (analysis.synth_engines) to ``out/spans.jsonl`` and the
    load generator's results to ``out/results.parquet``: one row per request (its trace id, intended
    start, status 200, latency in ms), the requests with a prefill over :data:`LONG_PREFILL_S` all
    sending :data:`SHARED_PROMPT`. Returns (spans path, results path)."""
    spans = list(vllm_spans(tl))
    roots = [s for s in spans if s.name == N.VLLM_SPAN_NAME]
    long = {s.trace_id for s in roots if float(s.attributes[N.VLLM_ATTR_PREFILL]) > LONG_PREFILL_S}
    res = pa.table({
        "request_id": pa.array(range(len(roots)), pa.int64()), "trace_id": [s.trace_id for s in roots],
        "intended_unix_ns": [s.start_ns for s in roots], "status": pa.array([200] * len(roots), pa.int64()),
        "latency_ms": [(s.end_ns - s.start_ns) / 1e6 for s in roots],
        "input_hash": [SHARED_PROMPT if s.trace_id in long else f"p{i}" for i, s in enumerate(roots)],
    })  # fmt: skip
    results = out / "results.parquet"
    pq.write_table(res, results)
    traces = out / "spans.jsonl"
    write_otlp_lines(traces, spans)
    return traces, results
