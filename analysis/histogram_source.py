"""The request-duration histograms of the scraped metrics as a complete source (analysis.sources).

The server counted every request into a bucket. Each bucket's count over the scrapes is its
increase (counter resets and series that appear after their target's first scrape counted as
PromQL's ``increase`` would; a directory of scrape files is one target, a Prometheus URL another);
the quantiles are Prometheus' ``histogram_quantile`` of those counts (promql/quantile.go
``bucketQuantile``: rank ``q * W``, linear inside the bucket, the lowest bucket from 0, the ``+Inf``
bucket answering the highest finite bound), so they are the figures the user's own Prometheus gives
for the same window. Two exceptions, where the traces know more than the linear assumption: a
bucket whose every request was traced (stagescope's sampler keeps every request slower than its slow
rule, so the tail buckets often are): the traces hold the requests' own values and the quantile is
read off them; and a bucket whose traces are a probability sample of its requests (each kept with a
known probability, OpenTelemetry's ``th``), at least :data:`MIN_BUCKET_SAMPLE` of them: their
Horvitz-Thompson weights, scaled to the bucket's count, place its requests. Requests rarely spread
evenly across a bucket (25-50 ms holding requests of 29-36 ms: ``histogram_quantile`` puts their
median at 38 ms, off by up to half the bucket's width whatever the traffic), while the sample's
error shrinks with its size (at most ``width * sqrt(0.25 / n)`` for ``n`` kept, a tenth of the width
at 25). A sample of unknown probabilities (a collector's tail sampling keeps the slow and the
failed) is not uniform within its bucket, and a few traces would put a step where the histogram
says nothing: those buckets stay Prometheus'.
The share over the threshold is Prometheus' ``histogram_fraction`` of the same counts (promql/quantile.go
``BucketFraction``: linear inside the bucket holding the threshold), with the same exceptions. For
the rest of the analysis (the breakdown's weights, the windows) the traced
samples in a bucket share its count (their sampling weights scaled to it), and a bucket no kept
trace fell in gets :data:`BUCKET_POINTS` evenly spread points, as ``histogram_quantile`` assumes
(they have no time, so they are in the distribution, not in the windows).
A histogram is used when its scrapes span the traced requests and its counts agree with them: at
least the kept samples, and with known sampling probabilities the Horvitz-Thompson estimate within
four standard errors or 10 %.
"""

from __future__ import annotations

import math
import posixpath
from collections import defaultdict
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import duckdb

from stagescope import names as N
from stagescope.analysis.intervals import METHOD_ORDER, Estimate, estimate, rank_bounds
from stagescope.analysis.keys import has_columns

if TYPE_CHECKING:
    from stagescope.analysis.breach import SLIView

__all__ = [
    "BUCKET_POINTS",
    "HISTOGRAMS",
    "MIN_BUCKET_SAMPLE",
    "SUPERSEDED_BY",
    "bucket_fraction",
    "bucket_quantile",
    "from_histograms",
    "histogram_estimates",
    "share_over",
]

