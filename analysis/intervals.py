"""Confidence intervals for every quantile the analysis reports, and the judgement of a measurement
against a predicted interval.

A p99 over 500 samples moves 10-30 % from run to run, so a quantile is never reported alone: each
has a 95 % interval (:data:`CONFIDENCE`). Methods (the report names the one it used,
``quantile_interval.method``):

* **order statistics** (:data:`METHOD_ORDER`, unweighted samples): distribution-free. For ``n``
  samples and the quantile ``q``, the number ``B`` of samples at or below the true quantile is
  Binomial(n, q), so ``[X_(l), X_(u)]`` covers it with probability ``P(l <= B <= u - 1)`` whatever the
  distribution (continuous). :func:`rank_bounds` picks the exact ranks, each tail at most
  ``(1 - confidence) / 2``. Where ``u`` would exceed ``n`` (too few samples above the quantile: a
  p99 needs at least 368) the upper end is unbounded (``None``), and likewise the lower one.
* **effective sample size** (:data:`METHOD_WEIGHTED`, weighted samples: sampling weights
  ``1 / sampling_p``, or the strata of a large input's breakdown): Woodruff's method. The variance
  of the weighted CDF at the estimated quantile is the process's binomial variance ``q(1-q)/N``
  plus the sampling variance of a Horvitz-Thompson total under Poisson sampling,
  ``sum w (w - 1) (1{x <= q̂} - q)^2 / N^2`` (``N`` = the summed weight); ``n_eff = q(1-q) / V`` is
  the sample size an unweighted sample of the same precision would have, and the interval's ends
  are the weighted quantiles at the levels the order-statistic ranks of ``n_eff`` give. With every
  weight 1 it is the order-statistic interval.

Lever predictions (analysis.counterfactual) are quantiles of per-request counterfactual values;
their interval is the interval of that quantile (the effect model's fitted parameters held fixed),
carried by :class:`Estimate`. :func:`judge` compares a measurement with a predicted interval. The SQL
that computes intervals over DuckDB relations is in analysis.interval_sql.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIDENCE",
    "METHOD_ORDER",
    "METHOD_WEIGHTED",
    "Estimate",
    "Judgement",
    "conclusive",
    "effective_n",
    "estimate",
    "interval_of",
    "judge",
    "levels",
    "min_samples",
    "rank_bounds",
    "woodruff_sum_sql",
]

#: Confidence of every interval the analysis reports.
CONFIDENCE = 0.95
METHOD_ORDER = "order-statistic"
METHOD_WEIGHTED = "weighted-effective-n"

Interval = tuple[float | None, float | None]


def _binom_cdf(n: int, q: float) -> tuple[int, list[float]]:
    """``(k0, F)`` with ``F[i] = P(Bin(n, q) <= k0 + i)`` over the band of ``k`` where the mass is
    not negligible (below ``k0`` the CDF is 0 to double precision, above the band 1). Exact: the
    pmf from ``lgamma`` at the mode, the rest by the ratio recurrence."""
    if q <= 0.0:
        return 0, [1.0]
    if q >= 1.0:
        return n, [1.0]
    mode = min(n, int((n + 1) * q))
    lg = math.lgamma(n + 1) - math.lgamma(mode + 1) - math.lgamma(n - mode + 1)
    p_mode = math.exp(lg + mode * math.log(q) + (n - mode) * math.log1p(-q))
    r = q / (1.0 - q)
    down, p, k = [], p_mode, mode
    while k > 0 and p > 1e-300:
        p = p * k / ((n - k + 1) * r)
        k -= 1
        down.append(p)
        if p < p_mode * 1e-18:
            break
    up, p, k = [], p_mode, mode
    while k < n and p > 1e-300:
        p = p * (n - k) * r / (k + 1)
        k += 1
        up.append(p)
        if p < p_mode * 1e-18:
            break
    pmf = [*reversed(down), p_mode, *up]
    k0 = mode - len(down)
    total, cdf = 0.0, []
    for x in pmf:
        total += x
        cdf.append(total)
    norm = cdf[-1]
    return k0, [c / norm for c in cdf]


def rank_bounds(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int | None, int | None]:
    """1-based ranks ``(l, u)`` such that ``[X_(l), X_(u)]`` covers the ``q`` quantile with
    probability at least ``confidence`` for any continuous distribution (each tail at most
    ``(1 - confidence) / 2``); ``None`` for an end that no order statistic of ``n`` samples can give."""
    if n < 1 or not 0.0 < q < 1.0:
        return None, None
    a = (1.0 - confidence) / 2.0
    k0, cdf = _binom_cdf(n, q)

    def f(k: int) -> float:  # P(B <= k)
        if k < k0:
            return 0.0
        i = k - k0
        return cdf[i] if i < len(cdf) else 1.0

    # l: the largest l in [1, n] with P(B <= l - 1) <= a (below k0 the CDF is 0, so start there)
    lo: int | None = None
    if f(0) <= a:
        lo = max(1, k0)
        while lo < n and f(lo) <= a:
            lo += 1
    # u: the smallest u in [1, n] with P(B <= u - 1) >= 1 - a
    hi: int | None = None
    u = max(1, k0)
    while u <= n:
        if f(u - 1) >= 1.0 - a:
            hi = u
            break
        u += 1
    return lo, hi


def min_samples(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose interval for the ``q`` quantile has both ends (a p99 at 95 %: 368)."""
    a = (1.0 - confidence) / 2.0
    return math.ceil(math.log(a) / math.log(max(q, 1.0 - q)))


