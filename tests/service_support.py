"""Test support for the reference service: run ``stagescope serve`` under uvicorn in a subprocess,
drive it with a small open-loop client, and read the spans its embedded sink wrote.

Not a test module (no ``test_`` prefix); imported by tests/test_service_*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from stagescope import names as N
from stagescope.procs import process_cpu_s, stop_process
from stagescope.service.scenarios import GENERATE_ROUTE, Scenario, Workload

SERVER_KIND = {2, "SPAN_KIND_SERVER"}


def machine_cpu() -> tuple[float, float] | None:
    """(idle, total) CPU seconds of the whole machine so far (Linux /proc/stat; None elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    hz = os.sysconf("SC_CLK_TCK")
    return (ticks[3] + ticks[4]) / hz, sum(ticks[:8]) / hz


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    spans_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> float | None:
        """CPU seconds the server process used so far (Linux /proc; None elsewhere)."""
        return process_cpu_s(self.proc.pid)


def _get(url: str, timeout: float = 2.0) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@contextlib.contextmanager
def serve(
    tmp: Path, *args: str, wait_ready: bool = True, baseline_sample: float = 1.0, timeout_s: float = 40.0
) -> Iterator[Served]:
    """Run ``stagescope serve ARGS`` on a free port with every trace kept; stop it with SIGINT."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    spans = tmp / "spans"
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "stagescope.cli", "serve", "--port", str(port), "--spans-out", str(spans),
           "--baseline-sample", str(baseline_sample), *args]  # fmt: skip
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    served = Served(proc, port, spans, log)
    try:
        deadline = time.monotonic() + timeout_s
        want = (200,) if wait_ready else (200, 503)
        path = "/readyz" if wait_ready else "/healthz"
        while _get(served.url + path) not in want:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}: {served.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready after {timeout_s} s: {served.log()[-2000:]}")
            time.sleep(0.05)
        yield served
    finally:
        if proc.poll() is None:
            interrupt(proc)


def interrupt(proc: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    """Stop a server process as Ctrl-C would (SIGINT, so it flushes), killing it after ``timeout_s``."""
    stop_process(proc, signal.SIGINT, timeout_s)


# --------------------------------------------------------------------------------------------------
# open-loop client
# --------------------------------------------------------------------------------------------------
@dataclass
class ClientResult:
    trace_id: str
    status: int
    sent: float
    end: float
    retry_after: str | None = None
    token_times: list[float] = field(default_factory=list)
    intended: float | None = None  # when the schedule said to send it (same clock as ``sent``)

    @property
    def latency_ms(self) -> float:
        return (self.end - self.sent) * 1000

    @property
    def late_ms(self) -> float:
        """How far behind its schedule the client sent this request (0 when it kept the schedule)."""
        return 0.0 if self.intended is None else max(0.0, (self.sent - self.intended) * 1000)


def body_for(route: str, w: Workload, i: int, rng: random.Random, pool: list[list[float]]) -> dict[str, Any]:
    if route == GENERATE_ROUTE:
        n = w.prompt_tokens_of(i)
        return {"prompt": " ".join(f"w{rng.randrange(5000)}" for _ in range(n)), "max_tokens": w.max_tokens,
                "stream": True}  # fmt: skip
    if pool and rng.random() < w.repeat_share:
        inputs = rng.choice(pool)
    else:
        inputs = [round(rng.gauss(0, 1), 6) for _ in range(w.predict_dim)]
        if len(pool) < w.repeat_pool:
            pool.append(inputs)
    return {"inputs": inputs}


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, intended: float | None = None
) -> ClientResult:
    trace_id = f"{random.getrandbits(128):032x}"
    headers = {"traceparent": f"00-{trace_id}-{random.getrandbits(64):016x}-01", "content-type": "application/json"}
    sent = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            res = ClientResult(trace_id, resp.status, sent, 0.0, resp.headers.get("Retry-After"), intended=intended)
            if stream and resp.status == 200:
                async for line in resp.content:
                    if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        res.token_times.append(time.perf_counter())
            else:
                await resp.read()
            res.end = time.perf_counter()
            return res
    except (TimeoutError, aiohttp.ClientError):
        return ClientResult(trace_id, 0, sent, time.perf_counter(), intended=intended)


async def drive(
    base_url: str, route: str, rate: float, duration_s: float, workload: Workload, *, seed: int = 1,
    poisson: bool = True,
) -> list[ClientResult]:
    """Open loop: requests leave on a (Poisson) schedule whatever the answers; returns every result."""
    rng = random.Random(seed)
    pool: list[list[float]] = []
    n = int(rate * duration_s)
    t = 0.0
    offsets = []
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate) if poisson else 1.0 / rate
    bodies = [orjson.dumps(body_for(route, workload, i, rng, pool)) for i in range(n)]
    timeout = aiohttp.ClientTimeout(total=120)
    conn = aiohttp.TCPConnector(limit=0)
    tasks = []
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.perf_counter()
        for off, body in zip(offsets, bodies, strict=True):
            delay = start + off - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(_one(session, base_url + route, body, route == GENERATE_ROUTE, start + off))
            )
        return list(await asyncio.gather(*tasks))


def drive_apart(
    base_url: str, route: str, rate: float, duration_s: float, workload: Workload, *, seed: int = 1,
    poisson: bool = True,
) -> list[ClientResult]:
    """:func:`drive` in a process of its own, so that it keeps its schedule whatever else the calling
    process runs: tests that drive several servers at once from threads of one process share one GIL,
    and a thread parsing another run's spans delays this client's sends, which then leave in a burst
    the scenario does not have (seen as a 717 ms p99 on a lever run whose server was idle 35 % of the
    time). Arguments and results travel as pickles over the child's stdin and stdout."""
    code = (
        "import asyncio, pickle, sys; sys.path.insert(0, sys.argv[1]); import service_support as S; "
        "a, k = pickle.load(sys.stdin.buffer); r = asyncio.run(S.drive(*a, **k)); "
        "sys.stdout.buffer.write(pickle.dumps(r))"
    )
    args = ((base_url, route, rate, duration_s, workload), {"seed": seed, "poisson": poisson})
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent)], input=pickle.dumps(args),
        capture_output=True, timeout=duration_s + 180, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    results: list[ClientResult] = pickle.loads(proc.stdout)
    return results