#: Histograms read as complete sources per SLI: (family, route label or None, model label). SGLang's
#: are its TokenizerMetricsCollector's (python/sglang/srt/metrics/collector.py @ 00ae9c15, arrival to
#: first / last token; the inter-token one observed once per token).
HISTOGRAMS: dict[str, tuple[tuple[str, str | None, str], ...]] = {
    N.SLI_E2E: (
        (N.METRIC_REQUEST_DURATION, N.LABEL_ROUTE, N.LABEL_MODEL),
        (N.VLLM_E2E, None, N.VLLM_LABEL_MODEL),
        (N.SGLANG_E2E, None, N.SGLANG_LABEL_MODEL),
    ),
    N.SLI_TTFT: (
        (N.METRIC_GENAI_TTFT, None, N.LABEL_MODEL),
        (N.VLLM_TTFT, None, N.VLLM_LABEL_MODEL),
        (N.SGLANG_TTFT, None, N.SGLANG_LABEL_MODEL),
    ),
    N.SLI_ITL: (
        (N.METRIC_INTER_TOKEN, None, N.LABEL_MODEL),
        (N.VLLM_ITL, None, N.VLLM_LABEL_MODEL),
        # vLLM before the rename (V0, early V1): the same per-token gaps (docs/design/metrics.md)
        (N.VLLM_TPOT_LEGACY, None, N.VLLM_LABEL_MODEL),
        (N.SGLANG_ITL, None, N.SGLANG_LABEL_MODEL),
    ),
}
#: A family read only where the one that replaced it was not scraped: vLLM releases between the two
#: names wrote both, with the same observations.
SUPERSEDED_BY = {N.VLLM_TPOT_LEGACY: N.VLLM_ITL}
#: Evenly spread points given to a histogram bucket no kept trace fell in (at most).
BUCKET_POINTS = 20
#: Traces kept with known probabilities a bucket needs for them to place its requests (as densely
#: as the spread points of a bucket without traces): the within-bucket quantile's standard error is
#: then at most ``sqrt(0.25 / 20)``, 11 % of the bucket's width.
MIN_BUCKET_SAMPLE = BUCKET_POINTS


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    row = con.execute(sql).fetchone()
    assert row is not None
    return tuple(row)


def _increase(points: list[tuple[int | None, float, str]], from_zero: bool) -> float:
    """A counter's increase over its points ``(ts_ms, value, file)`` (ts order); a decrease is a restart
    from 0; ``from_zero``: the series appeared after its source's first scrape, so it started at 0
    within the window. Without timestamps each file is one snapshot, cumulative since the server
    started: one gives its value, several (a ``before`` and an ``after``) their difference, as
    engine_metrics reads them."""
    timed = sorted((t, v) for t, v, _ in points if t is not None)
    if len(timed) < 2:
        by_file: dict[str, float] = {}
        for _, v, f in points:
            by_file[f] = max(by_file.get(f, v), v)
        if not by_file:
            return 0.0
        vals = list(by_file.values())
        return vals[0] if len(vals) == 1 else max(vals) - min(vals)
    inc = timed[0][1] if from_zero else 0.0
    for (_, a), (_, b) in pairwise(timed):
        inc += b - a if b >= a else b
    return inc


def _le_ms(le: str) -> float | None:
    """A bucket's ``le`` label as its upper bound in ms (``+Inf``, ``Inf``, ``inf``: infinity;
    ``1``, ``1.0``, ``1e0``: the same bound), None for a label that is not a number."""
    try:
        bound = float(le.strip())
    except ValueError:
        return None
    return None if math.isnan(bound) else bound * 1e3


def _target(source: object) -> str:
    """What one series' points come from: a Prometheus URL, or the directory of scrape files (one
    file per scrape of one target, as stagescope's recorder and a cron'd curl write them)."""
    text = str(source)
    return text if "://" in text else posixpath.dirname(text)


def _scraped(con: duckdb.DuckDBPyConnection, family: str) -> bool:
    return has_columns(con, "metric_samples", "metric") and bool(
        con.execute("SELECT 1 FROM metric_samples WHERE metric = ? LIMIT 1", [f"{family}_bucket"]).fetchone()
    )


