"""A SIMULATED Triton Inference Server: one ground truth, written the three ways Triton reports it.

For tests and examples only: nothing here ran Triton. A queue of requests in front of a model's
instances is simulated (FIFO, ``instances`` executing one request at a time, as Triton's default
scheduler does without dynamic batching); each request gets Triton's timestamps, and the same
requests are written

* as Triton's trace file (:func:`write_trace_file`), shaped as triton-inference-server/server
  src/tracer.cc writes it: ``TraceActivity`` puts ``{"id","model_name","model_version"[,"parent_id"]}``
  right before the REQUEST_START timestamp, every timestamp is an object of its own
  ``{"id","timestamps":[{"name","ns"}]}``, the frontend's HTTP_RECV_* come first (``StartTrace`` in
  src/http_server.cc captures them after sampling), the backend's compute timestamps after
  INFER_RESPONSE_COMPLETE (as in docs/user_guide/trace.md's example: backends report them once the
  execution is over), the traces of one request joined by ``,`` and the file an array
  (``TraceFile::SaveTraces``; ``closed=False``: as read from a running server, without the ``]``);
  ``ns`` on a steady clock (the docs' example value 2356425054587444 as origin);
* as OTLP/JSON lines of Triton's OpenTelemetry mode (:func:`write_otel`), the spans src/tracer.cc
  builds: ``InferRequest`` (started at sampling, after HTTP_RECV_END; frontend events) > the model
  span (``triton.model_name`` / ``model_version`` / ``trace_id`` / ``trace_parent_id``; REQUEST_START,
  QUEUE_START, REQUEST_END) > ``compute`` (the four COMPUTE_* events), all kind SERVER, scope
  ``triton-server`` (``kTritonTracer``), resource ``service.name`` ``triton-inference-server``; event
  times are ``time_offset_`` + steady clock;
* as the metrics endpoint (:func:`write_metrics`): the counters core's src/infer_stats.cc
  ``UpdateSuccessWithDuration`` / ``UpdateSuccessCacheHit`` increments per request (each duration
  truncated to whole microseconds; cache hits count in success, request and queue duration but not
  in inference count or compute), the cache families and the first-response histogram
  (whole milliseconds, default buckets 100, 500, 2000, 5000: core src/metric_model_reporter.h), with
  the HELP texts of core src/metrics.cc.

Triton traces every ``trace_rate``-th request (``--trace-config rate=N``); the counters count all.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stagescope import names as N
from stagescope.analysis.synth import KIND_SERVER, SynthSpan, write_otlp_lines

__all__ = ["STEADY_ORIGIN_NS", "SimRequest", "TritonSim", "simulate", "write_metrics", "write_otel",
           "write_trace_file"]  # fmt: skip

#: Steady-clock origin of the simulated server (the docs' example timestamp).
STEADY_ORIGIN_NS = 2_356_425_054_587_444
_MS = 1_000_000


@dataclass
class TritonSim:
    """A SIMULATED Triton model under open-loop Poisson load; times in milliseconds."""

    seed: int = 1
    requests: int = 4000
    rate_per_s: float = 80.0  # base arrival rate
    burst: tuple[float, float, float] | None = (20.0, 30.0, 160.0)  # (start s, end s, rate) of the incident
    instances: int = 1
    model: str = "resnet50"
    version: str = "1"
    infer_ms: float = 8.0  # median compute infer (lognormal)
    infer_sigma: float = 0.25
    input_ms: float = 0.4
    output_ms: float = 0.25
    cache_hit_ratio: float = 0.0  # share of requests the response cache answers
    protocol: str = "http"  # or "grpc"
    trace_rate: int = 1  # every N-th request is traced
    children: tuple[str, ...] = ()  # an ensemble's composing models (run one after the other) ...
    bls: bool = False  # ... or, True, the models a BLS model calls from inside its compute


@dataclass
class SimRequest:
    """One simulated request: its Triton trace id and timestamps (steady ns) per trace."""

    trace_id: int
    traced: bool
    cached: bool
    ts: dict[str, int]
    children: list[tuple[int, str, dict[str, int]]] = field(default_factory=list)


def _arrivals(cfg: TritonSim, rng: random.Random) -> Iterator[float]:
    t = 0.0
    for _ in range(cfg.requests):
        rate = cfg.rate_per_s
        if cfg.burst and cfg.burst[0] <= t < cfg.burst[1]:
            rate = cfg.burst[2]
        t += rng.expovariate(rate)
        yield t * 1000.0


def _child(t: float, dur: float) -> dict[str, float]:
    """A composing / called model's timestamps from ``t``, lasting ``dur`` ms."""
    c = {N.TRITON_TS_REQUEST_START: t, N.TRITON_TS_QUEUE_START: t + 0.01, N.TRITON_TS_COMPUTE_START: t + 0.03,
         N.TRITON_TS_COMPUTE_INPUT_END: t + 0.06, N.TRITON_TS_COMPUTE_OUTPUT_START: t + dur - 0.06,
         N.TRITON_TS_COMPUTE_END: t + dur - 0.03}  # fmt: skip
    c[N.TRITON_TS_REQUEST_END] = t + dur
    return c


