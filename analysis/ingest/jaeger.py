"""Jaeger JSON traces -> the flat ``spans`` table (Python; Jaeger exports are query-sized).

Shapes read: the query API ``{"data": [{"traceID", "spans": [...], "processes": {...}}]}``, the
Jaeger-UI single trace ``{"data": {"spans": [...], "processes": {...}}}`` or a bare trace object, and
a bare array of spans with inline ``process``. Times are **microseconds** (``startTime``,
``duration``) and become Unix nanoseconds. 64-bit trace ids are left-padded to 32 hex digits. The
parent is the first ``CHILD_OF`` reference (else the first reference, else ``parentSpanID``); kind
comes from the ``span.kind`` tag, an error from ``error=true`` or ``otel.status_code=ERROR``, the
W3C tracestate from ``w3c.tracestate`` (where the collector's Jaeger translator keeps it). A span's
``logs`` become its events: the log's ``event`` field is the event's name (as Jaeger stores OTLP span
events: jaegertracing/jaeger internal/storage/v2/cassandra/tracestore/to_dbmodel.go, ``eventNameAttr``),
its ``timestamp`` (microseconds) the time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from stagescope.analysis.ingest.check import MAX_NS, MIN_NS, Problem, unit_guess
from stagescope.analysis.ingest.file_errors import BadEntry, TraceFileError, line_of
from stagescope.analysis.ingest.files import SniffedFile, open_bytes
from stagescope.analysis.ingest.spans import ATTR_COLUMNS, INVALID_COLUMNS, SPAN_COLUMNS, STRING_ONLY
from stagescope.names import JAEGER_TAG_TRACESTATE

if TYPE_CHECKING:
    from stagescope.analysis.ingest.traces import TraceLoader

__all__ = ["SPAN_SCHEMA", "JaegerFileError", "insert_rows", "jaeger_rows", "load_jaeger_files", "tag_value"]

_KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_HEX = re.compile(r"[0-9a-fA-F]{1,32}")


class JaegerFileError(TraceFileError):
    """A bad Jaeger file: ``line`` (1-based) and ``reason`` without the file name."""


def _traces(doc: Any) -> Iterator[tuple[list[Any], dict[str, Any]]]:
    """(spans, processes) per trace, for every supported shape."""
    if isinstance(doc, list):
        yield doc, {}
        return
    if not isinstance(doc, dict):
        raise BadEntry(f"expected a Jaeger JSON object or array, got {type(doc).__name__}")
    data = doc.get("data", doc)
    items = data if isinstance(data, list) else [data]
    for t in items:
        if not isinstance(t, dict) or not isinstance(t.get("spans"), list):
            raise BadEntry("Jaeger trace without a spans list")
        procs = t.get("processes") or {}
        yield t["spans"], procs if isinstance(procs, dict) else {}


def _convert(v: Any, typ: str) -> Any:
    try:
        if typ == "VARCHAR":
            return None if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
        if typ == "BIGINT":
            return int(v)
        if typ == "DOUBLE":
            return float(v)
        if typ == "BOOLEAN":
            return v if isinstance(v, bool) else str(v).lower() == "true"
        if typ == "DOUBLE[]":
            return [float(x) for x in (orjson.loads(v) if isinstance(v, str) else v)]
    except (TypeError, ValueError, orjson.JSONDecodeError):
        return None
    raise ValueError(typ)


def _span_row(sp: Any, procs: dict[str, Any], file: str) -> dict[str, Any]:
    if not isinstance(sp, dict):
        raise BadEntry(f"span is {type(sp).__name__}, not an object")
    tid, sid = sp.get("traceID"), sp.get("spanID")
    for key, v in (("traceID", tid), ("spanID", sid)):
        if not isinstance(v, str) or not _HEX.fullmatch(v):
            raise BadEntry(f"{key} {v!r} is not hex", str(v))
    assert isinstance(tid, str) and isinstance(sid, str)
    start, dur = sp.get("startTime"), sp.get("duration", 0)
    if not isinstance(start, int) or isinstance(start, bool) or not isinstance(dur, int) or dur < 0:
        raise BadEntry(f"span {sid}: startTime/duration {start!r}/{dur!r} are not integer microseconds", str(sid))
    start_ns = start * 1000
    if not MIN_NS <= start_ns <= MAX_NS:
        raise BadEntry(
            f"span {sid}: startTime {start} is not plausible Unix microseconds ({unit_guess(start, 'us')})",
            str(start),
        )
    tags = {t.get("key"): t.get("value") for t in sp.get("tags") or [] if isinstance(t, dict)}
    refs = [r for r in sp.get("references") or [] if isinstance(r, dict)]
    ref = next((r for r in refs if r.get("refType") == "CHILD_OF"), refs[0] if refs else None)
    parent = (ref or {}).get("spanID") or sp.get("parentSpanID") or ""
    proc = sp.get("process") or procs.get(sp.get("processID", ""), {}) or {}
    status = str(tags.get("otel.status_code", "")).upper()
    row: dict[str, Any] = {
        "file": file,
        "trace_id": tid.lower().rjust(32, "0"),
        "span_id": sid.lower().rjust(16, "0"),
        "parent_span_id": str(parent).lower().rjust(16, "0") if parent and parent != "0" else "",
        "name": sp.get("operationName"),
        "kind": _KINDS.get(str(tags.get("span.kind", "")).lower(), 0),
        "start_ns": start_ns,
        "end_ns": start_ns + dur * 1000,
        "service": proc.get("serviceName") if isinstance(proc, dict) else None,
        "otel_status": 2 if str(tags.get("error", "")).lower() == "true" or status == "ERROR" else 0,
        "trace_state": str(tags[JAEGER_TAG_TRACESTATE]) if tags.get(JAEGER_TAG_TRACESTATE) else None,
    }
    row["events"] = _events(sp.get("logs"))
    for col, (typ, keys) in ATTR_COLUMNS.items():
        row[col] = next((tag_value(col, typ, tags[k]) for k in keys if k in tags), None)
    return row


def tag_value(col: str, typ: str, v: Any) -> Any:
    """A tag's value for spans-table column ``col`` of SQL type ``typ`` (the Python readers: Jaeger,
    Zipkin): converted, or for STRING_ONLY / INVALID_COLUMNS a non-empty string / what it is instead."""
    if col in STRING_ONLY or col in INVALID_COLUMNS:
        return _string_or_not(v, col in INVALID_COLUMNS)
    return _convert(v, typ)


def _events(logs: Any) -> list[dict[str, Any]] | None:
    """A Jaeger span's logs as ``{name, ns}`` events (logs without an ``event`` field are skipped)."""
    out = []
    for lg in logs if isinstance(logs, list) else ():
        ts = lg.get("timestamp") if isinstance(lg, dict) else None
        if not isinstance(ts, int) or isinstance(ts, bool):
            continue
        fields = lg.get("fields") or []
        name = next(
            (f.get("value") for f in fields if isinstance(f, dict) and f.get("key") == "event"), None
        ) if isinstance(fields, list) else None  # fmt: skip
        if isinstance(name, str):
            out.append({"name": name, "ns": ts * 1000})
    return out or None


