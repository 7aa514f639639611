"""Queueing estimates for the counterfactuals: Erlang C and the Allen-Cunneen G/G/c waiting time.

For ``c`` servers each serving ``mu`` requests/s, arrivals ``lam`` requests/s (offered load
``a = lam / mu``, utilization ``rho = a / c < 1``), the probability that a request waits is Erlang's C
formula, and the waiting-time tail is approximately exponential (Allen-Cunneen, exact for M/M/c)::

    P(W > t) ~= C(c, a) * exp(-t * (c * mu - lam) * 2 / (ca2 + cs2))

with ``ca2`` and ``cs2`` the squared coefficients of variation of inter-arrival and service times
(1 and 1 for M/M/c). The wait of a request at uniform rank ``u`` is then 0 when ``u <= 1 - C`` and
``ln(C / (1 - u)) / theta`` otherwise; :func:`wait_ms_sql` writes that as a SQL expression so each
request gets a deterministic rank from its trace id. Limits: stationary arrivals, identical servers,
first-come first-served; a bursty trace or a warm-up period makes the real tail longer.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

__all__ = [
    "DRIFT_PARTS",
    "Arrivals",
    "QueueModel",
    "arrivals",
    "erlang_c",
    "replay_shared",
    "replay_waits",
    "servers_for",
    "speed_drift",
    "uniform_rank_sql",
    "work_at_full",
]

#: :func:`speed_drift` compares the medians of this many consecutive parts of a run.
DRIFT_PARTS = 3


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in an M/M/c queue with offered load ``a`` (Erlangs); 1.0 when ``a >= c``."""
    if c <= 0 or a >= c:
        return 1.0
    if a <= 0:
        return 0.0
    term = 1.0
    total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    top = term * a / c * c / (c - a)
    return top / (total + top)


def servers_for(a: float, wait_share: float, start: int = 1, limit: int = 256) -> int:
    """Smallest ``c >= start`` for which fewer than ``wait_share`` of requests wait at all."""
    c = max(start, 1)
    while c < limit and erlang_c(c, a) >= wait_share:
        c += 1
    return c


@dataclass(frozen=True)
class QueueModel:
    """``servers`` servers of ``mu_per_s`` requests/s each, arrivals ``lam_per_s``, variabilities."""

    servers: int
    mu_per_s: float
    lam_per_s: float
    ca2: float = 1.0
    cs2: float = 1.0

    @property
    def utilization(self) -> float:
        return self.lam_per_s / (self.servers * self.mu_per_s)

    @property
    def p_wait(self) -> float:
        return erlang_c(self.servers, self.lam_per_s / self.mu_per_s)

    def wait_ms_sql(self, rank_sql: str) -> str:
        """SQL expression: the waiting time (ms) at uniform rank ``rank_sql`` in [0, 1)."""
        if self.utilization >= 0.999:
            return "NULL::DOUBLE"  # unstable: no finite prediction
        p = self.p_wait
        if p <= 0:
            return "0.0"
        theta = (self.servers * self.mu_per_s - self.lam_per_s) * 2.0 / max(self.ca2 + self.cs2, 1e-6)
        return (
            f"(CASE WHEN {rank_sql} <= {1.0 - p!r} THEN 0.0 "
            f"ELSE ln({p!r} / greatest(1.0 - {rank_sql}, 1e-9)) / {theta!r} * 1000.0 END)"
        )


def uniform_rank_sql(col: str) -> str:
    """A deterministic pseudo-uniform rank in [0, 1) from a column (DuckDB ``hash``)."""
    return f"((hash({col}) % 1000003) / 1000003.0)"


@dataclass(frozen=True)
class Arrivals:
    """Arrival rate (requests/s) and squared coefficient of variation of inter-arrival times."""

    rate_per_s: float
    ca2: float
    count: int


