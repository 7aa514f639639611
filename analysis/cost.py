"""Cost: accelerator time per request, what it costs, and what each lever would change.

**Accelerator-seconds per request** (``cost.accelerator_seconds_per_request``) is the accelerator time
the requests used, from the first of these the data holds (``cost.basis`` says which):

* ``executor-busy`` (:data:`BASIS_EXECUTOR_BUSY`): the increase of ``stagescope_executor_busy_seconds_total``
  (seconds executors ran batches) between the scrapes around the SLO's samples, over the requests served
  between the same scrapes (the increase of ``stagescope_request_duration_seconds_count``, every route
  of the model; the traces' requests where the histogram was not scraped). One executor is taken for
  one accelerator;
* ``utilization`` (:data:`BASIS_UTILIZATION`): accelerator utilization x time: the mean of
  ``DCGM_FI_DEV_GPU_UTIL`` (or Triton's ``nv_gpu_utilization``) per GPU over the samples' time range,
  times that range, summed over GPUs, over the requests in that range;
* ``trace-compute`` (:data:`BASIS_TRACE_COMPUTE`): from the traces alone, each request's accelerator
  stages (compute, prefill, decode) divided by its batch size (a batch's run is shared by its
  requests), averaged over the SLO's requests.

With the SLO's ``accelerator_price_per_hour`` the report adds ``cost_per_1k_requests`` and
``cost_per_million_output_tokens`` (the SLO's requests' ``gen_ai.usage.output_tokens``): the accelerator
time used, priced; idle time is not charged to requests. Where utilization is known,
``fleet_cost_per_1k_requests`` divides by it: what the fleet costs per 1,000 requests.

**Each lever's cost change** (``cost_delta``, :func:`lever_cost_delta`, from :func:`lever_effect` in
analysis.cost_levers):
``relative`` = ``work_factor x capacity_factor - 1``, where ``work_factor`` is the change in
accelerator work per request (quantize: the measured batch-time ratio; cache-results: the repeats
skip compute; cap-batch-wait: smaller batches amortize less, ``(a/B' + b) / (a/B + b)`` from the fit
of compute on batch size; reduce-batch-tokens: the same per token for the running batch) with the
fleet sized to keep its utilization, and ``capacity_factor`` the capacity a lever adds on purpose
(scale-out: executors doubled, x2). ``per_1k_requests`` is
``relative`` times the fleet cost per 1,000 requests (the used-time cost where utilization is not
known). ``sign`` is ``+``, ``-`` or ``0`` even where the size is unknown. Levers off the accelerator
(cache-features, offload-preprocessing, shrink-response, chunked-prefill, prewarm) change no
accelerator time (``0``; a worker pool's CPU is not priced).
"""

from __future__ import annotations

from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.attribution import BREAKDOWN, Attribution
from stagescope.analysis.breach import UTIL_METRICS, SLIView, sql_str, util_pct_sql
from stagescope.analysis.cost_levers import lever_effect
from stagescope.analysis.ingest.counters import increase

__all__ = [
    "BASIS_EXECUTOR_BUSY",
    "BASIS_TRACE_COMPUTE",
    "BASIS_UTILIZATION",
    "cost_report",
    "lever_cost_delta",
    "lever_effect",
]

BASIS_EXECUTOR_BUSY = "executor-busy"
BASIS_UTILIZATION = "utilization"
BASIS_TRACE_COMPUTE = "trace-compute"
#: Stages that run on the accelerator.
ACCELERATOR_STAGES = (N.STAGE_COMPUTE, N.STAGE_PREFILL, N.STAGE_DECODE)