def _ns(ms: float) -> int:
    return STEADY_ORIGIN_NS + round(ms * _MS)


def simulate(cfg: TritonSim) -> list[SimRequest]:
    """Requests with Triton's timestamps: frontend, scheduler queue (FIFO over ``instances``),
    compute input / infer / output, response and send."""
    rng = random.Random(cfg.seed)
    free = [0.0] * cfg.instances  # when each instance is next free (ms)
    out = []
    next_id = 1
    for i, arrive in enumerate(_arrivals(cfg, rng)):
        recv = 0.05 + rng.expovariate(1 / 0.1)
        t_req = arrive + recv + 0.06  # HTTP_RECV_END -> REQUEST_START: request parsing
        t_queue = t_req + 0.01
        cached = rng.random() < cfg.cache_hit_ratio
        ts = {N.TRITON_TS_HTTP_RECV_START: arrive, N.TRITON_TS_HTTP_RECV_END: arrive + recv,
              N.TRITON_TS_REQUEST_START: t_req, N.TRITON_TS_QUEUE_START: t_queue}  # fmt: skip
        kids: list[tuple[str, dict[str, float]]] = []
        if cached:
            done = t_queue + 0.02  # cache lookup, no queue behind the instances
            ts[N.TRITON_TS_REQUEST_END] = done + 0.01
        else:
            k = min(range(cfg.instances), key=free.__getitem__)
            start = max(t_queue, free[k])
            t_in = start + cfg.input_ms * rng.uniform(0.8, 1.2)
            t_out = t_in + cfg.infer_ms * math.exp(rng.gauss(0.0, cfg.infer_sigma))
            end = t_out + cfg.output_ms * rng.uniform(0.8, 1.2)
            if cfg.children and not cfg.bls:  # an ensemble: no compute of its own, its models in turn
                t = start
                for model in cfg.children:
                    kids.append((model, _child(t, (end - start) / len(cfg.children))))
                    t = kids[-1][1][N.TRITON_TS_REQUEST_END]
                end = t
            else:
                ts.update({N.TRITON_TS_COMPUTE_START: start, N.TRITON_TS_COMPUTE_INPUT_END: t_in,
                           N.TRITON_TS_COMPUTE_OUTPUT_START: t_out, N.TRITON_TS_COMPUTE_END: end})  # fmt: skip
                slot = (t_out - t_in) / max(1, len(cfg.children))
                for j, model in enumerate(cfg.children):  # BLS: the calls run inside its compute
                    kids.append((model, _child(t_in + j * slot + 0.1 * slot, 0.6 * slot)))
            free[k] = end
            done = t_out + 0.3 * (end - t_out) if not kids or cfg.bls else end
            ts[N.TRITON_TS_REQUEST_END] = end + 0.02
        # the backend hands the response over during its output phase, before it reports its compute
        # timestamps and releases the request (as a capture of Triton 2.51 shows: external/triton/)
        ts[N.TRITON_TS_INFER_RESPONSE_COMPLETE] = done + 0.005
        send = ts[N.TRITON_TS_INFER_RESPONSE_COMPLETE] + 0.05
        ts[N.TRITON_TS_HTTP_SEND_START] = send
        ts[N.TRITON_TS_HTTP_SEND_END] = send + 0.03
        if cfg.protocol == "grpc":
            ts = _as_grpc(ts)
        traced = i % cfg.trace_rate == 0
        req = SimRequest(next_id, traced, cached, {k: _ns(v) for k, v in ts.items()})
        next_id += 1
        for model, c in kids:
            req.children.append((next_id, model, {k: _ns(v) for k, v in c.items()}))
            next_id += 1
        out.append(req)
    return out


