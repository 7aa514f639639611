"""How much the lever's slot times move against today's within minutes on this machine: the
llama-slots-busy scenario's servers (today's one 2-slot llama-server, the lever's two), each behind
its probe gateway, timed as the sizing probe times them (``n`` streams sent at once, sent -> last
token) and under ``DUR`` seconds of closed-loop load (``n`` clients, each sending again as soon as its
answer ends); prints the medians and lever / today both ways. Timing: run it under the measurement
lock, ``flock /work/notes/measure.lock python benchmarks/slot_ratio_drift.py [DUR] [--pin]`` (about a
minute at 15 s). With ``--pin`` each server is pinned to a core of its own (server.placement;
today's server and the lever's first on the first core). docs/llama_cpp_slots_operating_point.md has the runs.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from stagescope.service.llama_cpp.probe import (
    config,
    probe_gateway,
    probe_servers,
    probe_text,
    stream_hold_s,
    timings,
)
from stagescope.service.llama_cpp.scenarios import get_scenario


def main(argv: list[str]) -> int:
    pin = "--pin" in argv
    argv = [a for a in argv if a != "--pin"]
    try:
        dur = float(argv[0]) if argv else 15.0
    except ValueError:
        print(f"slot_ratio_drift: DUR must be seconds, got {argv[0]!r}", file=sys.stderr)
        return 2
    if not 1.0 <= dur <= 300.0:
        print(f"slot_ratio_drift: DUR must be 1-300 s, got {dur:g}", file=sys.stderr)
        return 2
    sc = get_scenario("llama-slots-busy")
    w = sc.workload
    cfg, lever = config(sc), config(sc, apply_lever=True)

    def burst(g: str, n: int, key: int) -> list[float]:
        with ThreadPoolExecutor(n) as ex:
            return [s for s, _ in ex.map(lambda i: stream_hold_s(g, probe_text(w.prompt_tokens, key + i), w.max_tokens),
                                          range(n))]  # fmt: skip

    def sustained(g: str, n: int, key: int) -> list[float]:
        out: list[float] = []
        stop = time.perf_counter() + dur

        def client(c: int) -> None:
            k = key + 1000 * c
            while time.perf_counter() < stop:
                out.append(stream_hold_s(g, probe_text(w.prompt_tokens, k), w.max_tokens)[0])
                k += 1

        ts = [threading.Thread(target=client, args=(c,)) for c in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out[n:]  # the first n started together

    with probe_servers(cfg, pin=pin) as now, probe_servers(lever, pin=pin) as new, probe_gateway(now, cfg.parallel) as g_now, \
            probe_gateway(new, lever.parallel) as g_new:  # fmt: skip
        for u in (*now, *new):
            timings(u, probe_text(w.prompt_tokens, 0), 4)  # warm-up
        slots_now, slots_new = cfg.parallel * cfg.replicas, lever.parallel * lever.replicas
        got: dict[str, list[float]] = {"today burst": [], "lever burst": []}
        for r in range(2):
            got["today burst"] += burst(g_now, slots_now, 100 + 10 * r)
            got["lever burst"] += burst(g_new, slots_new, 200 + 10 * r)
        got["today sustained"] = sustained(g_now, slots_now, 10_000)
        got["lever sustained"] = sustained(g_new, slots_new, 20_000)
        for r in range(2):
            got["today burst"] += burst(g_now, slots_now, 300 + 10 * r)
            got["lever burst"] += burst(g_new, slots_new, 400 + 10 * r)
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in got.items():
        print(f"{k}: {len(v)} holds, median {med[k] * 1000:.0f} ms")
    print(f"servers {'pinned' if pin else 'not pinned'}; lever / today: bursts {med['lever burst'] / med['today burst']:.2f}, "
          f"sustained {med['lever sustained'] / med['today sustained']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
