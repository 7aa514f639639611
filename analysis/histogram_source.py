"""The request-duration histograms of the scraped metrics as a complete source (analysis.sources).

The server counted every request into a bucket. Each bucket's count over the scrapes is its
increase (counter resets and series that appear after their target's first scrape counted as
PromQL's ``increase`` would; a directory of scrape files is one target, a Prometheus URL another);
the traced samples in a bucket share its count (their sampling weights scaled to it) and so place
the requests inside it; a bucket that no kept trace fell in gets evenly spread points, as
``histogram_quantile`` assumes (they have no time, so they are in the quantiles, not the windows).
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
from stagescope.analysis.keys import has_columns

if TYPE_CHECKING:
    from stagescope.analysis.breach import SLIView

__all__ = ["BUCKET_POINTS", "HISTOGRAMS", "SUPERSEDED_BY", "from_histograms"]

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


def _target(source: object) -> str:
    """What one series' points come from: a Prometheus URL, or the directory of scrape files (one
    file per scrape of one target, as stagescope's recorder and a cron'd curl write them)."""
    text = str(source)
    return text if "://" in text else posixpath.dirname(text)


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
        src = _target(source)
        series[(src, tuple(sorted(lab.items())))].append((ts, float(value), str(source)))
    if not series:
        return None
    per_le: dict[float, float] = defaultdict(float)
    first = last = None
    for (src, key), pts in series.items():
        times = [t for t, _, _ in pts if t is not None]
        from_zero = bool(times) and min(times) > first_of.get(src, min(times))
        le = dict(key).get("le", "")
        try:
            bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le) * 1e3
        except ValueError:
            continue
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


def from_histograms(con: duckdb.DuckDBPyConnection, view: SLIView, complete: bool) -> bool:
    for family, route_label, model_label in HISTOGRAMS.get(view.slo.sli, ()):
        got = _bucket_counts(con, view, family, route_label, model_label)
        if got is None:
            continue
        counts, first, last = got
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
        if complete and total <= kept * 1.01 + 2:
            return False  # the traces hold every request the histogram counted
        _calibrate(con, view, counts)
        view.source = N.SOURCE_METRICS
        view.sampling["histogram"] = family
        return True
    return False


def _calibrate(con: duckdb.DuckDBPyConnection, view: SLIView, counts: list[tuple[float, float]]) -> None:
    """Scale each traced sample's weight so each bucket weighs its count; spread points in buckets no
    trace fell in (no start time, so they are in the quantiles, not in the windows)."""
    bounds = [b for b, _ in counts]
    finite = [b for b in bounds if math.isfinite(b)]
    bucket = (
        "CASE "
        + " ".join(f"WHEN value_ms <= {b!r} THEN {i}" for i, b in enumerate(finite))
        + f" ELSE {len(finite)} END"
        if finite
        else "0"
    )
    have = dict(con.execute(f"SELECT {bucket} AS b, sum(w) FROM {view.name} GROUP BY 1").fetchall())
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
