"""Whether the slot probe (:mod:`slot_probe`) can be trusted: the cores its servers got, against the
cores they may use.

The slot fault is sized from one request's time with every slot busy (``S``, measured by the probe).
Its servers share the machine with whatever else runs then, so ``S`` follows that: one probe, while
other work held the cores, had its servers on 0.32-0.40 of the one core each may use, timed ``S`` at
4,132 ms against 1,404-1,606 ms in the probes before and after it, and the baseline, on a freed
machine, did not breach at all. And the probe's server, with its own gateway and client beside it,
got 0.77-0.97 of its core, where a run's baseline server got 1.00-1.04 (CPU seconds from
``/proc/<pid>/stat``): the baselines held their slots 0.83-1.01x the probe's ``S``.

So the sizing

* measures the share (:func:`probe_share`): each server's CPU seconds over the burst's wall time (the
  probe's ``measured_cpu`` cells), over the cores it may use (:func:`server_allowance`: its
  ``--threads``, capped by its part of :func:`~stagescope.service.llama_cpp.cpu.available_cores`,
  the affinity mask and the cgroup quota; never a constant);
* repeats a probe whose share is under STARVED_SHARE, up to PROBE_ATTEMPTS probes, and keeps the
  least starved (:func:`best_attempt`);
* takes ``S`` at the server's full allowance (:func:`full_core_service`): a CPU-bound server's time
  scales with the cores it gets, and the run's baseline server gets its core. The measured times and
  cores still go to the analysis as measured (it rescales them itself, analysis.cpu_budget).

Limits: a server held back by something other than CPU (memory bandwidth, another process's cache)
shows a full share and a slow ``S``; the machine's load during the run is not known in advance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stagescope.errors import UserError

__all__ = [
    "PROBE_ATTEMPTS",
    "STARVED_SHARE",
    "ProbeShare",
    "best_attempt",
    "full_core_service",
    "probe_share",
    "server_allowance",
    "share_line",
]

#: A probe whose servers got under this share of the cores they may use ran starved, and is repeated:
#: the starved probe above got 0.32-0.40; the others of that series 0.77-0.97. 0.6 at first: a probe
#: whose lever servers got 0.60 passed, and its lever run, with the same outside load, held its slots
#: on 0.58 cores per server where the analysis expected the 0.84-0.87 of unloaded runs.
STARVED_SHARE = 0.7
#: Probes at most while each runs starved (about 40 s each); the least starved one counts.
PROBE_ATTEMPTS = 2


def server_allowance(threads: int, replicas: int, cores: float) -> float:
    """Cores one of ``replicas`` servers with ``threads`` threads each may use on ``cores`` cores: its
    threads, but no more than its part of the machine."""
    if threads < 1 or replicas < 1 or not (math.isfinite(cores) and cores > 0):
        raise UserError(f"llama.cpp: cannot size for {threads} threads x {replicas} servers on {cores:g} cores")
    return min(float(threads), cores / replicas)


@dataclass(frozen=True)
class ProbeShare:
    """The share of its allowance (cores) each probed server got with every slot busy: today's server
    (``serving``) and the lever's (``lever``); None where its CPU was not read."""

    serving: float | None
    lever: float | None
    serving_allowance: float
    lever_allowance: float

    @property
    def lowest(self) -> float | None:
        """The smaller known share; None when neither is known."""
        known = [s for s in (self.serving, self.lever) if s is not None]
        return min(known) if known else None

    @property
    def starved(self) -> bool:
        """Whether a server got under STARVED_SHARE of its allowance (unknown is not starved)."""
        low = self.lowest
        return low is not None and low < STARVED_SHARE


def probe_share(serving_cores: float | None, lever_cores: float | None, *, serving_allowance: float,
                lever_allowance: float) -> ProbeShare:  # fmt: skip
    """The :class:`ProbeShare` of the cores today's server and each lever server got (CPU s over wall s)
    against their allowances (:func:`server_allowance`)."""

    def share(cores: float | None, allowed: float) -> float | None:
        return None if cores is None or not math.isfinite(cores) or cores < 0 else cores / allowed

    return ProbeShare(share(serving_cores, serving_allowance), share(lever_cores, lever_allowance),
                      serving_allowance, lever_allowance)  # fmt: skip


def best_attempt(shares: list[ProbeShare]) -> int:
    """The index of the probe to keep: the first that did not run starved, else the one whose
    servers got the largest share."""
    if not shares:
        raise ValueError("no probe to choose from")
    for i, s in enumerate(shares):
        if not s.starved:
            return i
    return max(range(len(shares)), key=lambda i: shares[i].lowest or 0.0)


def full_core_service(service_s: float, share: float | None) -> float:
    """``S`` (s) as its server takes it on every core it may use: the probe's time x the share it got,
    never longer than measured (a share over 1 leaves it); as measured where the share is unknown."""
    if share is None or not share > 0:
        return service_s
    return service_s * min(1.0, share)


def share_line(share: ProbeShare, probes: int, measured_s: float, used_s: float) -> str:
    """One line saying what the kept probe's servers got (of ``probes`` run) and what the sizing made of
    it: ``measured_s``, the probe's S, and ``used_s``, :func:`full_core_service`'s."""
    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.0%}"

    line = (f"sizing probe: today's server got {pct(share.serving)} of the {share.serving_allowance:g} core(s) "
            f"it may use, the lever's {pct(share.lever)} of {share.lever_allowance:g} each")  # fmt: skip
    if share.starved:
        line += (f"; all {probes} probe(s) ran starved (under {STARVED_SHARE:.0%}: other work held the cores), "
                 "the least starved counts and its times are less certain")  # fmt: skip
    elif probes > 1:
        line += (f"; the {probes - 1} probe(s) before ran starved (under {STARVED_SHARE:.0%}: other work held "
                 "the cores) and were repeated")  # fmt: skip
    if used_s < measured_s:
        return line + (f"; S taken at the full allowance, as a run's server gets it: {measured_s * 1000:,.0f} -> "
                       f"{used_s * 1000:,.0f} ms")  # fmt: skip
    return line + f"; S {measured_s * 1000:,.0f} ms as measured"
