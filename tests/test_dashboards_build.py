"""Dashboards: the committed JSON is what the code generates, and each dashboard holds what issue 7
asks of it (checked on the JSON Grafana will load, not on the Python that builds it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stagescope import names
from stagescope.cli import main
from stagescope.dashboards.build import DASHBOARDS, rendered
from stagescope.dashboards.queries import metric_names, panel_queries, variable_queries

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "dashboards" / "generated"
BUILTINS = {"__rate_interval", "__interval", "__range"}


def _load(name: str) -> dict[str, Any]:
    return json.loads((GENERATED / name).read_text())


def _all_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p.get("type") != "row"]


def _exprs(dash: dict[str, Any], title_part: str) -> list[str]:
    hits = [q.expr for q in panel_queries(dash) if title_part.lower() in q.panel.lower()]
    assert hits, f"no panel titled like {title_part!r} in {dash['uid']}"
    return hits


def test_committed_dashboards_match_the_generator() -> None:
    fresh = rendered()
    assert sorted(p.name for p in GENERATED.glob("*.json")) == sorted(fresh)
    for name, text in fresh.items():
        assert (GENERATED / name).read_text() == text, (
            f"dashboards/generated/{name} is stale: run `make dashboards` and commit the result"
        )


def test_cli_writes_the_same_files(tmp_path: Path) -> None:
    assert main(["dashboards", "build", "--out", str(tmp_path / "d")]) == 0
    for name in DASHBOARDS:
        assert (tmp_path / "d" / name).read_text() == (GENERATED / name).read_text()


def test_cli_unwritable_output_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["dashboards", "build", "--out", str(blocker / "sub")]) == 2
    assert "cannot write dashboards" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_structure(name: str) -> None:
    dash = _load(name)
    assert dash["uid"] == name.removesuffix(".json")
    variables = [v["name"] for v in dash["templating"]["list"]]
    assert variables[:3] == ["datasource", "job", "model"]
    defined = set(variables) | BUILTINS
    seen: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        cells = {(pos["y"] + dy, pos["x"] + dx) for dy in range(pos["h"]) for dx in range(pos["w"])}
        assert not cells & seen, f"{panel['title']} overlaps another panel"
        seen |= cells
    for panel in _all_panels(dash):
        assert panel.get("description"), f"{panel['title']} has no description"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and refs
        for t in panel["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                assert var in defined, f"{panel['title']}: ${var} is not a variable"
    for v in variable_queries(dash):
        assert v.query.startswith("label_values(") and v.all_value == ".*"


def test_every_metric_name_comes_from_names() -> None:
    known = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    known |= {names.RULE_SLI_ERROR_RATIO_FORMAT.format(window=w) for w in names.SLO_WINDOWS}
    known |= {f"{m}{s}" for m in list(known) for s in ("_bucket", "_sum", "_count")}
    known.add("ALERTS")
    for name in DASHBOARDS:
        for q in panel_queries(_load(name)):
            unknown = metric_names(q.expr) - known
            assert not unknown, f"{name} / {q.panel}: {unknown} not in stagescope.names"


def test_latency_dashboard_puts_queue_beside_compute() -> None:
    dash = _load("stagescope-latency.json")
    (side,) = _exprs(dash, "Queue vs batch wait vs GPU compute")[1:]  # p99 target
    assert 'kind=~"queue|batch_wait|compute"' in side and 'stage=~"$stage"' in side
    assert "histogram_quantile(0.99" in side
    assert any(f"{names.METRIC_STAGE_DURATION}_sum" in e for e in _exprs(dash, "Time per request by stage"))
    heat = next(p for p in _all_panels(dash) if p["title"] == "Queue wait heatmap")
    assert heat["type"] == "heatmap" and 'kind="queue"' in heat["targets"][0]["expr"]
    assert heat["targets"][0]["format"] == "heatmap"
    exemplars = [t for p in _all_panels(dash) for t in p["targets"] if t["exemplar"]]
    assert any(names.METRIC_REQUEST_DURATION in t["expr"] for t in exemplars)
    assert any(names.RULE_SLO_THRESHOLD in e for e in _exprs(dash, "against the SLO threshold"))
    for title, metric in [
        ("Queue depth", names.METRIC_QUEUE_DEPTH),
        ("in flight", names.METRIC_INFLIGHT),
        ("Batch size", names.METRIC_BATCH_SIZE),
        ("Shed", names.METRIC_REQUESTS_SHED),
    ]:
        assert any(metric in e for e in _exprs(dash, title)), title  # fmt: skip


def test_llm_dashboard_defines_its_words_and_covers_vllm() -> None:
    dash = _load("stagescope-llm.json")
    panels = {p["title"]: p for p in _all_panels(dash)}
    assert "arrival at the server" in panels["Time to first token (TTFT)"]["description"]
    assert "one sample per gap" in panels["Inter-token latency (ITL)"]["description"]
    assert "(output tokens - 1)" in panels["Time per output token (TPOT)"]["description"]
    read = set().union(*(metric_names(q.expr) for q in panel_queries(dash)))
    exprs = " ".join(q.expr for q in panel_queries(dash))
    for metric in (
        names.VLLM_TTFT,
        names.VLLM_ITL,
        names.VLLM_TPOT,
        names.VLLM_NUM_RUNNING,
        names.VLLM_NUM_WAITING,
        names.VLLM_GENERATION_TOKENS,
        names.VLLM_PREFILL_TIME,
        names.VLLM_DECODE_TIME,
    ):  # read under both spellings (test_dashboards_vllm_spellings.py)
        assert read & {metric, f"{metric}_bucket", f"{metric}_sum", f"{metric}_count"}, metric
        assert f'__name__=~"{metric.replace(":", "[:_]")}' in exprs, metric
    assert 'kind=~"prefill|decode"' in exprs


def test_gpu_dashboard_uses_dcgm_names_and_puts_utilization_beside_queue() -> None:
    dash = _load("stagescope-gpu.json")
    exprs = " ".join(q.expr for q in panel_queries(dash))
    for metric in (
        names.DCGM_GPU_UTIL,
        names.DCGM_FB_USED,
        names.DCGM_POWER_USAGE,
        names.DCGM_SM_CLOCK,
        names.DCGM_GPU_TEMP,
        names.DCGM_XID_ERRORS,
    ):
        assert metric in exprs, metric  # fmt: skip
    beside = " ".join(_exprs(dash, "utilization beside queue depth"))
    assert names.DCGM_GPU_UTIL in beside and names.METRIC_QUEUE_DEPTH in beside
    triton = " ".join(_exprs(dash, "Triton: queue vs compute per request"))
    assert names.TRITON_QUEUE_DURATION_US in triton and names.TRITON_COMPUTE_INFER_US in triton


def test_slo_dashboard_shows_budget_burn_rates_and_alerts() -> None:
    dash = _load("stagescope-slo.json")
    exprs = " ".join(q.expr for q in panel_queries(dash))
    assert names.RULE_SLO_BUDGET_REMAINING in exprs and "ALERTS{" in exprs
    for w in names.SLO_WINDOWS:
        assert names.RULE_SLI_ERROR_RATIO_FORMAT.format(window=w) + "{" in exprs, w


def test_stage_panels_read_the_stage_variable_not_a_list_of_stages() -> None:
    """A team's own stages show up without editing a dashboard: every query over the stage histogram
    selects stages with ``$stage`` (label values of the histogram) and otherwise only by kind."""
    for name in DASHBOARDS:
        dash = _load(name)
        staged = [q for q in panel_queries(dash) if names.METRIC_STAGE_DURATION in q.expr]
        if not staged:
            continue
        (var,) = [v for v in variable_queries(dash) if v.name == "stage"]
        assert var.query == (
            f'label_values({names.METRIC_STAGE_DURATION}_count{{job=~"$job", model=~"$model"}}, stage)'
        )
        for q in staged:
            assert 'stage=~"$stage"' in q.expr, f"{name} / {q.panel}"
            assert not re.search(r'\bstage(=|!=|=~|!~)"(?!\$stage")', q.expr), f"{name} / {q.panel}: {q.expr}"


def test_llm_dashboard_has_a_cost_per_million_output_tokens_panel() -> None:
    """Issue 18: the price is a dashboard variable (a textbox, 1 until set); accelerator-seconds come
    from executor busy time (per model) or DCGM utilization; output tokens from the TTFT and ITL counts."""
    from stagescope.dashboards.queries import text_values

    dash = _load("stagescope-llm.json")
    assert text_values(dash) == {"accelerator_price_per_hour": "1"}
    (panel,) = [p for p in _all_panels(dash) if p["title"] == "Cost per million output tokens"]
    assert "accelerator_price_per_hour" in panel["description"] and "idle" in panel["description"]
    exprs = _exprs(dash, "Cost per million output tokens")
    assert len(exprs) == 3
    for e in exprs:
        assert e.startswith("$accelerator_price_per_hour / 3600 * ") and e.endswith(" * 1e6")
        assert f"{names.METRIC_INTER_TOKEN}_count" in e and f"{names.METRIC_GENAI_TTFT}_count" in e
    busy, util, fleet = exprs
    assert f"sum by (model) (rate({names.METRIC_EXECUTOR_BUSY}" in busy and "sum by (model) (rate(" in busy.split("/")[1]
    assert f"sum({names.DCGM_GPU_UTIL}" in util and ") / 100" in util
    assert f"count({names.DCGM_GPU_UTIL}" in fleet
