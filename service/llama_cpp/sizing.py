"""Size the llama.cpp scenarios to this machine now: probe servers time the engine, the scenario's load
or SLO follows from the times (the demo and the slow tests do this before a run and its lever check).

The engine's speed follows the machine and its load (a 1,500-token prompt took 1.5 s in one run and
0.6 s in the next; the 16-slot scenario's inter-token p99 was 120 ms on a loaded machine and 36 ms
on a quiet one at the same settings), so a scenario sized once breaches on one machine and not on the
next. Each fault is sized by the quantity that makes it:

* long prompts (``workload.long_prompt_every``): the prompt step's time at two lengths, fitted as
  ``a n + b n^2``; the long prompt gets the tokens one step processes in LONG_PROMPT_OVER_SLO x the
  TTFT threshold (:func:`tokens_for`);
* a decode fault (true stage ``decode``, an inter-token SLO): the gaps between streamed tokens with
  ``n`` streams decoding together (DECODE_PROBE_SHARES of the slots), the median gap fitted as
  ``a + b n``; the arrival rate keeps DECODE_LOAD_SHARE of the slots decoding (Little's law with that
  step) and the inter-token threshold is ITL_SLO_OVER_STEP x the fitted step with half the slots decoding:
  the full run's gaps, at 3/4 of the slots and more, pass it, and the running-batch cap the analysis
  chooses (the largest whose fitted step plus scatter stays within 80 % of the threshold) lies below
  half the slots (:func:`decode_load`);
* a slot fault (true stage ``queue``): one request's service time with every slot of the server busy;
  the arrival rate is SLOTS_OVERLOAD x those slots' capacity, and the TTFT threshold
  TTFT_SLO_OVER_SERVICE x that service time (:func:`slot_load`). The lever's servers are timed the
  same way, in alternating rounds, so the message says what capacity the scale-out has here (on a
  2-core machine the second server only helps while a core is free for it), and both times go to the
  gateway (``measured_service.*`` overrides, :data:`MEASURED_PREFIX`), which exports them for the
  analysis' scale-out model.

Times are llama.cpp's own (``timings.prompt_ms``, ``timings.predicted_ms``), on servers with the
scenario's settings, one thread each, after a warm-up request. Scenarios without such a fault (healthy)
are not sized.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import statistics
import tempfile
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.scenarios import Scenario

__all__ = [
    "DECODE_LOAD_SHARE",
    "DECODE_PROBE_SHARES",
    "ITL_SLO_OVER_STEP",
    "LONG_PROMPT_OVER_SLO",
    "MEASURED_PREFIX",
    "PROBE_TOKENS",
    "SLOTS_OVERLOAD",
    "SLOT_PROBE_ROUNDS",
    "TTFT_SLO_OVER_SERVICE",
    "decode_load",
    "sizing",
    "slot_load",
    "step_fit",
    "tokens_for",
]

#: A long prompt is sized to take this many times the SLO threshold to process, on this machine now.
LONG_PROMPT_OVER_SLO = 2.0
#: Prompt lengths the probe times, after a short warm-up: a prompt step costs more per token the longer
#: it is (1,024 tokens took 0.24 ms each, 4,016 tokens 1.04 ms each, minutes apart on this machine).
PROBE_TOKENS = (512, 2048)
#: Streams decoding together that the decode probe times, as shares of the scenario's slots (16 slots:
#: 4, 8 and 16 streams). One stream alone runs a faster path (4.6 ms a step, 8.0 ms
#: with two, here).
DECODE_PROBE_SHARES = (0.25, 0.5, 1.0)
#: Tokens each decode probe stream generates.
DECODE_PROBE_TOKENS = 64
#: The decode fault's load keeps this share of the slots decoding on average.
DECODE_LOAD_SHARE = 0.75
#: The inter-token threshold over the fitted step with half the slots decoding: twice the step there, so
#: the analysis' cap (fitted step plus scatter within 80 % of the threshold) is reachable below it.
#: (The probe's p95 gap moved 19-40 ms with the machine's other load; its median step 15-20 ms.)
#: (The scenario's SLO is a p95: at p99 the gateway path's scatter in a run, 40 ms at 10 slots here,
#: took more than half of any threshold the 16-slot run breached.)
ITL_SLO_OVER_STEP = 2.0
#: The slot fault's arrival rate over the capacity of the server's slots.
SLOTS_OVERLOAD = 1.5
#: The slot fault's TTFT threshold over one request's service time (every slot busy).
TTFT_SLO_OVER_SERVICE = 2.0
#: Rounds of the slot probe, alternating between the scenario's servers and the lever's; the medians
#: count. The machine's other load moves within a minute: one round of each once gave the lever's
#: servers 1.76x the time per request, and the lever run a minute later held its slots 0.91x as long.
SLOT_PROBE_ROUNDS = 3
#: An override so named is a measurement the gateway exports (serve ``--measured-service``), not an engine
#: setting: ``measured_service.<variant>`` = one request's service time in s with every slot busy, as
#: served (``serving``) and with the lever's servers (``scale-out``), for the analysis' scale-out model.
MEASURED_PREFIX = "measured_service."

_PROBE_WORDS = ("alpha", "river", "stone", "garden", "window", "orange", "silver", "market", "planet", "yellow",
                "bridge", "candle", "forest", "letter", "summer", "pencil", "rocket", "violet", "harbor", "meadow")  # fmt: skip


def _probe_text(words: int, key: int) -> str:
    """About ``words`` tokens of plain English words (a different text per ``key``); fits use the
    token counts llama.cpp reports (``prompt_n``, ``predicted_n``), not this estimate."""
    n = len(_PROBE_WORDS)
    return " ".join(_PROBE_WORDS[(k * (key + 3) + k // n) % n] for k in range(words))


@contextlib.contextmanager
def _probe_servers(cfg: Any) -> Iterator[list[str]]:
    """``cfg.replicas`` llama-servers with settings ``cfg``, ready; their URLs. Stopped on exit."""
    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gguf_model import ensure_model
    from stagescope.service.llama_cpp.server import LlamaServer

    build = ensure_server()
    model = ensure_model(build.vocab())
    with tempfile.TemporaryDirectory(prefix="stagescope-llama-probe-") as tmp:
        servers: list[LlamaServer] = []
        try:
            for i in range(cfg.replicas):
                servers.append(LlamaServer(build.server, model.path, cfg, log=Path(tmp) / f"llama-server-{i}.log"))
            for s in servers:
                s.wait_ready()
            yield [s.url for s in servers]
        except OSError as exc:
            raise UserError(f"llama.cpp: the sizing probe failed: {exc}") from None
        finally:
            for s in servers:
                s.stop()


def _timings(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """llama.cpp's ``timings`` of one completion (no prompt cache, every token generated)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": False, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        t = json.loads(r.read()).get("timings") or {}
    if not t.get("prompt_n") or not t.get("prompt_ms") or not t.get("predicted_n") or not t.get("predicted_ms"):
        raise UserError("llama.cpp: the sizing probe got no timings (prompt_n, prompt_ms, predicted_*) back")
    return dict(t)


