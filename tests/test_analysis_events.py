"""Deploys, scale events and model swaps (issue 18, deliverable 4): events from kube-state-metrics series
or an events file, on the timeline and in the reports, a window's breach attributed to the event it
follows with the lever that fits, and pod pending time as a stage of its own.

The incidents are SYNTHETIC (analysis/synth_events.py), with the kube-state-metrics series named and
labelled as kube-state-metrics' docs say (docs/metrics/workload/deployment-metrics.md, pod-metrics.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from stagescope import names as N
from stagescope.analysis import synth_engines as SEN
from stagescope.analysis import synth_events as SE
from stagescope.analysis import synth_multi as M
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.event_attribution import episodes
from stagescope.analysis.events_file import read_events_file
from stagescope.analysis.report import to_html, to_text
from stagescope.cli import main
from stagescope.errors import UserError

EVENT_LEVERS = {N.LEVER_SURGE_READINESS, N.LEVER_PREWARMED_PODS, N.LEVER_SCALE_AHEAD}
T0_MS = 1_764_460_800_000


def _con(data: S.SynthData, *, metrics: bool = True) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    if not metrics:
        data = S.SynthData(data.scenario, data.requests, data.stages, data.gaps, [])
    S.to_tables(con, data)
    return con


def _levers(rep: dict[str, Any]) -> set[str | None]:
    """Every lever a report names: per stage, per plan step, per breach that follows an event."""
    got = {lv["lever"] for lv in rep["levers"]} | {s["lever"] for s in rep.get("plan") or []}
    return got | {lv["lever"] for eb in rep["event_breaches"] for lv in eb["levers"]}


@pytest.mark.parametrize("name", list(SE.EVENT_INCIDENTS))
def test_incident_from_kube_state_metrics_is_attributed_to_its_event(name: str) -> None:
    inc = SE.generate_event_incident(name, seed=2)
    rep = analyze(_con(inc.data), inc.data.scenario.slo)
    assert rep["status"] == N.STATUS_BREACHED
    (event,) = rep["events"]
    assert (event["kind"], event["source"], event["target"]) == (inc.event_kind, N.EVENT_SOURCE_KSM, "serving/ranker")
    attributed = [eb for eb in rep["event_breaches"] if eb["event"] is not None]
    assert len(attributed) == 1 and attributed[0]["event_kind"] == inc.event_kind
    eb = attributed[0]
    # per window: "the breach in window W follows event 0"
    assert [w["event"] for w in rep["windows"]] == [0 if w["breached"] else None for w in rep["windows"]]
    assert eb["aftermath_share"] >= 0.9 and 0 <= eb["after_event_s"] <= 30
    (lv,) = eb["levers"]
    assert lv["lever"] == inc.lever
    # the prediction (the aftermath served like the rest) against the generator's truth
    assert lv["predicted_p99_ms"] == pytest.approx(inc.true_quantile(), rel=0.1)
    lo, hi = lv["interval_ms"]
    assert lo <= lv["predicted_p99_ms"] <= hi
    assert lv["cost_delta"]["sign"] == "+" and lv["cost_delta"]["relative"] > 0  # pods added on purpose
    # the stage the event grew gets its own lever
    assert rep["verdict"] == {"stage": inc.data.scenario.stage, "lever": inc.data.scenario.lever}


def test_rollout_seen_in_the_generation_and_updated_replicas() -> None:
    inc = SE.generate_event_incident("rolling-update-cold-start", seed=1)
    (ev,) = analyze(_con(inc.data), inc.data.scenario.slo)["events"]
    # generation 7 -> 8 seen at the 135 s scrape (after the one at 120 s); complete once every replica
    # is updated and none unavailable (the 195 s scrape)
    assert ev["time_unix_ms"] - T0_MS == 135_000 and ev["detail"]["since_unix_ms"] - T0_MS == 120_000
    assert ev["end_unix_ms"] - T0_MS == 195_000
    assert (ev["detail"]["generation_from"], ev["detail"]["generation_to"]) == (7, 8)


def test_scale_up_carries_its_pending_pods() -> None:
    inc = SE.generate_event_incident("hpa-scale-pending", seed=1)
    rep = analyze(_con(inc.data), inc.data.scenario.slo)
    (ev,) = rep["events"]  # the generation rise that came with the new replica count is the scale
    assert (ev["detail"]["replicas_from"], ev["detail"]["replicas_to"]) == (2, 5)
    pods = ev["detail"]["pods_pending"]
    assert len(pods) == 3 and all(p["pod"].startswith("ranker-6c9d7f8b54-") for p in pods)
    assert all(40 <= p["pending_s"] <= 75 and 45 <= p["scheduled_s"] <= 52 for p in pods)
    # pod pending is a stage of its own (kind pod_pending) with its own lever
    top = rep["attribution"][0]
    assert (top["stage"], top["kind"]) == (N.STAGE_POD_PENDING, N.KIND_POD_PENDING)
    assert rep["levers"][0]["lever"] == N.LEVER_PREWARMED_PODS


@pytest.mark.parametrize("name", list(SE.EVENT_INCIDENTS))
def test_events_file_gives_the_same_attribution(tmp_path: Path, name: str) -> None:
    inc = SE.generate_event_incident(name, seed=4)
    events = read_events_file(inc.write_events(tmp_path / "events.jsonl"))
    rep = analyze(_con(inc.data, metrics=False), inc.data.scenario.slo, events=events)
    (ev,) = rep["events"]
    assert ev["source"] == N.EVENT_SOURCE_FILE and ev["detail"]["file"] == "events.jsonl:1"
    (eb,) = [e for e in rep["event_breaches"] if e["event"] is not None]
    assert eb["levers"][0]["lever"] == inc.lever
    assert eb["levers"][0]["predicted_p99_ms"] == pytest.approx(inc.true_quantile(), rel=0.1)


def test_text_html_and_json_show_the_events(tmp_path: Path) -> None:
    inc = SE.generate_event_incident("rolling-update-cold-start", seed=5)
    rep = analyze(_con(inc.data), inc.data.scenario.slo)
    text = to_text(rep)
    assert "Events (1:" in text and "follows deploy" in text and "lever surge-with-readiness" in text
    html = to_html(rep)
    assert "id='events'" in html and "id='event-breaches'" in html and "surge-with-readiness" in html
    back = json.loads(json.dumps(rep))
    assert back["events"][0]["kind"] == N.EVENT_DEPLOY and back["event_summary"]["share"] > 0.9


@pytest.mark.parametrize("name", [n for n in S.SCENARIOS if n != "healthy"])
def test_a_breach_already_there_before_the_event_is_not_its(name: str) -> None:
    """A deploy in the middle of each single-cause scenario: a steady fault breaches every window and
    is not the deploy's; the bursty saturation (met in one window, breached after the deploy) is
    attributed, with the caveat that its earlier breaches follow no event; the cold start is over."""
    data = S.generate(name, 1500, seed=1, duration_s=300.0)
    mid = int(data.requests["start_unix_ns"].min() // 1_000_000) + 150_000
    ev = {"time_unix_ms": mid, "end_unix_ms": None, "kind": N.EVENT_DEPLOY, "source": N.EVENT_SOURCE_FILE,
          "target": "x", "description": "v1 -> v2", "detail": {}}  # fmt: skip
    rep = analyze(_con(data), data.scenario.slo, events=[ev])
    assert rep["events"] == [ev]
    got = [eb for eb in rep["event_breaches"] if eb["event"] is not None]
    if name == "saturated":
        assert len(got) == 1 and "follow no event" in got[0]["caveat"]
    else:
        assert got == [] and not (_levers(rep) & EVENT_LEVERS)


def test_a_breach_before_the_event_is_not_its() -> None:
    inc = SE.generate_event_incident("hpa-scale-pending", seed=3)
    late = {"time_unix_ms": T0_MS + 290_000, "end_unix_ms": None, "kind": N.EVENT_MODEL_SWAP,
            "source": N.EVENT_SOURCE_FILE, "target": "x", "description": "swap", "detail": {}}  # fmt: skip
    rep = analyze(_con(inc.data, metrics=False), inc.data.scenario.slo, events=[late])
    assert [eb["event"] for eb in rep["event_breaches"]] == [None]


def test_episodes_need_a_met_window_before() -> None:
    w = [{"start_unix_ms": i * 60_000, "seconds": 60.0, "breached": b} for i, b in enumerate([1, 0, 1, 1, 0, 1])]
    got = episodes(w)
    assert [(e["start_unix_ms"], e["windows"], e["met_before"]) for e in got] == [
        (0, 1, False), (120_000, 2, True), (300_000, 1, True),
    ]  # fmt: skip


def test_scale_down_names_no_lever_and_config_asks_to_compare(tmp_path: Path) -> None:
    inc = SE.generate_event_incident("hpa-scale-pending", seed=1)
    for kind, extra in ((N.EVENT_SCALE, {"replicas_from": 5, "replicas_to": 2}), (N.EVENT_CONFIG, {})):
        f = tmp_path / f"{kind}.jsonl"
        f.write_text(json.dumps({"time": (T0_MS + 184_000) / 1000, "kind": kind, **extra}) + "\n")
        rep = analyze(_con(inc.data, metrics=False), inc.data.scenario.slo, events=read_events_file(f))
        (eb,) = [e for e in rep["event_breaches"] if e["event"] is not None]
        assert [lv["lever"] for lv in eb["levers"]] == [None]
        assert ("scale-down" if kind == N.EVENT_SCALE else "compare the settings") in eb["levers"][0]["rationale"]


@pytest.mark.parametrize(
    ("name", "lever"),
    [("rolling-update-cold-start", N.LEVER_PREWARM), ("hpa-scale-pending", N.LEVER_SCALE_AHEAD)],
)
def test_model_swap_from_stagescope_model_load_counter(name: str, lever: str) -> None:
    """A reload seen in stagescope's own counter: requests that waited for the load in cold_start mean
    it reloaded in place (prewarm: load beside, then swap); else scale out ahead of the swap."""
    inc = SE.generate_event_incident(name, seed=1)
    data = S.SynthData(inc.data.scenario, inc.data.requests, inc.data.stages)
    lab = {N.LABEL_MODEL: "resnet"}
    for s in range(0, 301, 15):
        loads = 1.0 if s < (135 if name.startswith("rolling") else 195) else 2.0
        data.metrics.append((N.METRIC_MODEL_LOADS, lab, loads, T0_MS + s * 1000))
        data.metrics.append((N.METRIC_MODEL_READY, lab, 0.0 if 135 <= s < 195 else 1.0, T0_MS + s * 1000))
    rep = analyze(_con(data), data.scenario.slo)
    (ev,) = rep["events"]
    assert ev["kind"] == N.EVENT_MODEL_SWAP and ev["end_unix_ms"] - T0_MS == 195_000
    (eb,) = [e for e in rep["event_breaches"] if e["event"] is not None]
    assert eb["levers"][0]["lever"] == lever


def test_events_file_reader_accepts_both_time_forms(tmp_path: Path) -> None:
    f = tmp_path / "ev.jsonl"
    f.write_text(
        '{"time": "2025-11-20T12:00:05+01:00", "kind": "deploy", "team": "ml"}\n\n'
        '{"time": 1763640005.25, "end": 1763640065, "kind": "scale", "replicas_from": 2, "replicas_to": 4}\n'
    )
    a, b = read_events_file(f)  # by time
    assert a["time_unix_ms"] == 1763636405000 and a["detail"] == {"team": "ml", "file": "ev.jsonl:1"}
    assert b["time_unix_ms"] == 1763640005250 and b["end_unix_ms"] == 1763640065000
    f.write_text('{"time": "2026-11-20T12:00:05Z", "kind": "rollout"}\n')
    with pytest.raises(UserError, match=r"ev.jsonl:1: unknown kind 'rollout'"):
        read_events_file(f)


def test_cli_events_option(tmp_path: Path) -> None:
    inc = SE.generate_event_incident("rolling-update-cold-start", 1500, seed=6)
    traces = tmp_path / "spans.jsonl"
    S.write_otlp(inc.data, traces)
    events = inc.write_events(tmp_path / "events.jsonl")
    out = tmp_path / "report.json"
    argv = ["analyze", "--traces", str(traces), "--slo", "p99<300ms", "--events", str(events), "--format", "json"]
    assert main([*argv, "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["events"][0]["source"] == N.EVENT_SOURCE_FILE
    assert any(lv["lever"] == N.LEVER_SURGE_READINESS for eb in rep["event_breaches"] for lv in eb["levers"])


def test_event_kinds_are_not_stage_kinds() -> None:
    """Event rules share levers.RULES with the stage rules, keyed by kind: the vocabularies never meet."""
    assert not set(N.EVENT_KINDS) & {*N.KINDS, N.KIND_UNKNOWN, N.UNATTRIBUTED}


# -- the event levers fire on none of the existing incidents ------------------------------------------------


@pytest.mark.parametrize("name", list(S.SCENARIOS))
def test_event_levers_fire_on_no_scenario(name: str) -> None:
    data = S.generate(name, 800, seed=1)
    rep = analyze(_con(data), data.scenario.slo)
    assert rep["events"] == [] and not (_levers(rep) & EVENT_LEVERS)


@pytest.mark.parametrize("name", list(M.MULTI))
def test_event_levers_fire_on_no_multi_cause_incident(name: str) -> None:
    inc = M.generate_multi(name, 1000, seed=1)
    rep = analyze(_con(inc.data), inc.data.scenario.slo)
    assert rep["events"] == [] and not (_levers(rep) & EVENT_LEVERS)


@pytest.mark.parametrize("layout", SEN.LAYOUTS)
@pytest.mark.parametrize("fault", list(SEN.FAULTS))
def test_event_levers_fire_on_no_engine_fault(tmp_path: Path, fault: str, layout: str) -> None:
    from stagescope.analysis.ingest import load_dataset
    from stagescope.analysis.synth import write_otlp_lines

    outer = layout != "standalone"
    tl = SEN.timelines(300, fault, seed=1, pre_ms=8.0 if outer else 0.0, post_ms=3.0 if outer else 0.0)
    f = tmp_path / "spans.jsonl"
    write_otlp_lines(f, SEN.vllm_spans(tl, layout=layout))
    ds = load_dataset(traces=[f])
    rep = analyze(ds, "ttft:p95<500ms")
    assert rep["events"] == [] and not (_levers(rep) & EVENT_LEVERS)
    ds.close()


def _ksm_exposition(tmp_path: Path) -> Path:
    """Four scrapes of kube-state-metrics' text exposition, lines as its own store tests write them
    (kubernetes/kube-state-metrics internal/store/deployment_test.go and pod_test.go: HELP/TYPE lines,
    labels in its order), with millisecond timestamps: depl1's generation rises at the third scrape, a
    new pod is Pending at it and Running at the fourth."""
    t0 = T0_MS
    gen = [21, 21, 22, 22]
    upd = [200, 200, 150, 200]
    unav = [0, 0, 10, 0]
    lines = [
        "# HELP kube_deployment_metadata_generation Sequence number representing a specific generation of the desired state.",
        "# TYPE kube_deployment_metadata_generation gauge",
        "# HELP kube_pod_status_phase The pods current phase.",
        "# TYPE kube_pod_status_phase gauge",
    ]
    pod = 'namespace="ns1",pod="depl1-7b9f6c8d5-x2kqp",uid="uid1"'
    for i in range(4):
        ts = t0 + i * 15_000
        lines += [
            f'kube_deployment_metadata_generation{{namespace="ns1",deployment="depl1"}} {gen[i]} {ts}',
            f'kube_deployment_status_observed_generation{{namespace="ns1",deployment="depl1"}} {gen[i]} {ts}',
            f'kube_deployment_spec_replicas{{namespace="ns1",deployment="depl1"}} 200 {ts}',
            f'kube_deployment_status_replicas_updated{{namespace="ns1",deployment="depl1"}} {upd[i]} {ts}',
            f'kube_deployment_status_replicas_unavailable{{namespace="ns1",deployment="depl1"}} {unav[i]} {ts}',
            f'kube_deployment_spec_strategy_rollingupdate_max_surge{{deployment="depl1",namespace="ns1"}} 20 {ts}',
            f'kube_deployment_metadata_generation{{namespace="ns2",deployment="depl2"}} 14 {ts}',
            f'kube_deployment_spec_replicas{{namespace="ns2",deployment="depl2"}} 5 {ts}',
        ]
        if i >= 2:
            lines += [
                f'kube_pod_status_phase{{{pod},phase="Pending"}} {int(i == 2)} {ts}',
                f'kube_pod_status_phase{{{pod},phase="Running"}} {int(i == 3)} {ts}',
                f"kube_pod_created{{{pod}}} {(t0 + 22_000) / 1000:.0f} {ts}",
            ]
    f = tmp_path / "ksm.prom"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_kube_state_metrics_exposition_through_the_metrics_reader(tmp_path: Path) -> None:
    from stagescope.analysis.events import derived_events
    from stagescope.analysis.ingest import load_dataset

    inc = SE.generate_event_incident("rolling-update-cold-start", 300, seed=1)
    traces = tmp_path / "spans.jsonl"
    S.write_otlp(inc.data, traces)
    ds = load_dataset(traces=[traces], metrics=[_ksm_exposition(tmp_path)])
    (ev,) = derived_events(ds.con)  # depl2 never changed: no event
    assert (ev["kind"], ev["target"], ev["source"]) == (N.EVENT_DEPLOY, "ns1/depl1", N.EVENT_SOURCE_KSM)
    assert ev["time_unix_ms"] - T0_MS == 30_000 and ev["detail"]["since_unix_ms"] - T0_MS == 15_000
    assert ev["end_unix_ms"] - T0_MS == 45_000  # every replica updated, none unavailable
    (pod,) = ev["detail"]["pods_pending"]
    assert pod["pod"] == "depl1-7b9f6c8d5-x2kqp" and pod["pending_s"] == 15.0
    ds.close()
