"""Per-request results of a load run: the pinned ``results.parquet`` schema, and the run summary.

One row per request that was due (sent, or held back by ``--concurrency-cap`` when the run stopped).
Timestamps are Unix-epoch nanoseconds (int64, null where not reached). Latencies are milliseconds:
*corrected* ones are measured from the intended send time (what a user arriving on schedule waited),
*naive* ones from the actual send (what a closed-loop tool reports; hides coordinated omission).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stagescope.errors import UserError

__all__ = [
    "RESULTS_SCHEMA",
    "RequestResult",
    "Summary",
    "check_writable",
    "results_table",
    "summarize",
    "write_results",
]

#: The pinned results schema (stagescope plan, "Load-generator results (issue 5)").
RESULTS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("trace_id", pa.string(), nullable=False),  # 32 lowercase hex, as in the traceparent
        pa.field("route", pa.string(), nullable=False),
        pa.field("intended_unix_ns", pa.int64()),
        pa.field("sent_unix_ns", pa.int64()),
        pa.field("first_byte_unix_ns", pa.int64()),
        pa.field("end_unix_ns", pa.int64()),
        pa.field("status", pa.int64(), nullable=False),  # HTTP status; 0 = no response (connection error ...)
        pa.field("error", pa.string()),
        pa.field("latency_ms", pa.float64()),  # corrected: end - intended
        pa.field("naive_latency_ms", pa.float64()),  # end - sent
        pa.field("ttft_ms", pa.float64()),  # first token - intended (streams only)
        pa.field("ttft_naive_ms", pa.float64()),  # first token - sent
        pa.field("itl_mean_ms", pa.float64()),
        pa.field("itl_p99_ms", pa.float64()),
        pa.field("itl_max_ms", pa.float64()),
        # output tokens: the server's own count (OpenAI usage.completion_tokens) when it sent one, else
        # the token events received on the stream
        pa.field("n_tokens", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),  # requested prompt length
        pa.field("output_tokens", pa.int64()),  # requested max_tokens
        pa.field("input_hash", pa.string()),
    ]
)


@dataclass(slots=True)
class RequestResult:
    """What the client saw of one request (all ``*_ns`` are Unix-epoch nanoseconds)."""

    request_id: int
    trace_id: str
    route: str
    intended_ns: int
    sent_ns: int | None = None
    first_byte_ns: int | None = None
    end_ns: int | None = None
    status: int = 0
    error: str | None = None
    token_ns: list[int] | None = None  # arrival time of each token event (streams)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    input_hash: str | None = None
    span_id: str = ""
    usage_output_tokens: int | None = None  # the server's own output-token count (OpenAI ``usage``)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 400 and self.error is None and self.end_ns is not None


def _ms(a: int | None, b: int | None) -> float | None:
    return (a - b) / 1e6 if a is not None and b is not None else None


def results_table(results: Sequence[RequestResult]) -> pa.Table:
    """Build the pinned Arrow table (rows in request order)."""
    rows = sorted(results, key=lambda r: r.request_id)
    cols: dict[str, list[Any]] = {f.name: [] for f in RESULTS_SCHEMA}
    for r in rows:
        cols["request_id"].append(r.request_id)
        cols["trace_id"].append(r.trace_id)
        cols["route"].append(r.route)
        cols["intended_unix_ns"].append(r.intended_ns)
        cols["sent_unix_ns"].append(r.sent_ns)
        cols["first_byte_unix_ns"].append(r.first_byte_ns)
        cols["end_unix_ns"].append(r.end_ns)
        cols["status"].append(r.status)
        cols["error"].append(r.error)
        cols["latency_ms"].append(_ms(r.end_ns, r.intended_ns))
        cols["naive_latency_ms"].append(_ms(r.end_ns, r.sent_ns))
        tokens = r.token_ns
        first_tok = tokens[0] if tokens else None
        cols["ttft_ms"].append(_ms(first_tok, r.intended_ns))
        cols["ttft_naive_ms"].append(_ms(first_tok, r.sent_ns))
        if tokens is not None and len(tokens) >= 2:
            gaps = np.diff(np.asarray(tokens, dtype=np.int64)) / 1e6
            cols["itl_mean_ms"].append(float(gaps.mean()))
            cols["itl_p99_ms"].append(float(np.percentile(gaps, 99)))
            cols["itl_max_ms"].append(float(gaps.max()))
        else:
            for k in ("itl_mean_ms", "itl_p99_ms", "itl_max_ms"):
                cols[k].append(None)
        n = r.usage_output_tokens
        cols["n_tokens"].append(n if n is not None else (len(tokens) if tokens is not None else None))
        cols["prompt_tokens"].append(r.prompt_tokens)
        cols["output_tokens"].append(r.output_tokens)
        cols["input_hash"].append(r.input_hash)
    return pa.Table.from_pydict(cols, schema=RESULTS_SCHEMA)


def check_writable(path: str | Path) -> None:
    """Raise :class:`UserError` now, before a run, if ``path`` could not be written at its end
    (a directory in its place, a parent that is a file, no permission, a read-only file system)."""
    from stagescope.paths import ensure_writable_file

    ensure_writable_file(path, "results")


def write_results(table: pa.Table, path: str | Path) -> Path:
    """Write the table as Parquet (atomically: a temporary file renamed into place)."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        pq.write_table(table, tmp)
        tmp.replace(p)
    except OSError as exc:
        raise UserError(f"{p}: cannot write results: {exc.strerror or exc}") from None
    return p


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _quantiles(values: Sequence[float | None]) -> dict[str, float | None]:
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return {
        "p50": _pct(arr, 50),
        "p90": _pct(arr, 90),
        "p99": _pct(arr, 99),
        "p999": _pct(arr, 99.9),
        "max": float(arr.max()) if len(arr) else None,
        "mean": float(arr.mean()) if len(arr) else None,
    }


