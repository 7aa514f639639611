"""The CPU budget of a scale-out on one machine: what the added servers are left of its cores.

A sizing probe times the lever's servers at each occupancy (``stagescope_executor_occupancy_service_seconds``)
on the machine as it was during the probe: its servers got some cores
(``stagescope_executor_occupancy_cpu_cores``), with the probe's own gateway and client beside them and
whatever else ran then. In the lever run the servers share the cores with the run's own gateway (spans,
metrics, the relay of every streamed token) and load generator, whose CPU grows with the tokens
streamed. So the probe's times are rescaled from the cores its servers got to the cores the run will
leave them (:func:`rescale`), from what the BASELINE run measured (:func:`baseline_budget`; never the
run after the lever):

* ``cores``: the machine's cores (``stagescope_host_cpu_cores``: affinity mask, cgroup quota);
* ``path_s_per_token``: the CPU seconds the gateway and the client took per streamed token
  (``stagescope_process_cpu_seconds_total{role="gateway"|"client"}`` over the run, over the tokens
  its requests streamed; every CPU second counted per token, its fixed part too: an upper bound);
* ``engine_cores``: the cores one engine server used while it had a busy slot (its
  ``role="engine"`` CPU over the time its slots were busy): a server never runs faster than that;
* ``outside_cores``: the cores that work outside the run took beside it at the servers' priority or
  above (``stagescope_host_cpu_competing_seconds_total`` over the run, less the run's own processes'
  CPU; 0 where the gateway did not export it). The lever run is assumed to share the cores with the same
  outside load, the way the kernel's fair scheduler shares them: each of ``k`` outside threads
  (``ceil(outside_cores)``) gets at most what each busy server gets, so the outside work takes
  ``min(outside_cores, k x (cores - path) / (servers + k))`` (:func:`outside_share`). Before, the model
  assumed the outside load had gone, which a probe, a baseline and a lever run on a machine kept busy
  by other work all contradict.

At an occupancy where the probe's busy servers got ``total`` cores together and the request's server
``c`` of them, with ``tok`` tokens/s streamed (the slots' tokens over their time at that occupancy),
the run's server gets ``min(engine_cores, c * (cores - path_s_per_token * tok - outside) / total)``: the
probe's split between the servers (a server with more busy slots takes more), scaled to what the gateway,
the client and the outside work (``outside``: :func:`outside_share`) leave; a request's time scales by the probe's cores over those. Limits: the servers are assumed CPU-bound and
single-process (one llama-server each); memory-bandwidth or SMT contention between servers that the
probe saw stays in its times; outside load that starts or stops between the baseline and the lever
run is not known in advance (the lever check reports the cores the lever run's servers got).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

from stagescope import names as N

__all__ = ["CPUBudget", "baseline_budget", "engine_cpu_per_request", "for_run", "occupancy_cores", "outside_share",
           "rescale", "server_cores"]

#: Fixed-point iterations of :func:`server_cores` (the tokens streamed depend on the servers' speed).
_ITERATIONS = 20


@dataclass(frozen=True)
class CPUBudget:
    """What the baseline run measured of its machine's CPU (see the module docstring); units in names."""

    cores: float
    path_s_per_token: float
    engine_cores: float
    path_cores: float  # the gateway's and the client's CPU over the run (cores), for the model line
    outside_cores: float = 0.0  # cores outside work took beside the run at its priority or above


def _rates(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], tuple[float, float, float]]:
    """``{(role, replica): (CPU s over the run, first ms, last ms)}`` of the CPU counters."""
    rows = con.execute(
        """SELECT coalesce(labels[?], ''), coalesce(labels[?], ''), max(value) - min(value), min(ts_ms), max(ts_ms)
           FROM metric_samples WHERE metric = ? AND value IS NOT NULL AND ts_ms IS NOT NULL GROUP BY 1, 2""",
        [N.LABEL_ROLE, N.LABEL_REPLICA, N.METRIC_PROCESS_CPU],
    ).fetchall()
    return {(str(r), str(x)): (float(d), float(a), float(b)) for r, x, d, a, b in rows if d is not None and b > a}


