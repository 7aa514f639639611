"""Probe llama-servers for the sizing (:mod:`sizing`, :mod:`slot_probe`): start servers with a
scenario's settings, send plain-word prompts, read llama.cpp's ``timings`` or the streamed tokens as a
client sees them. Nothing here is recorded; prompts are generated words, not user content."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.scenarios import Scenario

__all__ = [
    "GATEWAY_READY_S",
    "config",
    "probe_gateway",
    "probe_servers",
    "probe_text",
    "server_pid",
    "stream_gaps",
    "stream_hold_s",
    "timings",
    "together",
]

#: Seconds the probe's gateway has to answer ``/readyz`` (it imports FastAPI, OpenTelemetry and the servers' check).
GATEWAY_READY_S = 60.0

#: The running probe servers' pids by URL (:func:`server_pid`).
_PIDS: dict[str, int] = {}

_PROBE_WORDS = ("alpha", "river", "stone", "garden", "window", "orange", "silver", "market", "planet", "yellow",
                "bridge", "candle", "forest", "letter", "summer", "pencil", "rocket", "violet", "harbor", "meadow")  # fmt: skip


def probe_text(words: int, key: int) -> str:
    """About ``words`` tokens of plain English words (a different text per ``key``); fits use the
    token counts llama.cpp reports (``prompt_n``, ``predicted_n``), not this estimate."""
    n = len(_PROBE_WORDS)
    return " ".join(_PROBE_WORDS[(k * (key + 3) + k // n) % n] for k in range(words))


@contextlib.contextmanager
def probe_servers(cfg: Any, *, pin: bool = False) -> Iterator[list[str]]:
    """``cfg.replicas`` llama-servers with settings ``cfg``, ready; their URLs. Stopped on exit. With
    ``pin`` each is pinned to cores of its own (server.placement, as ``serve --pin`` places a run's).
    The sizing probe does not pin, nor does the demo: pinning did not make the lever's slot times
    steadier (docs/llama_cpp_slots_operating_point.md, s12)."""
    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gguf_model import ensure_model
    from stagescope.service.llama_cpp.server import LlamaServer, placement

    build = ensure_server()
    model = ensure_model(build.vocab())
    with tempfile.TemporaryDirectory(prefix="stagescope-llama-probe-") as tmp:
        servers: list[LlamaServer] = []
        try:
            cpus = placement(cfg.replicas, cfg.threads) if pin else None
            for i in range(cfg.replicas):
                servers.append(LlamaServer(build.server, model.path, cfg, log=Path(tmp) / f"llama-server-{i}.log",
                                           cpus=cpus[i] if cpus else None))  # fmt: skip
            for s in servers:
                s.wait_ready()
                _PIDS[s.url] = s.proc.pid
            yield [s.url for s in servers]
        except OSError as exc:
            raise UserError(f"llama.cpp: the sizing probe failed: {exc}") from None
        finally:
            for s in servers:
                _PIDS.pop(s.url, None)
                s.stop()


def server_pid(url: str) -> int | None:
    """The pid of the :func:`probe_servers` server at ``url`` while it runs (its CPU is read from
    ``/proc``: :func:`stagescope.service.llama_cpp.cpu.process_cpu_s`); None for any other URL."""
    return _PIDS.get(url)


def timings(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """llama.cpp's ``timings`` of one completion (no prompt cache, every token generated)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": False, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        t = json.loads(r.read()).get("timings") or {}
    if not t.get("prompt_n") or not t.get("prompt_ms") or not t.get("predicted_n") or not t.get("predicted_ms"):
        raise UserError("llama.cpp: the sizing probe got no timings (prompt_n, prompt_ms, predicted_*) back")
    return dict(t)


def together(jobs: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """The timings of ``(url, prompt, max_tokens)`` completions sent at once (they decode together)."""
    with ThreadPoolExecutor(len(jobs)) as ex:
        return list(ex.map(lambda j: timings(*j), jobs))


def config(sc: Scenario, *, apply_lever: bool = False, **over: int) -> Any:
    """The engine settings of scenario ``sc`` (with its lever's change), with ``over`` replaced."""
    from stagescope.service.llama_cpp.serve import scenario_config

    cfg = scenario_config(sc.name, apply_lever=apply_lever)
    return dataclasses.replace(cfg, **over) if over else cfg


def _stream(url: str, prompt: str, max_tokens: int) -> tuple[float, list[float], dict[str, Any], str | None]:
    """``(send time, each streamed token's arrival, llama.cpp's final timings, the replica that served
    it where a gateway says so)`` of one streamed completion (monotonic seconds; no prompt cache, every
    token generated)."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    body = {"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": False, "ignore_eos": True, "stream": True}
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
    stamps: list[float] = []
    last: dict[str, Any] = {}
    try:
        sent = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        replica = resp.getheader(N.HEADER_REPLICA)
        for line in resp:
            if line.startswith(b"data: {"):
                stamps.append(time.monotonic())
                last = json.loads(line[6:]).get("timings") or last
    finally:
        conn.close()
    if len(stamps) < 3:
        raise UserError("llama.cpp: the sizing probe's stream returned fewer than 3 tokens")
    return sent, stamps, last, replica


def stream_gaps(url: str, prompt: str, max_tokens: int) -> tuple[list[float], float]:
    """``(gaps between streamed tokens in ms, as the client sees them, llama.cpp's prompt_ms)`` of one
    streamed completion (no prompt cache, every token generated)."""
    _, stamps, t, _ = _stream(url, prompt, max_tokens)
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(stamps[1:])], float(t.get("prompt_ms") or 0.0)  # 1st gap: the prompt


def stream_hold_s(url: str, prompt: str, max_tokens: int) -> tuple[float, str | None]:
    """``(seconds, replica)``: how long one streamed completion holds its slot as a streaming client
    sees it, sent -> last token, and the replica that served it where ``url`` is a gateway
    (:func:`probe_gateway`). This is how a run's requests are served (the load generator streams every
    token through the gateway) and what the scale-out model scales (a request's first prefill start ->
    last decode end); llama.cpp's own ``timings`` leave out the per-token streaming and its relay,
    whose CPU competes for the machine's cores once more streams run at once."""
    sent, stamps, _, replica = _stream(url, prompt, max_tokens)
    return stamps[-1] - sent, replica


@contextlib.contextmanager
def probe_gateway(urls: list[str], slots: int) -> Iterator[str]:
    """The stagescope gateway (``serve --upstream``, a child process) in front of the servers at ``urls``
    with ``slots`` slots each, ready; its URL. Stopped on exit. The probe's requests then take the path a
    run's requests take: admission, the relay of every streamed token, and every trace kept and written
    as a run's gateway writes them (to a temporary folder, removed on exit), so that the CPU the
    gateway's telemetry takes beside the servers is in the probe's times too. Without the spans, lever
    runs held their slots with every slot busy 6-11 % longer than the probe timed them (one run: 1,633
    against 1,465 ms, on 9 % more CPU seconds per request: 1.38 against 1.26 s)."""
    import signal
    import subprocess
    import sys

    from stagescope.procs import stop_process
    from stagescope.service.llama_cpp.server import free_port

    port = free_port()
    spans = tempfile.TemporaryDirectory(prefix="stagescope-llama-probe-spans-")
    cmd = [sys.executable, "-m", "stagescope.service.llama_cpp.serve", "--host", "127.0.0.1", "--port", str(port),
           "--slots", str(slots), "--spans-out", spans.name, "--baseline-sample", "1",  # as a run's gateway
           *itertools.chain.from_iterable(("--upstream", u) for u in urls)]  # fmt: skip
    with spans, tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + GATEWAY_READY_S
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                    raise UserError(f"llama.cpp: the sizing probe's gateway exited ({proc.returncode}): {tail[0]}")
                with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as r:
                    if r.status == 200:
                        break
                if time.monotonic() > deadline:
                    raise UserError(f"llama.cpp: the sizing probe's gateway was not ready in {GATEWAY_READY_S:g} s")
                time.sleep(0.2)
            yield url
        finally:
            stop_process(proc, signal.SIGINT, 15.0)
