"""Which finished requests keep their trace, and with what probability (OpenTelemetry's ``th``).

The keep decision is taken when a request has finished (measure, then publish), but it only depends
on things known by then: the trace id (chosen at request start, so exemplars and propagation can use
it at once), the caller's ``sampled`` flag and ``tracestate``, the request's duration and its outcome.

Policy, first match wins (configuration: explicit argument, then environment, then default):

* ``OTEL_TRACES_SAMPLER=always_off`` keeps nothing.
* a request that failed (5xx status or an exception) is kept (reason ``error``);
* a request slower than ``slow_threshold_ms`` is kept (reason ``slow``);
* otherwise the *head* sampler decides (reason ``baseline``): the explicit ``baseline_sample``
  argument if given (a trace-id ratio), else ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``
  (``always_on``, ``traceidratio``, ``parentbased_always_on``, ``parentbased_always_off``,
  ``parentbased_traceidratio``; the ``parentbased_*`` ones follow the caller's ``sampled`` flag when a
  ``traceparent`` came in), else ``STAGESCOPE_BASELINE_SAMPLE`` (a trace-id ratio), else
  :data:`DEFAULT_BASELINE_SAMPLE`.

**Probability sampling** (OpenTelemetry ``specification/trace/tracestate-probability-sampling.md``,
``tracestate-handling.md`` and the ``TraceIdRatioBased`` section of ``sdk.md``): a ratio ``p`` becomes
a 56-bit *rejection threshold* ``T = (1 - p) * 2^56`` rounded to 4 significant hex digits (the SDK
default precision; :func:`probability_to_threshold`); a trace is kept when its randomness ``R`` (the
low 56 bits of the trace id, or the caller's explicit ``rv``) satisfies ``R >= T``. That is the
*consistent* rule: a service sampling at a higher ratio keeps every trace one at a lower ratio keeps.
Every kept span says with what probability it was kept, in the ``ot`` entry of its W3C
``tracestate``: ``th:0`` for slow and failed requests (kept whatever their trace id: probability 1)
and for ``always_on``, ``th:<T in hex, trailing zeros dropped>`` for a ratio's baseline keeps, the
caller's ``th`` when a ``parentbased_*`` sampler follows a caller that sent one (checked for
consistency, ``R >= th``); when the probability is unknown (a ``parentbased_*`` sampler following a
caller that sent no ``th``) no ``th`` is written, as the specification requires. Other ``ot``
sub-keys (``rv``) and other vendors' tracestate entries of the caller are kept.

The Python SDK's own ``TraceIdRatioBased`` (opentelemetry-sdk 1.45) still keeps ``low 64 bits of the
trace id < p * 2^64`` and writes no ``th``: for the same ratio it keeps a different set of traces, so a
Python service on that sampler and a stagescope service at the same ratio do not keep the same traces.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from stagescope.names import (
    ENV_BASELINE_SAMPLE,
    ENV_SLOW_THRESHOLD_MS,
    OT_RANDOMNESS,
    OT_THRESHOLD,
    SAMPLED_BASELINE,
    SAMPLED_ERROR,
    SAMPLED_SLOW,
    SAMPLING_MAX_THRESHOLD,
    TRACESTATE_OT,
)

__all__ = [
    "DEFAULT_BASELINE_SAMPLE",
    "DEFAULT_SLOW_THRESHOLD_MS",
    "REASON_BASELINE",
    "REASON_ERROR",
    "REASON_SLOW",
    "TH_PRECISION",
    "CallerState",
    "SamplingPolicy",
    "parse_tracestate",
    "probability_to_threshold",
    "threshold_probability",
    "threshold_to_th",
]

_log = logging.getLogger(__name__)

#: Requests slower than this (milliseconds) always keep their trace, by default.
DEFAULT_SLOW_THRESHOLD_MS = 250.0
#: Share of the other requests that keep their trace, by default.
DEFAULT_BASELINE_SAMPLE = 0.01

REASON_SLOW = SAMPLED_SLOW
REASON_ERROR = SAMPLED_ERROR
REASON_BASELINE = SAMPLED_BASELINE

#: Significant hex digits of a ratio's threshold (the specification's recommended SDK default).
TH_PRECISION = 4
_MAX_T = SAMPLING_MAX_THRESHOLD
_MASK56 = _MAX_T - 1
_HEAD_MODES = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
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


def _env_float(env: Mapping[str, str], key: str) -> float | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """A resolved sampling configuration; :meth:`decide` is called once per finished request and
    :meth:`tracestate` once per kept one.

    ``head``: one of the ``OTEL_TRACES_SAMPLER`` values above (a ratio sampler is ``traceidratio``);
    ``ratio``: its ratio; ``slow_ns``: the tail threshold in nanoseconds (``None``: no slow rule).
    """

    head: str
    ratio: float
    slow_ns: int | None
    _threshold: int = field(init=False, repr=False, compare=False)
    _baseline_ts: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = probability_to_threshold(self.ratio)
        object.__setattr__(self, "_threshold", t)
        root = self.head.removeprefix("parentbased_")
        th = None
        if root == "always_on":
            th = "0"
        elif root == "traceidratio" and t < _MAX_T:
            th = threshold_to_th(t)
        object.__setattr__(self, "_baseline_ts", _tracestate(th, None))

    @property
    def threshold(self) -> int:
        """The head ratio's rejection threshold (2^56 for a ratio of 0: nothing passes)."""
        return self._threshold

    @classmethod
    def resolve(
        cls,
        *,
        slow_threshold_ms: float | None = None,
        baseline_sample: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SamplingPolicy:
        """Resolve the policy from arguments, then the environment, then the defaults."""
        env = os.environ if env is None else env
        if slow_threshold_ms is None:
            slow_threshold_ms = _env_float(env, ENV_SLOW_THRESHOLD_MS)
        if slow_threshold_ms is None:
            slow_threshold_ms = DEFAULT_SLOW_THRESHOLD_MS
        if slow_threshold_ms < 0:
            raise ValueError(f"slow_threshold_ms must be >= 0, got {slow_threshold_ms}")
        slow_ns = int(slow_threshold_ms * 1e6)

        if baseline_sample is not None:
            return cls("traceidratio", _check_ratio(baseline_sample, "baseline_sample"), slow_ns)
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        if sampler:
            if sampler not in _HEAD_MODES:
                _log.warning(
                    "OTEL_TRACES_SAMPLER=%r is not supported here; using parentbased_always_on", sampler
                )
                sampler = "parentbased_always_on"
            ratio = 1.0
            if sampler.endswith("traceidratio"):
                arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
                try:
                    ratio = _check_ratio(float(arg), "OTEL_TRACES_SAMPLER_ARG") if arg else 1.0
                except ValueError:
                    _log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio in [0, 1]; using 1.0", arg)
                    ratio = 1.0
            return cls(sampler, ratio, slow_ns)
        env_ratio = _env_float(env, ENV_BASELINE_SAMPLE)
        if env_ratio is not None:
            return cls("traceidratio", _check_ratio(env_ratio, ENV_BASELINE_SAMPLE), slow_ns)
        return cls("traceidratio", DEFAULT_BASELINE_SAMPLE, slow_ns)

    @property
    def keeps_everything(self) -> bool:
        """True when every trace is kept (``always_on``, or a ratio of 1)."""
        return self.head == "always_on" or (self.head == "traceidratio" and self.ratio >= 1.0)

    def head_keep(self, trace_id: int, parent_sampled: bool | None, rv: int | None = None) -> bool:
        """The head sampler's decision; ``parent_sampled`` is ``None`` when no traceparent came in,
        ``rv`` the caller's explicit randomness (else the low 56 bits of the trace id are used)."""
        head = self.head
        if head.startswith("parentbased_"):
            if parent_sampled is not None:
                return parent_sampled
            head = head[len("parentbased_") :]
        if head == "always_on":
            return True
        if head == "always_off":
            return False
        return (rv if rv is not None else trace_id & _MASK56) >= self._threshold

    def decide(
        self,
        trace_id: int,
        parent_sampled: bool | None,
        duration_ns: int,
        failed: bool,
        rv: int | None = None,
    ) -> str | None:
        """The reason a finished request keeps its trace (``error``, ``slow``, ``baseline``) or None."""
        if self.head == "always_off":
            return None
        if failed:
            return REASON_ERROR
        if self.slow_ns is not None and duration_ns >= self.slow_ns:
            return REASON_SLOW
        if self.head_keep(trace_id, parent_sampled, rv):
            return REASON_BASELINE
        return None

    def tracestate(
        self,
        reason: str,
        trace_id: int,
        parent_sampled: bool | None,
        caller: CallerState | None = None,
    ) -> str | None:
        """The W3C tracestate of a request kept for ``reason``: its ``ot`` entry says with what
        probability it was kept (see the module docstring); None when there is nothing to say."""
        if reason != REASON_BASELINE:
            th: str | None = "0"
        elif self.head.startswith("parentbased_") and parent_sampled is not None:
            th = None  # the caller decided: its threshold if it sent one that is consistent
            if caller is not None and caller.th is not None:
                r = caller.rv if caller.rv is not None else trace_id & _MASK56
                th = threshold_to_th(caller.th) if r >= caller.th else None
        elif caller is None:
            return self._baseline_ts
        else:
            root = self.head.removeprefix("parentbased_")
            th = "0" if root == "always_on" else threshold_to_th(self._threshold)
        if caller is None:
            return TRACESTATE_P1 if th == "0" else _tracestate(th, None)
        return _tracestate(th, caller)


def _check_ratio(value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a ratio between 0 and 1, got {value}")
    return float(value)
