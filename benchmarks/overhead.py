"""What stagescope costs a FastAPI service, as paired ratios over many short interleaved rounds.

Variants (servers in benchmarks/overhead_apps.py, each one uvicorn process):
  trivial endpoint (``POST /predict`` answering a small JSON): (a) ``bare``, no instrumentation;
  (b) ``stock``, opentelemetry-instrumentation-fastapi with every span exported (BatchSpanProcessor to
  a null exporter); (c) ``stagescope``, ``instrument_app`` defaults (fast mode, tail sampling, embedded
  sink, the OpenTelemetry context attached for the handler's own spans), three ``stage()`` blocks per
  request, metrics for every request;
  realistic endpoint (a dynamic batcher in front of a SIMULATED accelerator, 5 ms of ``asyncio.sleep``
  per batch, max batch 8, max wait 2 ms): (d) ``bare-batch``, ``stagescope.DynamicBatcher`` alone;
  (e) ``stagescope-batch``, the same plus ``instrument_app`` and two stages; (f) ``plain-batch``, a
  minimal batcher with no stagescope at all.

How it measures. ``--blocks`` times, one fresh server process per variant is started (a process's own
speed moves from one start to the next, so several are sampled); in each block ``--rounds`` paired
rounds run every variant back to back (the order alternates from round to round) for ``--duration``
seconds each, after ``--warmup`` seconds, with a closed-loop client of ``--connections`` keep-alive
connections that runs in this process. Per round and variant it records requests/s, the server
process's own CPU time per request (utime + stime of all its threads, from /proc/<pid>/stat), the
server's share of a core, and the client's share of its core (if the client's core is full, the
ratio measures the client, and the script says so). Each round gives a throughput ratio and a
capacity ratio (bare's CPU per request over the variant's) against its baseline; the script reports
their medians over all rounds with a distribution-free 95 % interval (order statistics of the
median, binomial ranks).

Placement (``--placement``): ``separate`` (default) pins every server to one CPU and the client to
another with ``os.sched_setaffinity``, so client and server never share a core and the scheduler
cannot move them onto one; ``same`` pins both to one CPU; ``none`` leaves placement to the kernel.

One request in 1000 asks for ``?slow=1`` and sleeps 300 ms: for the stagescope variants the script
checks that every request slower than 250 ms kept its full trace (server histogram against the spans
in the sink after each block's graceful stop).

Run: ``python benchmarks/overhead.py`` (``make bench``); ``--help`` for options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from overhead_report import PAIRS, pct, report

from stagescope.procs import process_cpu_s, stop_process

SLOW_EVERY = 1000
VARIANTS_TRIVIAL = ("bare", "stock", "stagescope")
VARIANTS_REALISTIC = ("bare-batch", "stagescope-batch", "plain-batch")
ENV_CLEAR = (
    "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_ENDPOINT", "STAGESCOPE_SPANS_DIR",
    "STAGESCOPE_SLOW_THRESHOLD_MS", "STAGESCOPE_BASELINE_SAMPLE", "PROMETHEUS_MULTIPROC_DIR",
)  # fmt: skip


# ------------------------------------------------------------------------------------------ client
def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    secs = process_cpu_s(pid)
    if secs is None:
        raise OSError(f"cannot read /proc/{pid}/stat")
    return secs


def _cpu_stat() -> dict[int, list[int]]:
    """Per CPU, /proc/stat's jiffies: user nice system idle iowait irq softirq steal."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split()
            out[int(f[0][3:])] = [int(x) for x in f[1:9]]
    return out


