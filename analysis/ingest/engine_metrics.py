"""vLLM's and SGLang's ``/metrics`` summed right: per-request means and counts, and the server-state
facts the lever rules read (preemptions, KV-cache use, waiting requests, prefix-cache hits,
speculative-decoding acceptance, tokens per step, SGLang's per-stage latencies).

**Summing.** One model's figures are spread over series: vLLM V1 writes every family once per
data-parallel engine (label ``engine``, vllm-project/vllm vllm/v1/metrics/loggers.py @ a6f0308c,
``labelnames = ["model_name", "engine"]``), SGLang once per publishing rank (``tp_rank``, ``dp_rank``,
``pp_rank``: sgl-project/sglang python/sglang/srt/metrics/collector.py @ 00ae9c15), and a scrape by
Prometheus adds ``instance`` (and in Kubernetes ``pod``, ``namespace``...). So a series is its metric
and its *whole* label set, and a model's figure is the **sum over every series of the model** (all
labels but the model's, and a family's own ones: ``le``, SGLang's ``stage``) of each series' own
increase. Per-request means are ``sum(increase(_sum)) / sum(increase(_count))``, never one series'.

**Increase.** A series' samples from several files or scrapes are one time series: with timestamps
(a Prometheus range query, or exposition lines carrying them) its increase runs from the first to the
last sample, a drop counting as a restart from zero (PromQL's ``increase`` without extrapolation;
a drop in any series of the same labels marks the restart for all of them, since a histogram's
``_sum`` can grow across a restart that its ``_count`` shows);
without timestamps a file is one snapshot, cumulative since the server started, and several
snapshots of a series (a ``before`` and an ``after`` file) give their difference (largest minus
smallest: a counter only grows between restarts). Gauges are summed over the engines at each
timestamp (waiting and running requests) or averaged (KV-cache use, a fraction per engine).

Renamed families are read under both names (docs/design/metrics.md @ 0328b592 "Prefix Cache Hit
Rate", loggers.py: ``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc``, ``gpu_prefix_cache_*`` ->
``prefix_cache_*``, ``time_per_output_token_seconds`` -> ``inter_token_latency_seconds``).
Durations are returned in **milliseconds**.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import duckdb

from stagescope import names as N

__all__ = [
    "GaugeStats",
    "engine_metric_facts",
    "gauge_stats",
    "increases",
    "sglang_stage_means",
    "vllm_stage_means",
]

Point = tuple[int | None, float | None, str]  # ts_ms, value, source

#: Labels that are part of a family's meaning, never summed over.
_IDENTITY_LABELS = frozenset({"le", "quantile", N.SGLANG_LABEL_STAGE})

_VLLM_PARTS = {
    "queue": N.VLLM_QUEUE_TIME, "prefill": N.VLLM_PREFILL_TIME, "decode": N.VLLM_DECODE_TIME,
    "inference": N.VLLM_INFERENCE_TIME, "ttft": N.VLLM_TTFT, "e2e": N.VLLM_E2E,
}  # fmt: skip
_SGLANG_PARTS = {"queue": N.SGLANG_QUEUE_TIME, "ttft": N.SGLANG_TTFT, "e2e": N.SGLANG_E2E}


def _drops(points: Sequence[Point]) -> set[int]:
    """Timestamps at which a timestamped series went down (a restart)."""
    timed = sorted((t, v) for t, v, _ in points if t is not None and v is not None)
    return {tb for (_, a), (tb, b) in pairwise(timed) if b < a}


def _series_increase(
    points: Sequence[Point], resets: set[int] | frozenset[int] = frozenset()
) -> float | None:
    """One series' increase (see the module docstring); ``resets``: timestamps at which the server
    restarted (any series of the same labels went down there: a histogram's ``_sum`` can grow across
    a restart while its ``_count`` shows it), where the series counts from zero."""
    timed = sorted((t, v) for t, v, _ in points if t is not None and v is not None)
    if len({t for t, _ in timed}) >= 2:
        inc = 0.0
        for (_, a), (tb, b) in pairwise(timed):
            inc += b if (b < a or tb in resets) else b - a
        return inc
    by_source: dict[str, float] = {}
    for _t, v, src in points:
        if v is not None:
            by_source[src] = max(by_source.get(src, v), v)
    values = list(by_source.values())
    if not values:
        return None
    return values[0] if len(values) == 1 else max(values) - min(values)


def _rows(con: duckdb.DuckDBPyConnection, metrics: Sequence[str]) -> list[tuple[Any, ...]]:
    return con.execute(
        "SELECT metric, map_entries(labels), ts_ms, value, source FROM metric_samples WHERE list_contains(?, metric)",
        [list(metrics)],
    ).fetchall()


def _split(entries: Any, keep: Sequence[str]) -> tuple[tuple[Any, ...], tuple[tuple[str, str], ...]]:
    """A series' labels -> (values of ``keep``, the other labels that tell its series apart)."""
    labels = {e["key"]: e["value"] for e in entries or []}
    kept = tuple(labels.get(k) for k in keep)
    rest = tuple(sorted((k, v) for k, v in labels.items() if k not in keep and k not in _IDENTITY_LABELS))
    return kept, rest


