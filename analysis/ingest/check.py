"""Diagnosing a bad OTLP/JSON trace file: which line, and what is wrong with it.

The fast SQL path (:mod:`stagescope.analysis.ingest.otlp`) is lenient and line-blind; when it fails
on a file, or leaves spans without ids or with implausible times, this module reads that one file in
Python (orjson) to name the first bad line and the reason, and to keep the good lines when the user
asked to skip bad input.

Plausible span times are Unix nanoseconds between 1973 and 2100; smaller values are reported with a
guess at their unit (seconds, milliseconds, microseconds).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from stagescope.analysis.ingest.files import open_bytes

__all__ = ["MAX_NS", "MIN_NS", "Problem", "api_error", "diagnose_otlp", "unit_guess"]

MIN_NS = 10**17  # 1973-03-03 in Unix ns
MAX_NS = 41 * 10**17  # 2099-12-02
_HEX = re.compile(r"[0-9a-fA-F]+")
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


@dataclass
class Problem:
    line: int
    message: str


def unit_guess(v: int, unit: str = "ns") -> str:
    """What an implausible epoch timestamp, read as ``unit`` (``"ns"`` or ``"us"``), probably is.

    Judged by magnitude alone (a time of this century is about 1.7e9 s, 1.7e12 ms, 1.7e15 us, 1.7e18 ns),
    so a value too large for its unit is not called microseconds: it is "nanoseconds" for a microsecond
    field, "after 2099" for a nanosecond one, or too large for any unit (an int64 overflow, a counter).
    """
    if v <= 0:
        return "not a timestamp"
    bounds = ((10**11, "seconds"), (10**14, "milliseconds"), (10**17, "microseconds"), (10**20, "nanoseconds"))
    name = next((n for bound, n in bounds if v < bound), None)
    if name is None:
        return "too large for a time in any unit"
    if name == {"ns": "nanoseconds", "us": "microseconds"}[unit]:
        return "after 2099"  # the unit fits; below 1973 the value is a smaller unit, caught above
    return f"looks like {name}"


def _int64(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _float_guess(v: Any) -> str:
    """`` (looks like seconds)`` etc. for a non-integer number, else ''."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    return f" ({unit_guess(int(f))})" if 0 < f < MIN_NS else ""


