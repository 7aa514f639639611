"""vLLM's and SGLang's own spans as requests and stages, wherever they sit (issue 16, deliverables 1-2).

The traces are SIMULATED (analysis/synth_engines.py: no GPU here) and shaped as the engines' source
writes them (the excerpts in external/vllm/upstream and external/sglang/upstream); the truth is
the generator's own timeline. Acceptance: standalone, beside / under opentelemetry-instrument's
FastAPI span, under a gateway span, and a front-end-bound tail: the TTFT quantile within 2 % of the
truth, the right stage and lever."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from results_support import write_shared_prompt_run

from stagescope import names as N
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.synth import write_otlp_lines
from stagescope.analysis.synth_engine_metrics import vllm_scrape
from stagescope.analysis.synth_engines import LAYOUTS, MODEL, ROUTE, sglang_spans, timelines, vllm_spans

N_REQ = 600
LEVER = {"queue": N.LEVER_SCALE_OUT, "prefill": N.LEVER_CHUNKED_PREFILL, "front-end": N.LEVER_MORE_API_SERVERS}
STAGE = {"queue": N.STAGE_QUEUE, "prefill": N.STAGE_PREFILL, "front-end": N.STAGE_FRONT_END}


def _tl(fault: str, layout: str = "standalone", seed: int = 1) -> Any:
    outer = layout != "standalone"
    return timelines(N_REQ, fault, seed=seed, pre_ms=8.0 if outer else 0.0, post_ms=3.0 if outer else 0.0)


def _load(tmp_path: Path, spans: Any, name: str = "spans.jsonl", **kw: Any) -> Any:
    f = tmp_path / name
    write_otlp_lines(f, spans)
    return load_dataset(traces=[f], **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", ["queue", "prefill", "front-end"])
def test_vllm_v1_ttft_stage_and_lever_wherever_its_span_sits(tmp_path: Path, layout: str, fault: str) -> None:
    tl = _tl(fault, layout)
    ds = _load(tmp_path, vllm_spans(tl, layout=layout))
    rep = analyze(ds, "ttft:p95<500ms")
    truth = float(np.quantile(tl.ttft, 0.95))
    assert rep["status"] == N.STATUS_BREACHED and rep["samples"] == N_REQ
    assert rep["quantile_ms"] == pytest.approx(truth, rel=0.02)
    assert rep["verdict"] == {"stage": STAGE[fault], "lever": LEVER[fault]}
    assert rep["attribution"][0]["stage"] == STAGE[fault] and rep["attribution"][0]["share"] > 0.9
    # one request per request: the outer span is the request, the engine span its sample
    n, routes = ds.con.execute("SELECT count(*), list(DISTINCT route) FROM requests").fetchone()
    assert n == N_REQ and routes == [N.VLLM_SPAN_NAME if layout == "standalone" else ROUTE]
    ds.close()


@pytest.mark.parametrize("layout", ["fastapi-sibling", "fastapi-child", "gateway"])
def test_outer_span_gives_e2e_and_the_time_outside_the_engine(tmp_path: Path, layout: str) -> None:
    tl = _tl("queue", layout, seed=3)
    ds = _load(tmp_path, vllm_spans(tl, layout=layout))
    got = ds.con.execute("SELECT duration_ms FROM requests ORDER BY start_unix_ns").fetchall()
    assert [g[0] for g in got] == pytest.approx(list(tl.e2e), abs=0.2)  # the outer span's duration
    outside = N.STAGE_GATEWAY if layout == "gateway" else N.STAGE_FRONT_END
    # the outer span's time before and after the engine's interval is a stage of its own
    own = ds.con.execute(f"SELECT sum(duration_ms) FROM stages WHERE stage = '{outside}'").fetchone()[0]
    engine_fe = 0.0 if layout == "gateway" else float((tl.front + tl.back).sum())
    assert own == pytest.approx(float((tl.pre + tl.post).sum()) + engine_fe, rel=0.01)
    rep = analyze(ds, f"p99<{float(np.quantile(tl.e2e, 0.5)) * 3:.0f}ms", route=ROUTE)
    assert not any(r["stage"] == N.UNATTRIBUTED and r["share"] > 0.01 for r in rep["attribution"])
    ds.close()


def test_v1_front_end_gap_is_at_the_start_of_the_ttft_window_never_decode(tmp_path: Path) -> None:
    tl = _tl("front-end", seed=4)
    ds = _load(tmp_path, vllm_spans(tl))
    rep = analyze(ds, "ttft:p95<500ms")
    assert all(r["stage"] != N.STAGE_DECODE for r in rep["attribution"])  # nothing after the first token
    first = ds.con.execute(
        "SELECT stage FROM stages s JOIN requests r USING (request_key) WHERE s.start_unix_ns = r.start_unix_ns"
    ).fetchall()
    assert {f[0] for f in first} == {N.STAGE_FRONT_END}  # every request's first stage: the front end
    fe = ds.con.execute(
        f"SELECT sum(duration_ms) FROM stages WHERE stage = '{N.STAGE_FRONT_END}' AND start_unix_ns IN "
        "(SELECT start_unix_ns FROM requests)"
    ).fetchone()[0]
    assert fe == pytest.approx(float(tl.front.sum()), rel=1e-3)
    assert "--api-server-count" in rep["levers"][0]["rationale"]
    ds.close()


def test_v0_time_in_queue_runs_from_arrival(tmp_path: Path) -> None:
    """V0 (no prefill/decode attributes): the queue runs from arrival to the first schedule, so a slow
    front end is in it (V0's engine runs in the API server's process)."""
    tl = _tl("front-end", seed=5)
    ds = _load(tmp_path, vllm_spans(tl, version="v0"))
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["quantile_ms"] == pytest.approx(float(np.quantile(tl.ttft, 0.95)), rel=0.02)
    assert rep["verdict"]["stage"] == N.STAGE_QUEUE
    q = ds.con.execute(f"SELECT sum(duration_ms) FROM stages WHERE stage = '{N.STAGE_QUEUE}'").fetchone()[0]
    assert q == pytest.approx(float((tl.front + tl.queue).sum()), rel=1e-3)
    ds.close()


def test_semconv_opt_in_naming_and_lifecycle_child_spans(tmp_path: Path) -> None:
    tl = _tl("prefill", seed=6)
    ds = _load(tmp_path, vllm_spans(tl, semconv_opt_in=True, lifecycle=True))
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["route"] == f"chat {MODEL}" and rep["verdict"]["lever"] == N.LEVER_CHUNKED_PREFILL
    assert ds.con.execute("SELECT count(*), min(model) FROM requests").fetchone() == (N_REQ, MODEL)
    # the child spans are the stages (not also the attributes): one queue, prefill, decode each
    per = dict(ds.con.execute("SELECT stage, count(*) FROM stages GROUP BY 1").fetchall())
    assert per[N.STAGE_QUEUE] == per[N.STAGE_PREFILL] == per[N.STAGE_DECODE] == N_REQ
    assert per[N.STAGE_FRONT_END] == N_REQ  # arrival -> the queue span
    ds.close()


@pytest.mark.parametrize(("fault", "slices", "stage", "lever"), [
    ("queue", True, N.STAGE_QUEUE, N.LEVER_SCALE_OUT),
    ("queue", False, N.STAGE_PREFILL, N.LEVER_SCALE_OUT),  # SGLang's prefill holds its queue
    ("prefill", True, N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL),
    ("front-end", True, N.STAGE_FRONT_END, N.LEVER_MORE_API_SERVERS),
    ("front-end", False, N.STAGE_FRONT_END, N.LEVER_MORE_API_SERVERS),
])  # fmt: skip
def test_sglang_spans(tmp_path: Path, fault: str, slices: bool, stage: str, lever: str) -> None:
    tl = _tl(fault, seed=7)
    ds = _load(tmp_path, sglang_spans(tl, slices=slices))
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["quantile_ms"] == pytest.approx(float(np.quantile(tl.ttft, 0.95)), rel=0.02)
    assert rep["verdict"] == {"stage": stage, "lever": lever} and rep["route"] == "Req"
    assert ds.con.execute("SELECT count(*), min(source) FROM requests").fetchone() == (N_REQ, N.SOURCE_SGLANG)
    if not slices and fault == "queue":
        assert "holds the wait queue" in rep["levers"][0]["rationale"]
    ds.close()


@pytest.mark.parametrize(("fault", "lever"), [
    ("long-outputs", N.LEVER_CAP_OUTPUT_TOKENS), ("slow-steps", N.LEVER_SPECULATIVE_DECODING),
])  # fmt: skip
def test_long_outputs_are_not_slow_steps(tmp_path: Path, fault: str, lever: str) -> None:
    tl = timelines(1500, fault, seed=2)
    ds = _load(tmp_path, vllm_spans(tl))
    thr = float(np.quantile(tl.e2e, 0.5)) * 1.6
    rep = analyze(ds, f"p95<{thr:.0f}ms")
    assert rep["verdict"] == {"stage": N.STAGE_DECODE, "lever": lever}
    ev = rep["evidence"]
    ratio = ev["per_token_ms_tail"] / ev["per_token_ms_baseline"]
    assert (ratio < 1.25) if fault == "long-outputs" else (ratio > 2)
    pred = rep["levers"][0]["predicted_p99_ms"]
    assert pred is not None and pred < rep["quantile_ms"]
    ds.close()


def test_engine_spans_in_traces_of_their_own_are_no_data_that_says_so(tmp_path: Path) -> None:
    """A caller without a traceparent: released vLLM puts llm_request in a trace of its own, beside
    nothing. A TTFT SLO on the HTTP route has no sample, and the reason says why (never "met")."""
    tl = _tl("queue", "fastapi-sibling")
    alone = [
        dataclasses.replace(s, trace_id=s.trace_id[::-1], parent_span_id="") if s.name == N.VLLM_SPAN_NAME else s
        for s in vllm_spans(tl, layout="fastapi-sibling")
    ]
    ds = _load(tmp_path, alone)
    rep = analyze(ds, "ttft:p95<500ms", route=ROUTE)
    assert rep["status"] == N.STATUS_NO_DATA and rep["breached"] is None
    why = rep["no_data_reason"]
    assert f"{N_REQ} LLM engine spans" in why and "none in the traces of these requests" in why
    assert "traceparent" in why
    ds.close()


def test_waiting_gauge_replaces_queue_depth_na_and_kv_pressure_comes_before_scale_out(tmp_path: Path) -> None:
    """Timestamped scrapes during the incident: the waiting gauge as of each request stands for the
    queue depth; preemptions rising with the running batch (and a full KV cache) point at KV headroom."""
    tl = _tl("queue", seed=8)
    t0 = int(tl.t0_ns.min() // 10**6)
    scrapes = []
    for k, s in enumerate(range(0, 320, 20)):
        burst = 1.0 if 120 <= s <= 180 else 0.0
        scrapes.append(vllm_scrape(tl, until_s=s, ts_ms=t0 + s * 1000, running=8 + 40 * burst,
                                   waiting=30 * burst, kv_usage=0.5 + 0.48 * burst, preemptions=k * 2 + 15 * burst * k))  # fmt: skip
    prom = tmp_path / "scrapes.prom"
    prom.write_text("".join(scrapes))
    f = tmp_path / "spans.jsonl"
    write_otlp_lines(f, vllm_spans(tl))
    ds = load_dataset(traces=[f], metrics=[prom])
    rep = analyze(ds, "ttft:p95<500ms")
    ev = rep["evidence"]
    assert ev["queue_depth_tail"] > ev["queue_depth_baseline"] >= 0 and "num_requests_waiting" in ev["queue_depth_source"]
    assert rep["verdict"] == {"stage": N.STAGE_QUEUE, "lever": N.LEVER_KV_CACHE_HEADROOM}
    assert "n/a" not in rep["levers"][0]["rationale"].split("Predicted")[0]
    ds.close()


def test_prefix_caching_off_on_shared_prompts(tmp_path: Path) -> None:
    """Long prefills of prompts the load generator sent again and again, prefix caching off
    (vllm:cache_config_info): prefix caching, before chunked prefill."""
    tl = _tl("prefill", seed=1)
    traces, results = write_shared_prompt_run(tl, tmp_path)
    prom = tmp_path / "m.prom"
    prom.write_text(vllm_scrape(tl, prefix_caching=False))
    ds = load_dataset(traces=[traces], metrics=[prom], results=[results])
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["evidence"]["prefix_caching_enabled"] is False
    assert rep["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_PREFIX_CACHING}
    ds.close()
    # the same traffic with the cache on and hitting: the prompts are long, not recomputed
    prom.write_text(vllm_scrape(tl, prefix_caching=True, prefix_hit_ratio=0.8))
    ds = load_dataset(traces=[traces], metrics=[prom], results=[results])
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["evidence"]["prefix_cache_hit_ratio"] == pytest.approx(0.8, abs=0.01)
    assert rep["verdict"] == {"stage": N.STAGE_PREFILL, "lever": N.LEVER_CHUNKED_PREFILL}
    ds.close()


@pytest.mark.parametrize("layout", ["standalone", "gateway"])
def test_copies_of_engine_spans_are_one_request(tmp_path: Path, layout: str) -> None:
    """A request is one span id: the same spans in two files (an exporter's retried batch,
    overlapping exports) are one request each, with one set of stages."""
    tl = _tl("queue", layout, seed=9)
    spans = list(vllm_spans(tl, layout=layout))
    write_otlp_lines(tmp_path / "a.jsonl", spans)
    write_otlp_lines(tmp_path / "b.jsonl", spans[::-1])
    ds = load_dataset(traces=[tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert ds.repeated_spans == len(spans)
    assert ds.con.execute("SELECT count(*), count(DISTINCT request_key) FROM requests").fetchone() == (N_REQ, N_REQ)
    per = dict(ds.con.execute("SELECT stage, count(*) FROM stages GROUP BY 1").fetchall())
    assert per[N.STAGE_QUEUE] == N_REQ
    # the engine's stages carry the kinds their names imply (the lever rules go by kind)
    kinds = dict(ds.con.execute("SELECT stage, list(DISTINCT kind) FROM stages GROUP BY 1").fetchall())
    assert kinds[N.STAGE_QUEUE] == [N.KIND_QUEUE] and kinds[N.STAGE_FRONT_END] == [N.KIND_CPU]
    assert kinds.get(N.STAGE_GATEWAY, [N.KIND_NETWORK]) == [N.KIND_NETWORK]
    rep = analyze(ds, "ttft:p95<500ms", route=None if layout == "standalone" else ROUTE)
    assert rep["samples"] == N_REQ
    assert rep["quantile_ms"] == pytest.approx(float(np.quantile(tl.ttft, 0.95)), rel=0.02)
    ds.close()


def test_engine_stage_rules_go_by_kind_and_name() -> None:
    """front_end is kind cpu and gateway kind network (names.STAGE_KINDS), yet each has its own rule
    ahead of its kind's: more API servers, not a worker pool; measure the gateway, not shrink the
    response. A team's own cpu or network stage still gets its kind's rule."""
    from stagescope.analysis import levers as L

    ev: dict[str, Any] = {"shares": {}, "kinds": {}}
    fe = L.choose(N.STAGE_FRONT_END, N.STAGE_KINDS[N.STAGE_FRONT_END], ev)
    gw = L.choose(N.STAGE_GATEWAY, N.STAGE_KINDS[N.STAGE_GATEWAY], ev)
    assert fe is not None and fe[0] == N.LEVER_MORE_API_SERVERS
    assert gw is not None and gw[0] is None and "Measure it first" in gw[1]
    tok = L.choose("tokenize", N.KIND_CPU, ev)
    hop = L.choose("proxy", N.KIND_NETWORK, ev)
    assert tok is not None and tok[0] == N.LEVER_OFFLOAD_PREPROCESSING
    assert hop is not None and hop[0] == N.LEVER_SHRINK_RESPONSE
