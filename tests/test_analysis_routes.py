"""Routes are never pooled: each route an SLO's SLI applies to is checked on its own, ``--route``
checks one, and the report leads with the worst (synthetic multi-route incidents with a known cause
per route, and a Jaeger trace from external/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from asgi_support import asgi_request

from stagescope.analysis import routes as R
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze, frames
from stagescope.analysis.report import to_html, to_text
from stagescope.analysis.synth_routes import mix
from stagescope.cli import main
from stagescope.names import STATUS_BREACHED, STATUS_MET, STATUS_NO_DATA

REPO = Path(__file__).resolve().parents[1]
SCORE, GEN, RANK, EMBED = "/v1/score", "/v1/generate", "/v1/rank", "/v1/embed"
PER_ENTRY = {
    "slo",
    "route",
    "status",
    "breached",
    "no_data_reason",
    "latency_ms",
    "attribution",
    "verdict",
    "levers",
}


def _con(parts: dict[str, tuple[str, int]], seed: int = 3) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    S.to_tables(con, mix(parts, seed=seed))
    return con


def _truth(rep: dict[str, Any], scenario: str) -> None:
    sc = S.SCENARIOS[scenario]
    assert rep["status"] == STATUS_BREACHED and rep["verdict"] == {"stage": sc.stage, "lever": sc.lever}, (
        rep["route"], rep["attribution"][:2])  # fmt: skip


def test_the_issue_case_a_slow_feature_fetch_beside_a_stream() -> None:
    """Issue 14: /v1/score with a slow feature store and a streaming /v1/generate in one folder. Pooled
    under 'p99<300ms' the tail is long generations (decode, speculative-decoding); per route, the e2e
    SLO is checked on /v1/score alone (the stream is listed, not pooled) and finds the feature fetch."""
    con = _con({SCORE: ("slow-feature-store", 800), GEN: ("llm-healthy", 300)})
    rep = analyze(con, "p99<300ms")
    assert rep["route"] == SCORE and rep["slo"]["route"] == SCORE
    _truth(rep, "slow-feature-store")
    assert [r["route"] for r in rep["routes"]] == [SCORE]
    assert [(s["route"], s["requests"]) for s in rep["routes_skipped"]] == [(GEN, 300)]
    assert (
        "streams" in rep["routes_skipped"][0]["why"] and f"--route {GEN}" in rep["routes_skipped"][0]["why"]
    )
    text = to_text(rep)
    assert text.startswith(f"SLO p99<300ms on route {SCORE}: BREACHED")
    assert f"{GEN} (300 requests): streams" in text
    # the same requests pooled under one route name: what the analysis used to answer
    con.execute("UPDATE requests SET route = 'pooled'")
    pooled = analyze(con, "p99<300ms")
    assert pooled["verdict"] == {"stage": "decode", "lever": "speculative-decoding"}


def test_route_checks_a_streaming_route_e2e_when_asked() -> None:
    con = _con({SCORE: ("slow-feature-store", 800), GEN: ("llm-healthy", 300)})
    rep = analyze(con, "p99<300ms", route=GEN)
    assert rep["route"] == GEN and rep["samples"] == 300 and [r["route"] for r in rep["routes"]] == [GEN]
    assert rep["routes_skipped"] == []


def test_ttft_applies_to_streaming_routes_only() -> None:
    con = _con({SCORE: ("slow-feature-store", 600), GEN: ("llm-long-prompts", 800)})
    rep = analyze(con, "ttft:p95<500ms")
    assert [r["route"] for r in rep["routes"]] == [GEN]
    _truth(rep, "llm-long-prompts")
    assert [(s["route"], s["why"]) for s in rep["routes_skipped"]] == [(SCORE, "does not stream: no TTFT")]
    # asked for the predict route, the TTFT SLO has no data there, and says where TTFTs are
    one = analyze(con, "ttft:p95<500ms", route=SCORE)
    assert one["status"] == STATUS_NO_DATA and one["breached"] is None
    assert one["no_data_reason"].startswith(f"600 request spans seen on route {SCORE}, none with a TTFT")
    assert f"(routes with such samples: {GEN})" in one["no_data_reason"]


def test_each_route_its_own_verdict_and_the_top_level_is_the_worst() -> None:
    con = _con({SCORE: ("slow-feature-store", 800), EMBED: ("long-batch-wait", 500), RANK: ("healthy", 400)})
    rep = analyze(con, "p99<300ms")
    by = {r["route"]: r for r in rep["routes"]}
    assert set(by) == {SCORE, EMBED, RANK}
    for entry in rep["routes"]:
        assert set(entry) >= PER_ENTRY and "routes" not in entry
    _truth(by[SCORE], "slow-feature-store")
    _truth(by[EMBED], "long-batch-wait")
    assert by[RANK]["status"] == STATUS_MET and by[RANK]["verdict"] is None and by[RANK]["levers"] == []
    # each route's figures are its own: its samples, and only its stages' time
    assert [by[r]["samples"] for r in (SCORE, EMBED, RANK)] == [800, 500, 400]
    assert by[EMBED]["attribution"][0]["stage"] == "batch_wait"
    # worst first: both breached, the one furthest over its threshold leads; the met route last
    ratios = [r["quantile_ms"] / r["slo"]["threshold_ms"] for r in rep["routes"]]
    assert [r["status"] for r in rep["routes"]] == [STATUS_BREACHED, STATUS_BREACHED, STATUS_MET]
    assert ratios[0] >= ratios[1] and rep["route"] == rep["routes"][0]["route"]
    assert rep["verdict"] == rep["routes"][0]["verdict"]
    # frames() gives the breakdown of the route the top level is about
    assert len(frames(con)["ss_breakdown"]) == rep["samples"]
    text = to_text(rep)
    assert "Routes checked (3, worst first" in text
    for route in (SCORE, EMBED, RANK):
        assert f"SLO p99<300ms on route {route}: " in text
    page = to_html(rep)
    assert "Routes checked (3" in page and all(r in page for r in (SCORE, EMBED, RANK))


def test_an_slo_file_without_route_is_checked_per_route_and_with_route_on_its_own(tmp_path: Path) -> None:
    con = _con({SCORE: ("slow-feature-store", 800), RANK: ("healthy", 400), GEN: ("llm-decode-heavy", 300)})
    f = tmp_path / "slo.yaml"
    f.write_text(
        "slos:\n"
        "  - {name: latency, service: s, sli: e2e, threshold_ms: 300, objective: 0.99}\n"
        f"  - {{name: gaps, service: s, sli: itl, route: {GEN}, threshold_ms: 60, objective: 0.99}}\n"
    )
    rep = analyze(con, str(f))
    got = sorted((r["slo"]["name"], r["route"], r["status"]) for r in rep["routes"])
    assert got == [
        ("gaps", GEN, STATUS_BREACHED),
        ("latency", RANK, STATUS_MET),
        ("latency", SCORE, STATUS_BREACHED),
    ]
    gaps = next(r for r in rep["routes"] if r["slo"]["name"] == "gaps")
    _truth(gaps, "llm-decode-heavy")
    # the top level's headline, then one verdict per (SLO, route)
    assert to_text(rep).count("SLO latency (p99<300ms) on route ") == 3
    # --route keeps the SLOs for that route (and binds those without one to it)
    only = analyze(con, str(f), route=GEN)
    assert sorted((r["slo"]["name"], r["route"]) for r in only["routes"]) == [("gaps", GEN), ("latency", GEN)]


def test_routes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    con = _con({f"/v1/r{i}": ("healthy", 60 + i) for i in range(5)})
    monkeypatch.setattr(R, "MAX_ROUTES", 3)
    rep = analyze(con, "p99<300ms")
    assert [r["samples"] for r in sorted(rep["routes"], key=lambda r: -r["samples"])] == [64, 63, 62]
    assert sorted(s["route"] for s in rep["routes_skipped"]) == ["/v1/r0", "/v1/r1"]
    assert all("beyond the 3 busiest routes" in s["why"] for s in rep["routes_skipped"])


def test_routes_of_a_trace_we_did_not_generate(capsys: pytest.CaptureFixture[str]) -> None:
    """Jaeger's integration example (external/otlp/jaeger): three operations, no http.route, so the
    span name is the route; each is checked on its own and ``--route`` picks one."""
    trace = REPO / "external" / "otlp" / "jaeger" / "integration_example_trace.json"
    argv = ["analyze", "--traces", str(trace), "--slo", "p99<1ms", "--format", "json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted((r["route"], r["samples"]) for r in rep["routes"]) == [
        ("example-operation-1", 2), ("example-operation-2", 1), ("example-operation-3", 1),
    ]  # fmt: skip
    assert rep["route"] == rep["routes"][0]["route"]
    assert main([*argv, "--route", "example-operation-1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["route"] == "example-operation-1" and one["samples"] == 2 and len(one["routes"]) == 1
    assert main([*argv, "--route", "/v1/nope"]) == 3
    nope = json.loads(capsys.readouterr().out)
    assert nope["no_data_reason"].startswith(
        "route /v1/nope not in the data: routes seen are example-operation-1"
    )


def test_cli_route_over_otlp_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = mix({SCORE: ("slow-feature-store", 500), GEN: ("llm-long-prompts", 400)}, seed=8)
    traces = tmp_path / "spans.jsonl"
    S.write_otlp(data, traces)
    base = ["analyze", "--traces", str(traces), "--format", "json"]
    assert main([*base, "--slo", "p99<300ms", "--route", SCORE]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["route"] == SCORE and rep["requests"] == 500
    _truth(rep, "slow-feature-store")
    assert main([*base, "--slo", "ttft:p95<500ms"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["route"] == GEN and rep["requests"] == 400
    _truth(rep, "llm-long-prompts")


def test_route_for_no_slo_of_the_file_is_bad_input_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(
        f"slos:\n  - {{name: p, service: s, sli: e2e, route: {SCORE}, threshold_ms: 300, objective: 0.99}}\n"
    )
    missing = tmp_path / "never-read"
    for route, needle in (
        (GEN, f"--route {GEN}: no SLO in {f} is for it (its routes: {SCORE})"),
        ("", "empty route"),
    ):
        assert main(["analyze", "--traces", str(missing), "--slo", str(f), "--route", route]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_requests_that_matched_no_route_are_one_route_named_as_the_metrics_name_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server span of a request no route matched is named by its method alone (HTTP semconv, as the
    stock instrumentation and stagescope's middleware do, with no ``http.route``): the analysis read
    those spans as routes ``GET`` and ``POST`` (a scanner's 404s "SLO p99<200ms on route GET"), while
    the request histogram counts them under ``unmatched``. They are one route, ``unmatched``."""
    import asyncio

    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    import stagescope
    from stagescope.names import UNMATCHED_ROUTE

    app = FastAPI()
    handle = stagescope.instrument_app(
        app, service_name="s", registry=CollectorRegistry(), spans_dir=tmp_path / "spans", baseline_sample=1.0
    )

    @app.get("/v1/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    async def call(method: str, path: str) -> int:
        return (await asgi_request(app, method, path))[0]

    async def thirteen_requests() -> list[int]:
        out = [await call("GET", f"/v1/items/{i}") for i in range(6)]
        out += [await call("GET", f"/wp-admin/{i}.php") for i in range(4)]
        return out + [await call("POST", "/nope") for _ in range(3)]

    assert asyncio.run(thirteen_requests()) == [200] * 6 + [404] * 7
    assert handle.force_flush()
    stagescope.uninstrument_app(app)
    argv = ["analyze", "--traces", str(tmp_path / "spans"), "--slo", "p99<300ms", "--format", "json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted((r["route"], r["samples"]) for r in rep["routes"]) == [
        ("/v1/items/{item_id}", 6), (UNMATCHED_ROUTE, 7),
    ]  # fmt: skip
