"""Size a slot fault (true stage ``queue``: every slot busy, requests wait) to this machine now, and
measure what the scale-out model needs: how long a request holds a slot on the lever's servers at each
occupancy of the machine.

* As served: one request's time holding a slot with every slot of the scenario's servers busy (``S``);
  the arrival rate is SLOTS_OVERLOAD x those slots' capacity, and the TTFT threshold
  TTFT_SLO_OVER_SERVICE x ``S`` (:func:`slot_load`).
* With the lever (a second server): ``n`` requests at once for every ``n`` from 1 to all the lever's
  slots, through a gateway that places them as in a run (the replica with the most free slots first)
  and says where (its replica header), and each request's time read by the replica's occupancy: ``T(own, others)``, its own server's busy slots and
  the other servers'. On a machine whose cores the servers share, a request on one server slows when
  the other server decodes too, and the lever run's servers are not always both full: the scale-out
  model (analysis.slot_replay.slot_scale_out) replays the arrivals with each request's speed following
  the occupancy at each moment (analysis.queueing.replay_shared).

Times are taken as a streaming client sees them through the stagescope gateway (probe.probe_gateway,
probe.stream_hold_s: sent -> last token), the way the run's load generator is served and its slot
times recorded; llama.cpp's own ``timings`` leave out the per-token streaming and its relay. One probe on this machine, load average about 3 (other engineers' work): the
lever's servers with every slot busy took 1.6-2.1x as long as today's server by llama.cpp's timings
(non-streaming), 1.2-1.3x streamed; the lever runs held their slots 1.1-1.3x as long. Rounds alternate
between today's servers and the lever's, and the medians count, so a change in the machine's other
load between them moves both alike. All times go to the gateway (``measured_service.*`` overrides,
:data:`MEASURED_PREFIX`), which exports them for the analysis, each with the cores its server got
during the burst (``measured_cpu.*``, :data:`MEASURED_CPU_PREFIX`: the server's CPU seconds from
``/proc`` over the longest hold on it), from which the analysis rescales them to what the run's own
gateway and client leave the servers (analysis.cpu_budget).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.llama_cpp.cpu import available_cores, process_cpu_s
from stagescope.service.llama_cpp.probe import (
    config,
    probe_gateway,
    probe_servers,
    probe_text,
    server_pid,
    stream_hold_s,
    timings,
)
from stagescope.service.llama_cpp.probe_share import (
    PROBE_ATTEMPTS,
    ProbeShare,
    best_attempt,
    full_core_service,
    probe_share,
    server_allowance,
    share_line,
)
from stagescope.service.scenarios import Scenario

__all__ = [
    "MEASURED_CPU_PREFIX",
    "MEASURED_PREFIX",
    "OCCUPANCY_MARK",
    "SLOTS_OVERLOAD",
    "SLOT_PROBE_ROUNDS",
    "SLOT_RUN_ARRIVALS",
    "SLOT_RUN_MAX_S",
    "TTFT_SLO_OVER_SERVICE",
    "export_measured",
    "occupancy_key",
    "parse_occupancy_key",
    "size_slots",
    "slot_load",
]

#: The slot fault's arrival rate over the capacity of the server's slots at its full cores
#: (probe_share.full_core_service): an overload, so every slot is busy and the queue grows by
#: ``1 - 1 / SLOTS_OVERLOAD`` of the elapsed time, on top of the trace's bursts. 1.5 at first: a 45 s run
#: on a machine slower than its probe had 35 of 81 requests wait past the load generator's 30 s
#: timeout. Then 1.25 of the probe's S as measured, which put the lever's after-state on the knee of
#: the queueing curve: replaying five recorded baselines, 5 % longer slot times moved the predicted
#: queue wait p95 by 31-39 % (17-33 % at 1.15, 8-25 % at 1.05). And the probe's server got 0.77-0.97 of
#: its core where the baselines' got 1.00-1.04, so those runs were at about 1.25 / 0.9 of their
#: capacity, further up the knee. S is now taken at the server's full core, and a starved probe
#: repeated, so a run's baseline is not faster than S; 1.15 keeps the breach (the queue grows by 13 % of
#: the run, 80 arrivals: about 4 S against a threshold of 2 S) with the lever's servers further below
#: their capacity (about 1.6x today's on two shared cores). A moderate load was tried and measured
#: (0.35 / 0.6 / 0.75 with a threshold of 0.3 S, docs/llama_cpp_slots_operating_point.md): the trace's
#: bursts (120 arrivals, inter-arrival cv^2 2.0) still queued 7-29 % of the lever run's requests, so its
#: p95 moved 1.8-6.2x as much as the slot times (2.7-5.5x at 1.15), and errors were +29 / -18 / -42 %.
SLOTS_OVERLOAD = 1.15
#: The slot fault's TTFT threshold over one request's service time (every slot busy).
TTFT_SLO_OVER_SERVICE = 2.0
#: Rounds of the slot probe, alternating between the scenario's servers and the lever's; the medians
#: count. The machine's other load moves within a minute: one round of each once gave the lever's
#: servers 1.76x the time per request, and the lever run a minute later held its slots 0.91x as long.
SLOT_PROBE_ROUNDS = 3
#: A slot fault's run lasts long enough for this many arrivals at the sized rate (the demo's runs are
#: at least that long): a 12 s run had 28, so its TTFT p95 was the second-longest wait, and a
#: bootstrap of one lever run's p95 spanned 2,177-3,197 ms (5-95 %) around 2,737 ms. With 80 the p95
#: is the 4th-longest.
SLOT_RUN_ARRIVALS = 80
#: ... but at most this long (s): a slow machine's low rate would otherwise ask for minutes.
SLOT_RUN_MAX_S = 60.0
#: An override so named is a measurement the gateway exports (serve ``--measured-service``), not an engine
#: setting: ``measured_service.<variant>`` = one request's service time in s with every slot busy, as
#: served (``serving``) and with the lever's servers (``scale-out``), for the analysis' scale-out model;
#: ``measured_service.<variant>@<own>+<others>`` the same at that occupancy (:func:`occupancy_key`).
MEASURED_PREFIX = "measured_service."
#: An override so named is the cores (CPU s over wall s) the request's server got in the measured-service
#: measurement of the same key (serve ``--measured-cpu``), exported for the scale-out model's CPU budget.
MEASURED_CPU_PREFIX = "measured_cpu."
#: Separates the variant from the occupancy in a measured-service key (``scale-out@2+1``).
OCCUPANCY_MARK = "@"


def occupancy_key(variant: str, own: int, others: int) -> str:
    """``variant@own+others``: the measured-service key of a request's time with ``own`` busy slots on
    its server and ``others`` on the other servers."""
    return f"{variant}{OCCUPANCY_MARK}{own}+{others}"


def parse_occupancy_key(key: str) -> tuple[str, int, int] | None:
    """``(variant, own, others)`` of an :func:`occupancy_key`; None for a plain variant; a UserError for
    a malformed one (own at least 1, others at least 0)."""
    variant, mark, occ = key.partition(OCCUPANCY_MARK)
    if not mark:
        return None
    own, plus, others = occ.partition("+")
    if not variant or not plus or not own.isdigit() or not others.isdigit() or int(own) < 1:
        raise UserError(f"--measured-service {key!r}: expected VARIANT@OWN+OTHERS busy slots, e.g. scale-out@2+1")
    return variant, int(own), int(others)


def slot_load(service_s: float, *, slots: int) -> tuple[float, float]:
    """``(arrival rate /s, TTFT threshold ms)`` for a slot fault: SLOTS_OVERLOAD x the capacity of
    ``slots`` slots that each serve a request in ``service_s``, and TTFT_SLO_OVER_SERVICE x that time."""
    if service_s <= 0:
        raise UserError(f"llama.cpp: a request's service time must be positive, got {service_s:g} s")
    return SLOTS_OVERLOAD * slots / service_s, TTFT_SLO_OVER_SERVICE * service_s * 1000.0


def _holds(gateway: str, n: int, sc: Scenario, key: int, pids: list[int | None]) -> list[tuple[float, int, float | None]]:
    """``[(streamed slot time s, replica, cores its server got)]`` of ``n`` of scenario ``sc``'s requests
    sent at once through the probe's ``gateway`` (which places them, and says where); ``pids``: the
    gateway's servers in replica order, whose CPU seconds over the burst, divided by the longest time
    a request held one of its slots, are the cores it got (None where a pid is unknown)."""
    w = sc.workload
    before = [None if p is None else process_cpu_s(p) for p in pids]
    with ThreadPoolExecutor(n) as ex:
        got = list(ex.map(lambda i: stream_hold_s(gateway, probe_text(w.prompt_tokens, key + i), w.max_tokens), range(n)))
    after = [None if p is None else process_cpu_s(p) for p in pids]
    if any(r is None or not r.isdigit() or int(r) >= len(pids) for _, r in got):
        raise UserError("llama.cpp: the sizing probe's gateway did not say which replica served a request")
    placed = [(secs, int(str(r))) for secs, r in got]
    shares: list[float | None] = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        wall = max((secs for secs, r in placed if r == i), default=0.0)
        shares.append((a - b) / wall if a is not None and b is not None and wall > 0 else None)
    return [(secs, r, shares[r]) for secs, r in placed]


Cell = tuple[float, float | None]  # (median s, median cores where measured)


def _median_cell(times: list[float], cores: list[float | None]) -> Cell:
    known = [c for c in cores if c is not None]
    return statistics.median(times), statistics.median(known) if known else None


def _occupancy_round(gateway: str, replicas: int, slots: int, sc: Scenario, key: int,
                     pids: list[int | None]) -> dict[tuple[int, int], Cell]:  # fmt: skip
    """``{(own, others): (median s, median cores)}`` from ``n`` = 1 .. every slot of the gateway's
    servers at once."""
    out: dict[tuple[int, int], tuple[list[float], list[float | None]]] = {}
    for n in range(1, replicas * slots + 1):
        got = _holds(gateway, n, sc, key + 10 * n, pids)
        for secs, r, cores in got:
            own = sum(1 for _, x, _ in got if x == r)
            cell = out.setdefault((own, n - own), ([], []))
            cell[0].append(secs)
            cell[1].append(cores)
    return {k: _median_cell(*v) for k, v in out.items()}


def _measure(cfg: Any, lever: Any, sc: Scenario) -> tuple[Cell, dict[tuple[int, int], Cell]]:
    """``(S, {(own, others): T})``, each with the cores its server got: today's servers with every slot
    busy, and the lever's servers at each occupancy, each behind its own gateway; the medians of
    SLOT_PROBE_ROUNDS alternating rounds (all servers and gateways start first)."""
    w = sc.workload
    with probe_servers(cfg) as now, probe_servers(lever) as new, probe_gateway(now, cfg.parallel) as g_now, \
            probe_gateway(new, lever.parallel) as g_new:  # fmt: skip
        for u in (*now, *new):
            timings(u, probe_text(w.prompt_tokens, 0), 4)  # warm-up
        pids_now, pids_new = [server_pid(u) for u in now], [server_pid(u) for u in new]
        served: tuple[list[float], list[float | None]] = ([], [])
        table: dict[tuple[int, int], tuple[list[float], list[float | None]]] = {}
        for r in range(SLOT_PROBE_ROUNDS):
            got = _holds(g_now, cfg.parallel * cfg.replicas, sc, 1000 * r + 1, pids_now)
            served[0].append(statistics.median(s for s, _, _ in got))
            served[1].append(_median_cell([1.0], [c for _, _, c in got])[1])
            for k, (secs, cores) in _occupancy_round(g_new, lever.replicas, lever.parallel, sc, 1000 * r + 501,
                                                     pids_new).items():  # fmt: skip
                cell = table.setdefault(k, ([], []))
                cell[0].append(secs)
                cell[1].append(cores)
    return _median_cell(*served), {k: _median_cell(*v) for k, v in sorted(table.items())}


def size_slots(sc: Scenario) -> tuple[dict[str, Any], str]:
    """The slot fault's overrides (rate, SLO, the measured times for the gateway) and one line saying them."""
    cfg = config(sc)
    lever = config(sc, apply_lever=True)
    full = (lever.parallel, (lever.replicas - 1) * lever.parallel)
    host = available_cores()
    allowed = server_allowance(cfg.threads, cfg.replicas, host), server_allowance(lever.threads, lever.replicas, host)
    attempts: list[tuple[tuple[Cell, dict[tuple[int, int], Cell]], ProbeShare]] = []
    for _ in range(PROBE_ATTEMPTS):  # a probe whose servers ran starved is repeated (probe_share)
        got = _measure(cfg, lever, sc)
        share = probe_share(got[0][1], got[1][full][1] if full in got[1] else None,
                            serving_allowance=allowed[0], lever_allowance=allowed[1])  # fmt: skip
        attempts.append((got, share))
        if not share.starved:
            break
    pick = best_attempt([s for _, s in attempts])
    ((measured_s, service_cores), cells), share = attempts[pick]
    table = {k: secs for k, (secs, _) in cells.items()}
    if full not in table:
        raise UserError(f"llama.cpp: the sizing probe never had every slot of the lever's servers busy ({sorted(table)})")
    lever_service = table[full]
    # the rate and the threshold from S at the server's full allowance, as the run's baseline server
    # gets it (probe_share); the times go to the analysis as measured, with the cores they had
    service = full_core_service(measured_s, share.serving)
    rate, ttft = slot_load(service, slots=cfg.parallel * cfg.replicas)
    rate, ttft = round(rate, 1), float(max(10, round(ttft, -1)))
    # the lever's capacity from its time at full cores too, as S above: a starved probe's raw time
    # would say the lever's servers are busier than the rate was sized for
    lever_cap = lever.parallel * lever.replicas / full_core_service(lever_service, share.lever)
    spec = f"{sc.slo.sli}:p{sc.slo.objective * 100:g}<{ttft:g}ms"
    measured = {f"{MEASURED_PREFIX}{N.VARIANT_SERVING}": round(measured_s, 4),
                f"{MEASURED_PREFIX}{sc.lever}": round(lever_service, 4)}  # fmt: skip
    for (own, others), secs in table.items():
        measured[MEASURED_PREFIX + occupancy_key(str(sc.lever), own, others)] = round(secs, 4)
    # the cores each measurement's server got: the analysis rescales the times from them to what the
    # run's servers will be left of the machine (analysis.cpu_budget)
    if service_cores is not None:
        measured[f"{MEASURED_CPU_PREFIX}{N.VARIANT_SERVING}"] = round(service_cores, 4)
    for (own, others), (_, cores) in cells.items():
        if cores is not None:
            measured[MEASURED_CPU_PREFIX + occupancy_key(str(sc.lever), own, others)] = round(cores, 4)
    seen = ", ".join(f"{own}+{others} busy {secs * 1000:.0f}"
                     + (f" on {cells[(own, others)][1]:.2f} cores" if cells[(own, others)][1] is not None else "")
                     for (own, others), secs in table.items())  # fmt: skip
    run_s = float(min(SLOT_RUN_MAX_S, math.ceil(SLOT_RUN_ARRIVALS / rate)))
    return {"scenario.rate_rps": rate, "scenario.slo_spec": spec, "run.min_duration_s": run_s, **measured}, (
        f"slot load sized to this machine now: a request takes {service * 1000:.0f} ms (streamed, its server on its full cores) with all "
        f"{cfg.parallel * cfg.replicas} slots busy, so {rate:g} requests/s ({SLOTS_OVERLOAD:g} x their capacity) "
        f"and SLO {spec} ({TTFT_SLO_OVER_SERVICE:g} x that time); on the lever's {lever.replicas} servers a "
        f"request took ({seen} ms: its server's busy slots + the others'): {lever_cap:.2f} requests/s with "
        f"all busy, {rate / lever_cap:.0%} busy at that rate; the same in the lever check, and all these times go "
        f"to the scale-out model (exported by the gateway); runs of at least {run_s:g} s ({run_s * rate:.0f} arrivals)"
        f"\n  {share_line(share, len(attempts), measured_s, service)}"
    )