def arrivals(con: duckdb.DuckDBPyConnection, view: str, scale_ms: float | None = None) -> Arrivals:
    """Arrival statistics of the requests in ``view`` (a relation with one ``start_unix_ns`` row per
    request, such as :attr:`~stagescope.analysis.breach.SLIView.arrivals`).

    ``ca2`` is the squared coefficient of variation of the inter-arrival gaps; with ``scale_ms`` it is
    instead the index of dispersion of arrival counts in windows of that length (variance / mean of
    the counts; 1 for Poisson arrivals): the arrivals' variability at the time scale of one service,
    which is what a queue feels (gap CV2 over-weights near-simultaneous sends).

    Where the relation has a weight column ``w`` that is not all 1 (sampled traces: each kept request
    stands for ``w`` requests), the rate is the summed weight over the time spanned, and ``ca2`` the
    index of dispersion of the weighted counts less the sampling's own variance (``sum(w^2 - w)``
    per window, for independent keep decisions); 1 (Poisson) without ``scale_ms``."""
    weighted = (
        con.execute(f"SELECT count(*) FILTER (WHERE w <> 1) FROM {view}").fetchone()
        if _has_weight(con, view)
        else None
    )
    if weighted and weighted[0]:
        return _weighted_arrivals(con, view, scale_ms)
    row = con.execute(
        f"""WITH s AS (SELECT start_unix_ns - lag(start_unix_ns) OVER (ORDER BY start_unix_ns) AS gap
                       FROM {view})
            SELECT count(*) + 1, avg(gap), var_pop(gap) FROM s WHERE gap IS NOT NULL"""
    ).fetchone()
    if row is None or not row[1]:
        return Arrivals(0.0, 1.0, int(row[0]) if row else 0)
    n, mean, var = row
    ca2 = float(var) / float(mean) ** 2 if var is not None and mean else 1.0
    if scale_ms is not None and scale_ms > 0:
        w = max(1, int(scale_ms * 1e6))
        idc = con.execute(
            f"""WITH a AS (SELECT start_unix_ns FROM {view}),
                     b AS (SELECT (start_unix_ns - (SELECT min(start_unix_ns) FROM a)) // {w} AS k, count(*) AS c
                           FROM a GROUP BY 1),
                     f AS (SELECT coalesce(b.c, 0) AS c FROM range((SELECT max(k) + 1 FROM b)) r(k)
                           LEFT JOIN b USING (k))
                SELECT var_pop(c) / avg(c) FROM f"""
        ).fetchone()
        if idc is not None and idc[0] is not None:
            ca2 = float(idc[0])
    return Arrivals(1e9 / float(mean), min(4.0, max(0.25, ca2)) if math.isfinite(ca2) else 1.0, int(n))


def _has_weight(con: duckdb.DuckDBPyConnection, view: str) -> bool:
    try:
        cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {view}").fetchall()}
    except duckdb.Error:
        return False
    return "w" in cols


def _weighted_arrivals(con: duckdb.DuckDBPyConnection, view: str, scale_ms: float | None) -> Arrivals:
    row = con.execute(
        f"SELECT count(*), sum(w), (max(start_unix_ns) - min(start_unix_ns)) / 1e9 FROM {view}"
    ).fetchone()
    if row is None or not row[0] or not row[2]:
        return Arrivals(0.0, 1.0, int(row[0]) if row else 0)
    n, total, span_s = int(row[0]), float(row[1]), float(row[2])
    ca2 = 1.0
    if scale_ms is not None and scale_ms > 0:
        w_ns = max(1, int(scale_ms * 1e6))
        idc = con.execute(
            f"""WITH a AS (SELECT start_unix_ns, w FROM {view}),
                     b AS (SELECT (start_unix_ns - (SELECT min(start_unix_ns) FROM a)) // {w_ns} AS k,
                                  sum(w) AS c, sum(w * w - w) AS v FROM a GROUP BY 1),
                     f AS (SELECT coalesce(b.c, 0) AS c, coalesce(b.v, 0) AS v FROM range((SELECT max(k) + 1 FROM b)) r(k)
                           LEFT JOIN b USING (k))
                SELECT (var_pop(c) - avg(v)) / avg(c) FROM f"""
        ).fetchone()
        if idc is not None and idc[0] is not None and math.isfinite(float(idc[0])):
            ca2 = float(idc[0])
    return Arrivals(total / span_s, min(4.0, max(0.25, ca2)), n)


def replay_waits(arrivals_ms: list[float], service_ms: list[float], servers: int) -> list[float]:
    """Each request's wait (ms) in a first-come first-served queue of ``servers`` identical servers,
    the requests arriving at ``arrivals_ms`` (sorted) and holding a server for ``service_ms`` (a
    trace-driven replay: Kiefer-Wolfowitz's recursion for G/G/c, the next free server's time). Unlike
    the steady-state formulas it keeps the trace's own bursts and its length: a short window that
    starts with an empty queue does not wait as long as the steady state (the relaxation time of a
    queue at utilization ``rho`` grows as ``1 / (1 - sqrt(rho))^2`` service times)."""
    if servers < 1:
        raise ValueError(f"servers must be at least 1, got {servers}")
    free = [float("-inf")] * servers
    out: list[float] = []
    for t, s in zip(arrivals_ms, service_ms, strict=True):
        start = max(t, heapq.heappop(free))
        out.append(start - t)
        heapq.heappush(free, start + max(0.0, s))
    return out


