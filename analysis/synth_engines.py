"""SIMULATED LLM-engine traces, shaped as vLLM and SGLang write them, from a known ground truth.

No GPU and no engine runs here: each request is a timeline drawn from a small statistical model
(:func:`timelines`, milliseconds) with one fault injected into its true stage, and the emitters turn
the timelines into spans **exactly as the engines' source writes them**, every shape choice citing
the upstream file it follows (excerpts in ``external/vllm/upstream`` and ``external/sglang/upstream``):

* :func:`vllm_spans`: vLLM's ``llm_request`` span in its V1 form (``OutputProcessor.do_tracing``,
  vllm-project/vllm vllm/v1/engine/output_processor.py @ d0782260) or V0 form (``create_trace_span``,
  vllm/engine/llm_engine.py @ 0005bbd7), optionally named ``"{operation} {model}"`` with the semconv
  opt-in (tests/tracing/test_gen_ai_semconv.py @ 2b106481) and with the lifecycle child spans
  (tests/tracing/test_request_lifecycle_tracing.py @ 8d1fa3c4); placed standalone, beside or under
  FastAPI's SERVER span (``opentelemetry-instrument vllm serve``: released vLLM makes them siblings,
  vllm-project/vllm#43005 makes ``llm_request`` the child), or under a traced gateway;
* :func:`sglang_spans`: SGLang's request root span with its thread and stage-slice spans
  (sgl-project/sglang python/sglang/srt/observability/trace.py @ 02a58088, req_time_stats.py @
  00ce49e0, managers/tokenizer_manager_components/request_tracing.py @ 2d396b52).

Everything is marked as simulated: service names ``simulated-vllm`` / ``simulated-sglang`` /
``simulated-gateway``, model ``simulated/llm``. :func:`timelines` is deterministic for a seed.
Metric scrapes are in :mod:`stagescope.analysis.synth_engine_metrics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stagescope import names as N
from stagescope.analysis.synth import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, AttrValue, SynthSpan

__all__ = ["FAULTS", "LAYOUTS", "MODEL", "ROUTE", "Timelines", "sglang_spans", "timelines", "vllm_spans"]

MODEL = "simulated/llm"
ROUTE = "/v1/chat/completions"
#: Where the engine's span sits (see vllm_spans).
LAYOUTS = ("standalone", "fastapi-sibling", "fastapi-child", "gateway")
#: The injected faults and the stage each one is in (``long-outputs`` and ``slow-steps``: decode).
FAULTS = {
    "queue": N.STAGE_QUEUE, "prefill": N.STAGE_PREFILL, "front-end": N.STAGE_FRONT_END,
    "long-outputs": N.STAGE_DECODE, "slow-steps": N.STAGE_DECODE, "none": None,
}  # fmt: skip


@dataclass
class Timelines:
    """The true timeline of ``n`` requests, milliseconds (``t0_ns``: the outermost span's start).

    ``pre``: outer span start -> engine arrival (HTTP server or gateway work before the engine);
    ``front``: arrival -> queued (V1 front end: tokenization, API server, IPC); ``queue``; ``prefill``;
    ``decode`` (first -> last token); ``back``: last token -> the front end's last iteration (vLLM's
    e2e end); ``post``: that -> the outer span's end. The true server-side TTFT is ``ttft``."""

    t0_ns: np.ndarray
    pre: np.ndarray
    front: np.ndarray
    queue: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray
    back: np.ndarray
    post: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    fault: str

    @property
    def n(self) -> int:
        return len(self.t0_ns)

    @property
    def ttft(self) -> np.ndarray:
        """Outer span start -> first token (ms): what the request's caller waited for the first token."""
        return self.pre + self.front + self.queue + self.prefill

    @property
    def engine_ttft(self) -> np.ndarray:
        """vLLM V1's ``time_to_first_token``: arrival -> first token (ms)."""
        return self.front + self.queue + self.prefill

    @property
    def e2e(self) -> np.ndarray:
        """The outer span's duration (ms)."""
        return self.ttft + self.decode + self.back + self.post


