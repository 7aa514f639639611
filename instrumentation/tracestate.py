"""OpenTelemetry's ``ot`` entry of the W3C tracestate: sampling thresholds and randomness.

Specification: ``trace/tracestate-probability-sampling.md`` and ``trace/tracestate-handling.md``. A
sampler's *rejection threshold* ``T`` is a 56-bit value, ``(1 - p) * 2^56`` for probability ``p``,
written as ``th:<hex>`` (14 hex digits with the trailing zeros dropped; ``th:0`` = probability 1);
``rv:<14 hex digits>`` is an explicit 56-bit randomness value. Plain functions, no state: the policy
that uses them is :mod:`stagescope.instrumentation.sampling`. Also :func:`parse_traceparent`, the
W3C ``traceparent`` header the tracestate travels with (the middleware reads both per request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stagescope.names import OT_RANDOMNESS, OT_THRESHOLD, SAMPLING_MAX_THRESHOLD, TRACESTATE_OT

__all__ = [
    "TH_PRECISION",
    "TRACESTATE_P1",
    "CallerState",
    "parse_traceparent",
    "parse_tracestate",
    "probability_to_threshold",
    "threshold_probability",
    "threshold_to_th",
]

_MAX_T = SAMPLING_MAX_THRESHOLD
_MASK56 = _MAX_T - 1

#: Significant hex digits of a ratio's threshold (the specification's recommended SDK default).
TH_PRECISION = 4
#: The tracestate of a span kept with probability 1 (slow, failed, always_on).
TRACESTATE_P1 = f"{TRACESTATE_OT}={OT_THRESHOLD}:0"


def probability_to_threshold(p: float, precision: int = TH_PRECISION) -> int:
    """The 56-bit rejection threshold of sampling probability ``p`` (in ``(0, 1]``), rounded to
    ``precision`` significant hex digits of ``p`` (more digits of the threshold for small ``p``, whose
    threshold starts with ``f``s), as the specification's conversion does: 0.01 -> ``fd70a``, 0.1 ->
    ``e666``, 1 -> 0. ``p`` below 2^-56 gets the largest threshold (about one trace in 2^56)."""
    if p >= 1.0:
        return 0
    if p <= 0.0:
        return _MAX_T  # never: no randomness value reaches it (not a probability; never written)
    _, exp = math.frexp(p)
    digits = max(1, min(14, precision + exp // -4))
    unit = 16 ** (14 - digits)
    t = _MAX_T - round(p * _MAX_T)
    return min(_MASK56, (t + unit // 2) // unit * unit)


def threshold_to_th(threshold: int) -> str:
    """``th`` value of a threshold: 14 hex digits with the trailing zeros dropped (``0`` for 0)."""
    return "0" if threshold == 0 else format(threshold, "014x").rstrip("0")


def threshold_probability(threshold: int) -> float:
    """Sampling probability of a rejection threshold: ``(2^56 - threshold) / 2^56``."""
    return (_MAX_T - threshold) / _MAX_T


def _hex56(value: str, exact: bool) -> int | None:
    """A 56-bit value from 1-14 hex digits padded with trailing zeros (``th``), or exactly 14 (``rv``)."""
    if not 1 <= len(value) <= 14 or (exact and len(value) != 14):
        return None
    try:
        return int(value.ljust(14, "0"), 16)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class CallerState:
    """What a caller's ``tracestate`` says about sampling: its ``th`` and ``rv`` (None when absent or
    invalid), the other ``ot`` sub-keys and the other vendors' entries (kept as they came)."""

    th: int | None = None
    rv: int | None = None
    ot_rest: tuple[str, ...] = ()
    others: tuple[str, ...] = ()


def parse_tracestate(header: str) -> CallerState:
    """The sampling part of a W3C ``tracestate`` header value (see :class:`CallerState`)."""
    th = rv = None
    ot_rest: list[str] = []
    others: list[str] = []
    for member in header.split(","):
        member = member.strip()
        if not member:
            continue
        key, _, value = member.partition("=")
        if key.strip() != TRACESTATE_OT:
            others.append(member)
            continue
        for sub in value.split(";"):
            k, _, v = sub.partition(":")
            if k == OT_THRESHOLD:
                th = _hex56(v, exact=False)
            elif k == OT_RANDOMNESS:
                rv = _hex56(v, exact=True)
                ot_rest.append(sub)
            elif sub:
                ot_rest.append(sub)
    return CallerState(th, rv, tuple(ot_rest), tuple(others))


def _tracestate(th: str | None, caller: CallerState | None) -> str | None:
    """Our tracestate: the ``ot`` entry first (with ``th`` when known), then the caller's others."""
    if caller is None:
        return f"{TRACESTATE_OT}={OT_THRESHOLD}:{th}" if th is not None else None
    subs = ([f"{OT_THRESHOLD}:{th}"] if th is not None else []) + list(caller.ot_rest)
    members = ([f"{TRACESTATE_OT}={';'.join(subs)}"] if subs else []) + list(caller.others)
    return ",".join(members) or None


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """``(trace_id, parent_span_id, sampled)`` from a W3C ``traceparent`` value, or None if invalid."""
    if len(value) < 55 or value[2:3] != b"-" or value[35:36] != b"-" or value[52:53] != b"-":
        return None
    if value[:2] == b"ff" or (len(value) > 55 and (value[:2] == b"00" or value[55:56] != b"-")):
        return None
    try:
        trace_id = int(value[3:35], 16)
        span_id = int(value[36:52], 16)
        flags = int(value[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or b"+" in value[:55] or b" " in value[:55]:
        return None
    return trace_id, span_id, bool(flags & 1)