async def _client(
    port: int, connections: int, warmup_s: float, duration_s: float, server_pid: int, server_cpu: int | None
) -> dict[str, float]:
    """One closed-loop measurement: requests/s, server CPU us per request, server and client core shares,
    and on the server's CPU (when pinned) the share other processes took and the hypervisor's steal."""
    body = b'{"x": 1}'
    head = b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"
    normal, slow = head % b"/predict" + body, head % b"/predict?slow=1" + body
    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s
    counts = [0] * connections
    sent = [0]  # all connections together: every SLOW_EVERY-th request is a slow one

    async def conn(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                break
            sent[0] += 1
            writer.write(slow if sent[0] % SLOW_EVERY == 0 else normal)
            header = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            if not header.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(header.decode(errors="replace"))
            if now >= measure_from:
                counts[i] += 1
        writer.close()

    async def cpu_window() -> tuple[float, float, float, float, dict[int, list[int]], dict[int, list[int]]]:
        await asyncio.sleep(measure_from - time.perf_counter())
        c0, p0, s0 = _cpu_seconds(server_pid), time.process_time(), _cpu_stat()
        await asyncio.sleep(stop_at - time.perf_counter())
        return c0, _cpu_seconds(server_pid), p0, time.process_time(), s0, _cpu_stat()

    window = asyncio.ensure_future(cpu_window())
    await asyncio.gather(*(conn(i) for i in range(connections)))
    c0, c1, p0, p1, s0, s1 = await window
    n = sum(counts)
    out = {
        "rps": n / duration_s,
        "cpu_us": (c1 - c0) / max(n, 1) * 1e6,
        "cpu_share": (c1 - c0) / duration_s,
        "client_share": (p1 - p0) / duration_s,
        "others_share": float("nan"),
        "steal_share": float("nan"),
    }
    if server_cpu is not None and server_cpu in s0 and server_cpu in s1:
        d = [b - a for a, b in zip(s0[server_cpu], s1[server_cpu], strict=True)]
        tick = os.sysconf("SC_CLK_TCK") * duration_s
        busy = (d[0] + d[1] + d[2] + d[5] + d[6]) / tick
        out["others_share"] = max(0.0, busy - out["cpu_share"])
        out["steal_share"] = d[7] / tick
    return out


# ------------------------------------------------------------------------------------------ driver
def context_cost(n: int = 200_000, repeats: int = 5) -> tuple[float, float]:
    """Microseconds per request, in this process: (looking at the current span, attaching and detaching
    the request's context), each net of an empty loop; best of ``repeats``."""
    from opentelemetry.trace import INVALID_SPAN, Span

    from stagescope.instrumentation.otel_context import (
        SPAN_KEY,
        attach_request_context,
        current_context,
        detach_request_context,
    )
    from stagescope.instrumentation.tracing import TracedRecord, new_span_id, new_trace_id

    rec = TracedRecord()
    rec.trace_id, rec.span_id = new_trace_id(), new_span_id()

    def timed(body: Any) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            body()
            best = min(best, time.perf_counter() - t0)
        return best / n * 1e6

    def empty() -> None:
        for _ in range(n):
            pass

    def look() -> None:  # as the middleware does it: one read of the current Context
        for _ in range(n):
            live = current_context().get(SPAN_KEY)
            if live is not None and live is not INVALID_SPAN and isinstance(live, Span):
                live.get_span_context()

    def attach() -> None:
        for _ in range(n):
            detach_request_context(attach_request_context(rec, current_context()))

    base = timed(empty)
    return timed(look) - base, timed(attach) - base


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


def _scrape_slow(port: int, threshold_s: float) -> int:
    """Requests slower than the threshold, from the server's own request-duration histogram."""
    import urllib.request

    from stagescope import names

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = below = 0.0
    for line in text.splitlines():
        if line.startswith(names.METRIC_REQUEST_DURATION + "_count"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(names.METRIC_REQUEST_DURATION + "_bucket") and f'le="{threshold_s}"' in line:
            below += float(line.rsplit(" ", 1)[1])
    return int(total - below)


def _sink_traces(spans_dir: Path, threshold_ns: int) -> tuple[int, int, int]:
    """(server spans, server spans slower than the threshold, of those with all their stage spans)."""
    servers: dict[str, tuple[int, int]] = {}
    stage_count: dict[str, int] = {}
    for f in spans_dir.glob("spans-*.jsonl"):
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        if s["kind"] == 2:
                            dur = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])
                            servers[s["spanId"]] = (dur, 0)
                        else:
                            stage_count[s["parentSpanId"]] = stage_count.get(s["parentSpanId"], 0) + 1
    slow = [sid for sid, (dur, _) in servers.items() if dur >= threshold_ns]
    complete = [sid for sid in slow if stage_count.get(sid, 0) >= 3]
    return len(servers), len(slow), len(complete)


