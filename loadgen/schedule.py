"""Open-loop schedules: when each request is *meant* to be sent, and what it asks for.

A :class:`Schedule` is plain data: arrival offsets in seconds from the start of the run (sorted,
non-negative), and per request the prompt and output token counts and prefix-block ids where a trace
gives them. Synthetic schedules come from :func:`synthetic_schedule` (Poisson, gamma with a chosen
coefficient of variation, or constant spacing); trace schedules from
:func:`stagescope.loadgen.traces.read_trace`, then :meth:`Schedule.scaled` (``--speedup``),
:meth:`Schedule.scaled_to_rate` and :meth:`Schedule.limited` (``--duration``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stagescope.errors import UserError
from stagescope.loadgen.limits import MAX_DURATION_S, MAX_RATE_RPS, MAX_REQUESTS

__all__ = [
    "ARRIVAL_KINDS",
    "MAX_DURATION_S",
    "MAX_RATE_RPS",
    "MAX_REQUESTS",
    "Schedule",
    "check_size",
    "parse_arrival",
    "synthetic_schedule",
]

#: Arrival processes accepted by ``--arrival`` (``gamma`` takes ``:CV``, e.g. ``gamma:2.0``).
ARRIVAL_KINDS: tuple[str, ...] = ("poisson", "gamma", "constant")

def check_size(n_requests: float, duration_s: float, what: str) -> None:
    """``UserError`` when a run of ``n_requests`` over ``duration_s`` seconds is beyond the bounds."""
    if n_requests > MAX_REQUESTS:
        raise UserError(
            f"{what} makes {n_requests:.0f} requests; at most {MAX_REQUESTS} per run (lower --rate or --duration)"
        )
    if duration_s > MAX_DURATION_S:
        raise UserError(
            f"{what} lasts {duration_s:.0f} s; at most {MAX_DURATION_S:.0f} s per run "
            "(cut it with --duration, or replay faster with --speedup)"
        )


@dataclass(frozen=True)
class Schedule:
    """Intended send times and request sizes for one run.

    ``offsets_s``: seconds from the run start, sorted ascending, float64. ``prompt_tokens`` and
    ``output_tokens``: int64 arrays of the same length, or ``None`` when the source has no token
    counts. ``hash_ids``: per request the prefix-block ids (Mooncake: 512-token blocks; requests
    sharing leading ids share a prompt prefix), or ``None``. ``duration_s``: the span the schedule
    covers (for a synthetic schedule the requested duration, which is longer than the last offset).
    """

    offsets_s: np.ndarray
    prompt_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    hash_ids: Sequence[Sequence[int]] | None = None
    duration_s: float = 0.0
    source: str = "synthetic"
    block_tokens: int = 512
    target_rate_rps: float | None = None  # the rate asked for (synthetic or --rate), if any

    def __post_init__(self) -> None:
        n = len(self.offsets_s)
        for name in ("prompt_tokens", "output_tokens", "hash_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries, offsets_s has {n}")
        if self.duration_s <= 0.0 and n:
            object.__setattr__(self, "duration_s", float(self.offsets_s[-1]))

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def nominal_rate_rps(self) -> float:
        """The rate asked for when there was one, else the schedule's own mean rate."""
        return self.target_rate_rps if self.target_rate_rps is not None else self.rate_rps

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate in requests per second over ``duration_s`` (0 for an empty span)."""
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0

    def _take(self, keep: np.ndarray | slice) -> tuple[np.ndarray | None, np.ndarray | None, list | None]:
        prompt = self.prompt_tokens[keep] if self.prompt_tokens is not None else None
        output = self.output_tokens[keep] if self.output_tokens is not None else None
        hashes = None
        if self.hash_ids is not None:
            idx = np.arange(len(self))[keep]
            hashes = [self.hash_ids[int(i)] for i in idx]
        return prompt, output, hashes

    def scaled(self, speedup: float) -> Schedule:
        """Replay ``speedup`` times faster: every offset (and the span) divided by ``speedup``."""
        if not 0 < speedup < float("inf"):  # also refuses nan
            raise UserError(f"--speedup must be a finite number > 0, got {speedup}")
        return dataclasses.replace(
            self,
            offsets_s=self.offsets_s / speedup,
            duration_s=self.duration_s / speedup,
            target_rate_rps=self.target_rate_rps * speedup if self.target_rate_rps is not None else None,
        )

    def scaled_to_rate(self, rate_rps: float) -> Schedule:
        """Time-scale the schedule so that its mean rate is ``rate_rps`` (shape of the arrivals kept)."""
        if not 0 < rate_rps <= MAX_RATE_RPS:
            raise UserError(f"--rate must be a finite number in (0, {MAX_RATE_RPS:g}] requests/s, got {rate_rps}")
        if self.rate_rps <= 0:
            raise UserError(f"{self.source}: too few requests to scale to a rate")
        scaled = self.scaled(rate_rps / self.rate_rps)
        return dataclasses.replace(scaled, target_rate_rps=rate_rps)

    def limited(self, duration_s: float | None) -> Schedule:
        """Keep the requests meant to be sent before ``duration_s`` seconds (``None``: keep all)."""
        if duration_s is None or duration_s >= self.duration_s:
            return self
        if not 0 < duration_s < float("inf"):
            raise UserError(f"--duration must be a finite number > 0, got {duration_s}")
        n = int(np.searchsorted(self.offsets_s, duration_s, side="left"))
        prompt, output, hashes = self._take(slice(0, n))
        return dataclasses.replace(
            self,
            offsets_s=self.offsets_s[:n],
            prompt_tokens=prompt,
            output_tokens=output,
            hash_ids=hashes,
            duration_s=float(duration_s),
        )

    def shifted_to_zero(self) -> Schedule:
        """Start the first request at offset 0 (trace timestamps are absolute or start late)."""
        if not len(self) or self.offsets_s[0] == 0.0:
            return self
        first = float(self.offsets_s[0])
        return dataclasses.replace(
            self, offsets_s=self.offsets_s - first, duration_s=max(self.duration_s - first, 0.0)
        )


def parse_arrival(spec: str) -> tuple[str, float]:
    """Parse ``--arrival``: ``poisson`` | ``constant`` | ``gamma:CV`` -> (kind, coefficient of variation)."""
    kind, _, arg = spec.strip().lower().partition(":")
    if kind == "poisson" and not arg:
        return "poisson", 1.0
    if kind == "constant" and not arg:
        return "constant", 0.0
    if kind == "gamma":
        try:
            cv = float(arg)
        except ValueError:
            raise UserError(
                f"--arrival gamma needs a coefficient of variation, e.g. gamma:2.0 (got {spec!r})"
            ) from None
        if not 0.001 <= cv <= 100:  # also refuses nan and inf; a tinier CV is --arrival constant
            raise UserError(f"--arrival gamma:CV needs a CV from 0.001 to 100 (got {spec!r})")
        return "gamma", cv
    raise UserError(f"unknown --arrival {spec!r}; use poisson, constant or gamma:CV")


def synthetic_schedule(
    rate_rps: float, duration_s: float, arrival: str = "poisson", seed: int = 0
) -> Schedule:
    """Arrivals at mean ``rate_rps`` requests/s for ``duration_s`` seconds.

    Poisson: exponential gaps. Gamma: gaps with shape ``1/CV**2`` and mean ``1/rate`` (CV > 1 is
    burstier than Poisson). Constant: one request every ``1/rate`` seconds, the first at 0.
    """
    if not 0 < rate_rps <= MAX_RATE_RPS:  # also refuses nan and inf
        raise UserError(f"--rate must be a finite number in (0, {MAX_RATE_RPS:g}] requests/s, got {rate_rps}")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise UserError(f"--duration must be a finite number in (0, {MAX_DURATION_S:g}] s, got {duration_s}")
    check_size(rate_rps * duration_s, duration_s, f"--rate {rate_rps:g} for --duration {duration_s:g} s")
    kind, cv = parse_arrival(arrival)
    mean_gap = 1.0 / rate_rps
    expected = rate_rps * duration_s
    if kind == "constant":
        offsets = np.arange(0.0, duration_s, mean_gap)
    else:
        rng = np.random.default_rng(seed)
        offsets = np.empty(0)
        n = int(expected + 10 * np.sqrt(expected) * max(cv, 1.0) + 16)
        start = 0.0
        chunks = []
        while start < duration_s:
            if kind == "poisson":
                gaps = rng.exponential(mean_gap, n)
            else:
                shape = 1.0 / (cv * cv)
                gaps = rng.gamma(shape, mean_gap / shape, n)
            chunk = start + np.cumsum(gaps)
            chunks.append(chunk)
            start = float(chunk[-1])
        offsets = np.concatenate(chunks)
        offsets = offsets[offsets < duration_s]
    return Schedule(
        offsets,
        duration_s=float(duration_s),
        source=f"{arrival} {rate_rps:g} req/s",
        target_rate_rps=rate_rps,
    )
