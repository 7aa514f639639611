"""The reference service over real HTTP (uvicorn subprocesses): readiness and cold starts, bad requests,
overload and recovery, streamed tokens matching what the client sees, no text in telemetry, the CLI."""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_support import drive, free_port, quantile, read_spans, serve

from stagescope import names as N
from stagescope.service.scenarios import PREDICT_ROUTE, Workload

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stagescope.cli", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_cli_bad_input_is_one_line_exit_2() -> None:
    r = _cli("serve", "--scenario", "no-such-scenario")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "unknown scenario 'no-such-scenario'" in r.stderr
    assert "slow-feature-store" in r.stderr and "Traceback" not in r.stderr
    r = _cli("serve", "--set", "no_such_knob=3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no_such_knob" in r.stderr
    r = _cli("serve", "--set", "max_batch_size=many")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "max_batch_size" in r.stderr
    r = _cli("serve", "--scenario", "healthy", "--apply-lever")
    assert r.returncode == 2 and "no lever" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = _cli("serve", "--port", str(port))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    r = _cli("serve", "--list-scenarios")
    assert r.returncode == 0 and "llm-decode-heavy" in r.stdout


async def _stream(url: str, prompt: str, max_tokens: int, trace_id: str) -> tuple[int, float, list[float], str]:
    """One streamed generation over a connection opened beforehand (a GET /healthz on the same
    session), so that ``sent`` is when the request left and not when a TCP connection started: the
    server's TTFT is timed from the request's arrival, which a fresh connection's setup precedes."""
    headers = {"traceparent": f"00-{trace_id}-{random.getrandbits(64):016x}-01"}
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url.rsplit("/v1/", 1)[0] + "/healthz") as warm:
            await warm.read()
        sent = time.perf_counter()
        async with session.post(url, json={"prompt": prompt, "max_tokens": max_tokens}, headers=headers) as r:
            times, words = [], []
            async for line in r.content:
                if line.startswith(b"data: {"):
                    times.append(time.perf_counter())
                    words.append(line.split(b'"token":"')[1].split(b'"')[0].decode())
            return r.status, sent, times, " ".join(words)


def test_readiness_cold_start_bad_requests_streams_and_no_text(tmp_path: Path) -> None:
    secret = "zebracorn-7f3a-never-record-me"
    with serve(tmp_path, "--set", "model_load_s=1.5", "--set", "max_body_bytes=20000", "--log-level", "info",
               wait_ready=False) as s:  # fmt: skip
        ready0 = _status(s.url + "/readyz")

        async def during_load() -> tuple[int, int]:
            async with aiohttp.ClientSession() as session:
                headers = {"traceparent": f"00-{'c' * 32}-{'1' * 16}-01"}
                async with session.post(s.url + PREDICT_ROUTE, json={"inputs": [1.0, 2.0]}, headers=headers) as r:
                    await r.read()
                    return r.status, _status(s.url + "/readyz")

        status, ready1 = asyncio.run(during_load())
        assert (ready0, status, ready1) == (503, 200, 200)
        assert _status(s.url + "/healthz") == 200

        bad = [
            (b"{not json", 400), (b"", 400), (b"[1, 2]", 422), (b'{"inputs": "abc"}', 422),
            (b'{"inputs": [1, "x"]}', 422), (b'{"entity_id": -3}', 422), (b"x" * 30000, 413),
        ]  # fmt: skip
        for body, want in bad:
            assert _post(s.url + PREDICT_ROUTE, body) == want, body[:30]
        gen_bad = [(b'{"prompt": 5}', 422), (b'{"max_tokens": 3}', 422), (b'{"prompt": "hi", "max_tokens": "ten"}', 422),
                   (b'{"prompt": "hi", "max_tokens": 100000}', 422), (b'{"prompt": ""}', 422)]  # fmt: skip
        for body, want in gen_bad:
            assert _post(s.url + "/v1/generate", body) == want, body

        # streamed tokens: the server's TTFT and gaps against what this client sees (checked below)
        seen = []
        for k in range(5):
            tid = f"{k + 1:032x}"
            out = asyncio.run(_stream(s.url + "/v1/generate", f"{secret} tell me a story {k}", 16, tid))
            seen.append((tid, *out))
        metrics_text = _text(s.url + "/metrics")
    spans = {r.trace_id: r for r in read_spans(s.spans_dir)}
    cold = spans["c" * 32]
    assert cold.attrs[N.ATTR_COLD_START] is True and cold.stages.get(N.STAGE_COLD_START, 0) > 100
    assert all(r.status < 500 for r in spans.values() if "readyz" not in r.name), [(r.name, r.status, r.attrs.get("error.type")) for r in spans.values() if r.status >= 500]
    # Each server TTFT lies inside its client's (the request arrives after it leaves, the first token
    # is written before it is read), and the closest of the five is within 5 ms of it: a loaded machine
    # delays some of the client's reads, a server timing TTFT from a later point (after its queue or
    # prefill) would shift all five. Likewise the token gaps, by their median per stream.
    ttft_lag, gap_err = [], []
    for tid, status, sent, times, _text_out in seen:
        assert status == 200 and len(times) == 16
        srv = spans[tid]
        client_ttft = times[0] - sent
        server_ttft = float(srv.attrs[N.VLLM_ATTR_TTFT])
        assert 0 < server_ttft <= client_ttft, (tid, client_ttft, server_ttft)
        ttft_lag.append(client_ttft - server_ttft)
        client_gaps = [b - a for a, b in itertools.pairwise(times)]
        server_gaps = srv.attrs[N.ATTR_TOKEN_GAPS]
        assert len(server_gaps) == len(client_gaps) == 15
        gap_err.append(statistics.median(abs(a - b) for a, b in zip(client_gaps, server_gaps, strict=True)))
        assert srv.attrs[N.GENAI_USAGE_OUTPUT_TOKENS] == 16 and srv.attrs[N.GENAI_USAGE_INPUT_TOKENS] == 6
        assert {N.STAGE_PREFILL, N.STAGE_DECODE} <= set(srv.stages)
    assert min(ttft_lag) < 0.005 and max(gap_err) < 0.005, (ttft_lag, gap_err)
    # no prompt or completion text in spans, metrics or logs
    telemetry = "".join(p.read_text() for p in s.spans_dir.glob("*.jsonl")) + metrics_text + s.log()
    assert secret not in telemetry
    for *_, completion in seen:
        assert completion.count(" ") == 15 and completion not in telemetry
    assert f'modelName="{N.SIMULATED_ACCELERATOR_MODEL_NAME}"' in metrics_text
    assert N.DCGM_GPU_UTIL in metrics_text


