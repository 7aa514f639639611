"""Size the llama.cpp scenarios to this machine now: probe servers time the engine, the scenario's load
or SLO follows from the times (the demo and the slow tests do this before a run and its lever check).

The engine's speed follows the machine and its load (a 1,500-token prompt took 1.5 s in one run and
0.6 s in the next; the 16-slot scenario's inter-token p99 was 120 ms on a loaded machine and 36 ms
on a quiet one at the same settings), so a scenario sized once breaches on one machine and not on the
next. Each fault is sized by the quantity that makes it:

* long prompts (``workload.long_prompt_every``): the prompt step's time at two lengths, fitted as
  ``a n + b n^2``; the long prompt gets the tokens one step processes in LONG_PROMPT_OVER_SLO x the
  TTFT threshold (:func:`tokens_for`). As for the slot probe (:mod:`probe_share`), the probe's server
  CPU is read around each step: a probe whose server got under STARVED_SHARE of its core is repeated
  (PROBE_ATTEMPTS at most, the least starved kept), and each step's time is taken at the server's full
  core (:func:`full_core_steps`). A starved probe timed the steps slow and so sized the prompts short:
  a run on a freed machine then processed them under the threshold and did not breach;
* a decode fault (true stage ``decode``, an inter-token SLO): the gaps between streamed tokens with
  ``n`` streams decoding together (DECODE_PROBE_SHARES of the slots), the median gap fitted as
  ``a + b n``; the arrival rate keeps DECODE_LOAD_SHARE of the slots decoding (Little's law with that
  step) and the inter-token threshold is ITL_SLO_OVER_STEP x the fitted step with half the slots decoding:
  the full run's gaps, at 3/4 of the slots and more, pass it, and the running-batch cap the analysis
  chooses (the largest whose fitted step plus scatter stays within 80 % of the threshold) lies below
  half the slots (:func:`decode_load`);
* a slot fault (true stage ``queue``): :mod:`slot_probe` (one request's streamed time with every slot
  busy sets the rate and threshold; the lever's servers are timed at every occupancy for the
  scale-out model; the run lasts at least SLOT_RUN_ARRIVALS arrivals).

Prompt and decode times are llama.cpp's own (``timings.prompt_ms``, the streamed gaps), on servers with
the scenario's settings, one thread each, after a warm-up request. Scenarios without such a fault (healthy)
are not sized.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.llama_cpp.cpu import available_cores, process_cpu_s
from stagescope.service.llama_cpp.probe import config as _config
from stagescope.service.llama_cpp.probe import probe_servers as _probe_servers
from stagescope.service.llama_cpp.probe import probe_text as _probe_text
from stagescope.service.llama_cpp.probe import server_pid as _server_pid
from stagescope.service.llama_cpp.probe import stream_gaps as _stream_gaps
from stagescope.service.llama_cpp.probe import timings as _timings
from stagescope.service.llama_cpp.probe_share import (
    PROBE_ATTEMPTS,
    STARVED_SHARE,
    ProbeShare,
    best_attempt,
    full_core_service,
    server_allowance,
)
from stagescope.service.llama_cpp.slot_probe import (
    MEASURED_PREFIX,
    SLOT_PROBE_ROUNDS,
    SLOT_RUN_ARRIVALS,
    SLOTS_OVERLOAD,
    TTFT_SLO_OVER_SERVICE,
    size_slots,
    slot_load,
)
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
    "SLOT_RUN_ARRIVALS",
    "TTFT_SLO_OVER_SERVICE",
    "decode_load",
    "full_core_steps",
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

# -- long prompts ------------------------------------------------------------------------------------


Step = tuple[int, float, float | None]  # (prompt tokens, ms, share of its core the server got; None: unread)


def _prompt_step_ms(sc: Scenario) -> list[Step]:
    """``(prompt tokens, ms, share)`` of one prompt step of each PROBE_TOKENS length on one slot of a server
    with scenario ``sc``'s settings; ``share``: the server's CPU seconds over the request's wall time, over
    the cores it may use (probe_share.server_allowance)."""
    cfg = _config(sc, parallel=1, replicas=1)
    allowed = server_allowance(cfg.threads, 1, available_cores())
    out: list[Step] = []
    with _probe_servers(cfg) as (url,):
        _timings(url, _probe_text(64, 0), 1)
        pid = _server_pid(url)
        for i, size in enumerate(PROBE_TOKENS):
            cpu0, t0 = (process_cpu_s(pid) if pid else None), time.perf_counter()
            t = _timings(url, _probe_text(size, i + 1), 1)
            wall, cpu1 = time.perf_counter() - t0, (process_cpu_s(pid) if pid else None)
            share = None if cpu0 is None or cpu1 is None or wall <= 0 else (cpu1 - cpu0) / wall / allowed
            out.append((int(t["prompt_n"]), float(t["prompt_ms"]), share))
    return out


def full_core_steps(steps: list[Step]) -> list[tuple[int, float]]:
    """``(tokens, ms)`` of each probe step at its server's full core: its time x the share it got (a
    CPU-bound step's time scales with the cores), never longer than measured; as measured where the
    share is unknown."""
    return [(n, full_core_service(ms, share)) for n, ms, share in steps]


def _lowest_share(steps: list[Step]) -> float | None:
    known = [sh for *_, sh in steps if sh is not None]
    return min(known) if known else None


def _prompt_probe(sc: Scenario) -> tuple[list[Step], int]:
    """The kept prompt probe and how many ran: repeated while its server ran starved (under
    STARVED_SHARE of its core), PROBE_ATTEMPTS at most; the first not starved, else the least starved."""
    attempts: list[list[Step]] = []
    shares: list[ProbeShare] = []
    for _ in range(PROBE_ATTEMPTS):
        attempts.append(_prompt_step_ms(sc))
        shares.append(ProbeShare(_lowest_share(attempts[-1]), None, 1.0, 1.0))
        if not shares[-1].starved:
            break
    return attempts[best_attempt(shares)], len(attempts)


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
    steps, ran = _prompt_probe(sc)
    probes = full_core_steps(steps)
    target = LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms
    room = min(cfg.batch_size, cfg.ctx_per_slot) - w.max_tokens - 64  # one step; the slot's context
    tokens = max(256, min(room, tokens_for(target, probes)))
    seen = ", ".join(f"{n} tokens in {ms:.0f} ms" + (f" on {sh:.0%} of its core" if sh is not None else "")
                     for n, ms, sh in steps)  # fmt: skip
    low = _lowest_share(steps)
    starved = (f"; the {ran - 1} probe(s) before ran starved (under {STARVED_SHARE:.0%} of its core) and were "
               "repeated" if ran > 1 and low is not None and low >= STARVED_SHARE else
               f"; all {ran} probe(s) ran starved, the least starved counts" if low is not None
               and low < STARVED_SHARE else "")  # fmt: skip
    return {"workload.long_prompt_tokens": tokens}, (
        f"long prompts sized to this machine now: {tokens} tokens each, what llama.cpp processes in one step "
        f"of about {target:.0f} ms ({LONG_PROMPT_OVER_SLO:g} x the SLO threshold) at the speed just measured "
        f"({seen}), taken at the server's full core{starved}; the same length in the lever check"
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


def sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    """Overrides sizing scenario ``sc`` to this machine now, and what they are in one line (see the
    module docstring); ``({}, None)`` for a scenario without a fault to size."""
    if sc.workload.long_prompt_every:
        return _size_long_prompts(sc)
    if sc.true_stage == N.STAGE_DECODE and sc.slo.sli == N.SLI_ITL:
        return _size_decode(sc)
    if sc.true_stage == N.STAGE_QUEUE:
        return size_slots(sc)
    return {}, None
