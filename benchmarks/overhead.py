"""What stagescope costs a FastAPI service: requests/s side by side in one run, printed as ratios.

Each variant is one uvicorn process (``--serve``); a load client in another process (``--client``:
asyncio, raw HTTP/1.1 keep-alive, ``--connections`` closed-loop connections) counts completed
requests over ``--duration`` seconds after a warm-up. Variants run interleaved, ``--rounds`` times,
and the median requests/s of each is reported.

Trivial endpoint (``POST /predict`` answering a small JSON):
  (a) ``bare``: no instrumentation;
  (b) ``stock``: opentelemetry-instrumentation-fastapi, every span exported (BatchSpanProcessor to a
      null exporter);
  (c) ``stagescope``: ``instrument_app`` defaults (fast mode, tail sampling, embedded sink), three
      ``stage()`` blocks per request, metrics for every request.
Realistic endpoint (``POST /predict`` through a dynamic batcher to a *simulated accelerator*: 5 ms of
``asyncio.sleep`` per batch, max batch 8, max wait 2 ms, one executor; so at most 1,600 requests/s,
the accelerator's limit, as in a GPU-bound service):
  (d) ``bare-batch``: ``stagescope.DynamicBatcher``, no ``instrument_app``, no stages;
  (e) ``stagescope-batch``: the same plus ``instrument_app`` defaults and preprocess/postprocess stages
      (so five stages per request with the batcher's batch_wait, queue and compute);
  (f) ``plain-batch``: for reference, a minimal batcher with the same policy and no stagescope at all.

One request in 1000 (every variant alike) asks for ``?slow=1`` and sleeps 300 ms: for the stagescope
variants the script checks that every request slower than the slow threshold (250 ms by default) kept
its full trace, by comparing the server's own request histogram with the spans in the sink.

The stagescope variants include what fast mode does for OpenTelemetry coexistence on every request:
it looks at the current span (is another instrumentation's span the request's?) and, since none is
here, attaches an OpenTelemetry context holding the request's ids for the handler's own spans. The
script first prints that per-request cost measured in-process (best of 5 loops), and the machine's
load average before each round (the machine may be shared: rerun when it is high).

Run: ``python benchmarks/overhead.py`` (``make bench``); ``--help`` for options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLOW_EVERY = 1000
VARIANTS_TRIVIAL = ("bare", "stock", "stagescope")
VARIANTS_REALISTIC = ("bare-batch", "stagescope-batch", "plain-batch")
ENV_CLEAR = (
    "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_ENDPOINT", "STAGESCOPE_SPANS_DIR",
    "STAGESCOPE_SLOW_THRESHOLD_MS", "STAGESCOPE_BASELINE_SAMPLE", "PROMETHEUS_MULTIPROC_DIR",
)  # fmt: skip


# ------------------------------------------------------------------------------------------ server
def build_app(variant: str, spans_dir: str | None) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    batcher: Any = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        if batcher is not None:
            await batcher.start()
        yield
        if batcher is not None:
            await batcher.stop()

    app = FastAPI(lifespan=lifespan)

    async def simulated_accelerator(items: list[Any]) -> list[Any]:
        await asyncio.sleep(0.005)  # simulated accelerator: 5 ms per batch
        return [{"y": i} for i in range(len(items))]

    if variant == "bare":

        @app.post("/predict")
        async def predict_bare(slow: int = 0) -> dict[str, bool]:
            if slow:
                await asyncio.sleep(0.3)
            return {"ok": True}

    elif variant == "stock":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class NullExporter(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NullExporter()))

        @app.post("/predict")
        async def predict_stock(slow: int = 0) -> dict[str, bool]:
            if slow:
                await asyncio.sleep(0.3)
            return {"ok": True}

        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)

    elif variant == "stagescope":
        import stagescope

        stagescope.instrument_app(app, service_name="bench", spans_dir=spans_dir)

        @app.post("/predict")
        async def predict_stagescope(slow: int = 0) -> dict[str, bool]:
            with stagescope.stage("preprocess"):
                pass
            with stagescope.stage("compute"):
                if slow:
                    await asyncio.sleep(0.3)
            with stagescope.stage("postprocess"):
                pass
            return {"ok": True}

    elif variant in ("plain-batch", "bare-batch"):
        if variant == "plain-batch":
            batcher = _MinimalBatcher(simulated_accelerator, max_batch_size=8, max_wait_s=0.002)
        else:
            import stagescope

            batcher = stagescope.DynamicBatcher(
                simulated_accelerator, max_batch_size=8, max_wait_ms=2, model="bench-model"
            )

        @app.post("/predict")
        async def predict_bare_batch(slow: int = 0) -> Any:
            if slow:
                await asyncio.sleep(0.3)
            return await batcher.submit(1)

    elif variant == "stagescope-batch":
        import stagescope

        stagescope.instrument_app(app, service_name="bench", spans_dir=spans_dir, models=["bench-model"])
        batcher = stagescope.DynamicBatcher(
            simulated_accelerator, max_batch_size=8, max_wait_ms=2, model="bench-model"
        )

        @app.post("/predict")
        async def predict_stagescope_batch(slow: int = 0) -> Any:
            rec = stagescope.current_request()
            if rec is not None:
                rec.model = "bench-model"
            with stagescope.stage("preprocess"):
                if slow:
                    await asyncio.sleep(0.3)
            out = await batcher.submit(1)
            with stagescope.stage("postprocess"):
                pass
            return out

    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return app


class _MinimalBatcher:
    """The bare baseline: same batching policy as DynamicBatcher (close at max size or max wait after
    the first item, one executor), no telemetry."""

    def __init__(self, run_batch: Any, *, max_batch_size: int, max_wait_s: float) -> None:
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._open: list[tuple[Any, asyncio.Future[Any]]] = []
        self._closed: asyncio.Queue[list[tuple[Any, asyncio.Future[Any]]]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._closed = asyncio.Queue()
        self._task = asyncio.create_task(self._executor())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._open and self._closed is not None:
            self._closed.put_nowait(self._open)
            self._open = []

    async def submit(self, item: Any) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._open.append((item, fut))
        if len(self._open) >= self.max_batch_size:
            self._close()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._close)
        return await fut

    async def _executor(self) -> None:
        assert self._closed is not None
        while True:
            batch = await self._closed.get()
            results = await self.run_batch([i for i, _ in batch])
            for (_, fut), res in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(res)


def serve(variant: str, port: int, spans_dir: str | None) -> None:
    import uvicorn

    uvicorn.run(
        build_app(variant, spans_dir), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


# ------------------------------------------------------------------------------------------ client
def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _client(
    port: int, connections: int, warmup_s: float, duration_s: float, server_pid: int
) -> dict[str, Any]:
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

    async def cpu_window() -> tuple[float, float]:
        await asyncio.sleep(measure_from - time.perf_counter())
        c0 = _cpu_seconds(server_pid)
        await asyncio.sleep(stop_at - time.perf_counter())
        return c0, _cpu_seconds(server_pid)

    window = asyncio.ensure_future(cpu_window())
    await asyncio.gather(*(conn(i) for i in range(connections)))
    c0, c1 = await window
    n = sum(counts)
    return {
        "requests": n,
        "rps": n / duration_s,
        "cpu_us": (c1 - c0) / max(n, 1) * 1e6,
        "cpu_share": (c1 - c0) / duration_s,
    }


def run_client(port: int, connections: int, warmup_s: float, duration_s: float, server_pid: int) -> None:
    print(json.dumps(asyncio.run(_client(port, connections, warmup_s, duration_s, server_pid))))


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


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    port = _free_port()
    spans_dir = tempfile.mkdtemp(prefix=f"stagescope-bench-{variant}-")
    env = {k: v for k, v in os.environ.items() if k not in ENV_CLEAR}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", variant, "--port", str(port), "--spans-dir", spans_dir], env=env
    )
    try:
        _wait_ready(port, server)
        out = subprocess.run(
            [sys.executable, __file__, "--client", "--port", str(port), "--connections", str(args.connections),
             "--warmup", str(args.warmup), "--duration", str(args.duration), "--server-pid", str(server.pid)],
            check=True, capture_output=True, text=True, env=env,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        if variant.startswith("stagescope"):
            result["slow_requests"] = _scrape_slow(port, 0.25)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    if variant.startswith("stagescope"):  # after shutdown: the sink has flushed everything
        n, slow, complete = _sink_traces(Path(spans_dir), 250_000_000)
        result.update(traces=n, slow_traces=slow, slow_traces_complete=complete)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=6.0, help="measured seconds per run (default 6)")
    p.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before (default 1.5)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    p.add_argument("--connections", type=int, default=16, help="client connections (default 16)")
    p.add_argument("--only", choices=("trivial", "realistic"), help="run one endpoint only")
    p.add_argument("--variants", help="comma list of variants to run (default: all of the endpoint(s))")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--spans-dir", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.spans_dir)
        return 0
    if args.client:
        run_client(args.port, args.connections, args.warmup, args.duration, args.server_pid)
        return 0

    variants: list[str] = []
    if args.only != "realistic":
        variants += VARIANTS_TRIVIAL
    if args.only != "trivial":
        variants += VARIANTS_REALISTIC
    if args.variants:
        variants = [v for v in args.variants.split(",") if v]
    import uvicorn

    http_impl = "httptools" if _has("httptools") else "h11"
    loop_impl = "uvloop" if _has("uvloop") else "asyncio"
    print(f"uvicorn {uvicorn.__version__} ({http_impl}, {loop_impl}), one server process; client: "
          f"{args.connections} connections in another process; {args.rounds} rounds x {args.duration:g} s; "
          f"{os.cpu_count()} CPUs", flush=True)  # fmt: skip
    look_us, attach_us = context_cost()
    print(f"fast mode's OpenTelemetry context per request (in-process): current-span look-up {look_us:.2f} us, "
          f"attach + detach of the request's context {attach_us:.2f} us", flush=True)  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        print(f"round {r + 1}: {_load()}", flush=True)
        for v in variants:
            res = run_variant(v, args)
            results[v].append(res)
            extra = ""
            if "traces" in res:
                extra = (f"  traces kept {res['traces']}; slower than 250 ms: {res['slow_requests']} requests, "
                         f"{res['slow_traces_complete']} full traces")  # fmt: skip
            print(
                f"round {r + 1} {v:17s} {res['rps']:8.0f} req/s {res['cpu_us']:7.0f} us CPU/request "
                f"(server at {100 * res['cpu_share']:3.0f}% of a core){extra}",
                flush=True,
            )
    med = {v: statistics.median(x["rps"] for x in rs) for v, rs in results.items()}
    cpu = {v: statistics.median(x["cpu_us"] for x in rs) for v, rs in results.items()}
    share = {v: statistics.median(x["cpu_share"] for x in rs) for v, rs in results.items()}
    print("\nmedians:               req/s   server CPU us/request   server CPU share")
    for v in variants:
        print(f"  {v:17s} {med[v]:8.0f} {cpu[v]:10.0f} {100 * share[v]:17.0f}%")
    print(
        "ratios (throughput; capacity = inverse server CPU per request, the robust one when other\n"
        "processes compete for the CPUs and the server gets well under 100% of a core):"
    )
    for name, variant, base, goal in (
        ("trivial   stock", "stock", "bare", "REFERENCE 0.40-0.56"),
        ("trivial   stagescope", "stagescope", "bare", "goal >= 0.85"),
        ("realistic stagescope", "stagescope-batch", "bare-batch", "goal >= 0.97"),
        ("realistic vs plain", "stagescope-batch", "plain-batch", "DynamicBatcher + instrumentation"),
    ):
        if variant in med and base in med:
            print(
                f"  {name:22s} throughput {med[variant] / med[base]:.3f}   capacity {cpu[base] / cpu[variant]:.3f}   ({goal})"
            )
    ok = all(
        x["slow_traces_complete"] >= x["slow_requests"]
        for v, rs in results.items()
        if v.startswith("stagescope")
        for x in rs
    )
    print(f"every request slower than 250 ms kept its full trace: {'yes' if ok else 'NO'}")
    print(f"after the last round: {_load()}")
    return 0


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
