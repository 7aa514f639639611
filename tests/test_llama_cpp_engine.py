"""The llama.cpp engine for real: llama-server built from source serving the random-weight GGUF, the
gateway in front of it, and every llama.cpp scenario diagnosed as its truth (slow).

The build is cached outside the repository (``.ci/run`` builds it before ``make test``); where it is
absent and cannot be built (no cmake or compiler) these tests skip with that one-line reason, and
where it can be built the first test builds it (minutes).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf", reason="the llama-cpp extra (gguf) is not installed")

from stagescope import names as N
from stagescope.service.llama_cpp.build import Build, cannot_build_reason, ensure_server, find_server
from stagescope.service.llama_cpp.gguf_model import ModelArtifact, ensure_model
from stagescope.service.llama_cpp.server import EngineConfig, LlamaServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a first run builds llama-server


@pytest.fixture(scope="module")
def engine() -> tuple[Build, ModelArtifact]:
    build = find_server()
    if build is None:
        reason = cannot_build_reason()
        if reason:
            pytest.skip(reason)
        build = ensure_server()
    return build, ensure_model(build.vocab())


@pytest.fixture(scope="module")
def server(engine: tuple[Build, ModelArtifact], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    build, model = engine
    s = LlamaServer(build.server, model.path, EngineConfig(parallel=2, ctx_per_slot=512),
                    log=tmp_path_factory.mktemp("llama") / "llama-server.log")  # fmt: skip
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return dict(json.loads(r.read()))


def test_llama_server_computes_with_timings_and_serves_its_metrics(server: LlamaServer) -> None:
    doc = _post(f"{server.url}/v1/completions", {"prompt": "alpha beta gamma delta " * 8, "max_tokens": 8,
                                                 "ignore_eos": True})  # fmt: skip
    t = doc["timings"]
    assert t["predicted_n"] == 8 and t["prompt_n"] + t.get("cache_n", 0) == doc["usage"]["prompt_tokens"] > 30
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0  # real compute took real time
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    served = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}
    assert set(N.LLAMACPP_METRICS) <= served, set(N.LLAMACPP_METRICS) - served
    with urllib.request.urlopen(f"{server.url}/props", timeout=10) as r:
        props = json.loads(r.read())
    assert "random-weights" in props["model_path"]


def test_gateway_relays_llama_metrics_and_puts_timings_on_spans(
    engine: tuple[Build, ModelArtifact], tmp_path: Path
) -> None:
    import asyncio
    import subprocess
    import time

    import numpy as np
    from service_support import interrupt, read_spans

    from stagescope.demo.runner import free_port
    from stagescope.loadgen import Schedule, run_load
    from stagescope.service.llama_cpp.engine import serve_command
    from stagescope.service.llama_cpp.scenarios import get_scenario

    sc = get_scenario("llama-healthy")
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(serve_command(sc, port=port, spans_dir=tmp_path / "spans", apply_lever=False),
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()
            time.sleep(0.1)
        sched = Schedule(offsets_s=np.array([0.0, 0.3, 0.6, 0.9]), duration_s=1.0,
                         prompt_tokens=np.full(4, 40, dtype=np.int64), output_tokens=np.full(4, 12, dtype=np.int64))
        run = asyncio.run(run_load(url, sched, route="/v1/completions", api="openai-completions", timeout_s=30))
        assert all(r.status == 200 for r in run.results)
        time.sleep(1.5)  # one relay poll after the load
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        interrupt(proc)
    assert f'{N.LLAMACPP_REQUESTS_PROCESSING}{{{N.LABEL_REPLICA}="0"}}' in metrics
    reqs = [r for r in read_spans(tmp_path / "spans") if r.name == "POST /v1/completions"]
    assert len(reqs) == 4
    for r in reqs:
        assert r.attrs[N.ATTR_LLAMACPP_PREDICTED_N] >= 1 and r.attrs[N.ATTR_LLAMACPP_PROMPT_MS] > 0
        assert r.attrs["gen_ai.usage.input_tokens"] >= 40
        # the gateway's prefill holds llama.cpp's own prompt time (and the wait for a batch before it)
        assert r.stages[N.STAGE_PREFILL] >= r.attrs[N.ATTR_LLAMACPP_PROMPT_MS] - 1.0
        assert N.STAGE_DECODE in r.stages and N.ATTR_LLAMACPP_PROMPT_WAIT_MS in r.attrs


@pytest.mark.parametrize("name", ["llama-healthy", "llama-long-prompts", "llama-many-slots", "llama-slots-busy"])
def test_each_llama_scenario_is_diagnosed_as_its_truth(
    name: str, engine: tuple[Build, ModelArtifact], tmp_path: Path
) -> None:
    from stagescope.demo.runner import run_duration, run_scenario
    from stagescope.service.engines import get_engine
    from stagescope.service.llama_cpp.scenarios import get_scenario

    sc = get_scenario(name)
    sized, _ = get_engine("llama-cpp").sizing(sc)  # long prompts sized to the machine now, as the demo does
    # as the demo: a slot fault's run lasts long enough for its quantile (the sizing says how long)
    res = run_scenario(name, out=tmp_path / name, duration_s=run_duration(15.0, sized), engine="llama-cpp",
                       overrides=sized)  # fmt: skip
    report = res.report
    assert report["breached"] == sc.breach, report.get("headline")
    if sc.breach:
        v = report["verdict"]
        assert (v["stage"], v["lever"]) == (sc.true_stage, sc.lever), report["levers"]
        lever = next(x for x in report["levers"] if x["lever"] == sc.lever)
        pred = lever["predicted_p99_ms"]
        if sc.lever == N.LEVER_CHUNKED_PREFILL:
            # llama.cpp fills its steps slot by slot: the long prompts' own prefill (1 in 15 requests, the
            # p95) and the prompts in later slots keep their time, so the quantile may stay where it was
            assert "slot by slot" in lever["rationale"]
            assert pred is not None and pred <= report["quantile_ms"]
        else:
            assert pred is not None and pred < report["quantile_ms"]
        if sc.lever == N.LEVER_SCALE_OUT and "replayed" in lever["rationale"]:
            # the interval carries the slot times' drift within the run (replays at 1 -/+ drift)
            lo, hi = lever.get("interval_ms") or (None, None)
            assert (lo is None or lo <= pred) and (hi is None or pred <= hi)
