"""Triton's trace file (``--trace-config triton,file=PATH``) -> the flat ``spans`` table.

Shape, as triton-inference-server/server src/tracer.cc writes it (``TraceActivity``,
``CaptureTimestamp``, ``TraceTensorActivity``, ``TraceFile::SaveTraces``) and
docs/user_guide/trace.md ("JSON Trace Output") describes it: one JSON array of objects, each with
an integer ``id`` (the Triton trace id, unique within one server run):

* ``{"id", "model_name", "model_version"[, "request_id"][, "parent_id"]}`` once per trace, written
  with its REQUEST_START; ``parent_id`` (only when not 0) names the containing ensemble's or BLS
  model's trace;
* ``{"id", "timestamps": [{"name", "ns"}]}``, one timestamp per object (level TIMESTAMPS), the
  frontend's HTTP_* / GRPC_* / INFER_RESPONSE_COMPLETE on the request's own id;
* ``{"id", "activity", "tensor": {...}}`` (level TENSORS): skipped; the tensor data is never read.

The array's closing ``]`` is written only when the server shuts down (``~TraceFile``), so a file
copied from a running server has none; it is read all the same. With ``log-frequency`` the traces go
to ``PATH.0``, ``PATH.1``, ... instead, each a whole array.

Clock: ``ns`` is Triton's steady clock (``std::chrono::steady_clock``, on Linux the time since boot),
not Unix time. The times are placed by an offset: ``STAGESCOPE_TRITON_CLOCK_OFFSET_NS`` when set
(Unix minus monotonic time on the Triton host, in ns: ``python3 -c "import time;
print(time.time_ns() - time.monotonic_ns())"`` there), else so that the file's last timestamp falls
at the file's modification time (Triton writes the file as traces complete, so that is when its
last trace ended, give or take the write delay; a copy that did not keep the time moves all of it).
Durations are exact either way; a warning says which placement was used.

Each root trace (no ``parent_id``) becomes one SERVER span named ``InferRequest`` (as the
OpenTelemetry mode names its root), route and model the root model's name, with its stages as
children (:mod:`~stagescope.analysis.ingest.triton`). Trace and span ids are hashes of the file
name and the Triton id (Triton's ids restart with each server run).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from stagescope import names as N
from stagescope.analysis.ingest.check import MAX_NS, MIN_NS, Problem
from stagescope.analysis.ingest.file_errors import TraceFileError
from stagescope.analysis.ingest.files import SniffedFile, open_bytes
from stagescope.analysis.ingest.triton import Node, SpanBuffer, build, children, span_id
from stagescope.errors import UserError

if TYPE_CHECKING:
    from stagescope.analysis.ingest.traces import TraceLoader

__all__ = ["SERVICE", "TritonFileError", "clock_offset", "load_triton_files", "triton_file_rows"]

#: ``service.name`` of Triton's spans (server src/tracer.cc ``ProcessOpenTelemetryParameters``).
SERVICE = "triton-inference-server"


class TritonFileError(TraceFileError):
    """A bad Triton trace file: ``line`` (1-based) and ``reason`` without the file name."""


class _Bad(Exception):
    """``entry``: the 0-based index of the offending array element; ``pos``: a byte offset."""

    def __init__(self, message: str, entry: int | None = None, pos: int | None = None) -> None:
        super().__init__(message)
        self.entry = entry
        self.pos = pos


def _entry_offset(data: bytes, entry: int) -> int:
    """Byte offset of the array's ``entry``-th element (only on the error path: one scan)."""
    import json

    text = data.decode("utf-8", "replace")
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    for _ in range(entry):
        while text[pos] in " \t\r\n,":
            pos += 1
        _, pos = dec.raw_decode(text, pos)
    while pos < len(text) and text[pos] in " \t\r\n,":
        pos += 1
    return len(text[:pos].encode())