def _bucket_counts(
    con: duckdb.DuckDBPyConnection, view: SLIView, family: str, route_label: str | None, model_label: str
) -> tuple[list[tuple[float, float]], int | None, int | None] | None:
    """Per bucket (upper bound in ms, count) of ``family`` over the scrapes, for the SLO's route and
    model; with the first and last scrape times (Unix ms) and None when no series matches."""
    slo = view.slo
    if (slo.route is not None and route_label is None) or not has_columns(con, "metric_samples", "labels"):
        return None  # the histogram cannot tell the SLO's route from the others
    newer = SUPERSEDED_BY.get(family)
    if newer is not None and con.execute(
        "SELECT 1 FROM metric_samples WHERE metric = ? LIMIT 1", [f"{newer}_bucket"]
    ).fetchone():
        return None  # read under its new name
    rows = con.execute(
        # a bucket count of +-Inf is no count (as NaN, read as NULL): it would scale weights by infinity
        "SELECT source, labels, ts_ms, value FROM metric_samples WHERE metric = ? AND isfinite(value)",
        [f"{family}_bucket"],
    ).fetchall()
    if not rows:
        return None
    shed = 0.0
    if family == N.METRIC_REQUEST_DURATION:
        got = con.execute(
            "SELECT sum(value) FROM metric_samples WHERE metric = ? AND isfinite(value)",
            [N.METRIC_REQUESTS_SHED],
        ).fetchone()
        shed = float(got[0] or 0.0) if got else 0.0
    # when each target (a directory of scrapes over time, or a Prometheus URL) was first scraped
    first_of: dict[str, int] = {}
    for source, ts in con.execute(
        "SELECT source, min(ts_ms) FROM metric_samples WHERE ts_ms IS NOT NULL GROUP BY source"
    ).fetchall():
        t = _target(source)
        first_of[t] = min(first_of.get(t, int(ts)), int(ts))
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int | None, float, str]]] = defaultdict(
        list
    )
    for source, labels, ts, value in rows:
        lab = dict(labels)
        if route_label is not None and slo.route is not None and lab.get(route_label) != slo.route:
            continue
        if slo.model is not None and lab.get(model_label) != slo.model:
            continue
        if shed and lab.get(N.LABEL_STATUS_CLASS) == "4xx":
            continue  # 429s are not latency samples; the histogram cannot tell them from other 4xx
        bound = _le_ms(lab.get("le", ""))
        if bound is None:
            continue
        # one bucket whatever the spelling of its bound (le="1" and Prometheus 3's le="1.0", "+Inf"/"inf")
        lab["le"] = repr(bound)
        src = _target(source)
        series[(src, tuple(sorted(lab.items())))].append((ts, float(value), str(source)))
    if not series:
        return None
    per_le: dict[float, float] = defaultdict(float)
    first = last = None
    for (src, key), pts in series.items():
        times = [t for t, _, _ in pts if t is not None]
        from_zero = bool(times) and min(times) > first_of.get(src, min(times))
        bound = float(dict(key)["le"])
        per_le[bound] += _increase(pts, from_zero)
        if times:  # a series that appeared later was counted from 0 since its source's first scrape
            begin = first_of[src] if from_zero else min(times)
            first = begin if first is None else min(first, begin)
            last = max(times) if last is None else max(last, max(times))
    bounds = sorted(per_le)
    counts, prev = [], 0.0
    for b in bounds:  # cumulative -> per bucket
        counts.append((b, max(0.0, per_le[b] - prev)))
        prev = max(prev, per_le[b])
    return counts, first, last


def bucket_quantile(counts: list[tuple[float, float]], q: float) -> float | None:
    """``histogram_quantile(q)`` of per-bucket ``(upper bound, count)`` pairs (ascending bounds, the
    last ``+Inf``), as Prometheus computes it (promql/quantile.go ``bucketQuantile``): rank ``q * W``
    (``W`` the count of all buckets), the first bucket whose cumulative count reaches it, linear
    interpolation inside that bucket; the lowest bucket starts at 0 when its upper bound is above 0
    (else its bound is the answer); a rank in the ``+Inf`` bucket answers the highest finite bound.
    None without observations, without a finite bucket, or for a ``q`` outside [0, 1]."""
    if not 0.0 <= q <= 1.0 or not counts or math.isfinite(counts[-1][0]):
        return None
    merged: list[list[float]] = []
    for b, c in counts:  # equal bounds (le="1" and le="1.0" before they were read as one) are one bucket
        if merged and merged[-1][0] == b:
            merged[-1][1] += c
        else:
            merged.append([b, c])
    cum, run = [], 0.0
    for b, c in merged:
        run += max(0.0, c)
        cum.append((b, run))
    total = cum[-1][1]
    if len(cum) < 2 or total <= 0:
        return None
    rank = q * total
    i = next(k for k, (_, c) in enumerate(cum) if c >= rank or k == len(cum) - 1)
    if i == len(cum) - 1:
        return cum[-2][0]
    if i == 0 and cum[0][0] <= 0:
        return cum[0][0]
    start, below = (cum[i - 1][0], cum[i - 1][1]) if i else (0.0, 0.0)
    end, count = cum[i][0], cum[i][1] - below
    return start + (end - start) * ((rank - below) / count) if count > 0 else end