def _string_or_not(v: Any, describe: bool) -> str | None:
    """A non-empty string tag value (``describe``: None), else None (``describe``: what it is instead)."""
    if isinstance(v, str) and v.strip():
        return None if describe else v
    if not describe:
        return None
    if isinstance(v, str):
        return "an empty string"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, int):
        return f"the integer {v}"
    if isinstance(v, float):
        return f"the number {v}"
    if isinstance(v, list):
        return "a list"
    return "a value that is not a string"


def jaeger_rows(data: bytes, file: str) -> list[dict[str, Any]]:
    """Rows of the spans table for one Jaeger JSON document; raises :class:`UserError` (file:line)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JaegerFileError(file, exc.lineno, f"malformed JSON: {exc.msg}") from None
    rows: list[dict[str, Any]] = []
    try:
        for spans, procs in _traces(doc):
            rows.extend(_span_row(sp, procs, file) for sp in spans)
    except BadEntry as exc:
        raise JaegerFileError(file, line_of(data, exc.needle), str(exc)) from None
    return rows


_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "DOUBLE[]": pa.list_(pa.float64()),
    "STRUCT(name VARCHAR, ns BIGINT)[]": pa.list_(pa.struct([("name", pa.string()), ("ns", pa.int64())])),
}
#: The spans table as an Arrow schema (the Python readers build their rows against it).
SPAN_SCHEMA = pa.schema([(c, _ARROW_TYPES[t]) for c, t in SPAN_COLUMNS.items()])


def load_jaeger_files(loader: TraceLoader, files: list[SniffedFile]) -> None:
    """Insert the spans of Jaeger files into ``loader.con``'s ``spans`` (bad files per ``skip_bad``)."""
    from stagescope.analysis.ingest.traces import FileSummary

    for f in files:
        try:
            rows = jaeger_rows(open_bytes(f.path), str(f.path))
        except JaegerFileError as exc:
            loader.bad(f.path, [Problem(exc.line, exc.reason)], "jaeger")
            continue
        loader.files.append(FileSummary(str(f.path), "jaeger"))
        insert_rows(loader.con, rows)


def insert_rows(con: Any, rows: list[dict[str, Any]]) -> None:
    """Append rows (dicts keyed by the spans table's columns) to ``spans``."""
    if rows:
        con.register("_python_rows", pa.Table.from_pylist(rows, schema=SPAN_SCHEMA))
        try:
            con.execute("INSERT INTO spans SELECT * FROM _python_rows")
        finally:
            con.unregister("_python_rows")
