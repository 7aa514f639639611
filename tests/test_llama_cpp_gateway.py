"""The llama.cpp gateway: FIFO slot admission, the stream passed through unchanged, and its spans.

The gateway runs as it does in the demo (``python -m stagescope.service.llama_cpp.serve``, uvicorn, the
embedded span sink), here in front of the test suite's OpenAI-compatible server
(``tests/apps/openai_server.py``), whose first token comes 60 ms after a request and whose gaps are
12/20/28 ms, so every stage the gateway records can be checked against known times. The same gateway
in front of a real llama-server is in ``tests/test_llama_cpp_engine.py`` (slow).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import free_port, interrupt, read_spans

from stagescope import names as N
from stagescope.service.llama_cpp.gateway import MODEL_ID, Replica, Router

APP = Path(__file__).parent / "apps" / "openai_server.py"
TTFT_MS, GAPS_MS = 60.0, (12.0, 20.0, 28.0)  # tests/apps/openai_server.py's delays


def test_router_admits_first_come_first_served_to_the_least_busy_replica() -> None:
    async def go() -> None:
        a, b = Replica(0, "http://a", 2), Replica(1, "http://b", 1)
        router = Router([a, b])
        got = [await router.acquire() for _ in range(3)]
        assert [r.index for r in got] == [0, 0, 1]  # most free slots first (2 > 1), ties to the lower index
        waiters = [asyncio.create_task(router.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        assert router.waiting == 3
        waiters[1].cancel()  # a client that went away gives up its place
        await asyncio.sleep(0)
        router.release(b)
        assert (await waiters[0]).index == 1 and router.waiting == 1
        router.release(a)
        assert (await waiters[2]).index == 0 and router.waiting == 0
        assert (a.busy, b.busy) == (2, 1)

    asyncio.run(go())


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(APP), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


def _gateway(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "stagescope.service.llama_cpp.serve", "--port", str(port),
           "--spans-out", str(tmp / "spans"), "--baseline-sample", "1", *args]  # fmt: skip
    log = (tmp / "gateway.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp / "gateway.log").read_text()
        time.sleep(0.05)


def _stage_intervals(spans_dir: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Trace id -> (stage, start ns, end ns) of every stage span in the sink's files."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    for path in spans_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        attrs = {a["key"]: a["value"].get("stringValue") for a in sp.get("attributes", [])}
                        if attrs.get(N.ATTR_STAGE):
                            out.setdefault(sp["traceId"], []).append(
                                (attrs[N.ATTR_STAGE], int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"]))
                            )
    return out


async def _stream(client: httpx.AsyncClient, url: str, i: int) -> list[str]:
    body = {"model": "tiny-test-model", "prompt": f"hello {i}", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers[N.HEADER_REPLICA] == "0"  # the one upstream: the sizing probe reads this
        return [ln for ln in [x async for x in r.aiter_lines()] if ln.startswith("data:")]


def test_gateway_queues_for_slots_and_records_stages(upstream: str, tmp_path: Path) -> None:
    proc, url = _gateway(tmp_path, "--upstream", upstream, "--slots", "2")
    try:

        async def go() -> list[list[str]]:
            async with httpx.AsyncClient(timeout=30) as c:
                await _stream(c, url, -1)  # warm the code paths first
                return list(await asyncio.gather(*(_stream(c, url, i) for i in range(4))))

        streams = asyncio.run(go())
        metrics = httpx.get(url + "/metrics").text
    finally:
        interrupt(proc)
    for events in streams:
        texts = [json.loads(e[5:])["choices"][0]["text"] for e in events[:-1] if json.loads(e[5:])["choices"]]
        assert len(texts) == 5 and events[-1] == "data: [DONE]"  # every token passed through, then [DONE]
        assert json.loads(events[-2][5:])["usage"]["completion_tokens"] == 5
    reqs = [r for r in read_spans(tmp_path / "spans") if r.name == "POST /v1/completions"]
    assert len(reqs) == 5
    decode_ms = sum(GAPS_MS[k % 3] for k in range(1, 5))
    for r in reqs:
        # the upstream's own delays bound the stages from below (a token cannot reach the gateway before
        # the upstream sent it); a stall of the gateway on a busy machine only bunches tokens later
        served = r.stages[N.STAGE_PREFILL] + r.stages[N.STAGE_DECODE]
        assert r.stages[N.STAGE_PREFILL] >= TTFT_MS - 2 and TTFT_MS + decode_ms - 2 <= served < 1000, r.stages
        ttft_ms = r.attrs[N.VLLM_ATTR_TTFT] * 1e3
        # TTFT runs from the request's arrival; the queue starts once its body is read and parsed
        assert -1 < ttft_ms - r.stages[N.STAGE_QUEUE] - r.stages[N.STAGE_PREFILL] < 30
        assert r.attrs[N.ATTR_MODEL] == MODEL_ID and r.attrs[N.ATTR_REPLICA] == 0
        assert len(r.attrs[N.ATTR_TOKEN_GAPS]) == 4
        assert len(r.attrs[N.ATTR_TOKEN_RUNNING]) == 4 and all(1 <= k <= 2 for k in r.attrs[N.ATTR_TOKEN_RUNNING])
    # two slots: never more than two requests past the queue at once, and with four sent together
    # at least one waited for a slot about as long as a stream holds one
    spans = _stage_intervals(tmp_path / "spans")
    held = [(min(a for st, a, _ in v if st != N.STAGE_QUEUE), max(e for _, _, e in v)) for v in spans.values()]
    edges = sorted([(a, 1) for a, _ in held] + [(e, -1) for _, e in held], key=lambda x: (x[0], x[1]))
    conc = peak = 0
    for _, d in edges:
        conc += d
        peak = max(peak, conc)
    assert peak == 2, held
    assert max(r.stages[N.STAGE_QUEUE] for r in reqs) > TTFT_MS, [r.stages for r in reqs]
    assert N.METRIC_QUEUE_DEPTH in metrics
    # the analysis reads each gap's running batch beside the gap
    from stagescope.analysis.api import connection
    from stagescope.analysis.ingest import load_dataset

    con = connection(load_dataset(traces=[tmp_path / "spans"]))
    row = con.execute("SELECT count(*), count(running), min(running), max(running) FROM token_gaps").fetchone()
    assert row == (20, 20, 1, 2), row


def test_gateway_bad_input_is_one_line(tmp_path: Path, upstream: str) -> None:
    for args, msg in (
        ([], "give --scenario"),
        (["--upstream", upstream], "--slots"),
        (["--upstream", "ftp://x", "--slots", "2"], "http(s) URL"),
        (["--scenario", "no-such"], "unknown llama.cpp scenario"),
        (["--scenario", "llama-healthy", "--apply-lever"], "no lever"),
        (["--scenario", "llama-many-slots", "--set", "parallel=0"], "positive integer"),
        (["--scenario", "llama-many-slots", "--set", "gpu_layers=3"], "unknown llama.cpp setting"),
    ):
        proc = subprocess.run([sys.executable, "-m", "stagescope.service.llama_cpp.serve", *args, "--port", "0"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0] and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_gateway_survives_a_dead_replica(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = None, None
    port = free_port()
    cmd = [sys.executable, "-m", "stagescope.service.llama_cpp.serve", "--port", str(port), "--upstream", dead,
           "--slots", "1", "--spans-out", str(tmp_path / "spans")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status = httpx.get(url + "/readyz", timeout=1).status_code
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert status == 503  # not ready while its replica is not
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "stream": True}, timeout=10)
        assert r.status_code == 502 and "unreachable" in r.text
        assert httpx.post(url + "/v1/completions", content=b"{nope", timeout=10).status_code == 400
        # the slot was given back: a second request is answered too, not queued forever
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=10).status_code == 502
    finally:
        interrupt(proc)