def timelines(
    n: int = 1500, fault: str = "queue", *, seed: int = 0, pre_ms: float = 0.0, post_ms: float = 0.0,
    duration_s: float = 300.0, t0_ns: int = 1_764_460_800 * 10**9,
) -> Timelines:  # fmt: skip
    """``n`` SIMULATED requests over ``duration_s`` with ``fault`` (a key of :data:`FAULTS`) in 6 % of
    them (a burst for ``queue``); ``pre_ms`` / ``post_ms``: median time the outer span (HTTP server,
    gateway) spends before / after the engine (0: no outer span)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, duration_s, n))

    def ln(median: float, sigma: float) -> np.ndarray:
        return median * np.exp(rng.normal(0.0, sigma, n))

    prompt = np.clip(ln(600, 0.4), 32, 6000).astype(int)
    out = np.clip(ln(120, 0.3), 8, 1000).astype(int)
    per_token = ln(22, 0.08)
    front, queue = ln(12, 0.3), rng.exponential(15, n)
    prefill = 20 + 0.1 * prompt * np.exp(rng.normal(0, 0.05, n))
    hit = rng.random(n) < 0.06
    if fault == "queue":  # one burst: a backlog builds and drains
        phase = np.clip((t / duration_s - 0.45) / 0.1, 0, 1)
        queue += np.sin(np.pi * phase) ** 2 * 2200 * rng.uniform(0.8, 1.0, n)
    elif fault == "prefill":  # long prompts
        prompt[hit] = rng.integers(14000, 18000, int(hit.sum()))
        prefill[hit] = 20 + 0.1 * prompt[hit]
    elif fault == "front-end":  # the API server falls behind (tokenization of big inputs, one process)
        front[hit] += ln(1200, 0.2)[hit]
    elif fault == "long-outputs":  # same per-token time, three times the tokens
        out[hit] *= 3
    elif fault == "slow-steps":  # same tokens, each step three times slower
        per_token[hit] *= 3
    decode = per_token * (out - 1)
    return Timelines(
        t0_ns + (t * 1e9).astype(np.int64), ln(pre_ms, 0.2) if pre_ms else np.zeros(n), front, queue,
        prefill, decode, ln(0.4, 0.2), ln(post_ms, 0.2) if post_ms else np.zeros(n), prompt, out, fault,
    )  # fmt: skip


class _Ids:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed + 7919)

    def trace(self) -> str:
        return f"{int(self.rng.integers(1, 2**63)):016x}{int(self.rng.integers(1, 2**63)):016x}"

    def span(self) -> str:
        return f"{int(self.rng.integers(1, 2**63)):016x}"


def _ns(ms: float) -> int:
    return round(float(ms) * 1e6)


def _fastapi_span(tid: str, sid: str, parent: str, st: int, en: int, svc: str) -> list[SynthSpan]:
    """opentelemetry-instrumentation-fastapi's SERVER span (``"{method} {route}"``, old HTTP semconv,
    the default) and two of the ASGI middleware's INTERNAL ``http send`` spans (it writes one per
    ``send`` event: the response start and every body chunk; the first and last are written here)."""
    attrs: dict[str, AttrValue] = {
        "http.method": "POST", "http.route": ROUTE, "http.target": ROUTE, "http.scheme": "http",
        "http.flavor": "1.1", "http.status_code": 200, "net.host.port": 8000,
    }  # fmt: skip
    out = [SynthSpan(tid, sid, f"POST {ROUTE}", st, en, parent, KIND_SERVER, attrs, service=svc)]
    for i, (a, b, ev) in enumerate(((st + 10**5, st + 2 * 10**5, "http.response.start"),
                                    (en - 2 * 10**5, en - 10**5, "http.response.body"))):  # fmt: skip
        out.append(SynthSpan(tid, f"{int(sid, 16) ^ (0xA5A0 + i):016x}", f"POST {ROUTE} http send", a, b, sid,
                             KIND_INTERNAL, {"asgi.event.type": ev}, service=svc))  # fmt: skip
    return out


def vllm_spans(
    tl: Timelines, *, layout: str = "standalone", version: str = "v1", semconv_opt_in: bool = False,
    lifecycle: bool = False, seed: int = 0,
) -> Iterator[SynthSpan]:  # fmt: skip
    """The spans of ``tl``'s requests as vLLM writes them (see the module docstring); ``layout`` is one
    of :data:`LAYOUTS`, ``version`` ``"v1"`` or ``"v0"``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    ids = _Ids(seed)
    svc = "simulated-vllm"
    for i in range(tl.n):
        tid = ids.trace()
        t0 = int(tl.t0_ns[i])
        arrival = t0 + _ns(tl.pre[i])
        first = arrival + _ns(tl.engine_ttft[i])
        last = first + _ns(tl.decode[i])
        e2e_end = last + _ns(tl.back[i])
        host_end = e2e_end + _ns(tl.post[i])
        caller = ids.span()  # the caller's span (a client not in these files): the traceparent's parent
        parent = caller
        if layout == "gateway":  # the gateway's SERVER span and its CLIENT span calling vLLM
            gw, gw_client = ids.span(), ids.span()
            yield SynthSpan(
                tid,
                gw,
                f"POST {ROUTE}",
                t0,
                host_end,
                caller,
                KIND_SERVER,
                {"http.route": ROUTE, "http.response.status_code": 200},
                service="simulated-gateway",
            )
            yield SynthSpan(tid, gw_client, "POST", t0 + _ns(tl.pre[i] * 0.4), host_end - _ns(tl.post[i] * 0.4),
                            gw, KIND_CLIENT, {"http.request.method": "POST", "server.port": 8000},
                            service="simulated-gateway")  # fmt: skip
            parent = gw_client
        elif layout.startswith("fastapi"):
            fa = ids.span()
            yield from _fastapi_span(tid, fa, caller, t0, host_end, svc)
            if layout == "fastapi-child":  # vllm-project/vllm#43005: the active server span is propagated
                parent = fa
        yield from _llm_request(tl, i, tid, ids.span(), parent, arrival, first, e2e_end, version, semconv_opt_in,
                                lifecycle, svc)  # fmt: skip


