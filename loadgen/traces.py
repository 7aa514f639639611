"""Read real arrival traces into a :class:`~stagescope.loadgen.schedule.Schedule`.

Formats (detected from the content, not the file name):

* **Azure LLM inference trace** CSV, header ``TIMESTAMP,ContextTokens,GeneratedTokens``; the 2023
  files write ``2023-11-16 18:17:03.9799600`` (7 fractional digits, no time zone), the 2024 files mix
  ``2024-05-10 00:00:00.009930+00:00`` and ``2024-05-12 00:00:00+00:00``. Timestamps without a zone
  are taken as UTC. ContextTokens/GeneratedTokens become prompt and output lengths.
* **Mooncake** JSONL: ``{"timestamp": ms from trace start, "input_length", "output_length",
  "hash_ids": [...]}``; ``hash_ids`` are 512-token prefix blocks, kept so that the generated prompts
  of requests sharing leading ids share a prefix.
* **Plain CSV of arrival offsets** in seconds: one number per line, optionally with a header whose
  first column is one of :data:`OFFSET_COLUMNS` and optional ``prompt_tokens``/``output_tokens``
  columns.

Bad input raises :class:`~stagescope.errors.UserError` naming the file and line.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from stagescope.errors import UserError
from stagescope.loadgen.limits import MAX_TOKENS
from stagescope.loadgen.schedule import Schedule

__all__ = ["AZURE_HEADER", "OFFSET_COLUMNS", "read_trace"]

AZURE_HEADER: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Accepted names of the offset column of a plain CSV (seconds from the trace start).
OFFSET_COLUMNS: tuple[str, ...] = ("offset_s", "offset", "arrival_s", "time_s", "timestamp_s", "t")
_PROMPT_COLUMNS = ("prompt_tokens", "input_tokens", "input_length", "contexttokens")
_OUTPUT_COLUMNS = ("output_tokens", "output_length", "max_tokens", "generatedtokens")
#: Mooncake's prefix-block size in tokens (FAST'25 release README).
MOONCAKE_BLOCK_TOKENS = 512


def read_trace(path: str | Path) -> Schedule:
    """Read an Azure CSV, Mooncake JSONL or plain offsets CSV; offsets start at 0, sorted by time."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: no such trace file") from None
    except OSError as exc:  # the reason alone ("Is a directory"), not the exception's repr of the path
        raise UserError(f"{p}: cannot read trace: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: cannot read trace: {exc}") from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise UserError(f"{p}: empty trace file")
    head = lines[first].strip()
    if head.startswith("{"):
        schedule = _read_mooncake(p, lines)
    elif tuple(c.strip() for c in head.split(",")) == AZURE_HEADER:
        schedule = _read_azure(p, lines, first)
    else:
        schedule = _read_offsets(p, lines, first)
    if not len(schedule):
        raise UserError(f"{p}: trace has a header but no requests")
    return _sorted(schedule).shifted_to_zero()


def _sorted(s: Schedule) -> Schedule:
    if len(s) < 2 or bool(np.all(np.diff(s.offsets_s) >= 0)):
        return s
    order = np.argsort(s.offsets_s, kind="stable")
    hashes = [s.hash_ids[int(i)] for i in order] if s.hash_ids is not None else None
    return Schedule(
        s.offsets_s[order],
        s.prompt_tokens[order] if s.prompt_tokens is not None else None,
        s.output_tokens[order] if s.output_tokens is not None else None,
        hashes,
        s.duration_s,
        s.source,
        s.block_tokens,
    )


