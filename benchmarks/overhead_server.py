"""Where the trivial endpoint's cost goes inside the real uvicorn server, under the benchmark's client.

benchmarks/overhead_profile.py counts stagescope's work in-process (ASGI straight into the app); this
script looks at the server benchmarks/overhead.py measures: one uvicorn process per variant pinned to
one CPU, the same closed-loop client (16 keep-alive connections, ``POST /predict``) on the other CPU.
Per variant and per request, over ``--duration`` seconds after a warm-up:

* ``threads``: CPU of each thread of the server (``/proc/<pid>/task/*/stat``: user and system
  microseconds; voluntary and involuntary context switches), and the garbage collector's collections
  per 1,000 requests and microseconds per request (``gc.callbacks``, in the server): does a span,
  sink or metrics thread, a GIL hand-off or the collector cost CPU per request?
* ``calls``: Python and C calls per request in the whole server process (``sys.setprofile`` turned
  on by a signal after the warm-up), by function: the work the in-process profile does not see;
* ``bytecodes``: interpreter instructions per request in the whole server (``sys.settrace`` opcode
  events), by function.

The measured window starts half a second into the client's run (its connections are open) and ends
with it; requests are counted in the server when it counts calls or bytecodes (uvicorn's
``RequestResponseCycle.__init__``, once per request; not a coroutine, which counts again each time
it resumes), else by the client. The totals need thousands of requests per variant (a quiet machine,
or a longer ``--duration``): the profiled server is 5-50 times slower.

Counts (calls, bytecodes) do not depend on load; the CPU figures do (run them under
``flock /work/notes/measure.lock``). The profiler slows the server, so ``calls`` and ``bytecodes``
print no time. ``--top`` lists the functions whose count per request differs most between the first
two variants.

Run: ``python benchmarks/overhead_server.py --what threads --variants bare,stagescope``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from overhead import _client, _free_port, _wait_ready

from stagescope.procs import stop_process

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
#: Seconds into each client run at which the measured window starts (connections are open by then).
_WINDOW_AFTER_S = 0.5
#: The key under which the server counts requests (calls of uvicorn's RequestResponseCycle.__init__,
#: once per request in every variant)
_PER_REQUEST = "<requests>"

# The server: overhead_apps.serve, with a SIGUSR1 handler that turns counting on, then off and writes
# the counts (and the collector's figures, and thread names) to a JSON file.
_SERVER = r"""
import collections, gc, json, os, signal, sys, threading, time
sys.path.insert(0, sys.argv[5])
os.sched_setaffinity(0, {int(sys.argv[6])})
variant, port, spans, out, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[7]
counts = collections.Counter()
on = [False]
gc_n, gc_ns, gc_t0 = [0, 0, 0], [0], [0]

def gc_cb(phase, info):
    if phase == "start":
        gc_t0[0] = time.thread_time_ns()
    else:
        gc_n[info["generation"]] += 1
        gc_ns[0] += time.thread_time_ns() - gc_t0[0]

def prof(frame, event, arg):
    if event == "call":
        c = frame.f_code
        if c.co_qualname == "RequestResponseCycle.__init__":
            counts["<requests>"] += 1
        counts[c.co_filename.rsplit("site-packages/", 1)[-1] + ":" + c.co_qualname] += 1
    elif event == "c_call":
        counts[(getattr(arg, "__module__", None) or "") + ":" + getattr(arg, "__qualname__", "?") + " (C)"] += 1

def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "call" and frame.f_code.co_qualname == "RequestResponseCycle.__init__":
        counts["<requests>"] += 1
    if event == "opcode":
        c = frame.f_code
        counts[c.co_filename.rsplit("site-packages/", 1)[-1] + ":" + c.co_qualname] += 1
    return trace

def toggle(*_):
    if not on[0]:
        on[0] = True
        counts.clear()
        if what == "calls":
            sys.setprofile(prof)
        elif what == "bytecodes":
            sys.settrace(trace)
        state = {"gc": list(gc_n), "gc_ns": gc_ns[0]}
    else:
        sys.setprofile(None)
        sys.settrace(None)
        on[0] = False
        state = {"gc": list(gc_n), "gc_ns": gc_ns[0], "counts": dict(counts),
                 "threads": {t.native_id: t.name for t in threading.enumerate()}}
    with open(out, "a") as f:
        f.write(json.dumps(state) + "\n")

gc.callbacks.append(gc_cb)
signal.signal(signal.SIGUSR1, toggle)
from overhead_apps import serve
serve(variant, port, spans)
"""


def _tasks(pid: int) -> dict[int, tuple[int, int, int, int]]:
    """Per thread: (user ticks, system ticks, voluntary, involuntary context switches)."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            st = (t / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        vol = int(st.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        nvol = int(st.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[int(t.name)] = (int(f[11]), int(f[12]), vol, nvol)
    return out


