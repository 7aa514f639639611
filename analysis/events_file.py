"""The events file of ``stagescope analyze --events FILE``: deploys, scale events, model swaps and config
changes a team records itself (a CI pipeline, ``kubectl rollout`` hooks, an HPA's event stream), as JSON
lines, read and checked in full before any trace is read.

One JSON object per line (blank lines skipped)::

    {"time": "2026-11-20T12:00:05Z", "kind": "deploy", "target": "ranker", "description": "v3 -> v4"}
    {"time": 1763640005.2, "kind": "scale", "target": "ranker", "replicas_from": 2, "replicas_to": 4}
    {"time": "2026-11-20T12:10:00+01:00", "end": "2026-11-20T12:11:30+01:00", "kind": "model_swap",
     "target": "ranker", "from": "resnet50-v3", "to": "resnet50-v4"}

``time`` (required) and ``end`` (optional: when a rollout completed, a model was ready again) are RFC 3339
times with a zone, or Unix seconds; ``kind`` is one of ``names.EVENT_KINDS`` (deploy, scale,
model_swap, config); ``target``, ``description``, ``from`` and ``to`` are strings; ``replicas_from`` and
``replicas_to`` whole numbers of replicas. Any other key is kept in the event's ``detail``. Every
problem is one :class:`~stagescope.errors.UserError` naming the file, the line and what is wrong.

The event (``report["events"]``, the same shape for every source, see analysis.events)::

    {"time_unix_ms": int, "end_unix_ms": int | None, "kind": str, "source": str,
     "target": str | None, "description": str, "detail": {...}}
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from stagescope import names as N
from stagescope.errors import UserError

__all__ = ["MAX_EVENTS", "make_event", "read_events_file"]

#: Lines an events file may hold (a longer file is almost surely not an events file).
MAX_EVENTS = 100_000
#: Keys with a meaning; any other key of a line is kept in ``detail``.
_STRING_KEYS = ("target", "description", "from", "to")
_INT_KEYS = ("replicas_from", "replicas_to")
#: Unix seconds before this (1973) or from this on (5138) are not seconds: ms or ns, or a typo.
_MIN_S, _MAX_S = 1e8, 1e11


def _time_ms(value: Any, where: str, key: str) -> int:
    """An events-file time (RFC 3339 with a zone, or Unix seconds) as Unix milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserError(f"{where}: '{key}' must be an RFC 3339 time or Unix seconds, got {value!r}"[:300])
    if isinstance(value, int | float):
        v = float(value)
        if not math.isfinite(v) or v < _MIN_S:
            raise UserError(f"{where}: '{key}' {value!r} is not a Unix time in seconds")
        if v >= _MAX_S:
            raise UserError(
                f"{where}: '{key}' {value!r} looks like milliseconds or nanoseconds: give Unix seconds or an "
                "RFC 3339 time"
            )
        return round(v * 1000)
    text = value.strip()
    try:
        dt = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise UserError(
            f"{where}: '{key}' {value[:60]!r} is not an RFC 3339 time (e.g. 2026-11-20T12:00:05Z)"
        ) from None
    if dt.tzinfo is None:
        raise UserError(
            f"{where}: '{key}' {value[:60]!r} has no time zone: add Z or an offset such as +02:00"
        )
    return round(dt.timestamp() * 1000)


def make_event(
    time_ms: int,
    kind: str,
    source: str,
    *,
    end_ms: int | None = None,
    target: str | None = None,
    description: str = "",
    **detail: Any,
) -> dict[str, Any]:
    """One event in the pinned shape (see the module docstring)."""
    return {
        "time_unix_ms": int(time_ms), "end_unix_ms": None if end_ms is None else int(end_ms), "kind": kind,
        "source": source, "target": target, "description": description or kind, "detail": detail,
    }  # fmt: skip


def _line_event(obj: Any, where: str, name: str, lineno: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object with 'time' and 'kind', got {type(obj).__name__}")
    for key in ("time", "kind"):
        if key not in obj:
            raise UserError(f"{where}: missing '{key}'")
    kind = obj["kind"]
    if kind not in N.EVENT_KINDS:
        raise UserError(
            f"{where}: unknown kind {str(kind)[:40]!r}; expected one of {', '.join(N.EVENT_KINDS)}"
        )
    t = _time_ms(obj["time"], where, "time")
    end = None if obj.get("end") is None else _time_ms(obj["end"], where, "end")
    if end is not None and end < t:
        raise UserError(f"{where}: 'end' is before 'time'")
    for key in _STRING_KEYS:
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise UserError(f"{where}: '{key}' must be a string, got {type(obj[key]).__name__}")
    for key in _INT_KEYS:
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UserError(
                f"{where}: '{key}' must be a whole number of replicas (0 or more), got {v!r}"[:300]
            )
    detail = {k: v for k, v in obj.items() if k not in ("time", "end", "kind", "target", "description")}
    return make_event(t, kind, N.EVENT_SOURCE_FILE, end_ms=end, target=obj.get("target"),
                      description=obj.get("description") or "", file=f"{name}:{lineno}", **detail)  # fmt: skip


def read_events_file(path: str | Path) -> list[dict[str, Any]]:
    """The events of a JSON-lines events file, by time (see the module docstring); every problem is
    one :class:`UserError` naming the file and the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: events file not found") from None
    except IsADirectoryError:
        raise UserError(f"{p}: is a directory, expected an events file (JSON lines)") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: not UTF-8 text; an events file is JSON lines") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read events file: {exc.strerror or exc}") from None
    out: list[dict[str, Any]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        if len(out) >= MAX_EVENTS:
            raise UserError(f"{where}: more than {MAX_EVENTS} events; is this an events file?")
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise UserError(f"{where}: not JSON ({msg}); each line must be one JSON object") from None
        out.append(_line_event(obj, where, p.name, lineno))
    out.sort(key=lambda e: e["time_unix_ms"])
    return out
