"""64-bit integer keys stored beside the string ids, so the analysis joins and groups on integers.

The ingest writes ``trace_key`` (into ``requests`` and ``stages``), ``request_key`` (into both: a
stage row's is its request's, see ingest.derive) and ``input_key`` (into ``requests``): the low 64
bits of the MD5 of ``trace_id``, of trace and span id of the request span, and of ``input_hash``
(NULL where those are NULL). MD5, not DuckDB's ``hash()``, whose values may change between DuckDB versions: keys written
to Parquet by one version must match keys computed by another. Joining stage rows to their request
on ``trace_key`` instead of the 32-character trace id reads a third of the bytes and compares
integers (``benchmarks/analysis.py``); two of a million trace ids share a key with odds of about
1 in 40 million, and even then their spans are clipped to each request's own interval.

Relations without the keys (built by hand in the pinned schema, Parquet written before they
existed) still work: the analysis then joins on ``trace_id`` and groups on ``hash(input_hash)``.
Without request keys (or where a stage row's is NULL) a trace's stage rows are matched to its
requests by time alone, so requests of one trace that run at the same time share the stage time
they overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import duckdb

__all__ = [
    "INPUT_KEY", "REQUEST_KEY", "REQUEST_KEYS", "TRACE_KEY", "has_columns", "has_request_keys", "input_ref",
    "key_sql", "remembering", "request_keys_sql", "trace_ref",
]  # fmt: skip

TRACE_KEY = "trace_key"
INPUT_KEY = "input_key"
REQUEST_KEY = "request_key"


#: What each key of a ``requests`` row is the key of: the row's columns, concatenated.
REQUEST_KEYS: dict[str, tuple[str, ...]] = {
    TRACE_KEY: ("trace_id",),
    INPUT_KEY: ("input_hash",),
    REQUEST_KEY: ("trace_id", "span_id"),
}


def key_sql(*columns: str) -> str:
    """SQL for the stored key of string columns, concatenated (NULL stays NULL)."""
    return f"md5_number_lower({' || '.join(columns)})"


def request_keys_sql(alias: str = "") -> str:
    """``key AS name`` of every one of :data:`REQUEST_KEYS`, over a requests row's columns (qualified
    by ``alias``, e.g. ``"s."``), comma-separated."""
    return ", ".join(f"{key_sql(*(alias + c for c in cols))} AS {k}" for k, cols in REQUEST_KEYS.items())


#: Answers of :func:`has_columns` while :func:`remembering` is active (None: not active).
_MEMO: ContextVar[dict[tuple[int, str], frozenset[str]] | None] = ContextVar(
    "stagescope_keys_memo", default=None
)


@contextmanager
def remembering() -> Iterator[None]:
    """Within the block :func:`has_columns` describes each relation once: the analysis asks about the
    same relations many times, and they do not change while it runs."""
    token = _MEMO.set({} if _MEMO.get() is None else _MEMO.get())
    try:
        yield
    finally:
        _MEMO.reset(token)


def has_columns(con: duckdb.DuckDBPyConnection, relation: str, *columns: str) -> bool:
    """Whether ``relation`` (a table, view or table function) has all of ``columns``."""
    memo = _MEMO.get()
    have = None if memo is None else memo.get((id(con), relation))
    if have is None:
        try:
            have = frozenset(r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall())
        except duckdb.Error:
            return False
        if memo is not None:
            memo[(id(con), relation)] = have
    return all(c in have for c in columns)


def trace_ref(con: duckdb.DuckDBPyConnection) -> str:
    """The column stage rows are joined to their requests on: ``trace_key`` where both ``requests``
    and ``stages`` carry it, else ``trace_id``."""
    both = has_columns(con, "requests", TRACE_KEY) and has_columns(con, "stages", TRACE_KEY)
    return TRACE_KEY if both else "trace_id"


def has_request_keys(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether stage rows can be matched to their own request: ``request_key`` in ``requests`` and
    ``stages``, and the trace keys beside it."""
    return (
        trace_ref(con) == TRACE_KEY
        and has_columns(con, "requests", REQUEST_KEY)
        and has_columns(con, "stages", REQUEST_KEY)
    )


def input_ref(con: duckdb.DuckDBPyConnection) -> str:
    """SQL for an integer key of a request's input (NULL without an input hash)."""
    if has_columns(con, "requests", INPUT_KEY):
        return INPUT_KEY
    return "CASE WHEN input_hash IS NOT NULL THEN hash(input_hash) END"