def _span(con: duckdb.DuckDBPyConnection, view: SLIView) -> tuple[int, int] | None:
    """The samples' time range (Unix ms): first arrival to last arrival."""
    row = con.execute(f"SELECT min(start_unix_ns), max(start_unix_ns) FROM {view.arrivals}").fetchone()
    if not row or row[0] is None:
        return None
    return int(row[0] // 1_000_000), int(row[1] // 1_000_000)


def _series(
    con: duckdb.DuckDBPyConnection, metric: str, model: str | None
) -> dict[Any, list[tuple[int, float]]]:
    """``(source, labels) -> [(ts_ms, value)]`` of a timestamped metric (optionally one model)."""
    flt = "" if model is None else f" AND labels[{sql_str(N.LABEL_MODEL)}] = {sql_str(model)}"
    rows = con.execute(
        f"SELECT source, CAST(labels AS VARCHAR), ts_ms, value FROM metric_samples WHERE metric = {sql_str(metric)} "
        f"AND ts_ms IS NOT NULL AND value IS NOT NULL{flt} ORDER BY ts_ms"
    ).fetchall()
    out: dict[Any, list[tuple[int, float]]] = {}
    for src, labels, ts, v in rows:
        out.setdefault((src, labels), []).append((int(ts), float(v)))
    return out


def _bracket(points: list[tuple[int, float]], t0: int, t1: int) -> list[tuple[int, float]]:
    """The points from the last one at or before ``t0`` to the first at or after ``t1``."""
    before = [i for i, (t, _) in enumerate(points) if t <= t0]
    after = [i for i, (t, _) in enumerate(points) if t >= t1]
    a = before[-1] if before else 0
    b = after[0] if after else len(points) - 1
    return points[a : b + 1]


def _counter_increase(
    con: duckdb.DuckDBPyConnection, metric: str, model: str | None, t0: int, t1: int
) -> tuple[float, int, int] | None:
    """Summed increase of a counter over its series between the scrapes bracketing ``[t0, t1]``, and
    the bracket's ends (Unix ms); None without two timestamped samples."""
    total, lo, hi, found = 0.0, None, None, False
    for pts in _series(con, metric, model).values():
        got = _bracket(pts, t0, t1)
        if len(got) < 2:
            continue
        pts_: list[tuple[int | None, float | None]] = list(got)
        inc = increase(pts_)
        if inc is None:
            continue
        found = True
        total += inc
        lo = got[0][0] if lo is None else min(lo, got[0][0])
        hi = got[-1][0] if hi is None else max(hi, got[-1][0])
    if not found or lo is None or hi is None:
        return None
    return total, lo, hi


def _requests_between(
    con: duckdb.DuckDBPyConnection, view: SLIView, model: str | None, t0: int, t1: int
) -> tuple[float, str] | None:
    """Requests served between ``t0`` and ``t1`` (Unix ms): the request histogram's count where it was
    scraped (every route of the model), else the traces' requests of the model in that range."""
    hist = _counter_increase(con, f"{N.METRIC_REQUEST_DURATION}_count", model, t0, t1)
    if hist is not None and hist[0] > 0:
        return hist[0], f"{N.METRIC_REQUEST_DURATION}_count"
    flt = "" if model is None else f" AND model = {sql_str(model)}"
    row = con.execute(
        f"SELECT count(*) FROM requests WHERE start_unix_ns BETWEEN {t0 * 1_000_000} AND {t1 * 1_000_000}"
        f" AND coalesce(status_code, 0) <> 429{flt}"
    ).fetchone()
    n = float(row[0]) if row else 0.0
    return (n, "the traces' requests") if n > 0 else None


def _executor_busy(
    con: duckdb.DuckDBPyConnection, view: SLIView, span: tuple[int, int]
) -> dict[str, Any] | None:
    busy = _counter_increase(con, N.METRIC_EXECUTOR_BUSY, view.slo.model, *span)
    if busy is None or busy[0] <= 0:
        return None
    seconds, lo, hi = busy
    served = _requests_between(con, view, view.slo.model, lo, hi)
    if served is None:
        return None
    n, counted = served
    return {
        "basis": BASIS_EXECUTOR_BUSY,
        "accelerator_seconds_per_request": seconds / n,
        "basis_detail": (
            f"{N.METRIC_EXECUTOR_BUSY}: {seconds:.2f} s of executor busy time over {n:,.0f} requests "
            f"({counted}) in {(hi - lo) / 1000:.0f} s; one executor taken for one accelerator"
        ),
        "utilization": None,
    }


def _utilization(
    con: duckdb.DuckDBPyConnection, view: SLIView, span: tuple[int, int]
) -> dict[str, Any] | None:
    t0, t1 = span
    for metric in UTIL_METRICS:
        rows = con.execute(
            f"SELECT CAST(labels AS VARCHAR), avg({util_pct_sql(metric)}) FROM metric_samples WHERE metric = {sql_str(metric)} "
            f"AND ts_ms BETWEEN {t0} AND {t1} AND value IS NOT NULL GROUP BY 1"
        ).fetchall()
        if not rows or t1 <= t0:
            continue
        gpus = len(rows)
        mean = sum(float(r[1]) for r in rows) / gpus / 100.0
        served = _requests_between(con, view, view.slo.model, t0, t1)
        if served is None:
            return None
        n, counted = served
        seconds = mean * gpus * (t1 - t0) / 1000.0
        return {
            "basis": BASIS_UTILIZATION,
            "accelerator_seconds_per_request": seconds / n,
            "basis_detail": (
                f"{metric}: mean {mean:.0%} on {gpus} accelerator(s) x {(t1 - t0) / 1000:.0f} s = {seconds:.1f} "
                f"accelerator-seconds over {n:,.0f} requests ({counted})"
            ),
            "utilization": round(mean, 4),
        }
    return None


def _trace_compute(view: SLIView, attr: Attribution, con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    cols = [c for s, c in attr.columns.items() if s in ACCELERATOR_STAGES]
    if not view.per_request or not cols:
        return None
    work = f"({' + '.join(f'coalesce({c}, 0)' for c in cols)}) / greatest(coalesce(batch_size, 1), 1)"
    w = attr.weight or "1.0"
    row = con.execute(f"SELECT sum({w} * {work}) / nullif(sum({w}), 0) FROM {BREAKDOWN}").fetchone()
    if not row or row[0] is None or row[0] <= 0:
        return None
    stages = ", ".join(s for s in attr.columns if s in ACCELERATOR_STAGES)
    return {
        "basis": BASIS_TRACE_COMPUTE,
        "accelerator_seconds_per_request": float(row[0]) / 1000.0,
        "basis_detail": (
            f"the traces: each request's {stages} time over its batch size, {float(row[0]):.2f} ms per request on "
            "average (no executor busy time or accelerator utilization was scraped)"
        ),
        "utilization": None,
    }


def cost_report(
    con: duckdb.DuckDBPyConnection, view: SLIView, attr: Attribution | None, price_per_hour: float | None
) -> dict[str, Any] | None:
    """The report's ``cost`` block (see the module docstring), or None when no basis is in the data."""
    span = _span(con, view)
    got = None
    if span is not None:
        got = _executor_busy(con, view, span) or _utilization(con, view, span)
    if got is None and attr is not None:
        got = _trace_compute(view, attr, con)
    if got is None:
        return None
    acc = float(got["accelerator_seconds_per_request"])
    tok = con.execute(
        f"SELECT sum(output_tokens), count(output_tokens), count(*) FROM requests WHERE {view.request_filter}"
    ).fetchone()
    tokens = float(tok[0]) / float(tok[2]) if tok and tok[0] and tok[2] and tok[1] >= 0.5 * tok[2] else None
    util = got.get("utilization")
    per_1k = None if price_per_hour is None else price_per_hour / 3600.0 * acc * 1000.0
    out = {
        "accelerator_price_per_hour": price_per_hour,
        "accelerator_seconds_per_request": round(acc, 6),
        "basis": got["basis"],
        "basis_detail": got["basis_detail"],
        "utilization": util,
        "cost_per_1k_requests": None if per_1k is None else round(per_1k, 6),
        "fleet_cost_per_1k_requests": None if per_1k is None or not util else round(per_1k / util, 6),
        "output_tokens_per_request": None if tokens is None else round(tokens, 2),
        "cost_per_million_output_tokens": (
            None if per_1k is None or not tokens else round(per_1k / 1000.0 / tokens * 1e6, 4)
        ),
    }
    return out


def lever_cost_delta(cost: dict[str, Any] | None, effect: dict[str, Any]) -> dict[str, Any]:
    """A lever's ``cost_delta`` (pinned): ``relative`` (new cost over current, minus 1; None when the
    size is unknown), ``per_1k_requests`` and ``per_million_output_tokens`` (that change in the
    SLO's currency; None without a price or a basis), ``sign`` (``+``, ``-``, ``0``) and ``model``.
    Reusable on a counterfactual state: pass that state's ``cost`` block and the lever's effect."""
    work, cap = effect.get("work_factor"), effect.get("capacity_factor")
    rel = None if work is None or cap is None else round(float(work) * float(cap) - 1.0, 4)
    sign = effect.get("sign", "0") if rel is None else ("+" if rel > 1e-9 else "-" if rel < -1e-9 else "0")
    base = None
    if cost is not None and cost.get("cost_per_1k_requests") is not None:
        base = cost.get("fleet_cost_per_1k_requests") or cost["cost_per_1k_requests"]
    per_1k = None if rel is None or base is None else round(rel * float(base), 6)
    tokens = None if cost is None else cost.get("output_tokens_per_request")
    per_m = None if per_1k is None or not tokens else round(per_1k / 1000.0 / float(tokens) * 1e6, 4)
    basis = ""
    if per_1k is not None and cost is not None:
        basis = (
            " (of the fleet cost)"
            if cost.get("fleet_cost_per_1k_requests")
            else " (of the accelerator time used)"
        )
    return {
        "relative": rel,
        "per_1k_requests": per_1k,
        "per_million_output_tokens": per_m,
        "sign": sign,
        "model": effect.get("model", "") + basis,
    }
