"""The three families of new levers (issue 18: workload, fleet, deploy/scale events) were built side by
side; here each family's SYNTHETIC incidents are checked against the other families' levers: on every
incident, no new lever but its own is named (per stage, per plan step, per breach that follows an
event)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import pytest

from stagescope import names as N
from stagescope.analysis import synth_events as SE
from stagescope.analysis import synth_fleet as F
from stagescope.analysis import synth_scenarios as S
from stagescope.analysis import synth_workload as W
from stagescope.analysis.api import analyze

WORKLOAD = {N.LEVER_SEPARATE_PREFILL_DECODE, N.LEVER_CAP_PROMPT_TOKENS, N.LEVER_CONTINUOUS_BATCHING,
            N.LEVER_CASCADE_SMALL_MODEL}  # fmt: skip
FLEET = {N.LEVER_SCALE_ON_QUEUE_DEPTH, N.LEVER_CONCURRENCY_LIMIT, N.LEVER_KV_CACHE_AWARE_ROUTING}
EVENTS = {N.LEVER_SURGE_READINESS, N.LEVER_PREWARMED_PODS, N.LEVER_SCALE_AHEAD}
NEW = WORKLOAD | FLEET | EVENTS


def _named(rep: dict[str, Any]) -> set[str]:
    got = {lv["lever"] for lv in rep.get("levers") or []} | {s["lever"] for s in rep.get("plan") or []}
    got |= {lv["lever"] for eb in rep.get("event_breaches") or [] for lv in eb["levers"]}
    for sub in rep.get("routes") or []:
        got |= _named(sub)
    return {lv for lv in got if lv is not None}


def _workload(name: str) -> tuple[dict[str, Any], set[str]]:
    inc = W.generate(name, 1500, seed=1)
    con = duckdb.connect()
    W.to_tables(con, inc)
    return analyze(con, inc.slo), {inc.data.scenario.lever}


def _fleet(name: str) -> tuple[dict[str, Any], set[str]]:
    inc = F.generate_fleet(name, seed=3)
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    return analyze(con, inc.data.scenario.slo), {inc.data.scenario.lever}


def _event(name: str) -> tuple[dict[str, Any], set[str]]:
    inc = SE.generate_event_incident(name, seed=2)
    con = duckdb.connect()
    S.to_tables(con, inc.data)
    return analyze(con, inc.data.scenario.slo), {inc.lever, inc.data.scenario.lever}


CASES: list[tuple[str, Callable[[str], tuple[dict[str, Any], set[str]]]]] = (
    [(n, _workload) for n in W.WORKLOAD] + [(n, _fleet) for n in F.FLEET] + [(n, _event) for n in SE.EVENT_INCIDENTS]
)


@pytest.mark.parametrize(("name", "run"), CASES, ids=[c[0] for c in CASES])
def test_no_other_familys_lever_fires_on_an_incident(name: str, run: Callable[[str], Any]) -> None:
    rep, own = run(name)
    assert rep["status"] == N.STATUS_BREACHED
    assert own <= _named(rep) | {None}, (name, _named(rep))
    assert (_named(rep) & NEW) <= own, (name, _named(rep) & NEW - own)
