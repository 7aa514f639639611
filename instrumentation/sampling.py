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
  ``traceparent`` came in), else ``STAGESCOPE_BASELINE_SAMPLE`` (a trace-id ratio), else the
  default: :data:`DEFAULT_BASELINE_SAMPLE`, raised on a quiet route so that it keeps about
  :data:`DEFAULT_BASELINE_MIN_PER_S` baseline traces a second (``STAGESCOPE_BASELINE_MIN_PER_S``,
  0 = none; see :class:`RouteFloor`): 1 % of a few dozen requests a second is no baseline at all.

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
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from stagescope.instrumentation.tracestate import (
    _MASK56,
    _MAX_T,
    TH_PRECISION,
    TRACESTATE_P1,
    CallerState,
    _tracestate,
    parse_tracestate,
    probability_to_threshold,
    threshold_probability,
    threshold_to_th,
)
from stagescope.names import (
    ENV_BASELINE_MIN_PER_S,
    ENV_BASELINE_SAMPLE,
    ENV_SLOW_THRESHOLD_MS,
    SAMPLED_BASELINE,
    SAMPLED_ERROR,
    SAMPLED_SLOW,
)

__all__ = [
    "DEFAULT_BASELINE_MIN_PER_S",
    "DEFAULT_BASELINE_SAMPLE",
    "DEFAULT_SLOW_THRESHOLD_MS",
    "REASON_BASELINE",
    "REASON_ERROR",
    "REASON_SLOW",
    "TH_PRECISION",
    "CallerState",
    "RouteFloor",
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
#: By default a route keeps at least about this many baseline traces a second (see RouteFloor).
DEFAULT_BASELINE_MIN_PER_S = 2.0
_MAX_FLOOR_ROUTES = 256

REASON_SLOW = SAMPLED_SLOW
REASON_ERROR = SAMPLED_ERROR
REASON_BASELINE = SAMPLED_BASELINE

_HEAD_MODES = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class RouteFloor:
    """The default head probability per route: ``ratio``, raised so that a route keeps about
    ``per_s`` baseline traces a second. The ``k``-th request of a second on a route (counting those
    the head sampler decides on) is kept with probability ``max(ratio, min(1, per_s / max(prev, k)))``,
    ``prev`` being the route's count in the previous second. It depends only on the requests before
    it, never on this request's latency or trace id, so the ``th`` written for it is truthful and
    ``1 / p`` is its Horvitz-Thompson weight; a busy route keeps ``ratio`` (at 1 %, from 200 requests
    a second up). (A reservoir, "the first N a second", would not say with what probability.)"""

    __slots__ = ("_busy", "_busy_t", "_cache", "_state", "per_s", "ratio")

    def __init__(self, per_s: float, ratio: float) -> None:
        self.per_s, self.ratio = per_s, ratio
        self._state: dict[str, list[int]] = {}  # route -> [second, count in it, count in the one before]
        self._cache: dict[int, int] = {}  # max(prev, k) -> threshold
        # past this count per_s / count is below ratio, so the probability is ratio itself (a busy
        # route): its threshold without a look-up (the margin keeps float rounding out of it)
        self._busy = per_s / ratio * (1 + 1e-9) if ratio > 0 else math.inf
        self._busy_t = probability_to_threshold(ratio)

    def threshold(self, route: str, now_s: int) -> int:
        """The rejection threshold for the next head decision on ``route`` at monotonic second ``now_s``."""
        st = self._state.get(route)
        if st is None:
            if len(self._state) >= _MAX_FLOOR_ROUTES:
                route = ""  # bounded, as the route label is: the rest share one floor
            st = self._state.setdefault(route, [now_s, 0, 0])
        if st[0] != now_s:
            st[2] = st[1] if now_s == st[0] + 1 else 0
            st[0], st[1] = now_s, 0
        k = st[1] = st[1] + 1
        d = st[2] if st[2] > k else k
        if d > self._busy:
            return self._busy_t
        t = self._cache.get(d)
        if t is None:
            t = probability_to_threshold(max(self.ratio, min(1.0, self.per_s / d)))
            if len(self._cache) < 4096:
                self._cache[d] = t
        return t


def _env_float(env: Mapping[str, str], key: str) -> float | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"environment variable {key}={raw!r} is not a finite number")
    return value


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """A resolved sampling configuration; :meth:`decide` is called once per finished request and
    :meth:`tracestate` once per kept one.

    ``head``: one of the ``OTEL_TRACES_SAMPLER`` values above (a ratio sampler is ``traceidratio``);
    ``ratio``: its ratio; ``slow_ns``: the tail threshold in nanoseconds (``None``: no slow rule);
    ``min_per_s``: the default policy's floor of baseline traces a second per route (:class:`RouteFloor`).
    """

    head: str
    ratio: float
    slow_ns: int | None
    min_per_s: float | None = None
    _threshold: int = field(init=False, repr=False, compare=False)
    _baseline_ts: str | None = field(init=False, repr=False, compare=False)
    _floor: RouteFloor | None = field(init=False, repr=False, compare=False)
    #: ``head`` taken apart once, for :meth:`keep` (called per request): always_off exactly, a
    #: parent-based sampler, and the root sampler's name
    _off: bool = field(init=False, repr=False, compare=False)
    _parent_based: bool = field(init=False, repr=False, compare=False)
    _root: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = probability_to_threshold(self.ratio)
        object.__setattr__(self, "_threshold", t)
        object.__setattr__(self, "_off", self.head == "always_off")
        object.__setattr__(self, "_parent_based", self.head.startswith("parentbased_"))
        object.__setattr__(self, "_root", self.head.removeprefix("parentbased_"))
        floor = None
        if self.min_per_s and self.head == "traceidratio" and self.ratio < 1.0:
            floor = RouteFloor(self.min_per_s, self.ratio)
        object.__setattr__(self, "_floor", floor)
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
        source = "slow_threshold_ms"
        if slow_threshold_ms is None:
            slow_threshold_ms = _env_float(env, ENV_SLOW_THRESHOLD_MS)
            source = f"environment variable {ENV_SLOW_THRESHOLD_MS}"  # the message names where it came from
        if slow_threshold_ms is None:
            slow_threshold_ms = DEFAULT_SLOW_THRESHOLD_MS
        if not 0 <= slow_threshold_ms < math.inf:  # also refuses nan
            raise ValueError(f"{source} must be a finite number >= 0, got {slow_threshold_ms}")
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
        floor = _env_float(env, ENV_BASELINE_MIN_PER_S)
        if floor is not None and floor < 0:
            raise ValueError(f"{ENV_BASELINE_MIN_PER_S} must be >= 0, got {floor}")
        return cls(
            "traceidratio", DEFAULT_BASELINE_SAMPLE, slow_ns,
            DEFAULT_BASELINE_MIN_PER_S if floor is None else floor,
        )  # fmt: skip

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
        route: str = "",
    ) -> str | None:
        """The reason a finished request keeps its trace (``error``, ``slow``, ``baseline``) or None."""
        return self.keep(trace_id, parent_sampled, duration_ns, failed, rv, route)[0]

    def keep(
        self,
        trace_id: int,
        parent_sampled: bool | None,
        duration_ns: int,
        failed: bool,
        rv: int | None = None,
        route: str = "",
        now_ns: int | None = None,
    ) -> tuple[str | None, int | None]:
        """:meth:`decide`'s reason and the rejection threshold the head ratio used (None where no
        ratio decided: the caller's flag, always_on/off, the tail rules), for :meth:`tracestate`.
        ``now_ns``: the time of the decision on a monotonic clock in nanoseconds (the middleware passes
        the request's end, ``time.perf_counter_ns()``, the same clock as ``time.monotonic_ns()`` on
        Linux and macOS); it places the decision in its second for the route floor (default: now)."""
        if self._off:
            return None, None
        if failed:
            return REASON_ERROR, None
        slow_ns = self.slow_ns
        if slow_ns is not None and duration_ns >= slow_ns:
            return REASON_SLOW, None
        if self._parent_based and parent_sampled is not None:
            return (REASON_BASELINE if parent_sampled else None), None  # the caller decided
        root = self._root
        if root != "traceidratio":
            return (REASON_BASELINE if root == "always_on" else None), None
        floor = self._floor
        if floor is None:
            t = self._threshold
        else:
            t = floor.threshold(route, (time.monotonic_ns() if now_ns is None else now_ns) // 1_000_000_000)
        r = rv if rv is not None else trace_id & _MASK56
        return (REASON_BASELINE, t) if r >= t else (None, None)

    def tracestate(
        self,
        reason: str,
        trace_id: int,
        parent_sampled: bool | None,
        caller: CallerState | None = None,
        threshold: int | None = None,
    ) -> str | None:
        """The W3C tracestate of a request kept for ``reason``: its ``ot`` entry says with what
        probability it was kept (see the module docstring); None when there is nothing to say.
        ``threshold``: the one :meth:`keep` says the head ratio used (default: the policy's ratio)."""
        if reason != REASON_BASELINE:
            th: str | None = "0"
        elif self.head.startswith("parentbased_") and parent_sampled is not None:
            th = None  # the caller decided: its threshold if it sent one that is consistent
            if caller is not None and caller.th is not None:
                r = caller.rv if caller.rv is not None else trace_id & _MASK56
                th = threshold_to_th(caller.th) if r >= caller.th else None
        elif threshold is not None and threshold != self._threshold:
            th = threshold_to_th(threshold)
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
