"""No data is never a verdict: an SLO with 0 samples is ``status: no_data``, ``breached: null``, exit 3,
and a reason naming what was read, the route and the attribute that was missing; never "met"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.report import to_html, to_text
from stagescope.analysis.synth import KIND_INTERNAL, KIND_SERVER, SynthSpan, request_spans, write_otlp_lines
from stagescope.cli import main
from stagescope.names import ATTR_STAGE, STATUS_NO_DATA, VLLM_ATTR_TTFT

REPO = Path(__file__).resolve().parents[1]
EXTERNAL = REPO / "external" / "otlp"
T0 = 1_764_460_800 * 10**9


def _analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    """Run ``stagescope analyze`` twice (JSON and text): exit status, report, text output."""
    rc = main(["analyze", *args, "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    rc_text = main(["analyze", *args])
    out = capsys.readouterr()
    assert rc_text == rc and "Traceback" not in out.err
    return rc, rep, out.out


def _assert_no_data(rc: int, rep: dict[str, Any], text: str, *needles: str) -> None:
    assert rc == 3
    assert rep["status"] == STATUS_NO_DATA and rep["breached"] is None and rep["verdict"] is None
    assert rep["samples"] == 0 and rep["levers"] == [] and rep["attribution"] == []
    reason = rep["no_data_reason"]
    assert reason and "\n" not in reason
    for n in needles:
        assert n in reason, (n, reason)
    headline = text.splitlines()[0]
    assert "NO DATA" in headline and reason in headline
    assert not re.search(r"\bmet\b", text), text
    page = to_html(rep)
    assert "NO DATA" in page and "class='verdict nodata'" in page
    visible = re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", page, flags=re.S))
    assert not re.search(r"\bmet\b", visible), visible


def _predict_file(path: Path, n: int = 40, *, status: int = 200, route: str = "/v1/predict") -> Path:
    spans = []
    for i in range(n):
        spans += request_spans(
            f"{i + 1:032x}", T0 + i * 10**8, [("compute", 1.0, 20.0 + i)], status=status, route=route,
            name=f"POST {route}",
        )  # fmt: skip
    write_otlp_lines(path, spans)
    return path


def test_an_empty_folder_is_no_data_not_met(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "spans"
    empty.mkdir()
    rc, rep, text = _analyze(capsys, "--traces", str(empty), "--slo", "p99<300ms")
    _assert_no_data(rc, rep, text, str(empty), "empty folder")


def test_a_folder_without_trace_files_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("not traces\n")
    rc, rep, text = _analyze(capsys, "--traces", str(tmp_path), "--slo", "p99<300ms")
    _assert_no_data(rc, rep, text, str(tmp_path), "no trace files")


def test_spans_without_a_request_span(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only child spans (their parent is not in the files): spans were read, none is a request."""
    spans = [
        SynthSpan(f"{i + 1:032x}", f"{i + 1:016x}", "work", T0, T0 + 10**6, parent_span_id="ab" * 8,
                  kind=KIND_INTERNAL)
        for i in range(7)
    ]  # fmt: skip
    f = tmp_path / "children.jsonl"
    write_otlp_lines(f, spans)
    rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", "p99<300ms")
    _assert_no_data(rc, rep, text, "7 spans, none of them a request span", str(f))


@pytest.mark.parametrize("stage", ["predict", True], ids=["a-name", "a-bool"])
def test_server_spans_that_carry_a_stage_are_named_as_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: object
) -> None:
    """A service that set ``stagescope.stage`` on its SERVER spans has stage spans and no request: the
    reason says so, not only "none of them a request span"."""
    spans = [
        SynthSpan(f"{i + 1:032x}", f"{i + 1:016x}", "POST /v1/predict", T0, T0 + 10**7, kind=KIND_SERVER,
                  attributes={ATTR_STAGE: stage})
        for i in range(5)
    ]  # fmt: skip
    f = tmp_path / "staged.jsonl"
    write_otlp_lines(f, spans)
    rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", "p99<300ms")
    _assert_no_data(rc, rep, text, "5 spans, none of them a request span", f"5 SERVER spans carry {ATTR_STAGE}")


@pytest.mark.parametrize(
    ("slo", "needle"),
    [
        ("ttft:p95<500ms", f"none with a TTFT ({VLLM_ATTR_TTFT} or a stream)"),
        ("itl:p99<60ms", "none with inter-token gaps"),
    ],
)
def test_an_sli_the_requests_do_not_carry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slo: str, needle: str
) -> None:
    f = _predict_file(tmp_path / "predict.jsonl")
    rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", slo)
    _assert_no_data(
        rc, rep, text, "40 request spans seen on route /v1/predict", needle, "read 80 spans from", str(f)
    )