def replay_shared(
    arrivals_ms: list[float], work_ms: list[float], *, replicas: int, slots: int,
    slowdown: Callable[[int, int], float],
) -> list[float]:  # fmt: skip
    """Each request's wait (ms) in a first-come first-served replay through ``replicas`` servers of
    ``slots`` slots each that share one machine: a request holding a slot progresses at
    ``1 / slowdown(own, others)`` ms of its ``work_ms`` per ms, ``own`` being the busy slots of its
    server and ``others`` those of the other servers at that moment (1 = the speed its ``work_ms``
    was measured at). A waiting request takes a slot of the server with the most free slots, the
    lowest index on a tie (the llama.cpp gateway's router). Unlike :func:`replay_waits` a request's
    slot time is not fixed: it follows the occupancy, which on a machine whose cores the servers share
    changes as requests come and go (a lever run's slots were held 1.1-1.3x as long as one server's,
    and twice as long with every slot of both busy as with one slot alone). An event-driven replay:
    O(requests x slots) per event."""
    if replicas < 1 or slots < 1:
        raise ValueError(f"replicas and slots must be at least 1, got {replicas} and {slots}")
    n = len(arrivals_ms)
    if len(work_ms) != n:
        raise ValueError(f"{n} arrivals but {len(work_ms)} work times")
    waits = [0.0] * n
    busy = [0] * replicas
    active: list[list[float]] = []  # [request, replica, work left in ms]
    queue: list[int] = []
    t, k = float("-inf"), 0

    def admit() -> None:
        while queue and any(b < slots for b in busy):
            r = max(range(replicas), key=lambda i: (slots - busy[i], -i))
            i = queue.pop(0)
            busy[r] += 1
            waits[i] = t - arrivals_ms[i]
            active.append([float(i), float(r), max(0.0, work_ms[i])])

    while k < n or active:
        total = sum(busy)
        rates = [1.0 / max(1e-9, slowdown(busy[int(a[1])], total - busy[int(a[1])])) for a in active]
        finish = min((a[2] / v for a, v in zip(active, rates, strict=True)), default=math.inf)
        nxt = arrivals_ms[k] - t if k < n else math.inf
        dt = max(0.0, min(finish, nxt))
        t = arrivals_ms[k] if nxt <= finish and k < n else t + dt
        for a, v in zip(active, rates, strict=True):
            a[2] -= v * dt
        if nxt <= finish and k < n:
            queue.append(k)
            k += 1
        else:
            done = [a for a in active if a[2] <= 1e-9 * max(1.0, abs(t))]
            for a in done or [min(active, key=lambda a: a[2])]:
                active.remove(a)
                busy[int(a[1])] -= 1
        admit()
    return waits


def speed_drift(hold_ms: list[float], parts: int = DRIFT_PARTS) -> float:
    """How far the time to serve the same work moved within one run: the largest over the smallest
    median hold among ``parts`` consecutive parts of ``hold_ms`` (in arrival order), minus 1 (0.08 =
    8 %); 0 with fewer than 2 holds a part. Meant for a run whose slots were busy throughout (each hold
    the same work at the same occupancy), so what moves is the machine's speed for it. A replay that
    predicts another run minutes later from these holds can be off by that much in its slot times;
    where the queue sits near its knee that moves the predicted quantile several times as much (a
    llama.cpp scale-out: 5 % longer slot times, 17-39 % longer TTFT p95), so the replay is repeated at
    ``1 -/+ drift`` for the prediction's interval (analysis.slot_replay.slot_scale_out)."""
    n = len(hold_ms) // max(1, parts)
    if parts < 2 or n < 2:
        return 0.0
    meds = sorted(sorted(hold_ms[i * n:(i + 1) * n])[n // 2] for i in range(parts))
    return meds[-1] / meds[0] - 1.0 if meds[0] > 0 else 0.0


def work_at_full(holds: list[tuple[float, float]], slowdown: Callable[[int], float]) -> list[float]:
    """Each hold ``(start ms, end ms)`` on one server as work at the speed of that server with every slot
    busy (ms): the integral over the hold of ``1 / slowdown(busy)``, ``busy`` being how many of the
    holds overlap at that moment (itself included) and ``slowdown(busy)`` the server's time at that
    occupancy over its time with every slot busy (below 1 while slots are free). A replay whose requests
    progress at the speed of an occupancy relative to every slot busy (:func:`replay_shared`) needs its
    work in those units: a baseline not saturated throughout ran part of its holds faster (one llama.cpp
    baseline held its slots 1,207 ms on average, against 1,594 ms with both slots busy, and the
    lever run then held them 1.32x as long as predicted). A sweep over the holds' ends: O(n log n)."""
    events = sorted([(s, 1) for s, e in holds if e > s] + [(e, -1) for s, e in holds if e > s])
    # F(t) = integral of 1 / slowdown(busy) from the first event: piecewise linear between events
    times: list[float] = []
    cum: list[float] = []
    busy, acc, last = 0, 0.0, None
    for t, d in events:
        if last is not None and t > last and busy > 0:
            acc += (t - last) / max(1e-9, slowdown(busy))
        times.append(t)
        cum.append(acc)
        busy, last = busy + d, t

    def at(t: float) -> float:  # F at an event time (the last entry at t: every change at t applied)
        return cum[bisect.bisect_right(times, t) - 1]

    return [at(e) - at(s) if e > s else 0.0 for s, e in holds]
