"""One demo run: the reference service in a scenario, under a replayed real arrival trace, analysed.

Steps (all local, no Docker): start ``stagescope serve`` as a child process on a local port with the
scenario (and, for the lever check, the lever's setting change), with stagescope's default sampling
(every request slower than 250 ms or failed, 1 % of the rest, each span saying with what probability
it was kept: the analysis weights them back, and the load results and the scraped metrics give the
SLO quantile); scrape its ``/metrics`` every second; drive it open-loop with the load generator
replaying the arrival times of a real Azure LLM trace scaled to the scenario's rate (request shapes
from the scenario's workload);
stop the service (its span sink flushes on shutdown); ingest spans, metrics and load results; run the
breach analysis against the scenario's SLO; write ``report.json`` and ``report.html``.

Layout of a run folder::

    DIR/spans/            OTLP/JSON lines (server spans from the service, CLIENT spans from the load)
    DIR/metrics/          one exposition file per scrape, samples stamped with the scrape time
    DIR/results.parquet   the load generator's per-request results
    DIR/report.json       the analysis (pinned JSON), DIR/report.html the same as a page
    DIR/service.log       the service's own output

A run into a folder that holds an earlier run's recordings first moves them into
``DIR/earlier-runs/<UTC time>/`` (nothing is deleted): the analysis reads every file under
``DIR/spans``, so two runs' spans side by side would be analysed as one incident.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from stagescope.demo.recorder import MetricsRecorder
from stagescope.errors import UserError
from stagescope.names import ENV_BASELINE_SAMPLE, ENV_SLOW_THRESHOLD_MS
from stagescope.paths import ensure_writable_dir
from stagescope.procs import stop_process
from stagescope.service.engines import DEFAULT_ENGINE, Engine, get_engine
from stagescope.service.scenarios import PREDICT_ROUTE, Scenario, Workload
from stagescope.slo import SLO

__all__ = [
    "ARRIVAL_TRACE",
    "MIN_DURATION_KEY",
    "RECORDINGS",
    "WORKLOAD_PREFIX",
    "RunResult",
    "apply_workload",
    "archive_previous",
    "check_port_free",
    "free_port",
    "run_duration",
    "run_scenario",
    "schedule_for",
]

#: The real arrival trace the demo replays (Azure LLM inference, conversation service, CC-BY-4.0): package
#: data (``demo/data``, with its licence and ``SOURCE.md``), so an installed wheel finds it too.
ARRIVAL_TRACE = Path(__file__).resolve().parent / "data" / "AzureLLMInferenceTrace_conv.csv"
#: How long the reference service may take to answer /readyz (seconds).
READY_TIMEOUT_S = 120.0
#: What one run records into its folder (an earlier run's are moved aside, see archive_previous).
RECORDINGS = (
    "spans", "metrics", "results.parquet", "report.json", "report.html", "service.log", "lever", "lever_check.json",
    "llama-server-0.log", "llama-server-1.log",  # the llama-cpp engine's servers
)  # fmt: skip


@dataclass
class RunResult:
    """What one run produced."""

    scenario: str
    lever_applied: bool
    out: Path
    report: dict[str, Any]
    requests_sent: int
    client_p99_ms: float | None
    interrupted: bool = False
    #: Where an earlier run's recordings in ``out`` were moved before this run, if there were any.
    archived: Path | None = None
    engine: str = DEFAULT_ENGINE


def archive_previous(out: Path) -> Path | None:
    """Move an earlier run's recordings in ``out`` into ``out/earlier-runs/<UTC time>/``; returns that
    folder, or None when ``out`` held none."""
    found = [out / n for n in RECORDINGS if (out / n).exists()]
    if not found:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = out / "earlier-runs" / stamp
    n = 1
    while dest.exists():
        n += 1
        dest = out / "earlier-runs" / f"{stamp}-{n}"
    dest.mkdir(parents=True)
    for p in found:
        p.rename(dest / p.name)
    return dest


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise a one-line :class:`UserError` if ``port`` cannot be listened on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is already in use; pick another with --port") from None
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def schedule_for(sc: Scenario, duration_s: float) -> Any:
    """Real arrival times at the scenario's rate, with the scenario's request shapes.

    The first ``rate x duration`` arrivals of the Azure trace are time-scaled to span ``duration_s``:
    the replay keeps the trace's own burstiness and carries the scenario's mean rate over the run (a
    whole-trace scale factor would not, since the trace's rate varies over its hour).
    """
    from stagescope.loadgen import Schedule, read_trace

    trace = read_trace(str(ARRIVAL_TRACE)).shifted_to_zero()
    k = max(1, round(sc.rate_rps * duration_s))
    if len(trace) <= k:
        raise UserError(f"{ARRIVAL_TRACE}: {len(trace)} arrivals, fewer than the {k} this run needs")
    offsets = trace.offsets_s[:k] * (duration_s / float(trace.offsets_s[k]))
    prompt = output = None
    if sc.route != PREDICT_ROUTE:  # a generation route: the reference service's or an OpenAI API
        w = sc.workload
        prompt = np.array([w.prompt_tokens_of(i) for i in range(k)], dtype=np.int64)
        output = np.full(k, w.max_tokens, dtype=np.int64)
    return Schedule(
        offsets_s=offsets, prompt_tokens=prompt, output_tokens=output, duration_s=duration_s,
        source=f"{ARRIVAL_TRACE.name} (first {k} arrivals, time-scaled)", target_rate_rps=sc.rate_rps,
    )  # fmt: skip


class ServiceProcess:
    """The engine's service (``stagescope serve``) as a child process; stopped with SIGINT so its sinks
    flush."""

    def __init__(
        self, sc: Scenario, *, port: int, spans_dir: Path, apply_lever: bool, log: Path, engine: Engine,
        overrides: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        cmd = engine.serve_command(sc, port=port, spans_dir=spans_dir, apply_lever=apply_lever, overrides=overrides)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # the embedded default records to local files
        for key in (
            "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG",
            ENV_BASELINE_SAMPLE,
            ENV_SLOW_THRESHOLD_MS,
        ):
            env.pop(key, None)  # stagescope's default sampling, whatever the shell exports
        self._log = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.log_path = log

    def _last_log_line(self) -> str:
        self._log.flush()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else "(no output)"

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise UserError(f"the reference service exited: {self._last_log_line()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise UserError(f"the reference service was not ready within {timeout_s:g} s (see {self.log_path})")

    def stop(self, timeout_s: float = 15.0) -> None:
        stop_process(self.proc, signal.SIGINT, timeout_s)
        self._log.close()


async def _drive(
    sc: Scenario, svc: ServiceProcess, out: Path, duration_s: float, progress: Callable[[Any], None] | None
) -> tuple[int, float | None, bool]:
    """Load the service while recording its metrics; Ctrl-C ends sending and keeps what was recorded."""
    from stagescope.loadgen import run_load
    from stagescope.loadgen.openai_api import infer_api

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    recorder = MetricsRecorder(f"{svc.url}/metrics", out / "metrics", interval_s=1.0)
    recorder.start()
    try:
        run = await run_load(
            svc.url, schedule_for(sc, duration_s), route=sc.route, out=out / "results.parquet",
            spans_dir=out / "spans", progress=progress, stop=stop, repeat_share=sc.workload.repeat_share,
            predict_dim=sc.workload.predict_dim, timeout_s=30.0, grace_s=10.0, api=infer_api(sc.route),
        )  # fmt: skip
    finally:
        await recorder.stop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    return len(run.results), run.summary.latency_ms.get("p99"), stop.is_set()


#: An override whose key starts so changes the scenario's load (a :class:`Workload` field: what the load
#: generator sends), not a setting of the service; an engine's sizing uses it (llama-cpp: the long
#: prompts' length).
WORKLOAD_PREFIX = "workload."
#: An override whose key starts so changes the scenario itself: its arrival rate or its SLO (an engine's
#: sizing: llama-cpp sizes a decode fault's rate and inter-token threshold, a slot fault's rate and
#: TTFT threshold to the machine).
SCENARIO_PREFIX = "scenario."
#: The scenario fields a SCENARIO_PREFIX override may set.
SCENARIO_FIELDS = ("rate_rps", "slo_spec")
#: An override so named is the shortest run (s) the engine's sizing asks for, so that the SLO's quantile
#: rests on enough arrivals (llama-cpp: a slot fault, SLOT_RUN_ARRIVALS at its sized rate); the demo runs
#: the longer of it and its own duration, and the service never sees it.
MIN_DURATION_KEY = "run.min_duration_s"


def run_duration(duration_s: float, overrides: dict[str, Any] | None) -> float:
    """The run's duration (s): ``duration_s``, or the sizing's MIN_DURATION_KEY where that is longer."""
    ask = (overrides or {}).get(MIN_DURATION_KEY)
    return max(duration_s, float(ask)) if isinstance(ask, int | float) and not isinstance(ask, bool) else duration_s


def apply_workload(sc: Scenario, overrides: dict[str, Any] | None) -> tuple[Scenario, dict[str, Any]]:
    """``(the scenario with the workload and scenario overrides applied, the service's overrides)``;
    an unknown workload or scenario field, a rate that is not a positive number or an SLO that does not
    parse is a UserError."""
    items = (overrides or {}).items()
    load = {k[len(WORKLOAD_PREFIX):]: v for k, v in items if k.startswith(WORKLOAD_PREFIX)}
    own = {k[len(SCENARIO_PREFIX):]: v for k, v in items if k.startswith(SCENARIO_PREFIX)}
    rest = {k: v for k, v in items if not k.startswith((WORKLOAD_PREFIX, SCENARIO_PREFIX)) and k != MIN_DURATION_KEY}
    if load:
        known = {f.name for f in dataclasses.fields(Workload)}
        bad = sorted(set(load) - known)
        if bad:
            raise UserError(f"unknown workload setting(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, **load))
    if own:
        bad = sorted(set(own) - set(SCENARIO_FIELDS))
        if bad:
            raise UserError(f"unknown scenario setting(s) {', '.join(bad)}; known: {', '.join(SCENARIO_FIELDS)}")
        rate = own.get("rate_rps", sc.rate_rps)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < float("inf"):
            raise UserError(f"scenario rate_rps must be a positive number of requests per second, got {rate!r}")
        sc = dataclasses.replace(sc, rate_rps=float(rate), slo_spec=str(own.get("slo_spec", sc.slo_spec)))
        try:
            sc.slo  # noqa: B018 - parse now: a bad SLO is one line before any work
        except ValueError as exc:
            raise UserError(f"scenario slo_spec {sc.slo_spec!r}: {exc}") from None
    return sc, rest


def analyse_run(out: Path, slo: SLO) -> dict[str, Any]:
    """Ingest a run folder and write ``report.json`` and ``report.html``; returns the report."""
    from stagescope.analysis.api import analyze
    from stagescope.analysis.ingest import load_dataset
    from stagescope.analysis.report import to_html, to_json

    metrics = [out / "metrics"] if (out / "metrics").exists() else []
    results = [out / "results.parquet"] if (out / "results.parquet").exists() else []
    ds = load_dataset(traces=[out / "spans"], metrics=metrics, results=results, skip_bad=True)
    report = analyze(ds, slo)
    (out / "report.json").write_text(to_json(report), encoding="utf-8")
    (out / "report.html").write_text(to_html(report), encoding="utf-8")
    return report


def run_scenario(
    name: str,
    *,
    out: Path,
    duration_s: float,
    apply_lever: bool = False,
    port: int | None = None,
    progress: Callable[[Any], None] | None = None,
    engine: str = DEFAULT_ENGINE,
    overrides: dict[str, Any] | None = None,
) -> RunResult:
    """Run scenario ``name`` of ``engine`` end to end into ``out`` (``overrides``: settings on top of the
    scenario's, such as the engine's sizing); see the module docstring."""
    eng = get_engine(engine)
    sc, overrides = apply_workload(eng.get_scenario(name), overrides)
    ensure_writable_dir(out, "the demo's output there")
    if port:
        check_port_free(port)
    else:
        port = free_port()
    archived = archive_previous(out)
    spans = out / "spans"
    spans.mkdir(parents=True, exist_ok=True)
    svc = ServiceProcess(
        sc, port=port, spans_dir=spans, apply_lever=apply_lever, log=out / "service.log", engine=eng,
        overrides=overrides,
    )
    sent, client_p99, interrupted = 0, None, False
    try:
        asyncio.run(svc.wait_ready())
        sent, client_p99, interrupted = asyncio.run(_drive(sc, svc, out, duration_s, progress))
    except KeyboardInterrupt:  # before the load started: nothing recorded by the load generator yet
        interrupted = True
    finally:
        svc.stop()
    if not any(spans.rglob("*.jsonl")):
        raise UserError(f"{spans}: the service recorded no spans (see {out / 'service.log'})")
    # the scenario's SLO is about its own route (probes and /metrics scrapes are not its traffic)
    report = analyse_run(out, dataclasses.replace(sc.slo, route=sc.route))
    return RunResult(sc.name, apply_lever, out, report, sent, client_p99, interrupted, archived, eng.name)