def test_overload_sheds_with_retry_after_and_recovers(tmp_path: Path) -> None:
    with serve(tmp_path, "--scenario", "saturated", "--set", "max_queue=8") as s:
        burst = asyncio.run(drive(s.url, PREDICT_ROUTE, 150.0, 2.0, Workload(), seed=3))
        # the backlog (at most 8 x 25 ms of compute) drains before the calm phase starts: waited for by
        # the service's own gauges (a scrape counts as no request in flight), not a sleep a loaded
        # machine can outlast
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            page = _text(s.url + "/metrics")
            if _gauge(page, N.METRIC_QUEUE_DEPTH) == 0 and _gauge(page, N.METRIC_INFLIGHT) == 0:
                break
            time.sleep(0.1)
        calm = asyncio.run(drive(s.url, PREDICT_ROUTE, 10.0, 2.0, Workload(), seed=4))
        metrics_text = _text(s.url + "/metrics")
    shed = [r for r in burst if r.status == 429]
    assert shed and all(r.retry_after and int(r.retry_after) >= 1 for r in shed)
    assert {r.status for r in burst} <= {200, 429}
    assert all(r.status == 200 for r in calm)
    assert quantile([r.latency_ms for r in calm], 0.99) < 300
    line = next(x for x in metrics_text.splitlines() if x.startswith(N.METRIC_REQUESTS_SHED) and "/v1/predict" in x)
    assert float(line.rsplit(" ", 1)[1]) == len(shed)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_real_redis_feature_store(tmp_path: Path) -> None:
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as c:
                if c.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        url = f"redis://127.0.0.1:{port}/0"
        with serve(tmp_path, "--feature-store", url, "--set", "feature_latency_ms=0", "--set", "num_entities=50") as s:
            res = asyncio.run(drive(s.url, PREDICT_ROUTE, 20.0, 1.0, Workload(), seed=5))
        assert res and all(r.status == 200 for r in res)
        out = subprocess.run(["redis-cli", "-p", str(port), "exists", "stagescope:features:49"],
                             capture_output=True, text=True)  # fmt: skip
        assert out.stdout.strip() in ("1", "")  # redis-cli may be absent; the service seeded the table
        reqs = read_spans(s.spans_dir)
        assert all(N.STAGE_FEATURE_FETCH in r.stages for r in reqs if r.name.endswith(PREDICT_ROUTE))
    finally:
        redis.terminate()
        redis.wait(10)
    r = _cli("serve", "--feature-store", "ftp://nowhere")
    assert r.returncode == 2 and "bad --feature-store" in r.stderr


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _gauge(metrics_text: str, name: str) -> float:
    """The sum of a gauge's samples (every label set) in a /metrics page."""
    return sum(s.value for fam in text_string_to_metric_families(metrics_text) if fam.name == name for s in fam.samples)


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def _post(url: str, body: bytes) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
