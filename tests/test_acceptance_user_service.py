"""Issue 14's acceptance: a team's own FastAPI service (tests/apps/score_app.py) with stagescope's
DEFAULT sampling, a slow feature fetch on one route and a streaming second route, driven by
``stagescope load``; ``stagescope analyze`` with and without the load generator's results gives the
first route's p50 and p99 within 10 % of the load generator's, the share over the threshold within
25 % of it, and names the slow stage and its lever; without a route in the SLO the routes are
reported apart.

Everything is real: uvicorn serving the app, the embedded span sink, ``/metrics`` scraped every
2 s into exposition files (as a Prometheus would, stamped with the scrape time), two ``stagescope
load`` processes (one per route) at the same time, and the ``stagescope analyze`` command. About
80 s on the shared 2-core machine. ``STAGESCOPE_ACCEPTANCE_FIGURES=FILE`` writes the figures beside
the truth as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from service_support import free_port, interrupt

from stagescope import names
from stagescope.demo.recorder import stamp_exposition

APPS = Path(__file__).parent / "apps"
RATE_SCORE = 50.0  # /v1/score requests per second
RATE_GENERATE = 4.0
DURATION_S = 50.0
THRESHOLD_MS = 300.0
SLO_FILE = f"""slos:
  - name: score-p99
    service: scorer
    sli: e2e
    route: /v1/score
    threshold_ms: {THRESHOLD_MS:g}
    objective: 0.99