def test_a_route_not_in_the_data_lists_the_routes_seen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _predict_file(tmp_path / "predict.jsonl")
    slo = tmp_path / "slo.yaml"
    slo.write_text(
        "slos:\n  - {name: x, service: s, sli: e2e, route: /v1/x, threshold_ms: 300, objective: 0.99}\n"
    )
    rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", str(slo))
    _assert_no_data(rc, rep, text, "route /v1/x not in the data: routes seen are /v1/predict (40 requests)")


def test_only_shed_requests_are_no_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _predict_file(tmp_path / "shed.jsonl", 12, status=429)
    rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", "p99<300ms")
    _assert_no_data(rc, rep, text, "all 12 requests on route /v1/predict were shed (HTTP 429)")


def test_data_we_did_not_generate_has_no_ttft(capsys: pytest.CaptureFixture[str]) -> None:
    """The OpenTelemetry proto example and a Jaeger integration trace (external/, their licences beside
    them): HTTP request spans, no stream. A TTFT SLO over them is no data, and says which file."""
    for f in (
        EXTERNAL / "opentelemetry-proto" / "trace.json",
        EXTERNAL / "jaeger" / "integration_example_trace.json",
    ):
        rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", "ttft:p95<500ms")
        _assert_no_data(rc, rep, text, "request span", "none with a TTFT", str(f))


def test_a_verdict_is_still_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _predict_file(tmp_path / "predict.jsonl")
    for slo, status in (("p99<300ms", "met"), ("p99<30ms", "breached")):
        rc, rep, text = _analyze(capsys, "--traces", str(f), "--slo", slo)
        assert rc == 0 and rep["status"] == status and rep["no_data_reason"] is None
        assert rep["breached"] is (status == "breached")
        assert ("BREACHED" if status == "breached" else "met") in text.splitlines()[0]


def test_relations_built_by_hand_with_no_sample() -> None:
    """The library on a connection (no ingest): the same status, and the reason says what is missing."""
    import duckdb

    from stagescope.analysis.api import analyze

    con = duckdb.connect()
    S.to_tables(con, S.generate("slow-feature-store", 50, seed=1))
    rep = analyze(con, "ttft:p95<500ms")
    assert rep["status"] == STATUS_NO_DATA and rep["breached"] is None
    assert rep["no_data_reason"].startswith("50 request spans seen on route /v1/predict, none with a TTFT")
    assert to_text(rep).startswith(
        "SLO ttft:p95<500ms on route /v1/predict: NO DATA -- 0 samples: 50 request spans seen"
    )


def test_the_demo_lever_check_never_reads_no_data_as_met() -> None:
    from stagescope.demo.main import _after_words, lever_check
    from stagescope.demo.runner import RunResult

    def run(report: dict[str, Any]) -> RunResult:
        return RunResult("slow-feature-store", False, Path("."), report, 10, None, False, None)

    slo = {"threshold_ms": 300.0, "spec": "p99<300ms", "objective": 0.99}
    before = {"slo": slo, "status": "breached", "breached": True, "quantile_ms": 600.0,
              "verdict": {"stage": "feature_fetch", "lever": "cache-features"},
              "levers": [{"lever": "cache-features", "predicted_p99_ms": 50.0}]}  # fmt: skip
    after = {"slo": slo, "status": "no_data", "breached": None, "quantile_ms": None,
             "no_data_reason": "route /v1/predict not in the data"}  # fmt: skip
    check = lever_check(run(before), run(after))
    assert check["within_slo_after"] is None and check["status_after"] == "no_data"
    words = _after_words(check)
    assert words == "no data after the lever: route /v1/predict not in the data" and "met" not in words
    after_met = {**after, "status": "met", "breached": False, "quantile_ms": 40.0, "no_data_reason": None}
    assert lever_check(run(before), run(after_met))["within_slo_after"] is True


def test_a_route_and_a_model_never_together() -> None:
    import dataclasses

    import duckdb

    from stagescope.analysis.api import analyze
    from stagescope.slo import parse_slo

    con = duckdb.connect()
    S.to_tables(con, S.generate("slow-feature-store", 30, seed=1))  # model resnet on /v1/predict
    con.execute(
        "INSERT INTO requests SELECT * REPLACE ('/v1/other' AS route, 'llama' AS model) FROM requests LIMIT 5"
    )
    slo = dataclasses.replace(parse_slo("p99<300ms")[0], route="/v1/predict", model="llama")
    rep = analyze(con, slo)
    assert rep["status"] == STATUS_NO_DATA
    assert (
        rep["no_data_reason"]
        == "no request on route /v1/predict and model llama: models on route /v1/predict are resnet (30 requests)"
    )