def levels(n: float, q: float, confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """The ``quantile_cont`` levels of the interval's ends for ``n`` (effective) samples: level
    ``(k - 1) / (n - 1)`` is exactly the ``k``-th order statistic of ``n`` samples (linear
    interpolation lands on it), so with unweighted samples the ends are :func:`rank_bounds`'s order
    statistics."""
    m = math.floor(n + 1e-6)  # an effective n computed as N to rounding error is N
    if m < 2:
        return None, None
    lo, hi = rank_bounds(m, q, confidence)
    return (
        None if lo is None else (lo - 1) / (m - 1),
        None if hi is None else (hi - 1) / (m - 1),
    )


def woodruff_sum_sql(expr: str, weight: str, q: float, q_value: float) -> str:
    """SQL aggregate: ``sum w (w - 1) (1{expr <= q̂} - q)^2``, the Horvitz-Thompson sampling
    variance of the weighted count at or below the estimate ``q_value`` (see :func:`effective_n`)."""
    z = f"(CASE WHEN ({expr}) <= {q_value!r} THEN {1.0 - q!r} ELSE {-q!r} END)"
    w = f"CAST(({weight}) AS DOUBLE)"  # a DECIMAL weight would overflow DuckDB's decimal scale
    return f"sum({w} * ({w} - 1.0) * {z} * {z}) FILTER (WHERE ({expr}) IS NOT NULL)"


def effective_n(total_weight: float, design_sum: float, q: float) -> float:
    """Woodruff's effective sample size for the ``q`` quantile: ``q(1-q) / V``,
    ``V = q(1-q)/N + design_sum / N^2`` (``N`` the summed weight, ``design_sum`` from
    :func:`woodruff_sum_sql`). Equals ``N`` when every weight is 1."""
    if total_weight <= 0:
        return 0.0
    v = q * (1 - q) / total_weight + max(0.0, design_sum) / total_weight**2
    return q * (1 - q) / v if v > 0 else total_weight


class Estimate(float):
    """A quantile estimate (ms) that carries its confidence interval: ``interval`` = ``(lo, hi)``
    (``None`` ends: unbounded), ``method`` and ``samples`` (effective). It is a float everywhere
    else, so code that computes with predictions is unchanged; arithmetic drops the interval."""

    interval: Interval
    method: str
    samples: float

    def __new__(
        cls, value: float, interval: Interval, method: str = METHOD_ORDER, samples: float = 0.0
    ) -> Estimate:
        obj = super().__new__(cls, value)
        obj.interval = interval
        obj.method = method
        obj.samples = samples
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (Estimate, (float(self), self.interval, self.method, self.samples))


def estimate(
    value: float | None,
    interval: Interval,
    method: str = METHOD_ORDER,
    samples: float = 0.0,
    digits: int | None = 3,
) -> Estimate | None:
    """An :class:`Estimate` (rounded to ``digits``: the report prints milliseconds to the
    microsecond; None keeps the value as computed); ends are kept on the right side of the value."""
    if value is None:
        return None
    v = float(value) if digits is None else round(float(value), digits)
    lo, hi = interval
    lo = None if lo is None else min(float(lo), v)
    hi = None if hi is None else max(float(hi), v)
    if digits is not None:
        lo = None if lo is None else round(lo, digits)
        hi = None if hi is None else round(hi, digits)
    return Estimate(v, (lo, hi), method, samples)


def interval_of(x: Any) -> list[float | None] | None:
    """The JSON ``[lo, hi]`` of an :class:`Estimate`; None for a plain number or None."""
    if isinstance(x, Estimate):
        return [x.interval[0], x.interval[1]]
    return None


def conclusive(
    value: float | None,
    interval: Interval | list[float | None] | None,
    threshold: float,
    q: float,
    samples: float,
) -> tuple[bool, str | None]:
    """Whether a quantile and its interval tell which side of ``threshold`` it is on; else why not
    (too few samples for a bounded interval, or the interval straddles the threshold)."""
    if value is None or interval is None:
        return False, "no samples"
    lo, hi = interval[0], interval[1]
    need = min_samples(q)
    name = f"p{q * 100:g}"
    if hi is None or lo is None:
        return False, (
            f"too few samples for a bounded {CONFIDENCE:.0%} interval of the {name}: {samples:,.0f} "
            f"(at least {need} are needed)"
        )
    if lo <= threshold <= hi:
        return False, (
            f"its {CONFIDENCE:.0%} interval [{lo:.1f}, {hi:.1f}] ms holds the {threshold:g} ms threshold: "
            "the run is too short to tell which side the quantile is on"
        )
    return True, None


@dataclass(frozen=True)
class Judgement:
    """A measurement against a predicted interval: ``verdict`` is ``within``, ``outside`` or
    ``too_short``; ``outside_by_ms`` how far beyond the nearer end; ``words`` one line for people."""

    verdict: str
    outside_by_ms: float | None
    words: str


def judge(
    measured: float | None,
    measured_interval: Interval | list[float | None] | None,
    predicted: float | None,
    predicted_interval: Interval | list[float | None] | None,
) -> Judgement:
    """Judge a measured quantile against a predicted one by their intervals: ``within`` the
    prediction's interval, ``outside`` it (by how much; noting when the measurement's own interval
    still overlaps it), or ``too_short`` when either interval is unbounded (too few samples above
    the quantile) or missing."""
    if measured is None or predicted is None or predicted_interval is None:
        return Judgement("too_short", None, "no prediction or no measurement to compare")
    plo, phi = predicted_interval[0], predicted_interval[1]
    mlo, mhi = (None, None) if measured_interval is None else (measured_interval[0], measured_interval[1])
    if plo is None or phi is None or mlo is None or mhi is None:
        which = "prediction" if plo is None or phi is None else "measurement"
        return Judgement(
            "too_short",
            None,
            f"too short to tell: the {which}'s {CONFIDENCE:.0%} interval is unbounded "
            "(too few samples above the quantile)",
        )
    if plo <= measured <= phi:
        return Judgement("within", 0.0, f"within the predicted {CONFIDENCE:.0%} interval")
    by = round(measured - phi if measured > phi else plo - measured, 1)
    overlap = mlo <= phi and mhi >= plo
    note = (
        f" (the measurement's own interval [{mlo:.0f}, {mhi:.0f}] ms overlaps it: the two runs' sampling noise "
        "can explain the gap)"
        if overlap
        else ""
    )
    side = "above" if measured > phi else "below"
    return Judgement(
        "outside", by, f"outside the predicted {CONFIDENCE:.0%} interval by {by:g} ms ({side}){note}"
    )
