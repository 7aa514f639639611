"""Finding input files and telling their kind from their first bytes (not from their names).

Trace kinds: ``otlp`` (``resourceSpans``), ``sink`` (OTLP lines named ``spans-<pid>-<n>.jsonl``),
``jaeger`` (query-API ``{"data": [...]}``, a bare array of Jaeger spans, or the Jaeger-UI
``{"data": {"spans": ...}}``), ``otlp-other`` (OTLP logs or metrics: no spans) and ``unknown``.
Directories are walked recursively; only files whose name ends in ``.json``, ``.jsonl``,
``.ndjson`` (optionally ``.gz``) are taken from a directory, files named explicitly are always read.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from stagescope.errors import UserError

__all__ = ["TRACE_SUFFIXES", "SniffedFile", "expand_paths", "open_bytes", "sniff"]

TRACE_SUFFIXES = (".json", ".jsonl", ".ndjson")
_SINK_NAME = re.compile(r"spans-\d+-\d+\.jsonl(\.gz)?$")
_GZIP_MAGIC = b"\x1f\x8b"
_HEAD = 256 * 1024


@dataclass
class SniffedFile:
    path: Path
    kind: str  # otlp | sink | jaeger | otlp-other | empty | unknown
    gzip: bool
    lines: bool  # True: one JSON value per line; False: one (possibly multi-line) document
    size: int


def expand_paths(
    paths: list[str | Path], suffixes: tuple[str, ...] = TRACE_SUFFIXES, warnings: list[str] | None = None
) -> list[Path]:
    """Files named, and matching files under directories (recursively, sorted); each file once even
    when named twice (directly and through its directory). A directory without matching files is
    reported in ``warnings``."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and f.name.removesuffix(".gz").endswith(suffixes)
            )  # fmt: skip
            if not found and warnings is not None:
                warnings.append(f"{p}: no {'/'.join(suffixes)} files in this directory: nothing read from it")
        elif p.is_file():
            found = [p]
        else:
            raise UserError(f"{p}: no such file or directory")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def open_bytes(path: Path) -> bytes:
    """The whole file, decompressed when it is gzip (by content, whatever its name)."""
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{path}: corrupt gzip data ({exc})") from None
    return data


def _head(path: Path) -> tuple[bytes, bool]:
    with open(path, "rb") as f:
        raw = f.read(_HEAD)
    if raw[:2] != _GZIP_MAGIC:
        if path.name.endswith(".gz") and raw:
            raise UserError(f"{path}: named .gz but is not gzip data")
        return raw, False
    try:
        with gzip.open(path, "rb") as g:
            return g.read(_HEAD), True
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: corrupt gzip data ({exc})") from None


def sniff(path: Path) -> SniffedFile:
    """Kind of a trace file from its first 256 KiB; raises UserError for unreadable/binary files."""
    try:
        head, is_gz = _head(path)
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    text = head.lstrip()
    if not text:
        return SniffedFile(path, "empty", is_gz, True, size)
    if b"\x00" in head[:4096] or text[:1] not in (b"{", b"["):
        raise UserError(f"{path}:1: not JSON (starts with {head[:16]!r})")
    first_line = text.split(b"\n", 1)[0]
    # one JSON value per line: the first line parses alone, or (a bad first line) the next line opens
    # another object; a pretty-printed document starts with "{" alone and continues indented
    second = text.split(b"\n", 2)[1].lstrip(b" \t\r") if text.count(b"\n") >= 1 else b""
    lines = text[:1] == b"{" and (
        b"\n" not in text or _is_json(first_line) or (first_line.strip() != b"{" and second[:1] == b"{")
    )
    window = text[:8192]
    if b'"resourceSpans"' in window:
        kind = "sink" if _SINK_NAME.search(path.name) else "otlp"
    elif b'"resourceLogs"' in window or b'"resourceMetrics"' in window:
        kind = "otlp-other"
    elif b'"traceID"' in window or (text[:1] == b"{" and b'"data"' in window):
        kind = "jaeger"
    else:
        kind = "unknown"
    return SniffedFile(path, kind, is_gz, lines, size)


def _is_json(line: bytes) -> bool:
    import orjson

    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True
