"""CPU accounting for the scale-out model on a machine whose cores the servers share: how many cores
this process may run on, and the CPU seconds each of the run's own processes took.

The lever's second llama-server shares the machine with the first, the gateway (spans, metrics, the
relay of every streamed token) and, in the demo, the load generator. The analysis leaves the servers
what the cores are less what the gateway and the client take (analysis.cpu_budget), so the gateway
exports, for every scrape (:class:`ProcessCPU`):

* ``stagescope_host_cpu_cores``: the cores this process may use (:func:`available_cores`: the CPU
  affinity mask, capped by a cgroup CPU quota where there is one);
* ``stagescope_process_cpu_seconds_total{role}``: its own CPU (``gateway``) and that of each engine
  server it started (``engine``, by ``replica``; read from ``/proc/<pid>/stat``). A server it only
  fronts (``--upstream``) has no pid here and no sample. A read that fails is counted
  (:attr:`ProcessCPU.failures`, exported as ``stagescope_process_cpu_read_failures_total``) and
  skipped;
* ``stagescope_host_cpu_competing_seconds_total``: the CPU seconds every process together took on the
  cores this one may run on (its affinity set, from ``/proc/stat``'s per-CPU lines) at its priority or
  above: user, system, irq, softirq and steal (a hypervisor's too), and niced user time only when this
  process is niced itself (work at nice 19 yields to a nice-0 server, so it is not counted then). The
  analysis takes the run's own processes off it: what is left is the outside load the servers shared
  the cores with. Not exported under a cgroup CPU quota below the affinity set (there the host's lines
  count other containers' work, not what the quota shares) nor where ``/proc/stat`` cannot be read.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stagescope import names as N
from stagescope.procs import process_cpu_s

__all__ = ["ProcessCPU", "available_cores", "competing_cpu_s", "process_cpu_s"]

_CGROUP = Path("/sys/fs/cgroup")


def _quota_cores(root: Path = _CGROUP) -> float | None:
    """The cgroup CPU quota in cores (v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us`` / ``cfs_period_us``);
    None without a quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else float(quota) / float(period)
    except (OSError, ValueError):
        pass
    try:
        q = float((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = float((root / "cpu" / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def available_cores(root: Path = _CGROUP) -> float:
    """Cores this process may run on: ``os.sched_getaffinity`` (else ``os.cpu_count``), capped by the
    cgroup's CPU quota (a container limited to 1.5 CPUs on a 16-core host has 1.5)."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        n = float(os.cpu_count() or 1)
    q = _quota_cores(root)
    return min(n, q) if q is not None and math.isfinite(q) and q > 0 else n


def competing_cpu_s(stat: str, cpus: set[int], *, niced: bool, clk_tck: float) -> float | None:
    """CPU seconds taken on ``cpus`` at a priority that competes with a process (``niced``: whether it
    runs at a nice value above 0), from the text of ``/proc/stat``: user, system, irq, softirq and steal
    of each ``cpuN`` line, and nice too when ``niced``; None without a line for every CPU of ``cpus``."""
    total, seen = 0, set()
    for line in stat.splitlines():
        head, _, rest = line.partition(" ")
        if not head.startswith("cpu") or not head[3:].isdigit() or int(head[3:]) not in cpus:
            continue
        try:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in rest.split()[:8])
        except ValueError:
            return None
        total += user + system + irq + softirq + steal + (nice if niced else 0)
        seen.add(int(head[3:]))
    return total / clk_tck if seen == cpus and cpus else None


def _competing_now() -> float | None:
    """:func:`competing_cpu_s` of this process now; None where it cannot be read or a cgroup quota caps
    the cores below the affinity set (see the module docstring)."""
    try:
        cpus = set(os.sched_getaffinity(0))
        q = _quota_cores()
        if q is not None and q < len(cpus):
            return None
        stat = Path("/proc/stat").read_text()
        return competing_cpu_s(stat, cpus, niced=os.getpriority(os.PRIO_PROCESS, 0) > 0,
                               clk_tck=float(os.sysconf("SC_CLK_TCK")))  # fmt: skip
    except (AttributeError, OSError, ValueError):
        return None


class ProcessCPU(Collector):
    """The gateway's own CPU, its engine servers' (``engines``: replica -> pid) and the host's cores,
    read at each scrape (a few ``/proc`` reads; nothing runs between scrapes)."""

    def __init__(self, engines: Mapping[int, int] | None = None) -> None:
        self.engines = dict(engines or {})
        self.cores = available_cores()
        self.failures = 0

    def collect(self) -> Iterable[Metric]:
        cpu = CounterMetricFamily(N.METRIC_PROCESS_CPU.removesuffix("_total"),
                                  "CPU seconds (user + system) of the run's own processes on this machine",
                                  labels=[N.LABEL_ROLE, N.LABEL_REPLICA])  # fmt: skip
        cpu.add_metric([N.ROLE_GATEWAY, ""], time.process_time())
        for replica, pid in sorted(self.engines.items()):
            secs = process_cpu_s(pid)
            if secs is None:
                self.failures += 1
                continue
            cpu.add_metric([N.ROLE_ENGINE, str(replica)], secs)
        cores = GaugeMetricFamily(N.METRIC_HOST_CPU_CORES, "cores this process may run on (affinity mask, cgroup quota)")
        cores.add_metric([], self.cores)
        out: list[Metric] = [cpu, cores]
        competing = _competing_now()
        if competing is not None:
            host = CounterMetricFamily(N.METRIC_HOST_CPU_COMPETING.removesuffix("_total"),
                                       "CPU seconds taken on the cores this process may use at its priority or above "
                                       "(every process's: user, system, irq, softirq, steal; nice only if niced)")  # fmt: skip
            host.add_metric([], competing)
            out.append(host)
        fails = CounterMetricFamily(N.METRIC_PROCESS_CPU_READ_FAILURES.removesuffix("_total"),
                                    "engine CPU reads that failed (process gone)")
        fails.add_metric([], float(self.failures))
        return [*out, fails]
