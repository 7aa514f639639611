"""A synthetic incident's data and its three output forms (the scenarios that produce one are in
:mod:`~stagescope.analysis.synth_scenarios`).

* :func:`write_otlp` -- OTLP/JSON lines, in **our** span format (SERVER span + one child span per
  stage with ``stagescope.stage``, the request attributes, optional load-generator CLIENT span) or in
  **vLLM's** (one ``llm_request`` span with ``gen_ai.latency.*`` attributes; LLM scenarios only);
* :func:`to_tables` -- the pinned analysis relations directly in a DuckDB connection (tests, benchmarks);
* :func:`write_metrics` -- Prometheus exposition text with millisecond timestamps.

All data here is synthetic and says so (service name ``synthetic-service``, GPU ``modelName``
``synthetic``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from stagescope import names as N
from stagescope.analysis.keys import key_sql, request_keys_sql
from stagescope.analysis.kinds import kind_sql

__all__ = [
    "GENERATE",
    "PREDICT",
    "SERVICE",
    "Scenario",
    "SynthData",
    "to_tables",
    "write_metrics",
    "write_otlp",
]

PREDICT = "/v1/predict"
GENERATE = "/v1/generate"
SERVICE = "synthetic-service"


@dataclass(frozen=True)
class Scenario:
    """Ground truth of one synthetic scenario (names and truths follow the reference service's table)."""

    name: str
    route: str
    slo: str
    stage: str | None
    lever: str | None


@dataclass
class SynthData:
    """One synthetic incident: per-request columns, stage intervals, token gaps, metric samples."""

    scenario: Scenario
    requests: dict[str, np.ndarray]
    stages: dict[str, np.ndarray]
    #: ``trace_id``, ``gap_ms`` in each stream's order; optional ``running``: each gap's running decode batch
    gaps: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: list[tuple[str, dict[str, str], float, int]] = field(default_factory=list)
    #: For a mix of routes (analysis.synth_routes.mix): each route's scenario (its ground truth).
    routes: dict[str, Scenario] = field(default_factory=dict)


def _present(v: Any) -> bool:
    """A value that is there for this request (not None / NaN: a column only some routes of a mix
    have, see analysis.synth_routes)."""
    return v is not None and not (isinstance(v, float) and np.isnan(v))


_REQ_COLS: dict[str, str] = {
    "trace_id": "VARCHAR", "span_id": "VARCHAR", "service": "VARCHAR", "name": "VARCHAR", "route": "VARCHAR",
    "model": "VARCHAR", "status_code": "INTEGER", "is_error": "BOOLEAN", "start_unix_ns": "BIGINT",
    "duration_ms": "DOUBLE", "ttft_ms": "DOUBLE", "itl_mean_ms": "DOUBLE", "itl_p99_ms": "DOUBLE",
    "itl_max_ms": "DOUBLE", "input_tokens": "BIGINT", "output_tokens": "BIGINT", "batch_size": "BIGINT",
    "queue_depth": "BIGINT", "input_hash": "VARCHAR", "cold_start": "BOOLEAN", "client_duration_ms": "DOUBLE",
    "source": "VARCHAR",
}  # fmt: skip


def to_tables(
    con: duckdb.DuckDBPyConnection, data: SynthData, *, source: str = "stagescope", keys: bool = True
) -> None:
    """Create the pinned relations (``requests``, ``stages``, ``token_gaps``, ``metric_samples``,
    ``client_results``) from ``data``, replacing existing ones; with ``keys`` the integer keys the
    ingest adds (analysis.keys) and the stage rows' kinds, without them the pinned columns only (as
    relations built by hand, or Parquet from before keys and kinds, hold them)."""
    r = dict(data.requests)
    n = len(r["trace_id"])
    r.setdefault("service", np.full(n, SERVICE))
    r.setdefault("name", np.array([f"POST {x}" for x in r["route"]]))
    r["is_error"] = np.asarray(r["status_code"]) >= 500
    r["source"] = np.full(n, source)
    sel = ", ".join(f"CAST({c if c in r else 'NULL'} AS {typ}) AS {c}" for c, typ in _REQ_COLS.items())
    con.register("req_tbl", pa.table({c: v for c, v in r.items()}))
    req_keys = f", {request_keys_sql()}" if keys else ""
    con.execute(f"CREATE OR REPLACE TABLE requests AS SELECT *{req_keys} FROM (SELECT {sel} FROM req_tbl)")
    con.register("st_tbl", pa.table(data.stages))
    con.execute(
        "CREATE OR REPLACE TABLE stages AS SELECT CAST(trace_id AS VARCHAR) trace_id, CAST(stage AS VARCHAR) stage, "
        "CAST(start_unix_ns AS BIGINT) start_unix_ns, CAST(end_unix_ns AS BIGINT) end_unix_ns, "
        "(end_unix_ns - start_unix_ns) / 1e6 AS duration_ms"
        # synthetic stage rows name their trace, not their request: matched to it by time
        + (
            f", {key_sql('CAST(trace_id AS VARCHAR)')} AS trace_key, NULL::UBIGINT AS request_key, "
            f"{kind_sql('CAST(stage AS VARCHAR)')} AS kind"
            if keys
            else ""
        )
        + " FROM st_tbl"
    )
    gaps = data.gaps or {"trace_id": np.array([], dtype=str), "gap_ms": np.array([], dtype=float)}
    cols = {
        "trace_id": pa.array(gaps["trace_id"], pa.string()),
        "gap_ms": pa.array(gaps["gap_ms"], pa.float64()),
    }
    if "running" in gaps:  # each gap's running decode batch (stagescope.itl.running), where the data has it
        cols["running"] = pa.array(gaps["running"], pa.float64())
    con.register("gap_tbl", pa.table(cols))
    running = ", CAST(running AS DOUBLE) running" if "running" in gaps else ""
    con.execute(
        f"CREATE OR REPLACE TABLE token_gaps AS SELECT trace_id, CAST(gap_ms AS DOUBLE) gap_ms{running} FROM gap_tbl"
    )
    m_tbl = pa.table(
        {
            "metric": pa.array([m[0] for m in data.metrics], pa.string()),
            "k": pa.array([list(m[1].keys()) for m in data.metrics], pa.list_(pa.string())),
            "v": pa.array([list(m[1].values()) for m in data.metrics], pa.list_(pa.string())),
            "value": pa.array([m[2] for m in data.metrics], pa.float64()),
            "ts_ms": pa.array([m[3] for m in data.metrics], pa.int64()),
        }
    )
    con.register("m_tbl", m_tbl)
    con.execute(
        "CREATE OR REPLACE TABLE metric_samples AS SELECT metric, CAST(map(k, v) AS MAP(VARCHAR, VARCHAR)) AS labels, "
        "value, ts_ms, 'synthetic' AS source FROM m_tbl"
    )
    con.execute(
        "CREATE OR REPLACE TABLE client_results AS SELECT * FROM (SELECT NULL::VARCHAR AS trace_id) WHERE false"
    )
    for name in ("req_tbl", "st_tbl", "gap_tbl", "m_tbl"):
        con.unregister(name)


def write_otlp(data: SynthData, path: str | Path, *, flavor: str = "stagescope") -> int:
    """Write the scenario as OTLP/JSON lines; ``flavor`` ``"vllm"`` writes ``llm_request`` spans
    (LLM scenarios only). Returns the number of spans written."""
    from stagescope.analysis.synth import KIND_SERVER, SynthSpan, request_spans, write_otlp_lines

    r = data.requests
    n = len(r["trace_id"])
    if flavor == "vllm":
        if data.scenario.route != GENERATE:
            raise ValueError(f"scenario {data.scenario.name!r} has no vLLM form (not an LLM route)")
        by = _stages_by_trace(data)
        spans = []
        for i in range(n):
            tid = str(r["trace_id"][i])
            st = by[tid]
            q, p, dcd = (st[s][1] - st[s][0] for s in (N.STAGE_QUEUE, N.STAGE_PREFILL, N.STAGE_DECODE))
            s0 = int(r["start_unix_ns"][i])
            attrs: dict[str, Any] = {
                N.VLLM_ATTR_QUEUE: q / 1e9, N.VLLM_ATTR_TTFT: float(r["ttft_ms"][i]) / 1e3,
                N.VLLM_ATTR_E2E: float(r["duration_ms"][i]) / 1e3, N.VLLM_ATTR_PREFILL: p / 1e9,
                N.VLLM_ATTR_DECODE: dcd / 1e9, N.VLLM_ATTR_INFERENCE: (p + dcd) / 1e9,
                N.VLLM_ATTR_PROMPT_TOKENS: int(r["input_tokens"][i]),
                N.VLLM_ATTR_COMPLETION_TOKENS: int(r["output_tokens"][i]), N.GENAI_REQUEST_MODEL: "llama",
            }  # fmt: skip
            end = s0 + int(float(r["duration_ms"][i]) * 1e6)
            spans.append(SynthSpan(tid, str(r["span_id"][i]), N.VLLM_SPAN_NAME, s0, end, kind=KIND_SERVER,
                                   attributes=attrs, service="synthetic-vllm"))  # fmt: skip
        return write_otlp_lines(path, spans)
    by = _stages_by_trace(data, keep_all=True)
    gaps_by: dict[str, list[float]] = {}
    for tid, g in zip(data.gaps.get("trace_id", []), data.gaps.get("gap_ms", []), strict=True):
        gaps_by.setdefault(str(tid), []).append(float(g) / 1e3)
    running_by: dict[str, list[int]] = {}
    if "running" in data.gaps:
        for tid, b in zip(data.gaps["trace_id"], data.gaps["running"], strict=True):
            running_by.setdefault(str(tid), []).append(int(b))

    def spans_iter() -> Any:
        for i in range(n):
            tid = str(r["trace_id"][i])
            s0 = int(r["start_unix_ns"][i])
            stage_list = [(s, (a - s0) / 1e6, (b - a) / 1e6) for s, a, b in by[tid]]
            attrs: dict[str, Any] = {
                N.ATTR_MODEL: str(r["model"][i]), N.ATTR_BATCH_SIZE: int(r["batch_size"][i]),
                N.ATTR_QUEUE_DEPTH: int(r["queue_depth"][i]), N.ATTR_INPUT_HASH: str(r["input_hash"][i]),
                N.ATTR_COLD_START: bool(r["cold_start"][i]),
            }  # fmt: skip
            if "escalated" in r:  # a cascade's escalation (analysis.synth_workload)
                attrs[N.ATTR_ESCALATED] = bool(r["escalated"][i])
            if "ttft_ms" in r and _present(r["ttft_ms"][i]):
                attrs.update({
                    N.VLLM_ATTR_TTFT: float(r["ttft_ms"][i]) / 1e3, N.VLLM_ATTR_E2E: float(r["duration_ms"][i]) / 1e3,
                    N.ATTR_ITL_MEAN: float(r["itl_mean_ms"][i]) / 1e3, N.ATTR_ITL_P99: float(r["itl_p99_ms"][i]) / 1e3,
                    N.ATTR_ITL_MAX: float(r["itl_max_ms"][i]) / 1e3, N.ATTR_TOKEN_GAPS: gaps_by.get(tid, []),
                    N.GENAI_USAGE_INPUT_TOKENS: int(r["input_tokens"][i]),
                    N.GENAI_USAGE_OUTPUT_TOKENS: int(r["output_tokens"][i]),
                })  # fmt: skip
                if tid in running_by:
                    attrs[N.ATTR_TOKEN_RUNNING] = running_by[tid]
            client = r.get("client_duration_ms")
            yield from request_spans(
                tid, s0, stage_list, duration_ms=float(r["duration_ms"][i]), name=f"POST {r['route'][i]}",
                route=str(r["route"][i]), attributes=attrs, service=SERVICE,
                client_ms=float(client[i]) if client is not None and _present(client[i]) else None,
            )  # fmt: skip

    return write_otlp_lines(path, spans_iter())


def _stages_by_trace(data: SynthData, keep_all: bool = False) -> Any:
    s = data.stages
    out: dict[str, Any] = {}
    for tid, st, a, b in zip(s["trace_id"], s["stage"], s["start_unix_ns"], s["end_unix_ns"], strict=True):
        if keep_all:
            out.setdefault(str(tid), []).append((str(st), int(a), int(b)))
        else:
            out.setdefault(str(tid), {})[str(st)] = (int(a), int(b))
    return out


def write_metrics(data: SynthData, path: str | Path) -> None:
    """Prometheus exposition text of the scenario's metric samples (timestamps in ms)."""
    lines = []
    for metric, labels, value, ts in data.metrics:
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{metric}{{{lab}}} {value} {ts}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
