"""How much of a llama-slots-busy lever check's miss is the outside load that changed between its two
runs: read recorded runs of ``stagescope demo --engine llama-cpp --scenario llama-slots-busy
--apply-lever --out RUN`` and print, per run, one Markdown row (docs/llama_cpp_slots_operating_point.md):

* the outside cores beside the baseline and beside the lever run (lever_check.json: the cores work
  outside the run took at the servers' priority or above), and the check as made (predicted, error);
* the baseline re-analysed with the CPU budget's outside load set to the LEVER run's (measured during
  it, so not a prediction: what the model gives when told the machine's other load), first with the
  outside work sharing the cores as analysis.cpu_budget.outside_share has it (its ``ceil(outside)``
  threads get at most a busy server's share: the added server squeezes them), then unsqueezed (it
  keeps the cores it took, as many threads, or a demand under its fair share, would);
* the lever run's measured p95;

then a second table: the outside cores over the baseline's last WINDOW_S seconds (what a look at the
machine right before the lever run would see) and the lever run's first WINDOW_S seconds, beside the
whole baseline's and the whole lever run's (from the recorded counters,
``stagescope_host_cpu_competing_seconds_total`` less the run's own processes' CPU, per window).

Offline, no timing: it reads the recordings only (it swaps two functions of analysis.cpu_budget for the
re-analyses). ``python benchmarks/slot_outside.py RUN [RUN ...]``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from stagescope import names as N

#: The window (s) of the second table.
WINDOW_S = 10.0

_COUNTER = re.compile(f"({N.METRIC_PROCESS_CPU}|{N.METRIC_HOST_CPU_COMPETING})" r"(\{[^}]*\})? (\S+) (\d+)$")


def _counters(folder: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """``{(metric, labels): [(s, value)]}`` of the CPU counters in a run's scrape files."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for f in sorted(folder.glob("scrape-*.prom")):
        for line in f.read_text(encoding="utf-8").splitlines():
            m = _COUNTER.match(line)
            if m:
                out.setdefault((m.group(1), m.group(2) or ""), []).append((int(m.group(4)) / 1000.0, float(m.group(3))))
    return out


def _outside(series: dict[tuple[str, str], list[tuple[float, float]]], t0: float, t1: float) -> float | None:
    """Cores outside the run over ``[t0, t1]``: the host's competing CPU rate less the run's processes'."""
    host, own = None, 0.0
    for (name, _), pts in series.items():
        p = [x for x in pts if t0 - 1e-6 <= x[0] <= t1 + 1e-6]
        if len(p) < 2 or p[-1][0] <= p[0][0]:
            continue
        rate = (p[-1][1] - p[0][1]) / (p[-1][0] - p[0][0])
        if name == N.METRIC_HOST_CPU_COMPETING:
            host = rate
        else:
            own += rate
    return None if host is None else max(0.0, host - own)


def window_row(run: Path) -> str:
    b, lv = _counters(run / "metrics"), _counters(run / "lever" / "metrics")
    bt, lt = [t for p in b.values() for t, _ in p], [t for p in lv.values() for t, _ in p]
    if not bt or not lt:
        return f"| {run} | (no CPU counters recorded) | | | | |"
    b0, b1, l0, l1 = min(bt), max(bt), min(lt), max(lt)
    cells = [_outside(b, b0, b1), _outside(b, b1 - WINDOW_S, b1), _outside(lv, l0, l0 + WINDOW_S), _outside(lv, l0, l1)]
    return f"| {run} | {l0 - b1:.0f} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |"


def _predicted(run: Path, spec: str, outside: float, squeeze: bool) -> float:
    from stagescope.analysis import cpu_budget as CB
    from stagescope.analysis.api import analyze
    from stagescope.analysis.ingest import load_dataset
    from stagescope.slo import parse_slo

    keep_budget, keep_share = CB.baseline_budget, CB.outside_share

    def budget(con: Any, stages: list[str]) -> Any:
        b = keep_budget(con, stages)
        return None if b is None else dataclasses.replace(b, outside_cores=outside)

    def kept(b: Any, *, left: float, servers: int) -> float:
        return min(b.outside_cores, max(left, 0.0))

    CB.baseline_budget = budget  # type: ignore[assignment]
    if not squeeze:
        CB.outside_share = kept  # type: ignore[assignment]
    try:
        ds = load_dataset(traces=[run / "spans"], metrics=[run / "metrics"], results=[run / "results.parquet"],
                          skip_bad=True)  # fmt: skip
        rep = analyze(ds, parse_slo(spec)[0])
    finally:
        CB.baseline_budget, CB.outside_share = keep_budget, keep_share
    lever: dict[str, Any] = next((x for x in rep["levers"] if x["lever"] == "scale-out"), {})
    got = lever.get("predicted_p99_ms")
    if got is None:
        raise SystemExit(f"slot_outside: {run}: the re-analysis gave no scale-out prediction")
    return float(got)


def row(run: Path) -> str:
    lc = json.loads((run / "lever_check.json").read_text(encoding="utf-8"))
    after, before_out, after_out = lc["p99_after_ms"], lc["outside_cores_before"], lc["outside_cores_after"]
    if None in (after, lc["predicted_p99_ms"], before_out, after_out):
        return f"| {run} | (no outside load or no prediction recorded) | | | | |"
    given = [_predicted(run, lc["slo"], float(after_out), sq) for sq in (True, False)]
    cells = " | ".join(f"{g:,.0f} ({after / g - 1:+.0%})" for g in given)
    return (f"| {run} | {before_out:.2f} / {after_out:.2f} | {lc['predicted_p99_ms']:,.0f} "
            f"({lc['prediction_error']:+.0%}) | {cells} | {after:,.0f} |")  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print("usage: python benchmarks/slot_outside.py RUN [RUN ...] (demo --out folders of llama-slots-busy "
              "--apply-lever runs)", file=sys.stderr)  # fmt: skip
        return 2
    runs = [Path(a) for a in argv]
    for run in runs:
        need = [run / "lever_check.json", run / "results.parquet", run / "spans", run / "metrics"]
        missing = [str(x) for x in need if not x.exists()]
        if missing:
            print(f"slot_outside: {run} is not a slots-busy --apply-lever run folder (missing {missing[0]})",
                  file=sys.stderr)  # fmt: skip
            return 2
    print("| run | outside cores, baseline / lever run | predicted (error) | at the lever run's outside load, "
          "squeezed (error) | the same, unsqueezed (error) | measured after |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for run in runs:
        print(row(run))
    print(f"\n| run | s between the runs | outside cores: baseline | its last {WINDOW_S:g} s | lever run's first "
          f"{WINDOW_S:g} s | lever run |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for run in runs:
        print(window_row(run))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
