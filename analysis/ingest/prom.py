"""Prometheus text exposition snapshots -> ``metric_samples``.

Tolerates what real scrapes and hand-kept fixtures contain: mixed metric families, comments other
than ``HELP``/``TYPE`` (``# NOTE ...``), empty ``# HELP NAME`` lines, spaces after the commas between
labels, a trailing comma, label-less samples, no trailing newline, ``NaN``/``+Inf``, optional
millisecond timestamps, OpenMetrics ``# EOF``. dcgm-exporter's "blank" sentinels (int64 values
9223372036854775792..807, int32 2147483632..647, fp64 >= 1.40737488355328e14 on ``DCGM_`` metrics)
mean "no value" and become NULL. A line that is none of these is bad input (file and line named).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from stagescope.analysis.ingest.files import expand_paths, open_bytes
from stagescope.analysis.ingest.traces import FileSummary
from stagescope.errors import UserError
from stagescope.names import DCGM_BLANK_SENTINEL

if TYPE_CHECKING:
    from stagescope.analysis.ingest import Dataset

__all__ = ["METRIC_SUFFIXES", "Sample", "insert_samples", "load_metric_files", "parse_exposition"]

METRIC_SUFFIXES = (".prom", ".txt", ".metrics")
Sample = tuple[str, dict[str, str], float | None, int | None]  # metric, labels, value, ts_ms

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})\s*(\{{.*\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESC = re.compile(r"\\(.)")
_INT64_BLANK_MIN = 9223372036854775792
_INT32_BLANKS = range(2147483632, 2147483648)
_FP64_BLANK = 140737488355328.0


def _labels(text: str, where: str) -> dict[str, str]:
    body = text[1:-1].strip()
    out: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if not m:
            raise UserError(f"{where}: malformed labels {text!r}")
        out[m.group(1)] = _ESC.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
        pos = m.end()
        if m.group(3) == "":
            break
    if body[pos:].strip():
        raise UserError(f"{where}: malformed labels {text!r}")
    return out


def _value(metric: str, raw: str, where: str) -> float | None:
    try:
        v = float(raw)
    except ValueError:
        raise UserError(f"{where}: sample value {raw!r} is not a number") from None
    if math.isnan(v):
        return None
    if math.isinf(v):
        return v
    if v >= float(_INT64_BLANK_MIN) or int(v) == DCGM_BLANK_SENTINEL:
        return None  # dcgm int64 blank / not-found / not-supported sentinels
    if metric.startswith("DCGM_") and ((v.is_integer() and int(v) in _INT32_BLANKS) or v >= _FP64_BLANK):
        return None
    return v


def parse_exposition(text: str, source: str = "<metrics>") -> Iterator[Sample]:
    """Samples of one exposition text; raises :class:`UserError` naming ``source`` and the line."""
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        where = f"{source}:{no}"
        m = _SAMPLE.match(s)
        if not m:
            raise UserError(f"{where}: not a Prometheus exposition line: {s[:60]!r}")
        name, labels, raw, ts = m.groups()
        yield (
            name,
            _labels(labels, where) if labels else {},
            _value(name, raw, where),
            _timestamp(ts, where) if ts else None,
        )


def _timestamp(raw: str, where: str) -> int:
    """A sample's timestamp (Unix ms, an int64 in the exposition format); more digits than that is bad input."""
    ts = int(raw) if len(raw) <= 20 else None
    if ts is None or not -(2**63) <= ts < 2**63:
        shown = raw if len(raw) <= 24 else raw[:21] + "..."
        raise UserError(f"{where}: timestamp {shown} is not Unix milliseconds (larger than a 64-bit integer)")
    return ts


def insert_samples(ds: Dataset, samples: Sequence[Sample], source: str) -> int:
    """Append samples to ``metric_samples``; returns how many."""
    if not samples:
        return 0
    table = pa.table(
        {
            "metric": pa.array([s[0] for s in samples], pa.string()),
            "labels": pa.array([list(s[1].items()) for s in samples], pa.map_(pa.string(), pa.string())),
            "value": pa.array([s[2] for s in samples], pa.float64()),
            "ts_ms": pa.array([s[3] for s in samples], pa.int64()),
            "source": pa.array([source] * len(samples), pa.string()),
        }
    )
    ds.con.register("_samples", table)
    try:
        ds.con.execute("INSERT INTO metric_samples SELECT * FROM _samples")
    finally:
        ds.con.unregister("_samples")
    return len(samples)


def _decode(data: bytes, path: Path) -> str:
    if b"\x00" in data[:4096]:
        raise UserError(f"{path}:1: binary data, not a Prometheus exposition")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: not UTF-8 text") from None


def load_metric_files(ds: Dataset, paths: Sequence[str | Path], *, skip_bad: bool = False) -> None:
    """Exposition files (directories: ``*.prom``, ``*.txt``, ``*.metrics``) into ``metric_samples``."""
    for path in expand_paths(list(paths), METRIC_SUFFIXES, ds.warnings):
        try:
            data = open_bytes(path)
            if not data.strip():
                raise UserError(f"{path}:1: empty file, no samples")
            samples: list[Any] = list(parse_exposition(_decode(data, path), str(path)))
            if not samples:
                raise UserError(f"{path}: no samples (only comments)")
        except UserError as exc:
            if not skip_bad:
                raise
            ds.warnings.append(
                f"skipped file: {exc}: its metrics are not read (accelerator utilization, queue depth and "
                "server counters from it are missing from the evidence)"
            )
            ds.files.append(FileSummary(str(path), "prometheus", skipped=True, note=str(exc)))
            continue
        n = insert_samples(ds, samples, str(path))
        ds.files.append(FileSummary(str(path), "prometheus", samples=n))