def _placement(mode: str) -> tuple[set[int] | None, set[int] | None, str]:
    """(server CPUs, client CPUs, what was done) for ``--placement``."""
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "none":
        return None, None, f"not pinned (kernel's choice among CPUs {cpus})"
    if mode == "same" or len(cpus) < 2:
        how = "both on" if mode == "same" else "only one CPU available: both on"
        return {cpus[0]}, {cpus[0]}, f"server and client pinned {how} CPU {cpus[0]}"
    return (
        {cpus[0]},
        {cpus[1]},
        f"servers pinned to CPU {cpus[0]}, client to CPU {cpus[1]} (sched_setaffinity)",
    )


class _Server:
    """One variant's uvicorn process for one block."""

    def __init__(self, variant: str, cpus: set[int] | None) -> None:
        self.variant, self.cpus = variant, cpus
        self.port = _free_port()
        self.spans_dir = tempfile.mkdtemp(prefix=f"stagescope-bench-{variant}-")
        env = {k: v for k, v in os.environ.items() if k not in ENV_CLEAR}
        cmd = [
            sys.executable,
            __file__,
            "--serve",
            variant,
            "--port",
            str(self.port),
            "--spans-dir",
            self.spans_dir,
        ]
        if cpus is not None:
            cmd += ["--cpus", ",".join(map(str, sorted(cpus)))]
        self.proc = subprocess.Popen(cmd, env=env)

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT, 30.0)


def _measure(server: _Server, args: argparse.Namespace, warmup_s: float) -> dict[str, float]:
    cpu = min(server.cpus) if server.cpus else None
    return asyncio.run(_client(server.port, args.connections, warmup_s, args.duration, server.proc.pid, cpu))


def run_block(block: int, variants: list[str], args: argparse.Namespace, cpus: set[int] | None,
              rounds: list[dict[str, dict[str, float]]]) -> bool:  # fmt: skip
    """Start fresh servers, warm them, run ``args.rounds`` paired rounds into ``rounds``, stop them and
    check the slow requests' traces; True when every slow request kept its full trace."""
    servers = {v: _Server(v, cpus) for v in variants}
    ok = True
    try:
        for s in servers.values():
            _wait_ready(s.port, s.proc)
        for s in servers.values():
            _measure(s, args, args.block_warmup)
        for r in range(args.rounds):
            i = len(rounds)
            order = variants if i % 2 == 0 else variants[::-1]
            got = {v: _measure(servers[v], args, args.warmup) for v in order}
            rounds.append(got)
            cells = "  ".join(
                f"{v} {x['rps']:5.0f}/s {x['cpu_us']:4.0f}us {100 * x['cpu_share']:3.0f}%|c{100 * x['client_share']:.0f}%"
                f"|o{pct(x['others_share'])}|st{pct(x['steal_share'])}"
                for v, x in got.items()
            )
            ratios = "  ".join(
                f"{v}/{b} {got[v]['rps'] / got[b]['rps']:.3f},{got[b]['cpu_us'] / got[v]['cpu_us']:.3f}"
                for _, v, b, _ in PAIRS
                if v in got and b in got
            )
            print(f"b{block + 1} r{r + 1:<2d} {_load_short()}  {cells}  ratios {ratios}", flush=True)
        slow = {v: _scrape_slow(s.port, 0.25) for v, s in servers.items() if v.startswith("stagescope")}
    finally:
        for s in servers.values():
            s.stop()
    for v, n_slow in slow.items():  # after the graceful stop: the sink has flushed everything
        n, _, complete = _sink_traces(Path(servers[v].spans_dir), 250_000_000)
        print(
            f"b{block + 1} {v}: traces kept {n}; slower than 250 ms: {n_slow} requests, {complete} full traces"
        )
        ok = ok and complete >= n_slow
    return ok