def _count(p: Path, lineno: int, raw: str, what: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise UserError(f"{p}:{lineno}: {what} is not an integer: {raw.strip()!r}") from None
    if value < 0:
        raise UserError(f"{p}:{lineno}: {what} is negative: {value}")
    if value > MAX_TOKENS:
        raise UserError(f"{p}:{lineno}: {what} is {value}; at most {MAX_TOKENS} tokens per request")
    return value


def _parse_timestamp(p: Path, lineno: int, raw: str) -> int:
    """Azure timestamp -> Unix ns. Up to 9 fractional digits kept (the 2023 files have 7)."""
    s = raw.strip()
    frac_ns = 0
    dot = s.find(".")
    if dot >= 0:
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        digits = s[dot + 1 : end]
        if not digits or len(digits) > 9:
            raise UserError(f"{p}:{lineno}: bad TIMESTAMP fraction: {s!r}")
        frac_ns = int(digits.ljust(9, "0"))
        s = s[:dot] + s[end:]
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise UserError(
            f"{p}:{lineno}: bad TIMESTAMP {raw.strip()!r} (want YYYY-MM-DD HH:MM:SS[.fffffff][+00:00])"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * 1_000_000_000 + frac_ns


def _read_azure(p: Path, lines: list[str], header_index: int) -> Schedule:
    stamps: list[int] = []
    prompt: list[int] = []
    output: list[int] = []
    for i in range(header_index + 1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        lineno = i + 1
        parts = line.split(",")
        if len(parts) != 3:
            raise UserError(
                f"{p}:{lineno}: expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), got {len(parts)}"
            )
        stamps.append(_parse_timestamp(p, lineno, parts[0]))
        prompt.append(_count(p, lineno, parts[1], "ContextTokens"))
        output.append(_count(p, lineno, parts[2], "GeneratedTokens"))
    ns = np.asarray(stamps, dtype=np.int64)
    offsets = (ns - ns.min()).astype(np.float64) / 1e9 if len(ns) else np.empty(0)
    return Schedule(
        offsets,
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
        None,
        float(offsets.max()) if len(offsets) else 0.0,
        source=str(p),
    )


def _read_mooncake(p: Path, lines: list[str]) -> Schedule:
    stamps: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hashes: list[tuple[int, ...]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lineno = i + 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}:{lineno}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise UserError(f"{p}:{lineno}: expected a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in row]
        if missing:
            raise UserError(
                f"{p}:{lineno}: missing {', '.join(missing)} (Mooncake rows need timestamp, input_length, output_length)"
            )
        ts = row["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts < math.inf:
            raise UserError(f"{p}:{lineno}: timestamp must be non-negative milliseconds, got {ts!r}")
        stamps.append(float(ts) / 1000.0)
        for key, dest in (("input_length", prompt), ("output_length", output)):
            v = row[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS:
                raise UserError(f"{p}:{lineno}: {key} must be an integer from 0 to {MAX_TOKENS}, got {v!r}")
            dest.append(v)
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise UserError(f"{p}:{lineno}: hash_ids must be a list of integers")
        hashes.append(tuple(ids))
    offsets = np.asarray(stamps, dtype=np.float64)
    return Schedule(
        offsets,
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
        hashes,
        float(offsets.max() - offsets.min()) if len(offsets) else 0.0,
        source=str(p),
        block_tokens=MOONCAKE_BLOCK_TOKENS,
    )


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _read_offsets(p: Path, lines: list[str], first: int) -> Schedule:
    header = [c.strip().lower() for c in lines[first].split(",")]
    prompt_col = output_col = None
    start = first
    if _is_number(header[0]):
        if len(header) != 1:
            raise UserError(
                f"{p}:{first + 1}: unknown column layout: a headerless offsets CSV has one column (seconds)"
            )
    else:
        if header[0] not in OFFSET_COLUMNS:
            raise UserError(
                f"{p}:{first + 1}: unknown column layout {lines[first].strip()!r}; expected an Azure trace "
                f"({','.join(AZURE_HEADER)}), Mooncake JSONL, or an offsets CSV whose first column is "
                f"one of {', '.join(OFFSET_COLUMNS)}"
            )
        for j, name in enumerate(header[1:], start=1):
            if name in _PROMPT_COLUMNS:
                prompt_col = j
            elif name in _OUTPUT_COLUMNS:
                output_col = j
            else:
                raise UserError(f"{p}:{first + 1}: unknown column {name!r} in offsets CSV")
        start = first + 1
    width = len(header)
    offsets: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    for i in range(start, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        lineno = i + 1
        parts = line.split(",")
        if len(parts) != width:
            raise UserError(f"{p}:{lineno}: expected {width} field(s), got {len(parts)}")
        try:
            t = float(parts[0])
        except ValueError:
            raise UserError(f"{p}:{lineno}: offset is not a number: {parts[0].strip()!r}") from None
        if not np.isfinite(t) or t < 0:
            raise UserError(f"{p}:{lineno}: offset must be a finite number of seconds >= 0, got {t}")
        offsets.append(t)
        if prompt_col is not None:
            prompt.append(_count(p, lineno, parts[prompt_col], header[prompt_col]))
        if output_col is not None:
            output.append(_count(p, lineno, parts[output_col], header[output_col]))
    arr = np.asarray(offsets, dtype=np.float64)
    return Schedule(
        arr,
        np.asarray(prompt, dtype=np.int64) if prompt_col is not None else None,
        np.asarray(output, dtype=np.int64) if output_col is not None else None,
        None,
        float(arr.max() - arr.min()) if len(arr) else 0.0,
        source=str(p),
    )