def _as_grpc(ts: dict[str, float]) -> dict[str, float]:
    """The gRPC frontend's names: no receive hook (GRPC_WAITREAD_* is the wait for the message)."""
    out = dict(ts)
    out[N.TRITON_TS_GRPC_WAITREAD_START] = out.pop(N.TRITON_TS_HTTP_RECV_START) - 5.0
    out[N.TRITON_TS_GRPC_WAITREAD_END] = out.pop(N.TRITON_TS_HTTP_RECV_END)
    out[N.TRITON_TS_GRPC_SEND_START] = out.pop(N.TRITON_TS_HTTP_SEND_START)
    out[N.TRITON_TS_GRPC_SEND_END] = out.pop(N.TRITON_TS_HTTP_SEND_END)
    return out


_FRONT_FIRST = (N.TRITON_TS_HTTP_RECV_START, N.TRITON_TS_HTTP_RECV_END, N.TRITON_TS_GRPC_WAITREAD_START,
                N.TRITON_TS_GRPC_WAITREAD_END)  # fmt: skip
_CORE_ORDER = (N.TRITON_TS_REQUEST_START, N.TRITON_TS_QUEUE_START, N.TRITON_TS_INFER_RESPONSE_COMPLETE,
               N.TRITON_TS_COMPUTE_START, N.TRITON_TS_COMPUTE_INPUT_END, N.TRITON_TS_COMPUTE_OUTPUT_START,
               N.TRITON_TS_COMPUTE_END, N.TRITON_TS_REQUEST_END, N.TRITON_TS_HTTP_SEND_START,
               N.TRITON_TS_HTTP_SEND_END, N.TRITON_TS_GRPC_SEND_START, N.TRITON_TS_GRPC_SEND_END)  # fmt: skip


def _stream(tid: int, model: str, version: str, ts: dict[str, int], parent: int | None) -> str:
    """One trace id's stream as TraceActivity / CaptureTimestamp append to it."""
    parts = []
    for name in (*_FRONT_FIRST, *_CORE_ORDER):
        if name not in ts:
            continue
        if name == N.TRITON_TS_REQUEST_START:
            head = f'{{"id":{tid},"model_name":"{model}","model_version":{version}'
            parts.append(head + (f',"parent_id":{parent}' if parent else "") + "}")
        parts.append(f'{{"id":{tid},"timestamps":[{{"name":"{name}","ns":{ts[name]}}}]}}')
    return ",".join(parts)


def write_trace_file(cfg: TritonSim, reqs: list[SimRequest], path: Path, *, closed: bool = True) -> int:
    """Triton's trace file of the traced requests; returns how many requests it holds."""
    traces = []
    for r in reqs:
        if r.traced:
            streams = [_stream(r.trace_id, cfg.model, cfg.version, r.ts, None)]
            streams += [_stream(cid, m, "1", ts, r.trace_id) for cid, m, ts in r.children]
            traces.append(",".join(streams))
    Path(path).write_text("[" + ",".join(traces) + ("]" if closed else ""))
    return len(traces)


def _events(ts: dict[str, int], names: tuple[str, ...], offset: int) -> list[tuple[str, int]]:
    return sorted(((n, ts[n] + offset) for n in names if n in ts), key=lambda e: e[1])


