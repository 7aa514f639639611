"""Sampled traces of LLM engines: an engine span's request is weighted by 1 / sampling_p like any other.

The traces are SIMULATED (analysis/synth_engines.py, shaped as vLLM writes them); they are then
sampled the way a tail-keeping sampler does: every request whose TTFT is at or over the slow rule
kept with probability 1 (``th:0``), every fourth of the rest in arrival order with ``th`` for p = 0.25
(OpenTelemetry's probability sampling: ``(2^56 - th) / 2^56``). Every fourth, not a quarter at random,
so that the kept requests stand for exactly the true number: the SLO's p95 sits on the steep edge of
the burst (p94 447 ms, p96 1041 ms), where the random error of an estimated count (a few % of the
fast requests) would move the quantile by hundreds of milliseconds, and the test would measure the
sampler's luck instead of the weighting. The threshold sits on every span of
a kept trace (as a propagated tracestate does), or on the engine span alone (a host span whose
instrumentation wrote no ``th``: the engine's is the trace's decision).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from stagescope import names as N
from stagescope.analysis.api import analyze
from stagescope.analysis.ingest import load_dataset
from stagescope.analysis.synth import write_otlp_lines
from stagescope.analysis.synth_engines import LAYOUTS, ROUTE, timelines, vllm_spans

N_REQ = 2000
P_FAST = 0.25  # 1 / p = 4 exactly: summed weights stay whole numbers, ranks exact
TH_FAST = f"{round((1 - P_FAST) * 2**56):014x}".rstrip("0") or "0"


def _sampled_file(tmp_path: Path, layout: str, where: str) -> tuple[Path, float, int, float]:
    """The kept traces as OTLP/JSON lines; (file, true TTFT p95, kept requests, naive p95)."""
    outer = layout != "standalone"
    tl = timelines(N_REQ, "queue", seed=11, pre_ms=8.0 if outer else 0.0, post_ms=3.0 if outer else 0.0)
    truth = float(np.quantile(tl.ttft, 0.95))
    slow = float(np.quantile(tl.ttft, 0.8))
    spans = list(vllm_spans(tl, layout=layout))
    engines = sorted((s for s in spans if s.name == N.VLLM_SPAN_NAME), key=lambda s: s.start_ns)
    order = np.argsort(tl.t0_ns, kind="stable")  # the engine spans in arrival order match the timelines'
    state: dict[str, str] = {}
    kept_ttft = []
    fast = 0
    for i, s in zip(order, engines, strict=True):
        if tl.ttft[i] >= slow:
            state[s.trace_id] = "ot=th:0"
        else:
            fast += 1
            if fast % 4:
                continue
            state[s.trace_id] = f"ot=th:{TH_FAST}"
        kept_ttft.append(float(tl.ttft[i]))
    raw = tmp_path / "all.jsonl"
    write_otlp_lines(raw, [s for s in spans if s.trace_id in state])
    out = tmp_path / "sampled.jsonl"
    with open(out, "wb") as f:
        for line in raw.read_bytes().splitlines():
            doc = orjson.loads(line)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        if where == "all" or sp["name"] == N.VLLM_SPAN_NAME:
                            sp["traceState"] = state[sp["traceId"]]
            f.write(orjson.dumps(doc) + b"\n")
    return out, truth, len(kept_ttft), float(np.quantile(kept_ttft, 0.95))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("where", ["all", "engine-only"])
def test_sampled_engine_requests_are_weighted(tmp_path: Path, layout: str, where: str) -> None:
    f, truth, kept, naive = _sampled_file(tmp_path, layout, where)
    ds = load_dataset(traces=[f])
    n, known, fast = ds.con.execute(
        f"SELECT count(*), count(sampling_p), count(*) FILTER (WHERE abs(sampling_p - {P_FAST}) < 1e-9) FROM requests"
    ).fetchone()
    assert n == kept and known == kept and 0 < fast < kept  # every engine request carries its trace's p
    route = None if layout == "standalone" else ROUTE
    rep = analyze(ds, "ttft:p95<500ms", route=route)
    assert rep["status"] == N.STATUS_BREACHED and rep["samples"] == kept
    assert rep["sampling"]["weighted"]
    assert rep["requests"] == pytest.approx(N_REQ, rel=0.01)  # what the kept requests stand for
    assert rep["quantile_ms"] == pytest.approx(truth, rel=0.02)
    assert naive > truth * 1.05  # unweighted, the kept requests' p95 is far too high
    assert rep["verdict"]["stage"] == N.STAGE_QUEUE
    ds.close()
