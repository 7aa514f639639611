"""Which finished requests keep their trace: head sampling from ``OTEL_TRACES_SAMPLER``, plus tail rules.

The keep decision is taken when a request has finished (measure, then publish), but it only depends
on things known by then: the trace id (chosen at request start, so exemplars and propagation can use
it at once), the caller's ``sampled`` flag, the request's duration and its outcome.

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

The ratio rule is OpenTelemetry's ``TraceIdRatioBased``: keep when the low 64 bits of the trace id
are below ``ratio * 2**64``, so every service that uses it agrees on the same traces.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from stagescope.names import ENV_BASELINE_SAMPLE, ENV_SLOW_THRESHOLD_MS

__all__ = [
    "DEFAULT_BASELINE_SAMPLE",
    "DEFAULT_SLOW_THRESHOLD_MS",
    "REASON_BASELINE",
    "REASON_ERROR",
    "REASON_SLOW",
    "SamplingPolicy",
]

_log = logging.getLogger(__name__)

#: Requests slower than this (milliseconds) always keep their trace, by default.
DEFAULT_SLOW_THRESHOLD_MS = 250.0
#: Share of the other requests that keep their trace, by default.
DEFAULT_BASELINE_SAMPLE = 0.01

REASON_SLOW = "slow"
REASON_ERROR = "error"
REASON_BASELINE = "baseline"

_MASK64 = (1 << 64) - 1
_HEAD_MODES = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


def _ratio_bound(ratio: float) -> int:
    """``TraceIdRatioBased.get_bound_for_rate``: keep when ``trace_id & (2**64-1) < bound``."""
    return round(min(1.0, max(0.0, ratio)) * (_MASK64 + 1))


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
    """A resolved sampling configuration; :meth:`decide` is called once per finished request.

    ``head``: one of the ``OTEL_TRACES_SAMPLER`` values above (a ratio sampler is ``traceidratio``);
    ``ratio``: its ratio; ``slow_ns``: the tail threshold in nanoseconds (``None``: no slow rule).
    """

    head: str
    ratio: float
    slow_ns: int | None
    _bound: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_bound", _ratio_bound(self.ratio))

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
        if not 0 <= slow_threshold_ms < math.inf:  # also refuses nan
            raise ValueError(f"slow_threshold_ms must be a finite number >= 0, got {slow_threshold_ms}")
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

    def head_keep(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """The head sampler's decision; ``parent_sampled`` is ``None`` when no traceparent came in."""
        head = self.head
        if head.startswith("parentbased_"):
            if parent_sampled is not None:
                return parent_sampled
            head = head[len("parentbased_") :]
        if head == "always_on":
            return True
        if head == "always_off":
            return False
        return (trace_id & _MASK64) < self._bound

    def decide(
        self, trace_id: int, parent_sampled: bool | None, duration_ns: int, failed: bool
    ) -> str | None:
        """The reason a finished request keeps its trace (``error``, ``slow``, ``baseline``) or None."""
        if self.head == "always_off":
            return None
        if failed:
            return REASON_ERROR
        if self.slow_ns is not None and duration_ns >= self.slow_ns:
            return REASON_SLOW
        if self.head_keep(trace_id, parent_sampled):
            return REASON_BASELINE
        return None


def _check_ratio(value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a ratio between 0 and 1, got {value}")
    return float(value)