# --------------------------------------------------------------------------------------------------
# spans
# --------------------------------------------------------------------------------------------------
def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


@dataclass
class ServerRequest:
    trace_id: str
    name: str
    duration_ms: float
    attrs: dict[str, Any]
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> int:
        return int(self.attrs.get("http.status_code", self.attrs.get("http.response.status_code", 0)))


def read_spans(spans_dir: Path) -> list[ServerRequest]:
    """Server requests with their stage totals (ms), from the sink's OTLP/JSON lines."""
    servers: dict[str, ServerRequest] = {}
    children: list[tuple[str, str, float]] = []
    for path in sorted(spans_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            doc = json.loads(line)
            for rs in doc.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        attrs = {a["key"]: _value(a["value"]) for a in sp.get("attributes", [])}
                        dur = (int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) / 1e6
                        if sp.get("kind") in SERVER_KIND:
                            servers[sp["traceId"]] = ServerRequest(sp["traceId"], sp["name"], dur, attrs)
                        elif N.ATTR_STAGE in attrs:
                            children.append((sp["traceId"], attrs[N.ATTR_STAGE], dur))
    for tid, st, dur in children:
        req = servers.get(tid)
        if req is not None:
            req.stages[st] = req.stages.get(st, 0.0) + dur
    return list(servers.values())


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (DuckDB's quantile_cont)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Signature:
    """What one scenario run shows: the SLI quantile, and which stage holds the excess of slow requests."""

    n: int
    sli_q_ms: float
    threshold_ms: float
    shares: dict[str, float]
    slow: int
    stage_medians: dict[str, float] = field(default_factory=dict)
    server_cpu_cores: float | None = None  # CPU the server got while driven (cores), when known
    machine_idle: float | None = None  # share of the machine's CPU time left idle while driven
    client_late_p99_ms: float | None = None  # how far behind its schedule the client sent (p99, ms)

    @property
    def dominant(self) -> str | None:
        return max(self.shares, key=lambda k: self.shares[k]) if self.shares else None


def signature(sc: Scenario, reqs: list[ServerRequest]) -> Signature:
    """SLI quantile over the scenario's route, and each stage's share of the excess time of requests
    above the threshold (excess = stage time above the median stage time of the requests below it)."""
    slo = sc.slo
    mine = [r for r in reqs if r.name.endswith(sc.route) and r.status == 200]
    thr = slo.threshold_ms
    if slo.sli == N.SLI_E2E:
        vals = {r.trace_id: r.duration_ms for r in mine}
    elif slo.sli == N.SLI_TTFT:
        vals = {r.trace_id: 1000 * float(r.attrs[N.VLLM_ATTR_TTFT]) for r in mine if N.VLLM_ATTR_TTFT in r.attrs}
    else:
        vals = {r.trace_id: 1000 * max(r.attrs.get(N.ATTR_TOKEN_GAPS) or [0.0]) for r in mine}
    if slo.sli == N.SLI_ITL:
        samples = [1000 * g for r in mine for g in (r.attrs.get(N.ATTR_TOKEN_GAPS) or [])]
    else:
        samples = list(vals.values())
    q = quantile(samples, slo.quantile)
    slow = [r for r in mine if vals.get(r.trace_id, 0.0) > thr]
    fast = [r for r in mine if r.trace_id in vals and vals[r.trace_id] <= thr]
    skip = {N.STAGE_DECODE} if slo.sli == N.SLI_TTFT else set()
    stages = {s for r in mine for s in r.stages} - skip
    base = {s: quantile([r.stages.get(s, 0.0) for r in fast], 0.5) if fast else 0.0 for s in stages}
    excess = {s: sum(max(0.0, r.stages.get(s, 0.0) - base[s]) for r in slow) for s in stages}
    total = sum(excess.values())
    shares = {s: v / total for s, v in excess.items()} if total > 0 else {}
    medians = {s: quantile([r.stages.get(s, 0.0) for r in mine], 0.5) for s in stages}
    return Signature(len(mine), q, thr, shares, len(slow), medians)