def increases(
    con: duckdb.DuckDBPyConnection, metrics: Sequence[str], keep: Sequence[str] = (N.VLLM_LABEL_MODEL,)
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """(values of the ``keep`` labels) -> metric -> increase summed over every series of that group,
    plus ``"_series"``: how many series (engines, instances, ranks) the group's figures add up."""
    pts: dict[tuple[Any, ...], dict[str, dict[Any, list[Point]]]] = defaultdict(lambda: defaultdict(dict))
    ids: dict[tuple[Any, ...], set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    for metric, entries, ts, value, source in _rows(con, metrics):
        kept, rest = _split(entries, keep)
        full = tuple(sorted((e["key"], e["value"]) for e in entries or [] if e["key"] not in keep))
        pts[kept][metric].setdefault(full, []).append((ts, value, source))
        ids[kept].add(rest)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for kept, by_metric in pts.items():
        row: dict[str, Any] = {"_series": len(ids[kept])}
        resets: dict[Any, set[int]] = defaultdict(set)  # per label set: restarts any of its series show
        for series in by_metric.values():
            for full, pts_ in series.items():
                resets[full] |= _drops(pts_)
        for metric, series in by_metric.items():
            incs = [x for x in (_series_increase(p, resets[f]) for f, p in series.items()) if x is not None]
            row[metric] = sum(incs) if incs else None
        out[kept] = row
    return out


def _mean(total: Any, n: Any, scale: float = 1e3) -> float | None:
    return None if total is None or not n else float(total) / float(n) * scale


def vllm_stage_means(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per vLLM model: ``requests`` (the queue histogram's count, else the e2e or TTFT one, summed
    over engines and instances),
    ``engines`` (series summed) and the mean ms per request of queue, prefill, decode, inference,
    ttft and e2e (``sum(increase(_sum)) / sum(increase(_count))`` over every series)."""
    metrics = [f"{h}_{s}" for h in _VLLM_PARTS.values() for s in ("sum", "count")]
    out = []
    for (model,), inc in sorted(increases(con, metrics).items(), key=str):
        # the queue histogram counts every scheduled request; releases before it (vLLM < 0.6) only
        # the e2e and TTFT ones
        counts = (inc.get(f"{h}_count") for h in (N.VLLM_QUEUE_TIME, N.VLLM_E2E, N.VLLM_TTFT))
        row: dict[str, Any] = {
            "model": model, "requests": next((c for c in counts if c is not None), None), "engines": inc["_series"],
        }  # fmt: skip
        for part, h in _VLLM_PARTS.items():
            row[f"{part}_ms"] = _mean(inc.get(f"{h}_sum"), inc.get(f"{h}_count"))
        out.append(row)
    return out


def sglang_stage_means(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per SGLang model: ``requests`` (the e2e histogram's count, summed over ranks), ``series``, mean
    ms of queue (``sglang:queue_time_seconds``), ttft and e2e, and ``stages``: the mean ms per
    observation of each ``sglang:per_stage_req_latency_seconds{stage}`` (tokenize, request_process,
    prefill_forward, ...; collector.py ``observe_per_stage_req_latency``)."""
    metrics = [f"{h}_{s}" for h in _SGLANG_PARTS.values() for s in ("sum", "count")]
    out = []
    for (model,), inc in sorted(increases(con, metrics, (N.SGLANG_LABEL_MODEL,)).items(), key=str):
        row: dict[str, Any] = {
            "model": model, "requests": inc.get(f"{N.SGLANG_E2E}_count"), "series": inc["_series"],
        }  # fmt: skip
        for part, h in _SGLANG_PARTS.items():
            row[f"{part}_ms"] = _mean(inc.get(f"{h}_sum"), inc.get(f"{h}_count"))
        row["stages"] = {}
        out.append(row)
    per = N.SGLANG_PER_STAGE_LATENCY
    stages = increases(con, [f"{per}_sum", f"{per}_count"], (N.SGLANG_LABEL_MODEL, N.SGLANG_LABEL_STAGE))
    for (model, stage), inc in sorted(stages.items(), key=str):
        mean = _mean(inc.get(f"{per}_sum"), inc.get(f"{per}_count"))
        found = [r for r in out if r["model"] == model]
        if found:
            row = found[0]
        else:
            row = {"model": model, "requests": None, "series": inc["_series"], "stages": {}}
            out.append(row)
        if mean is not None and stage is not None:
            row["stages"][stage] = round(mean, 3)
    return out


class GaugeStats:
    """A gauge over the engines: ``points`` (ts_ms, combined value) for timestamped samples, ``mean`` and
    ``max`` over time (untimestamped snapshots: one point per file)."""

    def __init__(self, points: list[tuple[int | None, float]]) -> None:
        self.points = points
        vals = [v for _, v in points]
        self.mean = sum(vals) / len(vals) if vals else None
        self.max = max(vals) if vals else None


def gauge_stats(
    con: duckdb.DuckDBPyConnection, metrics: Sequence[str], how: str = "sum", model: str | None = None
) -> GaugeStats | None:
    """The first of ``metrics`` (a family under its names, newest first) that was scraped, combined
    over its series at each timestamp (per file when untimestamped) by ``how`` (``sum`` or ``avg``);
    with ``model``, over that model's series only (vLLM's and SGLang's ``model_name``): another
    model's queue is not in front of its requests."""
    agg = "sum" if how == "sum" else "avg"
    flt, args = ("", []) if model is None else (" AND labels[?] = ?", [N.VLLM_LABEL_MODEL, model])
    for metric in metrics:
        rows = con.execute(
            f"""SELECT ts_ms, {agg}(value) FROM metric_samples WHERE metric = ? AND value IS NOT NULL{flt}
                GROUP BY ts_ms, CASE WHEN ts_ms IS NULL THEN source END ORDER BY ts_ms NULLS LAST""",
            [metric, *args],
        ).fetchall()
        if rows:
            return GaugeStats([(r[0], float(r[1])) for r in rows])
    return None


def _ratio(a: Any, b: Any) -> float | None:
    return None if a is None or not b else float(a) / float(b)


def _corr(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return None if sxx <= 0 or syy <= 0 else sxy / math.sqrt(sxx * syy)


def _preemptions_vs_running(con: duckdb.DuckDBPyConnection, counter: str, running: str) -> float | None:
    """Correlation, over the scrape intervals, of the preemptions in an interval (summed over engines)
    with the running requests at its end (summed): preemptions that rise with the batch are KV pressure."""
    rows = con.execute(
        """WITH p AS (SELECT ts_ms, sum(value) AS v FROM metric_samples WHERE metric = ? AND ts_ms IS NOT NULL
                      GROUP BY 1),
                r AS (SELECT ts_ms, sum(value) AS v FROM metric_samples WHERE metric = ? AND ts_ms IS NOT NULL
                      GROUP BY 1)
           SELECT p.v, r.v FROM p JOIN r USING (ts_ms) ORDER BY ts_ms""",
        [counter, running],
    ).fetchall()
    inc = [(b[0] - a[0] if b[0] >= a[0] else b[0], float(b[1])) for a, b in pairwise(rows)]
    return _corr([float(i) for i, _ in inc], [r for _, r in inc])


def _prefix_caching_enabled(con: duckdb.DuckDBPyConnection) -> bool | None:
    row = con.execute(
        "SELECT any_value(labels[?]) FROM metric_samples WHERE metric = ?",
        [N.VLLM_LABEL_PREFIX_CACHING, N.VLLM_CACHE_CONFIG_INFO],
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return str(row[0]).lower() == "true"


def engine_metric_facts(con: duckdb.DuckDBPyConnection, model: str | None = None) -> dict[str, Any]:
    """The engines' server-state evidence from ``metric_samples`` (keys absent where not scraped):
    ``engine`` (vllm / sglang), ``engine_requests``, ``engine_series``, ``preemptions``,
    ``preemptions_per_request``, ``preemptions_running_corr``, ``kv_cache_usage_mean`` / ``_max``
    (0..1), ``waiting_mean`` / ``_max``, ``running_mean``, ``prefix_cache_hit_ratio``,
    ``prefix_caching_enabled``, ``iteration_tokens_mean``, ``spec_decode_acceptance``,
    ``sglang_stages_ms``. With ``model`` the gauges (KV cache, waiting, running) are that model's
    series' (summed over its engines); without, every engine's."""
    ev: dict[str, Any] = {}
    vllm = [r for r in vllm_stage_means(con) if r.get("requests")]
    sgl = [r for r in sglang_stage_means(con) if r.get("requests") or r.get("stages")]
    is_sglang = bool(sgl) and not vllm
    if vllm or sgl:
        ev["engine"] = N.SOURCE_SGLANG if is_sglang else N.SOURCE_VLLM
        rows = sgl if is_sglang else vllm
        ev["engine_requests"] = sum(float(r.get("requests") or 0) for r in rows)
        ev["engine_series"] = max(int(r.get("engines") or r.get("series") or 0) for r in rows)
    if sgl:
        ev["sglang_stages_ms"] = {k: v for r in sgl for k, v in r["stages"].items()}
    counters = [N.VLLM_NUM_PREEMPTIONS, N.SGLANG_RETRACTED, N.VLLM_PREFIX_CACHE_QUERIES, N.VLLM_PREFIX_CACHE_HITS,
                N.VLLM_GPU_PREFIX_CACHE_QUERIES, N.VLLM_GPU_PREFIX_CACHE_HITS, N.VLLM_SPEC_DRAFT_TOKENS,
                N.VLLM_SPEC_ACCEPTED_TOKENS, N.SGLANG_PROMPT_TOKENS, N.SGLANG_CACHED_TOKENS,
                f"{N.VLLM_ITERATION_TOKENS}_sum", f"{N.VLLM_ITERATION_TOKENS}_count"]  # fmt: skip
    tot: dict[str, float] = defaultdict(float)
    seen: set[str] = set()
    for inc in increases(con, counters, ()).values():
        for m, v in inc.items():
            if m != "_series" and v is not None:
                tot[m] += float(v)
                seen.add(m)
    pre = N.SGLANG_RETRACTED if is_sglang else N.VLLM_NUM_PREEMPTIONS
    if pre in seen:
        ev["preemptions"] = tot[pre]
        ev["preemptions_per_request"] = _ratio(tot[pre], ev.get("engine_requests"))
        running = N.SGLANG_NUM_RUNNING_REQS if is_sglang else N.VLLM_NUM_RUNNING
        ev["preemptions_running_corr"] = _preemptions_vs_running(con, pre, running)
    for q, h in ((N.VLLM_PREFIX_CACHE_QUERIES, N.VLLM_PREFIX_CACHE_HITS),
                 (N.VLLM_GPU_PREFIX_CACHE_QUERIES, N.VLLM_GPU_PREFIX_CACHE_HITS),
                 (N.SGLANG_PROMPT_TOKENS, N.SGLANG_CACHED_TOKENS)):  # fmt: skip
        if q in seen and h in seen and tot[q] > 0:
            ev["prefix_cache_hit_ratio"] = tot[h] / tot[q]
            break
    if "prefix_cache_hit_ratio" not in ev:
        hr = gauge_stats(con, [N.SGLANG_CACHE_HIT_RATE], "avg")
        if hr is not None:
            ev["prefix_cache_hit_ratio"] = hr.mean
    ev["prefix_caching_enabled"] = _prefix_caching_enabled(con)
    it_s, it_c = f"{N.VLLM_ITERATION_TOKENS}_sum", f"{N.VLLM_ITERATION_TOKENS}_count"
    if it_s in seen and tot[it_c] > 0:
        ev["iteration_tokens_mean"] = tot[it_s] / tot[it_c]
    if N.VLLM_SPEC_DRAFT_TOKENS in seen and tot[N.VLLM_SPEC_DRAFT_TOKENS] > 0:
        ev["spec_decode_acceptance"] = tot[N.VLLM_SPEC_ACCEPTED_TOKENS] / tot[N.VLLM_SPEC_DRAFT_TOKENS]
    else:
        sa = gauge_stats(con, [N.SGLANG_SPEC_ACCEPT_RATE], "avg")
        if sa is not None:
            ev["spec_decode_acceptance"] = sa.mean
    for key, names, how in (
        ("kv_cache_usage", [N.VLLM_KV_CACHE_USAGE, N.VLLM_GPU_CACHE_USAGE, N.SGLANG_TOKEN_USAGE], "avg"),
        ("waiting", [N.VLLM_NUM_WAITING, N.SGLANG_NUM_QUEUE_REQS], "sum"),
        ("running", [N.VLLM_NUM_RUNNING, N.SGLANG_NUM_RUNNING_REQS], "sum"),
    ):
        g = gauge_stats(con, names, how, model)
        if g is not None:
            ev[f"{key}_mean"], ev[f"{key}_max"] = g.mean, g.max
    return {k: v for k, v in ev.items() if v is not None}