def bucket_fraction(counts: list[tuple[float, float]], lower: float, upper: float) -> float | None:
    """``histogram_fraction(lower, upper)`` of per-bucket ``(upper bound, count)`` pairs (ascending
    bounds, the last ``+Inf``), as Prometheus computes it for classic buckets (promql/quantile.go
    ``BucketFraction`` @ d15adb9a): the cumulative count at each end, linear inside the bucket holding
    it, an end on a bucket's bound taking the whole bucket below it (``upper`` inclusive); the lowest
    bucket starts at 0 when its bound is above 0 (else at -Inf, and is not interpolated), nothing of
    the ``+Inf`` bucket is below a finite end. None without observations or without the ``+Inf``
    bucket; 0 where ``lower >= upper``."""
    if not counts or counts[-1][0] != math.inf or math.isnan(lower) or math.isnan(upper):
        return None
    cum: list[list[float]] = []
    run = 0.0
    for b, c in counts:
        run += max(0.0, c)
        if cum and cum[-1][0] == b:  # coalesceBuckets: one bucket per bound
            cum[-1][1] = run
        else:
            cum.append([b, run])
    total = cum[-1][1]
    if total <= 0:
        return None
    if lower >= upper:
        return 0.0

    rank = 0.0
    ends: list[float | None] = [None, None]  # the cumulative counts at lower, upper
    lo_bound = 0.0 if cum[0][0] > 0 else -math.inf
    for i, (hi_bound, cum_count) in enumerate(cum):
        if i:
            lo_bound = cum[i - 1][0]
        for k, v in enumerate((lower, upper)):
            if ends[k] is None and lo_bound >= v:  # the end is at (or below) this bucket's lower bound
                ends[k] = rank
        if ends[0] is not None and ends[1] is not None:
            break
        for k, v in enumerate((lower, upper)):
            if ends[k] is None and lo_bound < v < hi_bound:  # the end is inside this bucket
                ends[k] = (
                    cum_count
                    if math.isinf(lo_bound)
                    else rank + (cum_count - rank) * (v - lo_bound) / (hi_bound - lo_bound)
                )
        if ends[0] is not None and ends[1] is not None:
            break
        rank = cum_count
    lo_rank, hi_rank = (total if e is None or e > total else e for e in ends)
    return (hi_rank - lo_rank) / total


def share_over(con: duckdb.DuckDBPyConnection, view: SLIView, threshold: float) -> float | None:
    """The share of the histogram's requests slower than ``threshold`` (ms), as Prometheus gives it:
    ``histogram_fraction(threshold, +Inf)`` (:func:`bucket_fraction`; ``1 - histogram_fraction(0,
    threshold)`` for buckets above 0): every bucket above the threshold whole, the one holding it
    linearly inside, the ``+Inf`` bucket all over a finite threshold. As for the quantiles, one
    exception: where the traces give the bucket holding the threshold (``view.traced_buckets``), its
    share over the threshold is the traces' own (their weights scaled to its count)."""
    counts = view.buckets
    if counts is None:
        return None
    over = bucket_fraction(counts, threshold, math.inf)
    if over is None:
        return None
    i = next((k for k, (b, _) in enumerate(counts) if b >= threshold), None)
    if i is None or counts[i][0] == threshold or counts[i][0] not in view.traced_buckets:
        return over  # (a threshold on a bound splits no bucket)
    total = sum(max(0.0, c) for _, c in counts)
    above = sum(max(0.0, c) for _, c in counts[i + 1 :])
    inside = f"value_ms > {counts[i - 1][0]!r}" if i else "TRUE"
    if math.isfinite(counts[i][0]):
        inside += f" AND value_ms <= {counts[i][0]!r}"  # the bucket as _calibrate assigns the traces
    row = con.execute(
        f"SELECT coalesce(sum(w) FILTER (WHERE value_ms > {threshold!r}), 0) FROM {view.name} WHERE {inside}"
    ).fetchone()
    return (above + float(row[0] if row else 0.0)) / total