def measure(variant: str, what: str, duration_s: float, cpus: tuple[int, int]) -> dict[str, Any]:
    """One fresh server of ``variant``: warm it, count for ``duration_s`` under the client, stop it."""
    port, spans, out = _free_port(), tempfile.mkdtemp(prefix="stagescope-server-"), tempfile.mktemp()
    cmd = [sys.executable, "-c", _SERVER, variant, str(port), spans, out, str(HERE), str(cpus[0]), what]
    proc = subprocess.Popen(cmd)
    marks: list[dict[int, tuple[int, int, int, int]]] = []

    def mark() -> None:  # at the start of the measured window: the client's connections are open
        marks.append(_tasks(proc.pid))
        os.kill(proc.pid, signal.SIGUSR1)

    try:
        _wait_ready(port, proc)
        asyncio.run(_client(port, 16, 0.3, 1.5, proc.pid, cpus[0]))  # warm-up
        timer = threading.Timer(_WINDOW_AFTER_S, mark)
        timer.start()
        got = asyncio.run(_client(port, 16, _WINDOW_AFTER_S, duration_s, proc.pid, cpus[0]))
        timer.join()
        after = _tasks(proc.pid)
        os.kill(proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(Path(out).read_text().splitlines()) < 2:
            time.sleep(0.1)
        start, end = (json.loads(line) for line in Path(out).read_text().splitlines()[:2])
    finally:
        stop_process(proc, signal.SIGINT, 30.0)
    before = marks[0]
    # requests: uvicorn's RequestResponseCycle.__init__ runs once per request (counted in the server while
    # it counts), else the client's count over the same window
    n = max(1, round(end.get("counts", {}).get(_PER_REQUEST, 0) or got["rps"] * duration_s))
    tick = os.sysconf("SC_CLK_TCK")
    threads = {}
    for tid, (u, s, v, nv) in after.items():
        u0, s0, v0, nv0 = before.get(tid, (0, 0, 0, 0))
        name = end["threads"].get(str(tid), "?")
        threads[name] = ((u - u0) / tick / n * 1e6, (s - s0) / tick / n * 1e6, (v - v0) / n, (nv - nv0) / n)
    return {
        "n": n,
        "rps": got["rps"],
        "cpu_us": got["cpu_us"],
        "threads": threads,
        "gc_per_1000": [(b - a) / n * 1000 for a, b in zip(start["gc"], end["gc"], strict=True)],
        "gc_us": (end["gc_ns"] - start["gc_ns"]) / 1000 / n,
        "counts": {k: v / n for k, v in end.get("counts", {}).items() if k != _PER_REQUEST},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--what", choices=("threads", "calls", "bytecodes"), default="threads")
    p.add_argument("--variants", default="bare,stagescope", help="comma list (default bare,stagescope)")
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per variant (default 4)")
    p.add_argument("--top", type=int, default=30, help="functions listed by difference (default 30)")
    args = p.parse_args()
    from overhead import VARIANTS_TRIVIAL

    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS_TRIVIAL]
    if bad or not variants or args.duration <= 0 or args.top < 0:
        print(f"overhead_server.py: --variants must name trivial-endpoint variants ({', '.join(VARIANTS_TRIVIAL)}),"
              " --duration > 0, --top >= 0", file=sys.stderr)  # fmt: skip
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    placement = (cpus[0], cpus[1] if len(cpus) > 1 else cpus[0])
    os.sched_setaffinity(0, {placement[1]})
    print(f"server on CPU {placement[0]}, client on CPU {placement[1]}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)  # fmt: skip
    results = {v: measure(v, args.what, args.duration, placement) for v in variants}
    for v, r in results.items():
        total = sum(r["counts"].values())
        line = f"{v}: {r['n']} requests"
        if args.what == "threads":
            line += f", {r['rps']:.0f}/s, server CPU {r['cpu_us']:.0f} us/request"
        else:
            line += f", {total:.1f} {args.what} per request (the profiler slows the server: no time)"
        print(line)
        if args.what == "threads":
            for name, (u, s, vol, nvol) in r["threads"].items():
                print(f"  thread {name:24s} user {u:6.1f} us  system {s:5.1f} us  switches {vol:.4f} voluntary, "
                      f"{nvol:.4f} involuntary  (per request)")  # fmt: skip
            gc_line = " ".join(f"{x:.2f}" for x in r["gc_per_1000"])
            print(f"  gc collections per 1000 requests (gen 0 1 2): {gc_line}; {r['gc_us']:.2f} us per request")
    if args.what != "threads" and len(variants) >= 2 and args.top:
        a, b = (results[v]["counts"] for v in variants[:2])
        print(f"{variants[1]} - {variants[0]}: {sum(b.values()) - sum(a.values()):+.1f} {args.what} per request; "
              f"largest differences per request ({variants[0]}, {variants[1]}, difference):")  # fmt: skip
        for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[: args.top]:
            print(f"  {a.get(k, 0):8.2f} {b.get(k, 0):8.2f} {b.get(k, 0) - a.get(k, 0):+8.2f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