def _llm_request(
    tl: Timelines, i: int, tid: str, sid: str, parent: str, arrival: int, first: int, e2e_end: int,
    version: str, semconv_opt_in: bool, lifecycle: bool, svc: str,
) -> Iterator[SynthSpan]:  # fmt: skip
    s = 1e-3  # ms -> the attributes' seconds
    name = N.VLLM_SPAN_NAME
    attrs: dict[str, AttrValue] = {
        N.VLLM_ATTR_PROMPT_TOKENS: int(tl.prompt_tokens[i]),
        N.VLLM_ATTR_COMPLETION_TOKENS: int(tl.output_tokens[i]),
        "gen_ai.request.id": f"chatcmpl-{sid}", "gen_ai.request.max_tokens": 2048,
        "gen_ai.request.temperature": 0.7, "gen_ai.request.top_p": 0.95, "gen_ai.request.n": 1,
    }  # fmt: skip
    if version == "v1":
        # do_tracing: ttft = first_token_latency (arrival, front end), queue = scheduled - queued,
        # prefill = first_token - scheduled, decode = last - first token, inference = last - scheduled,
        # e2e = the front end's iteration timestamp - arrival; finish reasons as a JSON list
        attrs.update({
            N.VLLM_ATTR_TTFT: float(tl.engine_ttft[i] * s), N.VLLM_ATTR_E2E: (e2e_end - arrival) / 1e9,
            N.VLLM_ATTR_QUEUE: float(tl.queue[i] * s), N.VLLM_ATTR_PREFILL: float(tl.prefill[i] * s),
            N.VLLM_ATTR_DECODE: float(tl.decode[i] * s),
            N.VLLM_ATTR_INFERENCE: float((tl.prefill[i] + tl.decode[i]) * s),
            "gen_ai.response.finish_reasons": json.dumps(["stop"]),
        })  # fmt: skip
    else:
        # create_trace_span: time_in_queue = first scheduled - arrival (no front-end gap in V0: the
        # engine runs in the API server's process), ttft and e2e from arrival; gen_ai.response.model
        attrs.update({
            N.VLLM_ATTR_QUEUE: float((tl.front[i] + tl.queue[i]) * s), N.VLLM_ATTR_TTFT: float(tl.engine_ttft[i] * s),
            N.VLLM_ATTR_E2E: (e2e_end - arrival) / 1e9, "gen_ai.response.model": MODEL,
            "gen_ai.usage.num_sequences": 1,
        })  # fmt: skip
    if semconv_opt_in:  # latest_gen_ai_semconv_attributes: "{operation} {model}" and the two attributes
        name = f"chat {MODEL}"
        attrs.update({N.GENAI_OPERATION_NAME: "chat", N.GENAI_REQUEST_MODEL: MODEL})
    # the span starts at arrival and ends when do_tracing runs, just after the last output is processed
    yield SynthSpan(tid, sid, name, arrival, e2e_end + 50_000, parent, KIND_SERVER, attrs, service=svc)
    if lifecycle:  # children of llm_request: queue (queued -> scheduled), prefill, decode
        queued = arrival + _ns(tl.front[i])
        sched = queued + _ns(tl.queue[i])
        for k, (nm, a, b) in enumerate(((N.VLLM_SPAN_QUEUE, queued, sched), (N.VLLM_SPAN_PREFILL, sched, first),
                                        (N.VLLM_SPAN_DECODE, first, first + _ns(tl.decode[i])))):  # fmt: skip
            yield SynthSpan(
                tid, f"{int(sid, 16) ^ (0x1C0 + k):016x}", nm, a, b, sid, KIND_INTERNAL, service=svc
            )


