"""``stagescope load`` against any HTTP service and OpenAI-compatible streaming servers.

End to end: ``tests/apps/openai_server.py`` (uvicorn, written from the OpenAI API reference, a known
token schedule: TTFT 60 ms, gaps 12/20/28 ms, comments and events split over writes, a role-only first
chat chunk) is driven by the ``stagescope load`` command; each request's TTFT and inter-token gaps are
compared with the times the server handed each chunk over. Also: the SSE reader fed byte by byte,
the body template, how a URL becomes a route, and bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from stagescope.errors import UserError
from stagescope.loadgen.api import resolve_target
from stagescope.loadgen.bodies import synthetic_prompt
from stagescope.loadgen.display import rate_line
from stagescope.loadgen.results import RequestResult, summarize
from stagescope.loadgen.schedule import Schedule, synthetic_schedule
from stagescope.loadgen.streams import LineStream, OpenAIStream
from stagescope.loadgen.template import BodyTemplate

APP = Path(__file__).parent / "apps" / "openai_server.py"
TOLERANCE_MS = 5.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(APP), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1).read()
                break
            except OSError:
                import time

                time.sleep(0.05)
        # one request first: a fresh server's first POST runs cold code paths before its handler (and
        # so before the arrival it records), which the client rightly sees and the server's figure lacks
        for path in ("/v1/chat/completions", "/v1/completions"):
            body = {"model": "tiny-test-model", "max_tokens": 1, "stream": True, "prompt": "x",
                    "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
            req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _records(url: str) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(url + "/_records", timeout=5).read())


def _load(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stagescope.cli", "load", "--no-progress", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)  # fmt: skip


# ------------------------------------------------------------------------------ the SSE reader
VLLM_CHAT = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":""},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}],"usage":null}\n\n'
    b": keep-alive\n\n"
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\r\n\r\n'
    b'data:{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n'
    b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}\n\n'
    b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}\n\n'
    b"data: [DONE]\n\n"
)


def _feed(reader_cls: type, body: bytes, step: int) -> RequestResult:
    r = RequestResult(0, "0" * 32, "/x", 0)
    reader = reader_cls(r)
    for i in range(0, len(body), step):
        reader.feed(body[i : i + step], i)  # the "time" of a piece is its offset
    reader.close(len(body))
    return r


@pytest.mark.parametrize("step", [1, 2, 7, 64, 10_000])
def test_openai_stream_counts_chunks_with_output_whatever_the_split(step: int) -> None:
    r = _feed(OpenAIStream, VLLM_CHAT, step)
    assert r.token_ns is not None and len(r.token_ns) == 4  # content x2, reasoning, tool call
    assert r.usage_output_tokens == 9 and r.error is None
    ends = [VLLM_CHAT.index(m) for m in (b'"Hel"', b'"lo"', b'"hm"', b'"tool_calls"')]
    for t, at in zip(r.token_ns, ends, strict=True):
        end_of_event = VLLM_CHAT.index(b"\n\n", at) if b"\r\n\r\n" not in VLLM_CHAT[at : at + 80] else (
            VLLM_CHAT.index(b"\r\n\r\n", at) + 2)  # fmt: skip
        # stamped with the piece that completed the event (the blank line), not earlier, not later
        assert end_of_event + 1 - step < t + step and t <= end_of_event + 1


def test_openai_stream_completions_and_failures() -> None:
    body = (b'data: {"choices":[{"text":"a","index":0}]}\n\ndata: {"choices":[{"text":"","index":0,'
            b'"finish_reason":"stop"}]}\n\ndata: {"choices":[{"text":"b"},{"text":"c"}]}\n\ndata: [DONE]\n\n')  # fmt: skip
    r = _feed(OpenAIStream, body, 3)
    assert r.token_ns is not None and len(r.token_ns) == 2 and r.usage_output_tokens is None
    err = _feed(OpenAIStream, b'data: {"choices":[{"text":"a"}]}\n\ndata: {"error": {"message": "secret '
                b'prompt text", "type": "InternalServerError", "code": 500}}\n\ndata: [DONE]\n\n', 5)  # fmt: skip
    assert err.error == "stream error: InternalServerError" and "secret" not in err.error
    assert _feed(OpenAIStream, b"data: {not json\n\n", 4).error == "stream: an event that is not JSON"
    # a last event without its blank line still counts (the body ended)
    tail = _feed(OpenAIStream, b'data: {"choices":[{"text":"a"}]}', 100)
    assert tail.token_ns is not None and len(tail.token_ns) == 1


def test_line_stream_is_one_token_per_data_line() -> None:
    r = _feed(LineStream, b'data: {"token": "a"}\n\n: c\nevent: x\ndata: {"token": "b"}\n\ndata: [DONE]\n\n', 3)
    assert r.token_ns is not None and len(r.token_ns) == 2


# ------------------------------------------------------------------------------ templates and routes
def test_body_template_types_text_keys_and_typos(tmp_path: Path) -> None:
    t = BodyTemplate({"max_tokens": "{{output_tokens}}", "q": "Summarize: {{ prompt }}", "id": "u-{{index}}",
                      "{{input_index}}": [1, 2.5, True, None, "{{model}}"], "lit": "{x} {{y"})  # fmt: skip
    out = json.loads(t.render({"output_tokens": 7, "prompt": 'a "b"\n', "index": 3, "input_index": 2,
                               "model": "m"}))  # fmt: skip
    assert out == {"max_tokens": 7, "q": 'Summarize: a "b"\n', "id": "u-3", "2": [1, 2.5, True, None, "m"],
                   "lit": "{x} {{y"}  # fmt: skip
    assert t.names == {"output_tokens", "prompt", "index", "input_index", "model"}
    with pytest.raises(UserError, match=r"unknown placeholder \{\{promt\}\}"):
        BodyTemplate({"q": "{{promt}}"})
    bad = tmp_path / "b.json"
    bad.write_text('{"a": 1,\n "b": }')
    with pytest.raises(UserError, match=r"b.json: not JSON \(line 2"):
        BodyTemplate.from_file(bad)


SCHED = Schedule(np.array([0.0]))
LLM_SCHED = Schedule(np.array([0.0]), prompt_tokens=np.array([5]), output_tokens=np.array([3]))


@pytest.mark.parametrize(
    ("url", "route", "api", "sched", "want"),
    [
        ("http://h:8000/v1/generate", None, None, SCHED, ("http://h:8000", "/v1/generate", "/v1/generate", None)),
        ("http://h:8000", None, None, LLM_SCHED, ("http://h:8000", "/v1/generate", "/v1/generate", None)),
        ("http://h:8000/", None, None, SCHED, ("http://h:8000", "/v1/predict", "/v1/predict", None)),
        ("http://h:8000/api/score?v=2", None, None, SCHED, ("http://h:8000", "/api/score?v=2", "/api/score", None)),
        ("http://h:8000/v1/generate", "/v1/predict", None, SCHED, ("http://h:8000", "/v1/predict", "/v1/predict", None)),
        ("http://h", None, "openai-chat", SCHED, ("http://h:80", "/v1/chat/completions", "/v1/chat/completions", "openai-chat")),
        ("https://h/v1", None, "openai-completions", SCHED, ("https://h:443", "/v1/completions", "/v1/completions", "openai-completions")),
        ("http://h:1/openai/v1/", None, "openai-chat", SCHED, ("http://h:1", "/openai/v1/chat/completions", "/openai/v1/chat/completions", "openai-chat")),
        ("http://h:1/v1/chat/completions", None, None, SCHED, ("http://h:1", "/v1/chat/completions", "/v1/chat/completions", "openai-chat")),
        ("http://h:1", "/v1/completions", None, SCHED, ("http://h:1", "/v1/completions", "/v1/completions", "openai-completions")),
    ],
)  # fmt: skip
def test_a_full_urls_path_is_the_route(url: str, route: str | None, api: str | None, sched: Schedule,
                                       want: tuple[str, str, str, str | None]) -> None:  # fmt: skip
    t = resolve_target(url, route, api, sched)
    assert (t.origin, t.path, t.route, t.api) == want


def test_mismatched_api_and_path_is_refused() -> None:
    with pytest.raises(UserError, match="is the openai-completions endpoint"):
        resolve_target("http://h/v1/completions", None, "openai-chat", SCHED)


def test_summary_names_sent_of_scheduled_and_the_schedules_own_rate() -> None:
    sched = synthetic_schedule(20.0, 20.0, "poisson", seed=3)
    results = []
    for i, off in enumerate(sched.offsets_s):
        t = int(off * 1e9)
        results.append(RequestResult(i, "0" * 32, "/v1/x", t, sent_ns=t, end_ns=t + 5_000_000, status=200))
    s = summarize(results, url="http://h:1", route="/v1/x", source=sched.source, target_rate_rps=20.0,
                  schedule_rate_rps=sched.rate_rps, duration_s=sched.duration_s, scheduled=len(sched))  # fmt: skip
    line = rate_line(s)
    n = len(sched)
    assert n != 400  # the draw is not exactly the target
    assert f"sent {n:,} of {n:,} scheduled" in line
    assert f"schedule's own mean rate {n / 20.0:,.1f} req/s (target 20.0)" in line
    assert "achieved" not in line and "sent at" not in line  # everything scheduled went out


# ------------------------------------------------------------------------------ end to end
def _gaps(ts: list[int]) -> np.ndarray:
    return np.diff(np.asarray(ts, dtype=np.int64)) / 1e6


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions"])
def test_load_drives_an_openai_streaming_server_within_5ms_of_its_own_timings(
    server: str, api: str, tmp_path: Path
) -> None:
    out = tmp_path / "results.parquet"
    spans = tmp_path / "spans"
    url = f"{server}/v1" if api == "openai-chat" else f"{server}/v1/completions"  # base URL, or the endpoint
    args = ["--url", url, "--rate", "6", "--duration", "3", "--arrival", "constant", "--output-tokens", "12",
            "--prompt-tokens", "40", "--out", str(out), "--spans-dir", str(spans), "--json"]  # fmt: skip
    if api == "openai-chat":
        args += ["--api", api]  # the completions run infers the API from the URL's path and names the model
    else:
        args += ["--model", "tiny-test-model"]
    proc = _load(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["api"] == api and summary["model"] == "tiny-test-model"
    assert summary["sent"] == summary["scheduled"] == summary["ok"] == 18
    rows = pq.read_table(out).to_pylist()
    recs = _records(server)
    client: dict[str, list[float]] = {"ttft": [], "itl_mean": [], "itl_p99": []}
    srv: dict[str, list[float]] = {"ttft": [], "itl_mean": [], "itl_p99": []}
    for row in rows:
        rec = recs[row["trace_id"]]
        assert row["status"] == 200 and row["error"] is None
        assert row["n_tokens"] == 12 == len(rec["token_ns"])  # the server's usage count
        assert row["input_hash"] == rec["body_hash"]  # the hash of exactly the bytes the server got
        sg = _gaps(rec["token_ns"])
        srv["ttft"].append((rec["token_ns"][0] - rec["arrival_ns"]) / 1e6)
        srv["itl_mean"].append(float(sg.mean()))
        srv["itl_p99"].append(float(np.percentile(sg, 99)))
        client["ttft"].append(row["ttft_naive_ms"])  # from the actual send, as the server's is from arrival
        client["itl_mean"].append(row["itl_mean_ms"])
        client["itl_p99"].append(row["itl_p99_ms"])
    assert min(srv["ttft"]) >= 60.0  # the server's schedule; the role-only chat chunk came at once
    diff = {k: np.asarray(client[k]) - np.asarray(srv[k]) for k in client}
    figures = {  # what the summary reports, from the client, beside the same figure from the server
        "TTFT p50": (summary["ttft_naive_ms"]["p50"], np.percentile(srv["ttft"], 50)),
        "TTFT p90": (summary["ttft_naive_ms"]["p90"], np.percentile(srv["ttft"], 90)),
        "ITL p99 per stream, p50": (summary["itl_p99_ms"]["p50"], np.percentile(srv["itl_p99"], 50)),
        "mean gap": (float(np.mean(client["itl_mean"])), float(np.mean(srv["itl_mean"]))),
    }
    print(f"{api}: " + "; ".join(f"{k} {c:.2f} vs server {s:.2f} ms" for k, (c, s) in figures.items())
          + f"; per request TTFT diff median {np.median(diff['ttft']):.2f} max {diff['ttft'].max():.2f} ms")  # fmt: skip
    for name, (c, s) in figures.items():
        assert abs(c - s) <= TOLERANCE_MS, f"{name}: client {c:.2f} ms, server {s:.2f} ms"
    # per request: the client's TTFT counts the network and both event loops, never less than the
    # server's; a mean over 11 gaps is within 5 ms for every request; single figures (TTFT, the p99
    # gap) for nearly all, as one process descheduled for a few ms on this shared machine shows in one
    assert diff["ttft"].min() > -1.0
    assert np.abs(diff["itl_mean"]).max() <= TOLERANCE_MS, sorted(np.round(diff["itl_mean"], 2))
    for k in ("ttft", "itl_p99"):
        within = float(np.mean(np.abs(diff[k]) <= TOLERANCE_MS))
        assert within >= 0.85 and abs(float(np.median(diff[k]))) <= 2.0, (k, sorted(np.round(diff[k], 2)))
    # content is never recorded: neither the prompt sent nor the completion received
    prompt = synthetic_prompt(40, unique_key=0)[:60].encode()
    for f in [out, *spans.rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert prompt not in data and b"w0 w1" not in data and b"w3 " not in data, f


def test_any_http_service_with_a_body_template_and_the_text_summary(server: str, tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"entity_id": "{{input_index}}", "query": "about {{prompt}}", "k": "{{output_tokens}}",
                                "n": "{{prompt_tokens}}", "tag": "r{{index}}"}))  # fmt: skip
    out = tmp_path / "r.parquet"
    proc = _load("--url", f"{server}/v1/score?v=2", "--body", str(body), "--rate", "20", "--duration", "2",
                 "--prompt-tokens", "9", "--output-tokens", "4", "--repeat-share", "0.5", "--header", "X-Team: ranking",
                 "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pq.read_table(out).to_pylist()
    n = len(rows)
    text = " ".join(proc.stdout.split())
    assert f"sent {n} of {n} scheduled" in text and "schedule's own mean rate" in text
    recs = _records(server)
    repeats = 0
    for row in rows:
        rec = recs[row["trace_id"]]
        assert rec["path"] == "/v1/score" and rec["query"] == "v=2" and rec["headers"]["x-team"] == "ranking"
        b = rec["body"]
        assert b["k"] == 4 and b["n"] == 9 and b["tag"] == f"r{row['request_id']}"
        assert isinstance(b["entity_id"], int) and b["entity_id"] <= row["request_id"]
        assert b["query"] == "about " + synthetic_prompt(9, unique_key=b["entity_id"])
        assert row["route"] == "/v1/score" and row["input_hash"] == rec["body_hash"] and row["status"] == 200
        repeats += b["entity_id"] != row["request_id"]
    assert 0 < repeats < n  # --repeat-share sent some requests with an earlier input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--body", "missing.json"], "missing.json: cannot read the body template"),
        (["--body", "bad.json"], "bad.json: not JSON (line 1"),
        (["--body", "typo.json"], "unknown placeholder {{promt}}"),
        (["--header", "no colon"], "--header must be 'NAME: VALUE'"),
        (["--api", "openai-chat", "--route", "/v1/completions"], "--route /v1/completions is the openai-completions"),
        (["--output-tokens", "0"], "argument --output-tokens: expected a whole number in [1, 10000000], got '0'"),
    ],
)
def test_bad_load_options_are_one_line(server: str, tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "typo.json").write_text('{"q": "{{promt}}"}')
    proc = _load("--url", f"{server}/v1/score", "--rate", "5", "--duration", "1", "--out", "r.parquet", *args,
                 cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r.parquet").exists()