def _together(jobs: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """The timings of ``(url, prompt, max_tokens)`` completions sent at once (they decode together)."""
    with ThreadPoolExecutor(len(jobs)) as ex:
        return list(ex.map(lambda j: _timings(*j), jobs))


def _config(sc: Scenario, *, apply_lever: bool = False, **over: int) -> Any:
    from stagescope.service.llama_cpp.serve import scenario_config

    cfg = scenario_config(sc.name, apply_lever=apply_lever)
    return dataclasses.replace(cfg, **over) if over else cfg


# -- long prompts ------------------------------------------------------------------------------------


def _prompt_step_ms(sc: Scenario) -> list[tuple[int, float]]:
    """``(prompt tokens, ms)`` of one prompt step of each PROBE_TOKENS length on one slot of a server
    with scenario ``sc``'s settings."""
    with _probe_servers(_config(sc, parallel=1, replicas=1)) as (url,):
        _timings(url, _probe_text(64, 0), 1)
        got = [_timings(url, _probe_text(size, i + 1), 1) for i, size in enumerate(PROBE_TOKENS)]
    return [(int(t["prompt_n"]), float(t["prompt_ms"])) for t in got]


def tokens_for(ms: float, probes: list[tuple[int, float]]) -> int:
    """Prompt tokens one step processes in ``ms``, from two probe steps ``(tokens, ms)``: the step's time
    as ``a n + b n^2`` through both (attention grows with the prompt), linear when that bends down."""
    (n1, t1), (n2, t2) = probes[0], probes[-1]
    b = (t2 / n2 - t1 / n1) / (n2 - n1) if n2 != n1 else 0.0
    a = t1 / n1 - b * n1
    if b <= 0 or a <= 0:
        return int(ms * n2 / t2)
    return int((-a + (a * a + 4 * b * ms) ** 0.5) / (2 * b))


def _size_long_prompts(sc: Scenario) -> tuple[dict[str, Any], str]:
    w = sc.workload
    cfg = _config(sc)
    probes = _prompt_step_ms(sc)
    target = LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms
    room = min(cfg.batch_size, cfg.ctx_per_slot) - w.max_tokens - 64  # one step; the slot's context
    tokens = max(256, min(room, tokens_for(target, probes)))
    seen = ", ".join(f"{n} tokens in {ms:.0f} ms" for n, ms in probes)
    return {"workload.long_prompt_tokens": tokens}, (
        f"long prompts sized to this machine now: {tokens} tokens each, what llama.cpp processes in one step "
        f"of about {target:.0f} ms ({LONG_PROMPT_OVER_SLO:g} x the SLO threshold) at the speed just measured "
        f"({seen}); the same length in the lever check"
    )


# -- decode: the step time with n streams ------------------------------------------------------------


def step_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``ms = a + b n`` through ``(streams, step ms)`` points."""
    xs, ys = [float(n) for n, _ in points], [float(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def decode_load(
    points: list[tuple[int, float]], *, slots: int, max_tokens: int, prompt_ms: float
) -> tuple[float, float]:
    """``(arrival rate /s, inter-token threshold ms)`` for a decode fault on ``slots`` slots, from the
    median gap with ``n`` streams decoding (``points``: ``(n, ms)``). The rate keeps ``L = DECODE_LOAD_SHARE x slots`` streams decoding (Little's law,
    ``L = rate x (prompt_ms + max_tokens x step(L))``, the step fitted as ``a + b n``). The threshold is
    ITL_SLO_OVER_STEP x the fitted step at half the slots: the full run's gaps, at 3/4 of the slots and
    more, pass it, and the analysis' cap (fitted step plus scatter within 80 % of the threshold) lies
    below half the slots. A step that does not grow with
    the streams (the fit's slope at or below 0) cannot make this fault: a UserError says so."""
    a, b = step_fit(points)
    if b <= 0:
        raise UserError(f"llama.cpp: the decode step does not grow with the streams here ({points}); "
                        "the decode fault cannot be sized")  # fmt: skip
    running = DECODE_LOAD_SHARE * slots
    rate = running / ((prompt_ms + max_tokens * (a + b * running)) / 1000.0)
    return rate, ITL_SLO_OVER_STEP * (a + b * slots / 2.0)


def _stream_gaps(url: str, prompt: str, max_tokens: int) -> tuple[list[float], float]:
    """``(gaps between streamed tokens in ms, as the client sees them, llama.cpp's prompt_ms)`` of one
    streamed completion (no prompt cache, every token generated)."""
    import http.client
    import time
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    body = {"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": False, "ignore_eos": True, "stream": True}
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
    stamps: list[float] = []
    prompt_ms = 0.0
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        for line in conn.getresponse():
            if line.startswith(b"data: {"):
                stamps.append(time.monotonic())
                t = json.loads(line[6:]).get("timings") or {}
                prompt_ms = float(t.get("prompt_ms") or prompt_ms)
    finally:
        conn.close()
    if len(stamps) < 3:
        raise UserError("llama.cpp: the sizing probe's stream returned fewer than 3 tokens")
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(stamps[1:])], prompt_ms  # 1st gap: the prompt


def _decode_gaps(sc: Scenario) -> tuple[list[tuple[int, float]], float]:
    """``([(streams, median gap ms)], prompt ms)``:
    DECODE_PROBE_SHARES of the slots streaming together from a server with scenario ``sc``'s settings."""
    cfg = _config(sc, replicas=1)
    w = sc.workload
    points: list[tuple[int, float]] = []
    prompt = 0.0
    with _probe_servers(cfg) as (url,):
        _timings(url, _probe_text(w.prompt_tokens, 0), 4)
        for share in DECODE_PROBE_SHARES:
            n = max(1, round(share * cfg.parallel))
            with ThreadPoolExecutor(n) as ex:
                got = list(ex.map(lambda i: _stream_gaps(url, _probe_text(w.prompt_tokens, i), DECODE_PROBE_TOKENS),
                                  range(n)))  # fmt: skip
            gaps = sorted(g for gs, _ in got for g in gs)
            points.append((n, statistics.median(gaps)))
            prompt = statistics.median(p for _, p in got)
    return points, prompt


def _size_decode(sc: Scenario) -> tuple[dict[str, Any], str]:
    slots = _config(sc).parallel
    points, prompt_ms = _decode_gaps(sc)
    rate, itl = decode_load(points, slots=slots, max_tokens=sc.workload.max_tokens, prompt_ms=prompt_ms)
    rate, itl = round(rate, 1), float(max(1, round(itl)))
    spec = f"{sc.slo.sli}:p{sc.slo.objective * 100:g}<{itl:g}ms"
    a, b = step_fit(points)
    seen = ", ".join(f"{n} streams {ms:.1f} ms" for n, ms in points)
    return {"scenario.rate_rps": rate, "scenario.slo_spec": spec}, (
        f"decode load sized to this machine now: {rate:g} requests/s keep about {DECODE_LOAD_SHARE * slots:g} "
        f"of {slots} slots decoding, SLO {spec} ({ITL_SLO_OVER_STEP:g} x the fitted step with {slots // 2} "
        f"streams); median gaps just measured {seen} (fit {a:.1f} ms + {b:.2f} ms per stream); "
        "the same in the lever check"
    )


# -- slots: one request's service time -------------------------------------------------------------


def slot_load(service_s: float, *, slots: int) -> tuple[float, float]:
    """``(arrival rate /s, TTFT threshold ms)`` for a slot fault: SLOTS_OVERLOAD x the capacity of
    ``slots`` slots that each serve a request in ``service_s``, and TTFT_SLO_OVER_SERVICE x that time."""
    if service_s <= 0:
        raise UserError(f"llama.cpp: a request's service time must be positive, got {service_s:g} s")
    return SLOTS_OVERLOAD * slots / service_s, TTFT_SLO_OVER_SERVICE * service_s * 1000.0


def _busy_round(urls: list[str], slots: int, sc: Scenario, key: int) -> float:
    """One request's service time (s, llama.cpp's prompt + generation time, the median request) with
    every one of ``slots`` slots of the servers at ``urls`` busy with scenario ``sc``'s requests at once."""
    w = sc.workload
    jobs = [(u, _probe_text(w.prompt_tokens, key + i * slots + k), w.max_tokens)
            for i, u in enumerate(urls) for k in range(slots)]  # fmt: skip
    got = _together(jobs)
    return statistics.median(float(t["prompt_ms"]) + float(t["predicted_ms"]) for t in got) / 1000.0


def _service_s(cfg: Any, lever: Any, sc: Scenario) -> tuple[float, float]:
    """``(as served, with the lever)``: one request's service time (s) with every slot busy, on servers
    with ``cfg``'s and with ``lever``'s settings, the median of SLOT_PROBE_ROUNDS rounds that alternate
    between the two (all servers start first and idle between rounds), so a change in the machine's
    other load between them moves both alike."""
    w = sc.workload
    with _probe_servers(cfg) as now, _probe_servers(lever) as new:
        for u in (*now, *new):
            _timings(u, _probe_text(w.prompt_tokens, 0), 4)
        a, b = [], []
        for r in range(SLOT_PROBE_ROUNDS):
            a.append(_busy_round(now, cfg.parallel, sc, 100 * r + 1))
            b.append(_busy_round(new, lever.parallel, sc, 100 * r + 51))
    return statistics.median(a), statistics.median(b)


def _size_slots(sc: Scenario) -> tuple[dict[str, Any], str]:
    cfg = _config(sc)
    lever = _config(sc, apply_lever=True)
    service, lever_service = _service_s(cfg, lever, sc)
    rate, ttft = slot_load(service, slots=cfg.parallel * cfg.replicas)
    rate, ttft = round(rate, 1), float(max(10, round(ttft, -1)))
    lever_cap = lever.parallel * lever.replicas / lever_service
    spec = f"{sc.slo.sli}:p{sc.slo.objective * 100:g}<{ttft:g}ms"
    measured = {f"{MEASURED_PREFIX}{N.VARIANT_SERVING}": round(service, 4),
                f"{MEASURED_PREFIX}{sc.lever}": round(lever_service, 4)}  # fmt: skip
    return {"scenario.rate_rps": rate, "scenario.slo_spec": spec, **measured}, (
        f"slot load sized to this machine now: a request takes {service * 1000:.0f} ms with all "
        f"{cfg.parallel * cfg.replicas} slots busy, so {rate:g} requests/s ({SLOTS_OVERLOAD:g} x their capacity) "
        f"and SLO {spec} ({TTFT_SLO_OVER_SERVICE:g} x that time); the lever's {lever.replicas} servers took "
        f"{lever_service * 1000:.0f} ms each with all {lever.parallel * lever.replicas} slots busy: "
        f"{lever_cap:.2f} requests/s, {rate / lever_cap:.0%} busy at that rate; the same in the lever check, and "
        "both times go to the scale-out model (exported by the gateway)"
    )


def sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    """Overrides sizing scenario ``sc`` to this machine now, and what they are in one line (see the
    module docstring); ``({}, None)`` for a scenario without a fault to size."""
    if sc.workload.long_prompt_every:
        return _size_long_prompts(sc)
    if sc.true_stage == N.STAGE_DECODE and sc.slo.sli == N.SLI_ITL:
        return _size_decode(sc)
    if sc.true_stage == N.STAGE_QUEUE:
        return _size_slots(sc)
    return {}, None
