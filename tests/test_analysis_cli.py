"""``stagescope analyze``: pinned JSON, text and HTML output; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagescope.analysis import synth_scenarios as S
from stagescope.cli import main

REPO = Path(__file__).resolve().parents[1]
PINNED = {
    "slo",
    "status",
    "no_data_reason",
    "route",
    "routes",
    "routes_skipped",
    "requests",
    "breached",
    "latency_ms",
    "attribution",
    "verdict",
    "levers",
    "windows",
    "warnings",
}


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("incident")
    data = S.generate("saturated", 800, seed=7)
    S.write_otlp(data, d / "spans.jsonl")
    S.write_metrics(data, d / "metrics.prom")
    return d / "spans.jsonl", d / "metrics.prom"


def test_json_report_has_the_pinned_shape(incident, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    traces, metrics = incident
    out = tmp_path / "report.json"
    argv = [
        "analyze",
        "--traces",
        str(traces),
        "--metrics",
        str(metrics),
        "--slo",
        "p99<300ms",
        "--window",
        "30s",
    ]
    assert main([*argv, "--format", "json", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert set(rep) >= PINNED
    assert rep["requests"] == 800 and rep["breached"] is True and rep["status"] == "breached"
    assert rep["no_data_reason"] is None and rep["route"] == "/v1/predict"
    # one route: routes holds the one report, of the top level's shape
    assert len(rep["routes"]) == 1 and set(rep["routes"][0]) >= PINNED - {"routes", "routes_skipped"}
    assert rep["routes"][0]["verdict"] == rep["verdict"] and rep["routes_skipped"] == []
    assert set(rep["latency_ms"]) == {"p50", "p95", "p99"}
    shares = [a["share"] for a in rep["attribution"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert rep["verdict"] == {"stage": "queue", "lever": "scale-out"}
    assert {"lever", "stage", "predicted_p99_ms", "rationale"} <= set(rep["levers"][0])
    assert len(rep["windows"]) >= 4 and any(w["breached"] for w in rep["windows"])
    assert rep["evidence"]["utilization_pct"] == pytest.approx(97.0)
    assert main([*argv, "--format", "text"]) == 0
    assert "lever: scale-out" in capsys.readouterr().out
    html = tmp_path / "r.html"
    assert main([*argv, "--format", "html", "--out", str(html)]) == 0
    assert html.read_text().startswith("<!DOCTYPE html>")


def test_trace_without_stage_spans_is_analysed_as_unattributed(capsys) -> None:  # type: ignore[no-untyped-def]
    trace = REPO / "external" / "otlp" / "opentelemetry-proto" / "trace.json"
    assert main(["analyze", "--traces", str(trace), "--slo", "p99<1ms", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["requests"] >= 1
    assert [a["stage"] for a in rep["attribution"] if a["share"] > 0] in ([], ["unattributed"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slo", "p99>300ms"], "bad SLO"),
        (["--slo", "p99<300ms", "--window", "soon"], "--window"),
        (["--slo", "p99<300ms", "--out", "/nonexistent-dir/x.json"], "/nonexistent-dir"),
        (["--slo", "/nonexistent/slo.yaml"], "slo.yaml"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(incident, capsys, args, needle) -> None:  # type: ignore[no-untyped-def]
    assert main(["analyze", "--traces", str(incident[0]), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_bad_trace_file_names_file_and_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"resourceSpans": []}\n{"resourceSpans": [\n')
    assert main(["analyze", "--traces", str(bad), "--slo", "p99<300ms"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl" in err and ":2" in err


def test_server_counters_from_real_vllm_and_triton_scrapes(capsys) -> None:  # type: ignore[no-untyped-def]
    trace = REPO / "external" / "otlp" / "opentelemetry-proto" / "trace.json"
    prom = REPO / "external" / "prometheus"
    metrics = [prom / "vllm" / "datadog_vllm_metrics.txt", prom / "triton" / "datadog_triton_metrics.txt"]
    argv = ["analyze", "--traces", str(trace), "--metrics", *map(str, metrics), "--slo", "p99<1ms"]
    assert main([*argv, "--format", "json"]) == 0
    counters = json.loads(capsys.readouterr().out)["server_counters"]
    assert counters["vllm"][0]["prefill_ms"] > 0 and counters["triton"][0]["compute_infer_ms"] > 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "vLLM facebook/opt-125m" in out and "Triton densenet_onnx" in out


def test_skip_bad_warns_and_analyses_the_good_files(incident, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "truncated.jsonl"
    bad.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab"\n')
    argv = ["analyze", "--traces", str(incident[0]), str(bad), "--slo", "p99<300ms", "--format", "json"]
    assert main(argv) == 2
    assert "truncated.jsonl" in capsys.readouterr().err
    assert main([*argv, "--skip-bad"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["requests"] == 800 and rep["verdict"] == {"stage": "queue", "lever": "scale-out"}
    assert any("truncated.jsonl" in w for w in rep["warnings"])


def _prom_quantile(q: float, cum: list[tuple[float, float]]) -> float:
    """Prometheus' bucketQuantile (promql/quantile.go), written here: rank q * W, the first bucket
    reaching it, linear inside it from 0 (lowest bucket) or the bucket below; +Inf: highest finite bound."""
    rank = q * cum[-1][1]
    b = next((i for i in range(len(cum) - 1) if cum[i][1] >= rank), len(cum) - 1)
    if b == len(cum) - 1:
        return cum[-2][0]
    start, below = (cum[b - 1][0], cum[b - 1][1]) if b else (0.0, 0.0)
    return start + (cum[b][0] - start) * (rank - below) / (cum[b][1] - below)


def _prom_share_over(t: float, cum: list[tuple[float, float]]) -> float:
    """``histogram_fraction(t, +Inf)`` (promql/quantile.go BucketFraction), written here: the cumulative
    count at ``t`` is the one below its bucket plus the bucket's share of the way from its lower bound
    (0 for the lowest) to ``t``; none of the +Inf bucket lies below a finite ``t``."""
    below = next((c for le, c in reversed(cum) if le <= t), 0.0)
    for (lo, c_lo), (hi, c_hi) in zip([(0.0, 0.0), *cum[:-1]], cum, strict=True):
        if lo < t < hi:
            below = c_lo if hi == float("inf") else c_lo + (c_hi - c_lo) * (t - lo) / (hi - lo)
    return 1.0 - below / cum[-1][1]


def test_metrics_only_vllm_scrape_is_answered_by_its_histograms(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A vLLM scrape alone (no traces): its e2e and TTFT histograms answer the SLO with exactly
    ``histogram_quantile``'s figures, named as their source, and the report says they cannot be
    split by route; with ``--route`` they cannot answer (no route label) and the report says why."""
    buckets = {  # (le s, cumulative), two scrapes a minute apart of model m
        "vllm:e2e_request_latency_seconds": [(0.3, 10, 40), (0.5, 15, 70), (1.0, 18, 96), (2.5, 20, 99), (float("inf"), 20, 100)],
        "vllm:time_to_first_token_seconds": [(0.1, 12, 60), (0.25, 18, 90), (0.5, 20, 99), (float("inf"), 20, 100)],
    }  # fmt: skip
    t0 = 1_764_000_000_000
    for k, ts in ((1, t0), (2, t0 + 60_000)):
        lines = []
        for fam, rows in buckets.items():
            lines.append(f"# TYPE {fam} histogram")
            for le, *c in rows:
                spelled = "+Inf" if le == float("inf") else repr(le)
                lines.append(f'{fam}_bucket{{le="{spelled}",model_name="m"}} {c[k - 1]}.0 {ts}')
            lines.append(f'{fam}_count{{model_name="m"}} {rows[-1][k]}.0 {ts}')
        (tmp_path / f"scrape{k}.prom").write_text("\n".join(lines) + "\n")
    metrics = [str(tmp_path / "scrape1.prom"), str(tmp_path / "scrape2.prom")]
    for slo, fam in (("p99<800ms", "vllm:e2e_request_latency_seconds"), ("ttft:p95<300ms", "vllm:time_to_first_token_seconds"),
                     ("p99<3s", "vllm:e2e_request_latency_seconds"), ("ttft:p50<250ms", "vllm:time_to_first_token_seconds")):
        out = tmp_path / "r.json"
        assert main(["analyze", "--metrics", *metrics, "--slo", slo, "--format", "json", "--out", str(out)]) == 0
        rep = json.loads(out.read_text())
        cum = [(le * 1e3, float(c2 - c1)) for le, c1, c2 in buckets[fam]]  # the increase over the window
        assert rep["sources"]["quantile_ms"] == "metrics" and rep["sampling"]["histogram"] == fam
        assert rep["requests"] == rep["samples"] == 80
        for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert rep["latency_ms"][key] == pytest.approx(_prom_quantile(q, cum), abs=1e-3), (fam, key)
        assert rep["status"] == ("breached" if rep["quantile_ms"] > rep["slo"]["threshold_ms"] else "met")
        assert any("no route label" in w and fam in w for w in rep["warnings"])
        # the share over the threshold as Prometheus gives it (linear inside the threshold's bucket, the
        # +Inf bucket all over 3 s; a threshold on a bound splits nothing), not the spread points'
        share = _prom_share_over(rep["slo"]["threshold_ms"], cum)
        assert rep["over_threshold_share"] == pytest.approx(share, abs=1e-5), (fam, slo)
    out = tmp_path / "route.json"
    argv = ["analyze", "--metrics", *metrics, "--slo", "p99<800ms", "--route", "/v1/chat/completions"]
    assert main([*argv, "--format", "json", "--out", str(out)]) == 3
    rep = json.loads(out.read_text())
    assert rep["status"] == "no_data"
    assert any("no route label" in w and "/v1/chat/completions" in w for w in rep["warnings"])


def test_an_input_option_given_twice_keeps_both(incident, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--traces a --traces b`` (or ``--results``/``--metrics`` twice: one per load process, a service's
    spans beside the load generator's) reads a and b, as ``--traces a b`` does; argparse's ``nargs="+"``
    alone kept only the last, and the first file's requests were silently left out."""
    traces, _ = incident
    lines = traces.read_text().splitlines(keepends=True)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(lines[: len(lines) // 2]))
    second.write_text("".join(lines[len(lines) // 2 :]))

    def requests(*args: str) -> int:
        out = tmp_path / "r.json"
        assert main(["analyze", *args, "--slo", "p99<300ms", "--format", "json", "--out", str(out)]) == 0
        return int(json.loads(out.read_text())["requests"])

    both = requests("--traces", str(first), str(second))
    assert both == requests("--traces", str(traces))
    assert requests("--traces", str(first), "--traces", str(second)) == both
    assert requests("--traces", str(second)) < both
