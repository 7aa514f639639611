"""Zipkin v2 JSON -> the flat ``spans`` table (Python; Zipkin answers are query-sized).

Shape: openzipkin/zipkin-api zipkin2-api.yaml. ``POST /api/v2/spans`` bodies and
``GET /api/v2/trace/{traceId}`` answers are a list of spans (``ListOfSpans`` / ``Trace``),
``GET /api/v2/traces`` a list of such lists (``ListOfTraces``); all three are read. A ``Span`` has

* ``traceId`` (16 or 32 lowercase hex; 64-bit ids are left-padded to 32 digits), ``id`` and
  ``parentId`` (16 hex), ``name``, ``kind`` (CLIENT, SERVER, PRODUCER, CONSUMER; absent: a local
  span, read as INTERNAL);
* ``timestamp`` and ``duration`` in epoch **microseconds** (to Unix ns); ``timestamp`` may be absent
  for an incomplete span (the spec's three edge cases): such spans are left out, with a warning;
* ``localEndpoint.serviceName`` (the service), ``tags`` (string values only: numbers such as
  ``gen_ai.latency.*`` arrive as text and are converted), ``annotations`` ``[{timestamp, value}]``
  (the span's events);
* ``shared``: true on the server half of an RPC span whose id the client created (B3's shared span
  ids). The two halves carry the same id; here the server half gets an id of its own whose parent is
  the client half, so neither is taken for a repeat of the other.

An error is an ``error`` tag (any value: Zipkin sets it to the message) or ``otel.status_code=ERROR``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from stagescope.analysis.ingest.check import MAX_NS, MIN_NS, Problem, unit_guess
from stagescope.analysis.ingest.file_errors import BadEntry, TraceFileError, line_of
from stagescope.analysis.ingest.files import SniffedFile, open_bytes
from stagescope.analysis.ingest.jaeger import insert_rows, tag_value
from stagescope.analysis.ingest.spans import ATTR_COLUMNS, SPAN_COLUMNS
from stagescope.analysis.ingest.triton import span_id as derived_id

if TYPE_CHECKING:
    from stagescope.analysis.ingest.traces import TraceLoader

__all__ = ["ZipkinFileError", "load_zipkin_files", "zipkin_rows"]

_KINDS = {"SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_TRACE_ID = re.compile(r"[0-9a-fA-F]{16}|[0-9a-fA-F]{32}")
_SPAN_ID = re.compile(r"[0-9a-fA-F]{16}")


class ZipkinFileError(TraceFileError):
    """A bad Zipkin file: ``line`` (1-based) and ``reason`` without the file name."""


def _spans(doc: Any) -> list[Any]:
    if not isinstance(doc, list):
        raise BadEntry(f"expected a JSON array of Zipkin spans, got {type(doc).__name__}")
    if doc and all(isinstance(t, list) for t in doc):  # ListOfTraces
        return [sp for t in doc for sp in t]
    return doc


def _micros(v: Any, what: str, sid: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadEntry(f"span {sid}: {what} {v!r} is not integer microseconds", str(v))
    return v


def _row(sp: Any, file: str) -> dict[str, Any] | None:
    if not isinstance(sp, dict):
        raise BadEntry(f"span is {type(sp).__name__}, not an object")
    tid, sid, parent = sp.get("traceId"), sp.get("id"), sp.get("parentId")
    if not isinstance(tid, str) or not _TRACE_ID.fullmatch(tid):
        raise BadEntry(f"traceId {tid!r} is not 16 or 32 hex digits", str(tid))
    if not isinstance(sid, str) or not _SPAN_ID.fullmatch(sid):
        raise BadEntry(f"id {sid!r} is not 16 hex digits", str(sid))
    if parent is not None and (not isinstance(parent, str) or not _SPAN_ID.fullmatch(parent)):
        raise BadEntry(f"span {sid}: parentId {parent!r} is not 16 hex digits", str(parent))
    if sp.get("timestamp") is None:
        return None  # incomplete (zipkin2-api.yaml: timestamp "possibly absent if incomplete")
    start = _micros(sp["timestamp"], "timestamp", sid)
    dur = _micros(sp.get("duration", 0), "duration", sid)
    if not MIN_NS <= start * 1000 <= MAX_NS:
        raise BadEntry(f"span {sid}: timestamp {start} is not plausible epoch microseconds ({unit_guess(start, 'us')})",
                   str(start))  # fmt: skip
    tags = sp.get("tags") or {}
    if not isinstance(tags, dict):
        raise BadEntry(f"span {sid}: tags is not an object of strings", sid)
    kind = sp.get("kind")
    if kind is not None and kind not in _KINDS:
        raise BadEntry(f"span {sid}: kind {kind!r} is none of {', '.join(_KINDS)}", str(kind))
    tid32, sid = tid.lower().rjust(32, "0"), sid.lower()
    parent_id = (parent or "").lower()
    if sp.get("shared") is True and kind == "SERVER":
        parent_id, sid = sid, derived_id(tid32, sid, "shared")
    ep = sp.get("localEndpoint")
    events = []
    for a in sp.get("annotations") or []:
        if isinstance(a, dict) and isinstance(a.get("value"), str) and isinstance(a.get("timestamp"), int):
            events.append({"name": a["value"], "ns": a["timestamp"] * 1000})
    row: dict[str, Any] = dict.fromkeys(SPAN_COLUMNS)
    row.update(
        file=file, trace_id=tid32, span_id=sid, parent_span_id=parent_id, name=sp.get("name"),
        kind=_KINDS.get(kind, 1) if kind else 1, start_ns=start * 1000, end_ns=(start + dur) * 1000,
        service=ep.get("serviceName") if isinstance(ep, dict) else None,
        otel_status=2 if "error" in tags or str(tags.get("otel.status_code", "")).upper() == "ERROR" else 0,
        events=events or None,
    )  # fmt: skip
    for col, (typ, keys) in ATTR_COLUMNS.items():
        row[col] = next((tag_value(col, typ, tags[k]) for k in keys if k in tags), None)
    return row


def zipkin_rows(data: bytes, file: str) -> tuple[list[dict[str, Any]], int]:
    """Rows of the spans table for one Zipkin v2 JSON document and the number of incomplete spans
    left out; raises :class:`ZipkinFileError` (file:line)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ZipkinFileError(file, exc.lineno, f"malformed JSON: {exc.msg}") from None
    rows: list[dict[str, Any]] = []
    incomplete = 0
    try:
        for sp in _spans(doc):
            row = _row(sp, file)
            if row is None:
                incomplete += 1
            else:
                rows.append(row)
    except BadEntry as exc:
        raise ZipkinFileError(file, line_of(data, exc.needle), str(exc)) from None
    return rows, incomplete


def load_zipkin_files(loader: TraceLoader, files: list[SniffedFile]) -> None:
    """Insert the spans of Zipkin v2 files into ``loader.con``'s ``spans`` (bad files per ``skip_bad``)."""
    from stagescope.analysis.ingest.traces import FileSummary

    for f in files:
        try:
            rows, incomplete = zipkin_rows(open_bytes(f.path), str(f.path))
        except ZipkinFileError as exc:
            loader.bad(f.path, [Problem(exc.line, exc.reason)], "zipkin")
            continue
        loader.files.append(FileSummary(str(f.path), "zipkin"))
        if incomplete:
            loader.warnings.append(
                f"{f.path}: {incomplete} Zipkin spans without a timestamp (incomplete) left out"
            )
        insert_rows(loader.con, rows)