def quantile_bucket(counts: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the bucket :func:`bucket_quantile` reads the ``q`` quantile in (None where
    it answers nothing)."""
    total = sum(max(0.0, c) for _, c in counts)
    if not 0.0 <= q <= 1.0 or total <= 0 or not counts:
        return None
    run = 0.0
    for i, (b, c) in enumerate(counts):
        run += max(0.0, c)
        if run >= q * total or i == len(counts) - 1:
            return b
    return None


def histogram_estimates(
    counts: list[tuple[float, float]], levels: dict[str, float]
) -> dict[str, Estimate | None]:
    """Each named quantile level of the histogram (:func:`bucket_quantile`) with its 95 % interval:
    the order-statistic ranks ``l, u`` of the ``W`` requests the histogram counted
    (intervals.rank_bounds), read off the same interpolated histogram at ``l / W`` and ``u / W``
    (Prometheus' rank ``k`` is level ``k / W``). It is the sampling interval of the quantile under
    the linear-in-bucket assumption ``histogram_quantile`` makes; how the requests lie inside a
    bucket is not in the histogram. ``samples``: ``W``."""
    total = sum(max(0.0, c) for _, c in counts)
    n = math.floor(total + 1e-6)
    out: dict[str, Estimate | None] = {}
    for key, q in levels.items():
        lo_rank, hi_rank = rank_bounds(n, q)
        ends = tuple(None if r is None else bucket_quantile(counts, r / total) for r in (lo_rank, hi_rank))
        out[key] = estimate(bucket_quantile(counts, q), (ends[0], ends[1]), METHOD_ORDER, float(n))
    return out


def from_histograms(con: duckdb.DuckDBPyConnection, view: SLIView, complete: bool) -> bool:
    for family, route_label, model_label in HISTOGRAMS.get(view.slo.sli, ()):
        got = _bucket_counts(con, view, family, route_label, model_label)
        if got is None:
            if view.slo.route is not None and route_label is None and view.trace_samples == 0 and _scraped(con, family):
                view.warnings.append(
                    f"metrics histogram {family} has no route label: it cannot answer for route {view.slo.route} "
                    "alone (without --route it gives every route's figures)"
                )
            continue
        counts, first, last = got
        if len(counts) < 2 or counts[-1][0] != math.inf:  # histogram_quantile is NaN for it
            view.warnings.append(
                f"metrics histogram {family} has no +Inf bucket or no finite one: its quantiles are "
                "undefined (Prometheus' histogram_quantile gives NaN), not used"
            )
            continue
        total = sum(c for _, c in counts)
        lo_ns, hi_ns, kept, var = _one(
            con,
            f"""SELECT min(start_unix_ns), max(start_unix_ns + CAST(value_ms * 1e6 AS BIGINT)), count(*),
                       coalesce(sum(w * (w - 1)), 0) FROM {view.name}""",
        )
        why = None
        spans = first is not None and last is not None and first != last and lo_ns is not None
        if spans and (first > lo_ns / 1e6 or last < hi_ns / 1e6):
            why = "its scrapes do not span the traced requests"
        if why is None and total < 0.98 * kept - 2:
            why = f"it counts {total:.0f} samples, fewer than the {kept} traced"
        if why is None and kept and view.sampling["unknown"] == 0:
            sd = math.sqrt(float(var))
            if abs(total - view.weight_total) > max(4 * sd, 0.1 * total, 5):
                why = f"it counts {total:.0f} samples where the traces stand for {view.weight_total:.0f}"
        if why is not None:
            view.warnings.append(
                f"metrics histogram {family} does not cover the traced requests ({why}): not used"
            )
            continue
        if complete and kept and total <= kept * 1.01 + 2:
            return False  # the traces hold every request the histogram counted (none kept: it answers)
        _calibrate(con, view, counts)
        view.buckets = counts
        if route_label is None:
            model = f" of model {view.slo.model}" if view.slo.model is not None else ""
            view.warnings.append(
                f"the quantiles are the engine's own histogram {family}'s (every request{model} it counted): "
                "it has no route label, so they cannot be split by route"
            )
        view.source = N.SOURCE_METRICS
        view.sampling["histogram"] = family
        return True
    return False


def _calibrate(con: duckdb.DuckDBPyConnection, view: SLIView, counts: list[tuple[float, float]]) -> None:
    """Scale each traced sample's weight so each bucket weighs its count; spread points in buckets no
    trace fell in (no start time, so they are in the distribution, not in the windows); note the
    buckets whose traces give their values (``view.traced_buckets``): every request of it traced, or
    at least :data:`MIN_BUCKET_SAMPLE` traced, each with a known sampling probability."""
    bounds = [b for b, _ in counts]
    finite = [b for b in bounds if math.isfinite(b)]
    bucket = (
        "CASE "
        + " ".join(f"WHEN value_ms <= {b!r} THEN {i}" for i, b in enumerate(finite))
        + f" ELSE {len(finite)} END"
        if finite
        else "0"
    )
    # pk 0: the sample's probability is known (weighting.sampling_kind_sql; per-request tables only:
    # the gaps of one stream are kept or dropped together, not a sample of gaps)
    known = "count(*) FILTER (WHERE pk = 0)" if view.per_request and has_columns(con, view.name, "pk") else "0"
    got = con.execute(f"SELECT {bucket} AS b, sum(w), count(*), {known} FROM {view.name} GROUP BY 1").fetchall()
    have = {b: w for b, w, _, _ in got}
    kept = {b: n for b, _, n, _ in got}
    sampled = {b: n == k for b, _, n, k in got}
    # a bucket every request of which was traced: the traces hold those requests' own values; one
    # whose traces are a probability sample of it, large enough: their weights place its requests
    view.traced_buckets = frozenset(
        b
        for i, (b, c) in enumerate(counts)
        if c > 0 and (kept.get(i, 0) >= c - 1e-6 or (sampled.get(i, False) and kept[i] >= MIN_BUCKET_SAMPLE))
    )
    factors, points = [], []
    for i, (b, c) in enumerate(counts):
        if not c:
            continue
        if have.get(i):
            factors.append(f"({i}, {c / float(have[i])!r})")
            continue
        lo = bounds[i - 1] if i else 0.0
        hi = b if math.isfinite(b) else lo
        k = max(1, min(BUCKET_POINTS, round(c)))
        points += [f"({lo + (hi - lo) * (j + 0.5) / k!r}, {c / k!r})" for j in range(k)]
    cols = "trace_id, " if not view.per_request else ""
    fac = (
        f"(VALUES {', '.join(factors)}) f(b, factor)"
        if factors
        else "(SELECT NULL::INTEGER AS b, 1.0 AS factor) f"
    )
    extra = (
        f"UNION ALL SELECT {'NULL, ' if cols else ''}NULL, v, NULL, NULL, NULL, pw FROM (VALUES {', '.join(points)}) p(v, pw)"
        if points
        else ""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {view.name} AS
        SELECT {cols}start_unix_ns, value_ms, queue_depth, batch_size, cold_start, w * coalesce(f.factor, 1.0) AS w
        FROM (SELECT *, {bucket} AS b FROM {view.name}) s LEFT JOIN {fac} USING (b)
        {extra}"""
    )
    view.count_rows(con)
