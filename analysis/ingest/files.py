"""Finding input files and telling their format from their first bytes (not from their names).

The format is the reader that claims the file (:func:`stagescope.analysis.ingest.readers.detect`:
OTLP/JSON, Jaeger v2's API v3, Triton's trace file, Zipkin v2, Jaeger, OTLP logs/metrics); files
no reader claims are ``unknown``, files with nothing in them ``empty``. Directories are walked
recursively; only files whose name ends in ``.json``, ``.jsonl``, ``.ndjson`` (optionally ``.gz``),
or ``.json.<N>`` (Triton's indexed trace files, ``file.0``, ``file.1``, ... with ``log-frequency``)
are taken from a directory, files named explicitly are always read.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stagescope.analysis.ingest.readers import Head, detect
from stagescope.errors import UserError
from stagescope.paths import not_readable_reason

if TYPE_CHECKING:
    from stagescope.analysis.ingest.readers import Reader

__all__ = ["TRACE_SUFFIXES", "SniffedFile", "expand_paths", "open_bytes", "sniff"]

TRACE_SUFFIXES = (".json", ".jsonl", ".ndjson")
#: Triton's trace files written with ``log-frequency``: ``<file>.<index>`` (server src/tracer.cc
#: ``TraceFile::SaveTraces``).
_INDEXED = re.compile(r"\.json\.\d+$")
_GZIP_MAGIC = b"\x1f\x8b"
_HEAD = 256 * 1024


@dataclass
class SniffedFile:
    path: Path
    kind: str  # the reader's kind (otlp, sink, jaeger-v3, triton-trace, zipkin, jaeger) | empty | unknown
    gzip: bool
    lines: bool  # True: one JSON value per line; False: one (possibly multi-line) document
    size: int
    reader: Reader | None = None
    head: bytes = field(default=b"", repr=False)  # the first bytes detection saw (whitespace stripped)


def expand_paths(
    paths: list[str | Path], suffixes: tuple[str, ...] = TRACE_SUFFIXES, warnings: list[str] | None = None
) -> list[Path]:
    """Files named, and matching files under directories (recursively, sorted); each file once even
    when named twice (directly and through its directory). A directory without matching files is
    reported in ``warnings``."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if os.path.isdir(p):  # os.path, not Path.is_dir(): that raises for a name too long
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and _wanted(f.name, suffixes)
            )  # fmt: skip
            if not found and warnings is not None:
                warnings.append(f"{p}: no {'/'.join(suffixes)} files in this directory: nothing read from it")
        elif os.path.isfile(p):
            found = [p]
        else:
            raise UserError(f"{p}: {not_readable_reason(p)}")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _wanted(name: str, suffixes: tuple[str, ...]) -> bool:
    bare = name.removesuffix(".gz")
    return bare.endswith(suffixes) or (suffixes == TRACE_SUFFIXES and bool(_INDEXED.search(bare)))


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
    """Format of a trace file from its first 256 KiB; raises UserError for unreadable/binary files."""
    try:
        head, is_gz = _head(path)
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    text = head.lstrip()
    if not text:
        return SniffedFile(path, "empty", is_gz, True, size)
    nul = head.find(b"\x00", 0, 4096)
    if nul >= 0 and text[:1] in (b"{", b"["):  # JSON-looking text with a NUL byte: say where, not ":1"
        line = head.count(b"\n", 0, nul) + 1
        raise UserError(f"{path}:{line}: binary data (a NUL byte at offset {nul}), not JSON text")
    if nul >= 0 or text[:1] not in (b"{", b"["):
        raise UserError(f"{path}:1: not JSON (starts with {head[:16]!r})")
    first_line = text.split(b"\n", 1)[0]
    # one JSON value per line: the first line parses alone, or (a bad first line) the next line opens
    # another object; a pretty-printed document starts with "{" alone and continues indented
    second = text.split(b"\n", 2)[1].lstrip(b" \t\r") if text.count(b"\n") >= 1 else b""
    lines = text[:1] == b"{" and (
        b"\n" not in text or _is_json(first_line) or (first_line.strip() != b"{" and second[:1] == b"{")
    )
    reader = detect(Head(path, text, lines))
    kind = reader.kind_of(path) if reader is not None else "unknown"
    return SniffedFile(path, kind, is_gz, lines, size, reader, text[:8192])


def _is_json(line: bytes) -> bool:
    import orjson

    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True