def baseline_budget(con: duckdb.DuckDBPyConnection, stream_stages: list[str]) -> CPUBudget | None:
    """The :class:`CPUBudget` of the run in ``con`` (its metric samples and its requests' ``stream_stages``,
    prefill and decode); None without the machine's cores, the gateway's or an engine's CPU, or tokens."""
    try:
        got = con.execute(
            "SELECT arg_max(value, coalesce(ts_ms, 0)) FROM metric_samples WHERE metric = ? AND value > 0",
            [N.METRIC_HOST_CPU_CORES],
        ).fetchone()
        rates = _rates(con)
    except duckdb.Error:
        return None
    if got is None or got[0] is None or not rates:
        return None
    cores = float(got[0])
    path = {k: v for k, v in rates.items() if k[0] in (N.ROLE_GATEWAY, N.ROLE_CLIENT)}
    engines = {k: v for k, v in rates.items() if k[0] == N.ROLE_ENGINE}
    if not any(k[0] == N.ROLE_GATEWAY for k in path) or not engines:
        return None
    lo = min(a for _, a, _ in path.values())
    hi = max(b for _, _, b in path.values())
    stages = ", ".join("'" + s.replace("'", "''") + "'" for s in stream_stages)
    # tokens streamed within the counters' window, and the time any slot of each run was busy in it
    row = con.execute(
        f"""WITH h AS (SELECT request_key, min(start_unix_ns) / 1e6 AS s, max(end_unix_ns) / 1e6 AS e FROM stages
                       WHERE stage IN ({stages}) GROUP BY 1),
                 t AS (SELECT h.*, r.output_tokens FROM h JOIN requests r USING (request_key))
            SELECT sum(output_tokens) FILTER (WHERE e BETWEEN ? AND ?), count(*) FROM t""",
        [lo, hi],
    ).fetchone()
    spans = con.execute(
        f"""SELECT min(start_unix_ns) / 1e6, max(end_unix_ns) / 1e6 FROM stages WHERE stage IN ({stages})
            GROUP BY request_key ORDER BY 1"""
    ).fetchall()
    if row is None or not row[0] or not spans:
        return None
    tokens = float(row[0])
    busy, cur_s, cur_e = 0.0, None, None  # union of the holds, clipped to the window
    for s, e in spans:
        s, e = max(float(s), lo), min(float(e), hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            busy += 0.0 if cur_e is None or cur_s is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += 0.0 if cur_e is None or cur_s is None else cur_e - cur_s
    if busy <= 0:
        return None
    path_cpu = sum(d for d, _, _ in path.values())
    # one server's cores while busy: the busiest engine's CPU over the time a slot was busy (a run with
    # one server; with several, each one's over the same time is a lower bound)
    engine = max(d for d, _, _ in engines.values()) / (busy / 1000.0)
    window_s = (hi - lo) / 1000.0
    return CPUBudget(cores=cores, path_s_per_token=path_cpu / tokens, engine_cores=engine,
                     path_cores=path_cpu / window_s, outside_cores=_outside(con, rates))  # fmt: skip


def _outside(con: duckdb.DuckDBPyConnection, rates: dict[tuple[str, str], tuple[float, float, float]]) -> float:
    """Cores taken beside the run by work outside it at its priority or above: the host's competing CPU
    rate less the rate of each of the run's own processes (each over its own counter's window); 0
    without the host's counter."""
    got = con.execute(
        """SELECT max(value) - min(value), min(ts_ms), max(ts_ms) FROM metric_samples
            WHERE metric = ? AND value IS NOT NULL AND ts_ms IS NOT NULL""",
        [N.METRIC_HOST_CPU_COMPETING],
    ).fetchone()
    if got is None or got[0] is None or got[2] <= got[1]:
        return 0.0
    host = float(got[0]) / ((float(got[2]) - float(got[1])) / 1000.0)
    own = sum(d / ((b - a) / 1000.0) for d, a, b in rates.values())
    return max(0.0, host - own)


def engine_cpu_per_request(con: duckdb.DuckDBPyConnection) -> float | None:
    """CPU seconds the run's engine servers took per request that generated tokens (all servers' CPU
    over the run, over those requests); None without engine CPU or such requests. A lever run whose
    servers take more CPU per request than its baseline ran slower for the same work than any CPU
    share explains (two servers on shared cores: +4 to +19 % in this machine's runs)."""
    try:
        rates = _rates(con)
        got = con.execute("SELECT count(*) FROM requests WHERE output_tokens > 0").fetchone()
    except duckdb.Error:
        return None
    engine = sum(d for (role, _), (d, _, _) in rates.items() if role == N.ROLE_ENGINE)
    n = int(got[0]) if got is not None and got[0] is not None else 0
    return engine / n if engine > 0 and n > 0 else None


def outside_share(budget: CPUBudget, *, left: float, servers: int) -> float:
    """The cores the outside work takes beside ``servers`` busy CPU-bound servers when the gateway and the
    client leave ``left`` cores: its ``k = ceil(outside_cores)`` threads get at most the fair share each
    (``left / (servers + k)``) and at most what they took in the baseline."""
    if budget.outside_cores <= 0:
        return 0.0
    k = max(1, math.ceil(budget.outside_cores - 1e-9))
    return min(budget.outside_cores, k * max(left, 0.0) / (max(servers, 1) + k))


def occupancy_cores(con: duckdb.DuckDBPyConnection, lever: str) -> tuple[dict[tuple[int, int], float], float | None]:
    """``({(own, others): cores}, cores as served)``: the cores the measured server got in each
    occupancy's measurement of ``lever``'s servers and in the measurement as served (every slot busy;
    exported with ``busy_own`` = ``busy_others`` = 0); ({}, None) without them."""
    try:
        rows = con.execute(
            """SELECT labels[?], labels[?], labels[?], arg_max(value, coalesce(ts_ms, 0)) FROM metric_samples
                WHERE metric = ? AND value > 0 GROUP BY 1, 2, 3""",
            [N.LABEL_VARIANT, N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS, N.METRIC_EXECUTOR_OCCUPANCY_CPU],
        ).fetchall()
    except duckdb.Error:
        return {}, None
    table: dict[tuple[int, int], float] = {}
    served = None
    for variant, own, others, v in rows:
        if v is None or not math.isfinite(float(v)) or not str(own).isdigit() or not str(others).isdigit():
            continue
        if variant == N.VARIANT_SERVING:
            served = float(v)
        elif variant == lever and int(own) >= 1:
            table[(int(own), int(others))] = float(v)
    return table, served


def server_cores(budget: CPUBudget, *, probe_cores: float, probe_total: float, busy_slots: int, tokens: float,
                 probe_ms: float, servers: int = 1) -> float:  # fmt: skip
    """The cores a server gets in the run at an occupancy where the probe's server got ``probe_cores`` and
    all the probe's busy servers together ``probe_total``, its ``busy_slots`` slots streaming ``tokens``
    tokens each, the probe timing a request at ``probe_ms``: the probe's split between the servers, scaled
    to what the gateway and the client leave of the cores (their CPU per token times the tokens per
    second at that speed) and the outside work beside the ``servers`` busy servers (:func:`outside_share`),
    at most ``engine_cores``. A fixed point: the slower the servers, the fewer tokens per second the
    gateway and the client relay."""
    got = probe_cores
    for _ in range(_ITERATIONS):
        hold_s = probe_ms / 1000.0 * probe_cores / max(got, 1e-9)
        left = budget.cores - budget.path_s_per_token * busy_slots * tokens / max(hold_s, 1e-9)
        left -= outside_share(budget, left=left, servers=servers)
        got = min(budget.engine_cores, max(0.05 * probe_cores, probe_cores * left / max(probe_total, 1e-9)))
    return got


def rescale(
    table_ms: dict[tuple[int, int], float], cores: dict[tuple[int, int], float], budget: CPUBudget, *,
    served_ms: float, served_cores: float | None, replicas: int, tokens: float,
) -> tuple[dict[tuple[int, int], float], float]:  # fmt: skip
    """``(table, served ms)`` rescaled from the cores the probe's servers got (``cores``, ``served_cores``)
    to those the run leaves them (:func:`server_cores`): served as in the baseline (one server busy, the
    baseline's own ``engine_cores``); each occupancy ``(own, others)`` with all the probe's busy servers'
    cores: its own and, where measured, the other server's in the same burst (``(others, own)``, two
    servers), else its own times the servers the gateway's placement keeps busy. A cell without its
    cores is kept."""
    served = served_ms * (served_cores / budget.engine_cores if served_cores else 1.0)
    out: dict[tuple[int, int], float] = {}
    for (own, others), ms in table_ms.items():
        probe = cores.get((own, others))
        if probe is None:
            out[(own, others)] = ms
            continue
        busy = 1 + min(replicas - 1, others)
        mirror = cores.get((others, own)) if replicas == 2 and others > 0 else None
        total = probe + mirror if mirror is not None else probe * busy
        run = server_cores(budget, probe_cores=probe, probe_total=total, busy_slots=own + others, tokens=tokens,
                           probe_ms=ms, servers=busy)  # fmt: skip
        out[(own, others)] = ms * probe / run
    return out, served


def for_run(
    con: duckdb.DuckDBPyConnection, table_ms: dict[tuple[int, int], float], served_ms: float,
    stream_stages: list[str], lever: str, *, replicas: int,
) -> tuple[dict[tuple[int, int], float], float, CPUBudget | None]:  # fmt: skip
    """``(table, served ms, budget)``: the occupancy table and the served time :func:`rescale`-d with the
    run's :func:`baseline_budget`, where the run recorded it and the probe its cores; else as given, None."""
    budget = baseline_budget(con, stream_stages)
    cores, served_cores = occupancy_cores(con, lever) if budget is not None else ({}, None)
    got = con.execute("SELECT avg(output_tokens) FROM requests WHERE output_tokens > 0").fetchall() if cores else []
    tok = got[0] if got else None  # fetchall: the caller registers a table on this connection next
    if budget is None or tok is None or not tok[0]:
        return table_ms, served_ms, None
    table, served = rescale(table_ms, cores, budget, served_ms=served_ms, served_cores=served_cores,
                            replicas=replicas, tokens=float(tok[0]))  # fmt: skip
    return table, served, budget