def _autogroup() -> str:
    """This process's autogroup and its nice (Linux with autogroup scheduling: ``nice`` only orders
    processes of one session; between sessions the autogroup's own nice decides, see sched(7))."""
    try:
        return "autogroup " + Path("/proc/self/autogroup").read_text().strip().split("/", 1)[-1]
    except OSError:
        return "no autogroup"


def _load_short() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu_mhz() -> str:
    try:
        mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]  # fmt: skip
    except (OSError, ValueError):
        return "CPU MHz not exposed"
    freq = (
        "cpufreq exposed" if Path("/sys/devices/system/cpu/cpu0/cpufreq").exists() else "no cpufreq (fixed)"
    )
    return f"cpu MHz {'/'.join(f'{m:.0f}' for m in mhz)} ({freq})" if mhz else "CPU MHz not exposed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--blocks", type=int, default=4, help="fresh server processes per variant, in turn (default 4)"
    )
    p.add_argument("--rounds", type=int, default=5, help="paired rounds per block (default 5)")
    p.add_argument(
        "--duration", type=float, default=2.0, help="measured seconds per variant per round (default 2)"
    )
    p.add_argument("--warmup", type=float, default=0.3, help="unmeasured seconds before each (default 0.3)")
    p.add_argument(
        "--block-warmup", type=float, default=1.5, help="unmeasured seconds per fresh server (default 1.5)"
    )
    p.add_argument("--connections", type=int, default=16, help="client connections (default 16)")
    p.add_argument("--placement", choices=("separate", "same", "none"), default="separate",
                   help="servers and client on separate pinned CPUs (default), one pinned CPU, or unpinned")  # fmt: skip
    p.add_argument("--only", choices=("trivial", "realistic"), help="run one endpoint only")
    p.add_argument("--variants", help="comma list of variants to run (default: all of the endpoint(s))")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--spans-dir", help=argparse.SUPPRESS)
    p.add_argument("--cpus", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        from overhead_apps import serve

        serve(args.serve, args.port, args.spans_dir)
        return 0
    known = VARIANTS_TRIVIAL + VARIANTS_REALISTIC
    variants: list[str] = []
    if args.only != "realistic":
        variants += VARIANTS_TRIVIAL
    if args.only != "trivial":
        variants += VARIANTS_REALISTIC
    if args.variants:
        variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in known]
    if bad or not variants:
        print(f"overhead.py: unknown variant(s) {', '.join(bad) or '(none given)'}; known: {', '.join(known)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.blocks < 1 or args.rounds < 1 or args.duration <= 0 or args.warmup < 0 or args.connections < 1:
        print("overhead.py: --blocks, --rounds, --connections must be >= 1, --duration > 0, --warmup >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    server_cpus, client_cpus, placement = _placement(args.placement)
    if client_cpus is not None:
        os.sched_setaffinity(0, client_cpus)
    import uvicorn

    http_impl = "httptools" if _has("httptools") else "h11"
    loop_impl = "uvloop" if _has("uvloop") else "asyncio"
    print(f"uvicorn {uvicorn.__version__} ({http_impl}, {loop_impl}), one server process per variant; client: "
          f"{args.connections} connections in this process; {args.blocks} blocks x {args.rounds} paired rounds x "
          f"{args.duration:g} s; {os.cpu_count()} CPUs, {_cpu_mhz()}; {placement}", flush=True)  # fmt: skip
    look_us, attach_us = context_cost()
    print(f"fast mode's OpenTelemetry context per request (in-process): current-span look-up {look_us:.2f} us, "
          f"attach + detach of the request's context {attach_us:.2f} us", flush=True)  # fmt: skip
    print(f"before: {_load()}; scheduling: {_autogroup()}", flush=True)
    print(
        "round lines: variant req/s, server CPU us/request, server share|client share; ratios throughput,capacity"
    )
    rounds: list[dict[str, dict[str, float]]] = []
    ok = all([run_block(b, variants, args, server_cpus, rounds) for b in range(args.blocks)])
    report(variants, rounds, placement)
    if any(v.startswith("stagescope") for v in variants):
        print(f"every request slower than 250 ms kept its full trace: {'yes' if ok else 'NO'}")
    print(f"after: {_load()}")
    return 0


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