_ROOT_EVENTS = (*_FRONT_FIRST, N.TRITON_TS_INFER_RESPONSE_COMPLETE, N.TRITON_TS_HTTP_SEND_START,
                N.TRITON_TS_HTTP_SEND_END, N.TRITON_TS_GRPC_SEND_START, N.TRITON_TS_GRPC_SEND_END)  # fmt: skip
_MODEL_EVENTS = (N.TRITON_TS_REQUEST_START, N.TRITON_TS_QUEUE_START, N.TRITON_TS_REQUEST_END)
_COMPUTE_EVENTS = (N.TRITON_TS_COMPUTE_START, N.TRITON_TS_COMPUTE_INPUT_END, N.TRITON_TS_COMPUTE_OUTPUT_START,
                   N.TRITON_TS_COMPUTE_END)  # fmt: skip


def _model_spans(trace: str, sid: str, parent: str, tid: int, parent_tid: int, model: str, version: str,
                 ts: dict[str, int], offset: int, rng: random.Random) -> list[SynthSpan]:  # fmt: skip
    attrs: dict[str, str | int] = {N.TRITON_ATTR_MODEL_NAME: model, N.TRITON_ATTR_MODEL_VERSION: int(version),
                                   N.TRITON_ATTR_TRACE_ID: tid, N.TRITON_ATTR_TRACE_PARENT_ID: parent_tid}  # fmt: skip
    common = {"kind": KIND_SERVER, "service": "triton-inference-server", "scope": "triton-server"}
    out = [SynthSpan(trace, sid, model, ts[N.TRITON_TS_REQUEST_START] + offset, ts[N.TRITON_TS_REQUEST_END] + offset,
                     parent, attributes=attrs, events=_events(ts, _MODEL_EVENTS, offset), **common)]  # type: ignore[arg-type]  # fmt: skip
    if N.TRITON_TS_COMPUTE_START in ts:
        out.append(SynthSpan(trace, f"{rng.getrandbits(64):016x}", N.TRITON_SPAN_COMPUTE,
                             ts[N.TRITON_TS_COMPUTE_START] + offset, ts[N.TRITON_TS_COMPUTE_END] + offset, sid,
                             events=_events(ts, _COMPUTE_EVENTS, offset), **common))  # type: ignore[arg-type]  # fmt: skip
    return out


def write_otel(cfg: TritonSim, reqs: list[SimRequest], path: Path, *, offset_ns: int, seed: int = 7) -> int:
    """OTLP/JSON lines of the traced requests as Triton's OpenTelemetry mode exports them (event and
    span times Unix ns: steady + ``offset_ns``); returns the number of requests."""
    rng = random.Random(seed)
    spans: list[SynthSpan] = []
    n = 0
    for r in reqs:
        if not r.traced:
            continue
        n += 1
        trace = f"{rng.getrandbits(128):032x}"
        root, top = f"{rng.getrandbits(64):016x}", f"{rng.getrandbits(64):016x}"
        first_read = r.ts.get(N.TRITON_TS_HTTP_RECV_END, r.ts.get(N.TRITON_TS_GRPC_WAITREAD_END, 0))
        last = max(r.ts.values())
        spans.append(SynthSpan(trace, root, N.TRITON_SPAN_ROOT, first_read + 20_000 + offset_ns,
                               last + 15_000 + offset_ns, kind=KIND_SERVER, service="triton-inference-server",
                               scope="triton-server", events=_events(r.ts, _ROOT_EVENTS, offset_ns)))  # fmt: skip
        spans += _model_spans(trace, top, root, r.trace_id, 0, cfg.model, cfg.version, r.ts, offset_ns, rng)
        for cid, model, ts in r.children:
            spans += _model_spans(trace, f"{rng.getrandbits(64):016x}", top, cid, r.trace_id, model, "1", ts,
                                  offset_ns, rng)  # fmt: skip
    write_otlp_lines(path, spans, spans_per_line=512)
    return n


def _counter(lines: list[str], name: str, help_: str, labels: str, value: float, kind: str = "counter") -> None:
    lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value:g}"]