def sglang_spans(tl: Timelines, *, slices: bool = True, seed: int = 0) -> Iterator[SynthSpan]:
    """The spans of ``tl``'s requests as SGLang (unified mode) writes them: the root span
    ``" Req <rid[:8]>"`` (role empty; ``TraceReqContext.trace_req_start``), kind INTERNAL (started
    without a kind) with the caller's span as parent (``external_trace_header``), ending at
    ``trace_req_finish`` with ``make_span_attrs``' attributes; with ``slices`` its tokenizer and
    scheduler thread spans (``"{label} [TP n] (host:... | pid:...)"``) and their stage slices
    (``APIServerReqTimeStats`` / ``SchedulerReqTimeStats``: tokenize, api_server_dispatch,
    prefill_waiting, prefill_forward, decode_forward). SGLang starts no span for a request that
    carries no trace context of its own; the root's parent here is the caller's (absent) span."""
    ids = _Ids(seed)
    svc = "simulated-sglang"
    for i in range(tl.n):
        tid, root = ids.trace(), ids.span()
        created = int(tl.t0_ns[i]) + _ns(tl.pre[i])
        tokenized = created + _ns(tl.front[i] * 0.6)
        dispatched = created + _ns(tl.front[i])  # api_server_dispatch_finish_time
        queued = dispatched  # wait_queue_entry_time (request_process: 0 here)
        forward = queued + _ns(tl.queue[i])  # forward_entry_time
        first = forward + _ns(tl.prefill[i])
        finished = first + _ns(tl.decode[i])
        rid = f"{root}{tid[:16]}"
        attrs: dict[str, AttrValue] = {
            "rid": rid[:32], "module": "sglang::request",
            N.VLLM_ATTR_COMPLETION_TOKENS: int(tl.output_tokens[i]), N.VLLM_ATTR_PROMPT_TOKENS: int(tl.prompt_tokens[i]),
            "gen_ai.usage.cached_tokens": 0, "gen_ai.request.id": rid[:32], "gen_ai.request.max_tokens": 2048,
            "gen_ai.response.model": MODEL, "gen_ai.response.finish_reasons": json.dumps(["stop"]),
            # convert_to_gen_ai_span_attrs: no time_in_queue; prefill from the dispatch's end
            N.VLLM_ATTR_TTFT: (first - created) / 1e9, N.VLLM_ATTR_E2E: (finished - created) / 1e9,
            N.VLLM_ATTR_DECODE: (finished - first) / 1e9, N.VLLM_ATTR_INFERENCE: (finished - dispatched) / 1e9,
            N.VLLM_ATTR_PREFILL: (first - dispatched) / 1e9,
        }  # fmt: skip
        yield SynthSpan(
            tid, root, f" Req {rid[:8]}", created, finished, ids.span(), KIND_INTERNAL, attrs, service=svc
        )
        if not slices:
            continue
        tok, sch = ids.span(), ids.span()
        yield SynthSpan(tid, tok, "Tokenizer (host:5f3a9c21 | pid:4121)", created, dispatched, root,
                        attributes={"thread_label": "Tokenizer", "pid": 4121}, service=svc)  # fmt: skip
        yield SynthSpan(tid, sch, "Scheduler [TP 0] (host:5f3a9c21 | pid:4188)", queued, finished, root,
                        attributes={"thread_label": "Scheduler", "tp_rank": 0, "pid": 4188}, service=svc)  # fmt: skip
        for k, (nm, parent, a, b) in enumerate((
            ("tokenize", tok, created, tokenized), ("api_server_dispatch", tok, tokenized, dispatched),
            ("prefill_waiting", sch, queued, forward), ("prefill_forward", sch, forward, first),
            ("decode_forward", sch, first, finished),
        )):  # fmt: skip
            # decode_forward stands for the per-step decode_loop slices (level 3, one per decode step,
            # decode_ct attribute), which this generator does not write one by one
            yield SynthSpan(
                tid, f"{int(root, 16) ^ (0x5100 + k):016x}", nm, a, b, parent, KIND_INTERNAL, service=svc
            )
