"""The LLM dashboard's vLLM panels find data whichever spelling a Prometheus stored vLLM's names in.

vLLM serves ``/metrics`` through prometheus_client (``make_asgi_app``), which picks the exposition
format from the scraper's Accept header; Prometheus asks for OpenMetrics first. prometheus_client
0.26's OpenMetrics writer keeps the colons in ``# TYPE vllm:...`` but writes the sample lines as
``vllm_time_to_first_token_seconds_bucket`` (prometheus/client_python#1177, open), so a Prometheus
scraping such a vLLM stores the underscore spelling, and a query for ``vllm:...`` finds nothing. The
text format keeps the colons.

Three STAND-IN vLLM ``/metrics`` endpoints (not vLLM: prometheus_client registries with vLLM's metric
names, types and ``model_name`` label from stagescope.names, moving every 20 ms), scraped every second
by Debian's Prometheus:

* ``negotiated``: the format prometheus_client itself chooses for Prometheus' Accept header
  (``choose_encoder``, what ``make_asgi_app`` does);
* ``text``: the text format (colons kept), as a scraper asking for text gets;
* ``escaped``: OpenMetrics with every sample name's colons written as underscores (#1177's output,
  whatever the installed prometheus_client does).

Every query of every vLLM panel, with ``$vllm_model`` set to each endpoint's model, must return a
finite value, and the model variable must list all three models.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import prometheus_client as pc
import pytest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as om
from prometheus_support import scraping_prometheus

from stagescope import names
from stagescope.dashboards.build import rendered
from stagescope.dashboards.queries import fill, panel_queries, text_values, variable_queries

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus not installed (apt-get install prometheus)"
)
MODES = ("negotiated", "text", "escaped")
HISTOGRAMS = (
    names.VLLM_TTFT, names.VLLM_ITL, names.VLLM_TPOT, names.VLLM_QUEUE_TIME, names.VLLM_PREFILL_TIME,
    names.VLLM_DECODE_TIME,
)  # fmt: skip
COUNTERS = (names.VLLM_PROMPT_TOKENS, names.VLLM_GENERATION_TOKENS)
GAUGES = (names.VLLM_NUM_RUNNING, names.VLLM_NUM_WAITING, names.VLLM_KV_CACHE_USAGE)


class StandInVllm:
    """One stand-in endpoint's registry (vLLM's names; SIMULATED values, not a vLLM)."""

    def __init__(self, model: str) -> None:
        self.registry = pc.CollectorRegistry()
        label = [names.VLLM_LABEL_MODEL]
        self.hists = [pc.Histogram(n, n, label, registry=self.registry).labels(model) for n in HISTOGRAMS]
        self.counters = [
            pc.Counter(n.removesuffix("_total"), n, label, registry=self.registry).labels(model) for n in COUNTERS
        ]
        self.gauges = [pc.Gauge(n, n, label, registry=self.registry).labels(model) for n in GAUGES]
        self.step = 0

    def move(self) -> None:
        self.step += 1
        for i, h in enumerate(self.hists):
            h.observe(0.01 * (1 + (self.step + i) % 7))
        for c in self.counters:
            c.inc(1 + self.step % 5)
        for i, g in enumerate(self.gauges):
            g.set((self.step + i) % 4 / 4)


def _escape_samples(text: bytes) -> bytes:
    """#1177's output: every sample line's metric name with its colons as underscores."""
    out = []
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            cut = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
            line = line[:cut].replace(":", "_") + line[cut:]
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def _handler(vllm: StandInVllm, mode: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if mode == "negotiated":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                body = encoder(vllm.registry)
            elif mode == "text":
                body, ctype = pc.generate_latest(vllm.registry), pc.CONTENT_TYPE_LATEST
            else:
                body, ctype = _escape_samples(om.generate_latest(vllm.registry)), om.CONTENT_TYPE_LATEST
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def endpoints() -> Iterator[dict[str, str]]:
    """mode -> host:port of a moving stand-in endpoint, its model named ``served-<mode>``."""
    stop = threading.Event()
    vllms = {m: StandInVllm(f"served-{m}") for m in MODES}
    servers = {m: ThreadingHTTPServer(("127.0.0.1", 0), _handler(vllms[m], m)) for m in MODES}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]

    def move() -> None:
        while not stop.wait(0.02):
            for v in vllms.values():
                v.move()

    threads.append(threading.Thread(target=move, daemon=True))
    for t in threads:
        t.start()
    try:
        yield {m: f"127.0.0.1:{s.server_address[1]}" for m, s in servers.items()}
    finally:
        stop.set()
        for s in servers.values():
            s.shutdown()
            s.server_close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_vllm_panels_read_both_spellings(tmp_path: Path, endpoints: dict[str, str]) -> None:
    dash = json.loads(rendered()["stagescope-llm.json"])
    vllm_queries = [q for q in panel_queries(dash) if q.panel.startswith("vLLM")]
    assert len(vllm_queries) >= 14, [q.panel for q in vllm_queries]
    (model_var,) = [v for v in variable_queries(dash) if v.name == "vllm_model"]
    with scraping_prometheus(tmp_path, {f"vllm-{m}": a for m, a in endpoints.items()}) as prom:
        deadline = time.monotonic() + 30
        while True:  # every target scraped at least 6 times (a 5 s rate has 2+ points in each)
            up = _get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': 'count_over_time(up[30s]) >= 6'})}")
            if len(up["data"]["result"]) == len(MODES):
                break
            assert time.monotonic() < deadline, up
            time.sleep(0.5)
        stored = set(_get(f"{prom}/api/v1/label/__name__/values")["data"])
        assert names.VLLM_TTFT + "_bucket" in stored  # the text endpoint's spelling
        assert names.VLLM_TTFT.replace(":", "_") + "_bucket" in stored  # the escaped endpoint's

        selector = model_var.query.removeprefix("label_values(").rsplit(",", 1)[0]
        series = _get(f"{prom}/api/v1/series?{urllib.parse.urlencode({'match[]': selector})}")["data"]
        assert {s[names.VLLM_LABEL_MODEL] for s in series} == {f"served-{m}" for m in MODES}, selector

        values = {"__rate_interval": "5s", "__interval": "1s", "__range": "1m", **text_values(dash)}
        empty = []
        for mode in MODES:
            for q in vllm_queries:
                expr = fill(q.expr, {**values, "vllm_model": f"served-{mode}"})
                answer = _get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
                finite = [s for s in answer["data"]["result"] if math.isfinite(float(s["value"][1]))]
                if not finite:
                    empty.append(f"{mode}: {q.panel} [{q.legend}]: {expr}")
        assert not empty, "\n".join(empty)