def _id_ok(v: Any, n_hex: int) -> bool:
    if not isinstance(v, str):
        return False
    if len(v) == n_hex and _HEX.fullmatch(v):
        return True
    return len(v) == ((n_hex // 2 + 2) // 3) * 4 and bool(_B64.fullmatch(v)) and v.endswith("=")


def _span_problem(sp: Any) -> str | None:
    if not isinstance(sp, dict):
        return f"span is {type(sp).__name__}, not an object"
    for key, n in (("traceId", 32), ("spanId", 16)):
        if key not in sp:
            return f"span without {key}"
        if not _id_ok(sp[key], n):
            return f"{key} {sp[key]!r} is not {n} hex digits"
    parent = sp.get("parentSpanId", "")
    if parent not in ("", None) and not _id_ok(parent, 16):
        return f"parentSpanId {parent!r} is not 16 hex digits"
    times = []
    for key in ("startTimeUnixNano", "endTimeUnixNano"):
        if key not in sp:
            return f"span {sp.get('spanId')} without {key}"
        t = _int64(sp[key])
        if t is None:
            guess = _float_guess(sp[key])
            return f"{key} {sp[key]!r} is not an integer of Unix nanoseconds{guess}"
        if not MIN_NS <= t <= MAX_NS:
            return f"{key} {t} is not a plausible Unix-nanosecond time ({unit_guess(t)})"
        times.append(t)
    if times[1] < times[0]:
        return f"span {sp.get('spanId')} ends before it starts"
    attrs = sp.get("attributes", [])
    if not isinstance(attrs, list) or not all(isinstance(a, dict) and "key" in a for a in attrs):
        return "span attributes are not a list of {key, value} objects"
    return None


def _doc_problem(doc: Any, wrapper: str | None = None) -> str | None:
    if wrapper is not None:
        if not isinstance(doc, dict) or wrapper not in doc:
            return f"expected an object holding the export request under {wrapper!r}"
        doc = doc[wrapper]
    if not isinstance(doc, dict):
        return f"expected an OTLP ExportTraceServiceRequest object, got {type(doc).__name__}"
    rs_list = doc.get("resourceSpans")
    if not isinstance(rs_list, list):
        return "no resourceSpans list: not OTLP/JSON traces"
    for rs in rs_list:
        if not isinstance(rs, dict) or not isinstance(rs.get("scopeSpans", []), list):
            return "resourceSpans item without a scopeSpans list"
        for ss in rs.get("scopeSpans", []):
            spans = ss.get("spans", []) if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                return "scopeSpans item without a spans list"
            for sp in spans:
                msg = _span_problem(sp)
                if msg:
                    return msg
    return None


def _open_lines(path: Path) -> IO[bytes]:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]  # GzipFile is a binary IO
    return open(path, "rb")


def diagnose_otlp(
    path: Path, *, lines: bool, good_out: Path | None = None, limit: int = 1000, wrapper: str | None = None
) -> tuple[list[Problem], int]:
    """Problems (1-based line numbers, at most ``limit``; reading stops there) and how many good lines
    were written to ``good_out`` (for skip-bad). Lines are streamed: memory stays bounded.

    For a single multi-line document nothing is good when it has a problem; the line named is the
    JSON syntax error's line, or the first line holding the offending value. ``wrapper``: the key
    each object holds its export request under (Jaeger v3's ``result``).
    """
    problems: list[Problem] = []
    if not lines:
        data = open_bytes(path)
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            return [Problem(exc.lineno, f"malformed JSON: {exc.msg}")], 0
        msg = _doc_problem(doc, wrapper)
        return ([Problem(_line_of(data, msg), msg)] if msg else []), 0
    n_good = 0
    no = 0
    out = open(good_out, "wb") if good_out is not None else None  # noqa: SIM115
    try:
        with _open_lines(path) as f:
            for no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    msg = _doc_problem(orjson.loads(raw), wrapper)
                except orjson.JSONDecodeError as exc:
                    cut = "EOF" in exc.msg or "end" in exc.msg
                    msg = f"malformed JSON ({'truncated line' if cut else exc.msg})"
                if msg is None:
                    if out is not None:
                        out.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    n_good += 1
                    continue
                problems.append(Problem(no, msg))
                if len(problems) >= limit:
                    break
    except (OSError, EOFError, zlib.error) as exc:
        problems.append(Problem(no + 1, f"corrupt gzip data ({exc})"))
    finally:
        if out is not None:
            out.close()
    return problems, n_good


def _line_of(data: bytes, msg: str) -> int:
    """Line of the first occurrence of the value quoted in ``msg`` (1 if none)."""
    m = re.search(r"(?:'([^']*)'|(\b\d{2,}\b))", msg)
    if m:
        needle = (m.group(1) or m.group(2)).encode()
        pos = data.find(needle)
        if pos >= 0:
            return data.count(b"\n", 0, pos) + 1
    return 1


def api_error(path: Path) -> str | None:
    """The message of a saved query-API error answer (Jaeger's ``{"error": {"httpCode", "message"}}``,
    jaegertracing/jaeger internal/proto/api_v3 ``GRPCGatewayError``), or None if the file is not one."""
    try:
        doc = orjson.loads(open_bytes(path))
    except orjson.JSONDecodeError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or "resourceSpans" in doc:
        return None
    code = err.get("httpCode") or err.get("http_code") or err.get("code")
    return f"a query API error answer, not traces (HTTP {code}: {err.get('message', '')!s})"