def _parse(data: bytes) -> list[Any]:
    """The JSON array, also when the server had not closed it yet (no final ``]``)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        body = data.rstrip()
        for fixed in (body + b"]", body.rstrip(b",") + b"]"):
            try:
                doc = orjson.loads(fixed)
                break
            except orjson.JSONDecodeError:
                continue
        else:
            raise _Bad(f"malformed JSON: {exc.msg}", pos=exc.pos) from None
    if not isinstance(doc, list):
        raise _Bad(f"expected a JSON array of Triton trace objects, got {type(doc).__name__}")
    return doc


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _nodes(doc: list[Any]) -> tuple[dict[int, Node], int]:
    """Triton traces by id, and the number of tensor objects skipped."""
    nodes: dict[int, Node] = {}
    tensors = 0
    for i, obj in enumerate(doc):  # written for speed: most entries are {"id", "timestamps": [one]}
        if type(obj) is not dict:
            raise _Bad(f"entry {i + 1} is {type(obj).__name__}, not an object", i)
        tid = obj.get("id")
        if type(tid) is not int or tid < 0:
            raise _Bad(f"entry {i + 1} without an integer id (id {obj.get('id')!r})", i)
        node = nodes.get(tid)
        if node is None:
            node = nodes[tid] = Node(tid)
        stamps = obj.get("timestamps")
        if stamps is not None:
            if type(stamps) is not list:
                raise _Bad(f"trace {tid}: timestamps is not a list", i)
            ts = node.ts
            for t in stamps:
                name = t.get("name") if type(t) is dict else None
                ns = t.get("ns") if type(t) is dict else None
                if type(name) is not str or type(ns) is not int or ns < 0:
                    raise _Bad(f"trace {tid}: timestamp {t!r} is not a {{name, ns}} pair of a name and "
                               "non-negative integer nanoseconds", i)  # fmt: skip
                got = ts.get(name)
                if got is None:
                    ts[name] = [ns]
                else:
                    got.append(ns)
            if len(obj) == 2:
                continue
        known = stamps is not None
        if "model_name" in obj:
            known = True
            if not isinstance(obj["model_name"], str):
                raise _Bad(f"trace {tid}: model_name {obj['model_name']!r} is not a string", i)
            node.model = obj["model_name"]
            version = obj.get("model_version")
            node.version = None if version is None else str(version)
            parent = obj.get("parent_id")
            if parent is not None:
                if _int(parent) is None:
                    raise _Bad(f"trace {tid}: parent_id {parent!r} is not an integer", i)
                node.parent = parent or None
        if "activity" in obj:
            known = True
            tensors += 1
        if not known:
            raise _Bad(f"trace {tid}: an object with neither model_name, timestamps nor activity", i)
    return nodes, tensors


def clock_offset(env: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    """``STAGESCOPE_TRITON_CLOCK_OFFSET_NS`` (Unix minus steady-clock ns on the Triton host), or None
    when unset; a value that is not an integer is a :class:`UserError`."""
    raw = (os.environ if env is None else env).get(N.ENV_TRITON_CLOCK_OFFSET_NS, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UserError(
            f"{N.ENV_TRITON_CLOCK_OFFSET_NS}={raw!r}: not an integer of nanoseconds (Unix time minus "
            "the Triton host's monotonic clock)"
        ) from None


def triton_file_rows(
    data: bytes, file: str, mtime_ns: int, offset_ns: int | None = None
) -> tuple[SpanBuffer, list[str]]:
    """Rows of the spans table for one Triton trace file, and warnings; raises :class:`UserError`
    (file:line) for bad input."""
    try:
        nodes, tensors = _nodes(_parse(data))
        lows = [min(v) for n in nodes.values() for v in n.ts.values()]
        if not lows:
            raise _Bad("no timestamps: traced at level TENSORS only? (stagescope needs TIMESTAMPS)")
        last = max(max(v) for n in nodes.values() for v in n.ts.values())
        placed = offset_ns if offset_ns is not None else mtime_ns - last
        if not MIN_NS <= min(lows) + placed <= MAX_NS:
            raise _Bad(f"timestamps do not place as Unix time with offset {placed} ns "
                       f"({N.ENV_TRITON_CLOCK_OFFSET_NS})")  # fmt: skip
    except _Bad as exc:
        pos = exc.pos if exc.pos is not None else (_entry_offset(data, exc.entry) if exc.entry is not None else 0)
        raise TritonFileError(file, data.count(b"\n", 0, pos) + 1, str(exc)) from None
    rows = SpanBuffer()
    orphans = inverted = 0
    kids = children(nodes)  # type: ignore[arg-type]  # int keys are Hashable
    for tid, node in nodes.items():
        if node.parent is not None:
            orphans += node.parent not in nodes
            continue
        req = build(nodes, tid, kids)  # type: ignore[arg-type]  # int keys are Hashable
        if req is None:
            continue
        inverted += req.inverted
        trace_id = span_id(file, tid, "trace") + span_id(file, tid, "trace2")
        root = span_id(file, tid, "request")
        rows.request(req, file=file, trace_id=trace_id, span=root, service=SERVICE, offset_ns=placed)
        rows.stages(req, file=file, trace_id=trace_id, parent=root, service=SERVICE, offset_ns=placed)
    warnings = []
    if offset_ns is None:
        when = dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        warnings.append(
            f"{file}: Triton trace timestamps are on the server's steady clock; placed so that the last "
            f"one falls at the file's modification time ({when}): durations are exact, wall-clock times "
            f"approximate (set {N.ENV_TRITON_CLOCK_OFFSET_NS} to place them exactly)"
        )
    if orphans:
        warnings.append(f"{file}: {orphans} Triton traces name a parent_id the file does not hold: left out")
    if inverted:
        warnings.append(f"{file}: {inverted} Triton intervals end before they start: left out")
    if tensors:
        warnings.append(f"{file}: {tensors} TENSORS entries skipped (tensor contents are never read)")
    return rows, warnings


def load_triton_files(loader: TraceLoader, files: list[SniffedFile]) -> None:
    """Insert the requests and stages of Triton trace files (bad files per ``skip_bad``)."""
    from stagescope.analysis.ingest.traces import FileSummary

    offset = clock_offset()
    for f in files:
        try:
            rows, warnings = triton_file_rows(
                open_bytes(f.path), str(f.path), Path(f.path).stat().st_mtime_ns, offset
            )
        except TritonFileError as exc:
            loader.bad(f.path, [Problem(exc.line, exc.reason)], "triton-trace")
            continue
        loader.files.append(FileSummary(str(f.path), "triton-trace"))
        loader.warnings.extend(warnings)
        rows.insert(loader.con)