def write_metrics(cfg: TritonSim, reqs: list[SimRequest], path: Path, *, cache: bool | None = None) -> None:
    """The metrics endpoint after every request (counters since the server started), for a plain
    model (``children`` empty: an ensemble's counters are per composing model)."""
    if cfg.children:
        raise ValueError("write_metrics writes a plain model's counters (no children)")
    us = {"request": 0, "queue": 0, "ci": 0, "infer": 0, "co": 0, "hit": 0}
    success = executed = hits = 0
    first: list[int] = []
    for r in reqs:
        ts = r.ts
        success += 1
        us["request"] += (ts[N.TRITON_TS_REQUEST_END] - ts[N.TRITON_TS_REQUEST_START]) // 1000
        if r.cached:
            hits += 1
            us["queue"] += 10_000 // 1000  # QUEUE_START -> cache lookup start
            us["hit"] += 20_000 // 1000
        else:
            executed += 1
            us["queue"] += (ts[N.TRITON_TS_COMPUTE_START] - ts[N.TRITON_TS_QUEUE_START]) // 1000
            us["ci"] += (ts[N.TRITON_TS_COMPUTE_INPUT_END] - ts[N.TRITON_TS_COMPUTE_START]) // 1000
            us["infer"] += (ts[N.TRITON_TS_COMPUTE_OUTPUT_START] - ts[N.TRITON_TS_COMPUTE_INPUT_END]) // 1000
            us["co"] += (ts[N.TRITON_TS_COMPUTE_END] - ts[N.TRITON_TS_COMPUTE_OUTPUT_START]) // 1000
        first.append((ts[N.TRITON_TS_INFER_RESPONSE_COMPLETE] - ts[N.TRITON_TS_REQUEST_START]) // _MS)
    lab = f'model="{cfg.model}",version="{cfg.version}"'
    lines: list[str] = []
    _counter(lines, N.TRITON_REQUEST_SUCCESS, "Number of successful inference requests, all batch sizes", lab, success)
    _counter(lines, N.TRITON_INFERENCE_COUNT, "Number of inferences performed (does not include cached requests)",
             lab, executed)  # fmt: skip
    _counter(lines, N.TRITON_EXEC_COUNT, "Number of model executions performed (does not include cached requests)",
             lab, executed)  # fmt: skip
    for key, name, text in (
        ("request", N.TRITON_REQUEST_DURATION_US, "Cumulative inference request duration in microseconds (includes cached requests)"),
        ("queue", N.TRITON_QUEUE_DURATION_US, "Cumulative inference queuing duration in microseconds (includes cached requests)"),
        ("ci", N.TRITON_COMPUTE_INPUT_US, "Cumulative compute input duration in microseconds (does not include cached requests)"),
        ("infer", N.TRITON_COMPUTE_INFER_US, "Cumulative compute inference duration in microseconds (does not include cached requests)"),
        ("co", N.TRITON_COMPUTE_OUTPUT_US, "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ):  # fmt: skip
        _counter(lines, name, text, lab, us[key])
    if cache if cache is not None else cfg.cache_hit_ratio > 0:
        _counter(lines, N.TRITON_CACHE_HITS, "Number of cache hits per model", lab, hits)
        _counter(lines, N.TRITON_CACHE_HIT_US, "Total cache hit duration per model, in microseconds", lab, us["hit"])
        _counter(lines, N.TRITON_CACHE_MISSES, "Number of cache misses per model", lab, executed)
        _counter(lines, N.TRITON_CACHE_MISS_US, "Total cache miss (insert+lookup) duration per model, in microseconds",
                 lab, executed * 30)  # fmt: skip
    h = N.TRITON_FIRST_RESPONSE_MS
    lines += [f"# HELP {h} Duration from request to first response in milliseconds", f"# TYPE {h} histogram"]
    lines += [f"{h}_count{{{lab}}} {len(first)}", f"{h}_sum{{{lab}}} {sum(first)}"]
    for le in (100, 500, 2000, 5000):
        lines.append(f'{h}_bucket{{{lab},le="{le}"}} {sum(1 for f in first if f <= le)}')
    lines.append(f'{h}_bucket{{{lab},le="+Inf"}} {len(first)}')
    Path(path).write_text("\n".join(lines) + "\n")