"""


def _env(spans: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STAGESCOPE_"))}
    env.update({names.ENV_SPANS_DIR: str(spans), "PYTHONUNBUFFERED": "1"})
    return env  # stagescope's defaults: no sampling override anywhere


class Scraper:
    """Scrape ``/metrics`` every ``interval_s`` into stamped exposition files, as a Prometheus would."""

    def __init__(self, url: str, out: Path, interval_s: float = 2.0) -> None:
        self.url, self.out, self.interval_s = url, out, interval_s
        self.n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        out.mkdir(parents=True)

    def scrape(self) -> None:
        ts = int(time.time() * 1000)
        text = httpx.get(self.url, timeout=5).text
        self.n += 1
        (self.out / f"scrape-{self.n:04d}.prom").write_text(stamp_exposition(text, ts))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(httpx.HTTPError):  # a missed scrape is only a missed point
                self.scrape()

    def __enter__(self) -> Scraper:
        self.scrape()  # before any request
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.scrape()  # after the last request


def _load(url: str, route: str, rate: float, out: Path, spans: Path, seed: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "stagescope.cli", "load", "--url", url + route,
           "--rate", str(rate), "--arrival", "poisson", "--duration", str(DURATION_S), "--seed", str(seed),
           "--out", str(out), "--spans-dir", str(spans), "--json", "--no-progress"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(spans))


def _analyze(tmp: Path, tag: str, *args: str, slo: str | None = None) -> dict[str, Any]:
    out = tmp / f"report-{tag}.json"
    res = subprocess.run(
        [sys.executable, "-m", "stagescope.cli", "analyze", *args, "--slo", slo or str(tmp / "slo.yaml"),
         "--format", "json", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=_env(tmp / "unused"),
    )  # fmt: skip
    assert res.returncode in (0, 3), res.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def _truth(results: Path) -> dict[str, float]:
    t = pq.read_table(results, columns=["status", "latency_ms"]).to_pylist()
    ok = [r["latency_ms"] for r in t if r["status"] == 200 and r["latency_ms"] is not None]
    return {"requests": len(ok), "over_threshold_share": sum(v > THRESHOLD_MS for v in ok) / len(ok)}


def _skip_if_the_client_saw_what_the_server_did_not(tmp: Path, spans: Path, truth: dict[str, float]) -> None:
    """The SLO is server-side (arrival to last byte); the load generator's latency also holds what
    happens outside the server's measurement: the network, the server's accept queue, the client's
    own event loop. On a quiet machine that is a millisecond. On an overloaded one (this 2-core machine
    shared with other work) requests the server answered in under 250 ms (so their traces were not
    kept: every slower one is) took over the threshold for the client, and enough of them move the
    client's p99 away from any server-side figure. Then the load generator's figures are not the
    server-side truth this test compares with: skipped, saying so. Spans lost would look the same,
    so none may have been dropped."""
    from stagescope.analysis.ingest import load_dataset

    last = sorted((tmp / "metrics").glob("*.prom"))[-1].read_text()
    dropped = [
        ln for ln in last.splitlines() if ln.startswith(names.METRIC_SPANS_DROPPED) and " 0.0 " not in ln
    ]
    assert not dropped, dropped
    ds = load_dataset(traces=[spans])
    row = ds.con.execute(
        f"""SELECT count(*) FROM read_parquet('{tmp / "score.parquet"}') WHERE status = 200
            AND naive_latency_ms > {THRESHOLD_MS} AND trace_id NOT IN (SELECT trace_id FROM requests)"""
    ).fetchall()
    ds.close()
    unseen = int(row[0][0])
    if unseen > 0.005 * truth["requests"]:
        pytest.skip(
            f"{unseen} of {truth['requests']} requests the server answered in under 250 ms took over "
            f"{THRESHOLD_MS:g} ms for the client (machine overloaded: the client's p99 {truth['p99']:.0f} ms is "
            "not a server-side figure)"
        )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_user_service_with_default_sampling(tmp_path: Path) -> None:
    spans = tmp_path / "traces"
    (tmp_path / "slo.yaml").write_text(SLO_FILE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "uvicorn.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(APPS), "--host", "127.0.0.1", "--port", str(port),
         "--no-access-log", "score_app:app"],
        stdout=log, stderr=subprocess.STDOUT, env=_env(spans),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the app did not start"
            time.sleep(0.1)
        with Scraper(f"{url}/metrics", tmp_path / "metrics"):
            score = _load(url, "/v1/score", RATE_SCORE, tmp_path / "score.parquet", spans, seed=1)
            gen = _load(url, "/v1/generate", RATE_GENERATE, tmp_path / "generate.parquet", spans, seed=2)
            outs = [p.communicate(timeout=DURATION_S + 120) for p in (score, gen)]
            for p, (_, err) in zip((score, gen), outs, strict=True):
                assert p.returncode == 0, err.decode()[-2000:]
            time.sleep(0.5)
    finally:
        interrupt(server)  # SIGINT: the sink writes what it holds
        log.close()
    summary = json.loads(outs[0][0].decode())
    client = summary["latency_ms"]  # the load generator's own figures (corrected, client side)
    truth = {"p50": client["p50"], "p99": client["p99"], **_truth(tmp_path / "score.parquet")}

    both = [str(tmp_path / "score.parquet"), str(tmp_path / "generate.parquet")]
    reports = {
        "traces+metrics+results": _analyze(tmp_path, "results", "--traces", str(spans), "--metrics",
                                           str(tmp_path / "metrics"), "--results", *both),
        "traces+metrics": _analyze(tmp_path, "metrics", "--traces", str(spans), "--metrics",
                                   str(tmp_path / "metrics")),
        "traces": _analyze(tmp_path, "traces", "--traces", str(spans)),
    }  # fmt: skip
    figures: dict[str, Any] = {"truth (load generator)": truth}
    for tag, rep in reports.items():
        figures[tag] = {
            "p50": rep["latency_ms"]["p50"], "p99": rep["latency_ms"]["p99"], "requests": rep["requests"],
            "samples": rep["samples"], "over_threshold_share": rep["over_threshold_share"],
            "source": rep["sources"]["latency_ms"], "verdict": rep["verdict"],
            "predicted_p99_ms": rep["levers"][0]["predicted_p99_ms"] if rep["levers"] else None,
        }  # fmt: skip
    if os.environ.get("STAGESCOPE_ACCEPTANCE_FIGURES"):
        Path(os.environ["STAGESCOPE_ACCEPTANCE_FIGURES"]).write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    _skip_if_the_client_saw_what_the_server_did_not(tmp_path, spans, truth)
    kept = reports["traces"]["samples"]
    # every message holds the figures: a failure that passes on its rerun still says which was off
    assert kept < 0.3 * truth["requests"], ("default sampling keeps the slow requests and 1 % of the rest", figures)
    for tag in ("traces+metrics+results", "traces+metrics"):
        rep, got = reports[tag], figures[tag]
        assert rep["slo"]["route"] == "/v1/score" and rep["breached"], (tag, figures)
        assert got["p50"] == pytest.approx(truth["p50"], rel=0.10), (tag, figures)
        assert got["p99"] == pytest.approx(truth["p99"], rel=0.10), (tag, figures)
        assert got["over_threshold_share"] == pytest.approx(truth["over_threshold_share"], rel=0.25), (
            tag,
            figures,
        )
        assert rep["verdict"] == {"stage": names.STAGE_FEATURE_FETCH, "lever": names.LEVER_CACHE_FEATURES}, (
            tag,
            figures,
        )
        assert rep["requests"] == pytest.approx(truth["requests"], rel=0.02), (tag, figures)
    assert figures["traces+metrics+results"]["source"] == names.SOURCE_CLIENT_RESULTS, figures
    assert figures["traces+metrics"]["source"] == names.SOURCE_METRICS, figures
    # a one-line SLO without a route: the routes are analysed apart (analysis.routes), /v1/score leads
    pooled = _analyze(tmp_path, "no-route", "--traces", str(spans), "--metrics", str(tmp_path / "metrics"),
                      "--results", *both, slo=f"p99<{THRESHOLD_MS:g}ms")  # fmt: skip
    assert (
        pooled["route"] == "/v1/score" and pooled["verdict"] == reports["traces+metrics+results"]["verdict"]
    )
    assert pooled["latency_ms"] == reports["traces+metrics+results"]["latency_ms"]
    others = [r.get("route") for r in pooled["routes"][1:]] + [s["route"] for s in pooled["routes_skipped"]]
    assert "/v1/generate" in others, (pooled["routes"], pooled["routes_skipped"])
    # the traces alone are weighted by 1/sampling_p: the same verdict, figures from a 1 % sample
    alone = reports["traces"]
    assert alone["sources"]["latency_ms"] == names.SOURCE_TRACES and alone["sampling"]["weighted"], figures
    assert alone["verdict"] == reports["traces+metrics"]["verdict"], figures
    assert alone["over_threshold_share"] < 3 * truth["over_threshold_share"], figures