@dataclass
class Summary:
    """The run summary printed as a table, or as JSON with ``--json``. Latencies in milliseconds."""

    url: str
    route: str
    source: str
    target_rate_rps: float | None  # the rate asked for (--rate), None for a trace replayed at its pace
    schedule_rate_rps: float  # the schedule's own mean rate: a Poisson draw of 20 req/s may hold 18.1
    duration_s: float
    scheduled: int
    due: int  # requests whose intended time came before the run stopped
    sent: int
    completed: int
    ok: int
    errors: int
    achieved_rate_rps: float  # sent / duration (the schedule span the run covered): equals the schedule's
    # own rate when every scheduled request was sent
    send_lag_ms: dict[str, float | None]  # actual - intended send
    latency_ms: dict[str, float | None]  # corrected (from intended send), successful requests
    naive_latency_ms: dict[str, float | None]  # from actual send, successful requests
    ttft_ms: dict[str, float | None] = field(default_factory=dict)
    ttft_naive_ms: dict[str, float | None] = field(default_factory=dict)
    itl_p99_ms: dict[str, float | None] = field(default_factory=dict)
    status_counts: dict[str, int] = field(default_factory=dict)
    stopped_early: str | None = None  # why sending stopped before the schedule ended, if it did
    concurrency_cap: int | None = None
    realtime: bool = False  # sender and loop threads ran under SCHED_FIFO
    api: str | None = None  # "openai-completions" | "openai-chat" | None (any SSE/NDJSON stream)
    model: str | None = None  # the model the requests asked for (OpenAI APIs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    results: Sequence[RequestResult],
    *,
    url: str,
    route: str,
    source: str,
    target_rate_rps: float | None,
    duration_s: float,
    scheduled: int,
    stopped_early: str | None = None,
    concurrency_cap: int | None = None,
    realtime: bool = False,
    schedule_rate_rps: float | None = None,
    api: str | None = None,
    model: str | None = None,
) -> Summary:
    """Aggregate per-request results into a :class:`Summary`."""
    sent = [r for r in results if r.sent_ns is not None]
    ok = [r for r in results if r.ok]
    completed = [r for r in results if r.end_ns is not None]
    lag = [(r.sent_ns - r.intended_ns) / 1e6 for r in sent if r.sent_ns is not None]
    counts: dict[str, int] = {}
    for r in results:
        key = str(r.status) if r.status else (r.error or "no response").split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    streams = [r for r in ok if r.token_ns]
    itl_p99 = []
    for r in streams:
        if r.token_ns is not None and len(r.token_ns) >= 2:
            itl_p99.append(float(np.percentile(np.diff(np.asarray(r.token_ns)) / 1e6, 99)))
    return Summary(
        url=url,
        route=route,
        source=source,
        target_rate_rps=target_rate_rps,
        schedule_rate_rps=schedule_rate_rps if schedule_rate_rps is not None else (
            scheduled / duration_s if duration_s > 0 else 0.0),
        duration_s=duration_s,
        scheduled=scheduled,
        due=len(results),
        sent=len(sent),
        completed=len(completed),
        ok=len(ok),
        errors=len(results) - len(ok),
        achieved_rate_rps=len(sent) / duration_s if duration_s > 0 else 0.0,
        send_lag_ms=_quantiles(lag),
        latency_ms=_quantiles([_ms(r.end_ns, r.intended_ns) for r in ok]),
        naive_latency_ms=_quantiles([_ms(r.end_ns, r.sent_ns) for r in ok]),
        ttft_ms=_quantiles([_ms(r.token_ns[0], r.intended_ns) for r in streams if r.token_ns]),
        ttft_naive_ms=_quantiles([_ms(r.token_ns[0], r.sent_ns) for r in streams if r.token_ns]),
        itl_p99_ms=_quantiles(itl_p99),
        status_counts=counts,
        stopped_early=stopped_early,
        concurrency_cap=concurrency_cap,
        realtime=realtime,
        api=api,
        model=model,
    )
