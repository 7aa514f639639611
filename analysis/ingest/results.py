"""The load generator's ``results.parquet`` (one row per request, pinned schema) -> ``client_results``.

Columns (issue 5): ``request_id``, ``trace_id`` (32 lowercase hex), ``route``, ``intended_unix_ns``,
``sent_unix_ns``, ``first_byte_unix_ns``, ``end_unix_ns`` (Unix ns, NULL where not reached),
``status`` (0 = connection error), ``error``, ``latency_ms`` (end - intended), ``naive_latency_ms``
(end - sent), ``ttft_ms``, ``ttft_naive_ms``, ``itl_mean_ms``, ``itl_p99_ms``, ``itl_max_ms``,
``n_tokens``, ``prompt_tokens``, ``output_tokens``, ``input_hash``. Missing optional columns are NULL;
a file without the required ones is bad input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from stagescope.analysis.ingest.otlp import sql_str
from stagescope.analysis.ingest.traces import FileSummary
from stagescope.errors import UserError
from stagescope.paths import not_readable_reason

if TYPE_CHECKING:
    from stagescope.analysis.ingest import Dataset

__all__ = ["REQUIRED_COLUMNS", "RESULT_COLUMNS", "load_results"]

RESULT_COLUMNS: dict[str, str] = {
    "request_id": "BIGINT",
    "trace_id": "VARCHAR",
    "route": "VARCHAR",
    "intended_unix_ns": "BIGINT",
    "sent_unix_ns": "BIGINT",
    "first_byte_unix_ns": "BIGINT",
    "end_unix_ns": "BIGINT",
    "status": "INTEGER",
    "error": "VARCHAR",
    "latency_ms": "DOUBLE",
    "naive_latency_ms": "DOUBLE",
    "ttft_ms": "DOUBLE",
    "ttft_naive_ms": "DOUBLE",
    "itl_mean_ms": "DOUBLE",
    "itl_p99_ms": "DOUBLE",
    "itl_max_ms": "DOUBLE",
    "n_tokens": "BIGINT",
    "prompt_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "input_hash": "VARCHAR",
}
REQUIRED_COLUMNS = ("request_id", "intended_unix_ns", "status", "latency_ms")


def load_results(ds: Dataset, paths: Sequence[str | Path], *, skip_bad: bool = False) -> None:
    """Create ``client_results`` (empty when ``paths`` is empty) from results Parquet files."""
    ddl = ", ".join(f"{c} {t}" for c, t in RESULT_COLUMNS.items())
    ds.con.execute(f"CREATE TABLE client_results ({ddl}, source VARCHAR)")
    for p in map(Path, paths):
        files = sorted(p.rglob("*.parquet")) if os.path.isdir(p) else [p]
        for f in files:
            try:
                n = _load_one(ds.con, f)
            except UserError as exc:
                if not skip_bad:
                    raise
                ds.warnings.append(f"skipped file: {exc}: its load-generator results are not read")
                ds.files.append(FileSummary(str(f), "results", skipped=True, note=str(exc)))
                continue
            ds.files.append(FileSummary(str(f), "results", samples=n))


def _load_one(con: duckdb.DuckDBPyConnection, f: Path) -> int:
    if not os.path.isfile(f):
        raise UserError(f"{f}: {not_readable_reason(f)}")
    try:
        cols = {
            r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({sql_str(str(f))})").fetchall()
        }
    except duckdb.Error as exc:
        raise UserError(f"{f}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise UserError(f"{f}: not load-generator results: missing column(s) {', '.join(missing)}")
    select = ", ".join(
        (f"TRY_CAST({c} AS {t})" if c != "trace_id" else "lower(CAST(trace_id AS VARCHAR))") if c in cols
        else f"CAST(NULL AS {t})"
        for c, t in RESULT_COLUMNS.items()
    )  # fmt: skip
    before = con.execute("SELECT count(*) FROM client_results").fetchall()[0]
    try:
        con.execute(
            f"INSERT INTO client_results SELECT {select}, {sql_str(str(f))} FROM read_parquet({sql_str(str(f))})"
        )
    except duckdb.Error as exc:
        raise UserError(f"{f}: unreadable results ({str(exc).splitlines()[0]})") from None
    after = con.execute("SELECT count(*) FROM client_results").fetchall()[0]
    return int(after[0] if after else 0) - int(before[0] if before else 0)
