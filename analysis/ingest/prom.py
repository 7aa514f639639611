"""Prometheus text exposition snapshots -> ``metric_samples``.

Tolerates what real scrapes and hand-kept fixtures contain: mixed metric families, comments other
than ``HELP``/``TYPE`` (``# NOTE ...``), empty ``# HELP NAME`` lines, spaces after the commas between
labels, a trailing comma, label-less samples, no trailing newline, ``NaN``/``+Inf``, optional
millisecond timestamps, and OpenMetrics text (prometheus/docs docs/specs/om/open_metrics_spec.md,
"Text format"): the ``# EOF`` line, exemplars after a sample (``x_bucket{le="0.1"} 8 # {trace_id="..."}
0.05 1.7e9``, dropped: they are one observation, not the counts), ``_created`` samples (kept as their
own metric, read by nobody), sample names whose colons the writer escaped (restored from the
``# TYPE`` line, see :func:`_colon_families`) and timestamps in **seconds** (a float, or an integer in a file ending in
``# EOF``; an integer of 1e11 or more there is taken as milliseconds, as the exposition format and
stagescope's scrape recorder write them). dcgm-exporter's "blank" sentinels (int64 values
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
#: A sample's name and labels (label values may hold ``}``, ``#`` and escaped quotes); the rest of
#: the line is ``value [timestamp] [# exemplar]``.
_HEAD = re.compile(rf'^({_NAME})(?:\s*(\{{(?:[^"}}]|"(?:[^"\\]|\\.)*")*\}}))?')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
#: An OpenMetrics integer timestamp this large is milliseconds (seconds would be after the year 5000).
_MS_FROM = 10**11
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
    lines = text.splitlines()
    openmetrics = any(line.strip() == "# EOF" for line in lines)
    unescape = _colon_families(lines) if openmetrics else {}
    for no, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        where = f"{source}:{no}"
        m = _HEAD.match(s)
        rest = s[m.end() :] if m else ""
        if m and rest.lstrip().startswith("{"):
            raise UserError(f"{where}: malformed labels {rest.strip()[:60]!r}")
        fields = rest.split("#", 1)[0].split()  # an OpenMetrics exemplar follows " # "
        if not m or not rest[:1].isspace() or len(fields) not in (1, 2):
            raise UserError(f"{where}: not a Prometheus exposition line: {s[:60]!r}")
        name, labels = m.groups()
        if unescape and ":" not in name:
            name = _unescaped(name, unescape)
        raw, ts = fields[0], (fields[1] if len(fields) == 2 else None)
        yield (
            name,
            _labels(labels, where) if labels else {},
            _value(name, raw, where),
            _timestamp_ms(ts, openmetrics, where) if ts else None,
        )


def _colon_families(lines: list[str]) -> dict[str, str]:
    """``# TYPE`` families whose names hold a colon (``vllm:...``, ``sglang:...``), by their name with
    underscores: prometheus_client 0.26's OpenMetrics writer keeps the colon on ``# HELP``/``# TYPE``
    but escapes the samples' names with the label-name character set (openmetrics/exposition.py
    ``generate_latest``: ``_escape(s.name, escaping, _is_legacy_labelname_rune)``), so a vLLM scrape
    negotiated as OpenMetrics writes ``vllm_e2e_request_latency_seconds_bucket``."""
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#" and parts[1] == "TYPE" and ":" in parts[2]:
            out[parts[2].replace(":", "_")] = parts[2]
    return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))  # the longest family name first


def _unescaped(name: str, families: dict[str, str]) -> str:
    """``name`` with its family's colons restored (see :func:`_colon_families`)."""
    for escaped, family in families.items():
        if name == escaped or (name.startswith(escaped) and name[len(escaped)] == "_"):
            return family + name[len(escaped) :]
    return name


def _timestamp_ms(raw: str, openmetrics: bool, where: str) -> int:
    """A sample's timestamp in Unix ms: the text format writes integer ms, OpenMetrics seconds (see
    the module docstring)."""
    if re.fullmatch(r"-?\d{1,20}", raw):
        v = int(raw)
        ms = v * 1000 if openmetrics and abs(v) < _MS_FROM else v
    else:
        try:
            seconds = float(raw)
        except ValueError:
            raise UserError(f"{where}: timestamp {raw[:24]!r} is not a number") from None
        if not math.isfinite(seconds):
            raise UserError(f"{where}: timestamp {raw[:24]!r} is not a finite number")
        ms = round(seconds * 1000)
    if not -(2**63) <= ms < 2**63:  # the exposition format's int64 milliseconds
        shown = raw if len(raw) <= 24 else raw[:21] + "..."
        raise UserError(f"{where}: timestamp {shown} is not Unix milliseconds (larger than a 64-bit integer)")
    return ms


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