def export_measured(measured_service_s: Mapping[str, float], registry: CollectorRegistry,
                     measured_cpu_cores: Mapping[str, float] | None = None) -> None:
    """The measured service times as gauges in ``registry`` (the gateway's): plain variants and, by occupancy, ``variant@own+others``;
    with ``measured_cpu_cores`` (same keys) the cores the request's server got in each measurement."""
    if measured_cpu_cores:
        cpu = Gauge(N.METRIC_EXECUTOR_OCCUPANCY_CPU, "cores (CPU s / wall s) the request's server process got in "
                    "that measurement, before the run", [N.LABEL_VARIANT, N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS],
                    registry=registry)  # fmt: skip
        for key, cores in measured_cpu_cores.items():
            got = parse_occupancy_key(key)
            variant, own, others = got if got is not None else (key, 0, 0)  # 0+0: with every slot busy
            cpu.labels(variant, str(own), str(others)).set(float(cores))

    g = Gauge(N.METRIC_EXECUTOR_SERVICE, "median s one request holds a slot with every slot busy, measured "
              "before the run (variant: as served, or with a lever's servers)", [N.LABEL_VARIANT], registry=registry)  # fmt: skip
    occ = Gauge(N.METRIC_EXECUTOR_OCCUPANCY, "median s one request holds a slot with busy_own slots of its server "
                "and busy_others of the other servers busy, measured before the run",
                [N.LABEL_VARIANT, N.LABEL_BUSY_OWN, N.LABEL_BUSY_OTHERS], registry=registry)  # fmt: skip
    for key, secs in measured_service_s.items():
        parsed = parse_occupancy_key(key)
        if parsed is None:
            g.labels(key).set(float(secs))
        else:
            occ.labels(parsed[0], str(parsed[1]), str(parsed[2])).set(float(secs))
