"""benchmarks/overhead.py's summary: the paired ratios' medians with their 95 % intervals, and the verdict.

A round pairs every variant with its baseline (PAIRS) back to back; per round the throughput ratio is
the variant's requests/s over the baseline's, the capacity ratio the baseline's server CPU per request
over the variant's. The interval is distribution-free: the median's order statistics at binomial ranks.
"""

from __future__ import annotations

import math
import statistics

from stagescope.analysis.intervals import rank_bounds

__all__ = ["CLIENT_FULL", "GOALS", "PAIRS", "median_interval", "pct", "report"]

PAIRS = (  # (label, variant, baseline, goal)
    ("trivial   stock", "stock", "bare", "REFERENCE 0.40-0.56"),
    ("trivial   stagescope", "stagescope", "bare", "goal >= 0.85"),
    ("realistic stagescope", "stagescope-batch", "bare-batch", "goal >= 0.97"),
    ("realistic vs plain", "stagescope-batch", "plain-batch", "DynamicBatcher + instrumentation"),
)
GOALS = {"stagescope": 0.85, "stagescope-batch": 0.97}
CLIENT_FULL = 0.90  # client share of its core above which a round measured the client


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float | None, float | None, float]:
    """(median, low, high, coverage): a distribution-free interval for the median from order statistics.

    With n values sorted, [x_(k), x_(n+1-k)] covers the true median with probability 1 - 2 P(B <= k-1),
    B ~ Binomial(n, 1/2); k is the largest rank keeping that at or above ``level`` (the analysis' own
    order-statistic ranks, intervals.rank_bounds, at q = 1/2). ``None`` bounds when n is too small for
    the level (fewer than 6 values for 95 %)."""
    s = sorted(xs)
    n = len(s)
    k, _ = rank_bounds(n, 0.5, level)
    if k is None:
        return statistics.median(s), None, None, 0.0
    coverage = 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n
    return statistics.median(s), s[k - 1], s[n - k], coverage


def _fmt_interval(xs: list[float]) -> str:
    med, lo, hi, _cov = median_interval(xs)
    if lo is None or hi is None:
        return f"{med:.3f} (interval needs >= 6 rounds)"
    return f"{med:.3f} [{lo:.3f}, {hi:.3f}]"


def report(variants: list[str], rounds: list[dict[str, dict[str, float]]], placement: str) -> None:
    print(f"\n{len(rounds)} paired rounds; {placement}")
    print(
        "per variant over rounds:   req/s median   server CPU us/request median (min-max)   server share   "
        "client share max   others on server CPU median   steal max"
    )
    for v in variants:
        xs = [r[v] for r in rounds]
        cpu = [x["cpu_us"] for x in xs]
        print(f"  {v:17s} {statistics.median(x['rps'] for x in xs):10.0f}   {statistics.median(cpu):12.0f} "
              f"({min(cpu):.0f}-{max(cpu):.0f})   {100 * statistics.median(x['cpu_share'] for x in xs):10.0f}%"
              f"   {100 * max(x['client_share'] for x in xs):10.0f}%"
              f"   {pct(statistics.median(x['others_share'] for x in xs)):>20s}"
              f"   {pct(max(x['steal_share'] for x in xs)):>8s}")  # fmt: skip
    for v in variants:  # why a variant's CPU per request moves: other processes on its CPU or not
        quiet = [r[v]["cpu_us"] for r in rounds if r[v]["others_share"] < 0.10]
        busy = [r[v]["cpu_us"] for r in rounds if r[v]["others_share"] >= 0.10]
        if quiet and busy:
            print(f"  {v}: CPU us/request with other processes under 10 % of its CPU {statistics.median(quiet):.0f} "
                  f"({len(quiet)} rounds), at 10 % or more {statistics.median(busy):.0f} ({len(busy)} rounds)")  # fmt: skip
    full = [v for v in variants if any(r[v]["client_share"] > CLIENT_FULL for r in rounds)]
    if full:
        print(f"WARNING: the client's core was above {100 * CLIENT_FULL:.0f}% in rounds of {', '.join(full)}: "
              "there the requests/s measure the client, not the server")  # fmt: skip
    print(
        "paired ratios, median [95 % interval] over rounds: throughput (variant req/s / baseline's) and "
        "capacity (baseline's server CPU per request / variant's)"
    )
    for label, v, b, goal in PAIRS:
        if v in variants and b in variants:
            thr = [r[v]["rps"] / r[b]["rps"] for r in rounds]
            cap = [r[b]["cpu_us"] / r[v]["cpu_us"] for r in rounds]
            print(f"  {label:22s} throughput {_fmt_interval(thr)}   capacity {_fmt_interval(cap)}   ({goal})")
    _med, lo, _hi, cov = median_interval([1.0] * len(rounds))
    if lo is not None:
        print(
            f"  (interval: ranks of the median's order statistics, coverage {100 * cov:.1f} % for {len(rounds)} rounds)"
        )
    for v, target in GOALS.items():
        pair = next(((lab, b) for lab, vv, b, _ in PAIRS if vv == v), None)
        if pair is None or v not in variants or pair[1] not in variants:
            continue
        cap = [r[pair[1]]["cpu_us"] / r[v]["cpu_us"] for r in rounds]
        m, lo, _, _ = median_interval(cap)
        verdict = "holds" if m >= target else "NOT met"
        if lo is not None:
            verdict += f"; the interval's low end {'is' if lo >= target else 'is not'} at or above it"
        print(
            f"goal {v} >= {target:.2f}x of {pair[1]}, judged on the capacity ratio's median {m:.3f}: {verdict}"
        )
    print("(judged on capacity: a server's own CPU time per request does not change when other processes take\n"
          " part of its core, its requests/s do; with the server at ~100 % of its core the two ratios agree)")  # fmt: skip


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.0f}%"
