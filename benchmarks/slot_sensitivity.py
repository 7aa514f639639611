"""How far a llama-slots-busy lever check can trust its scale-out prediction: read recorded runs of
``stagescope demo --engine llama-cpp --scenario llama-slots-busy --apply-lever --out RUN`` and print,
per run, one Markdown row (docs/llama_cpp_slots_operating_point.md):

* the check itself (lever_check.json): before, predicted [interval], after, error;
* the sensitivity: the baseline re-analysed with the slot times' drift fixed at ``--drift`` (the
  model's own replays at slot times ``1 -/+ drift``), and how much the p95 moves per slot time;
* the share of the lever run's requests that waited for a slot (gateway ``queue`` span over 5 ms);
* the p95 of the client's TTFT less the gateway's queue, baseline / lever run (the first token
  without the wait, which the model keeps as the baseline measured it);
* the slowdown with every slot of both servers busy: the model's (``2+2 busy xF`` in its rationale)
  against the lever run's own (median hold spent mostly at 2+2 over the baseline's median hold with
  both slots busy).

Offline, no timing: it reads the recordings only. ``python benchmarks/slot_sensitivity.py RUN [RUN ...]``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

Hold = tuple[float, float, str]  # (start ms, end ms, replica)


def _spans(run: Path) -> dict[str, dict[str, Any]]:
    """``{trace id: {"queue": ms, "s": first stream start ms, "e": last stream end ms, "r": replica}}``."""
    by: dict[str, dict[str, Any]] = defaultdict(dict)
    for f in sorted((run / "spans").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        t, name = s["traceId"], s["name"]
                        a, b = int(s["startTimeUnixNano"]) / 1e6, int(s["endTimeUnixNano"]) / 1e6
                        if name == "queue":
                            by[t]["queue"] = b - a
                        elif name in ("prefill", "decode"):
                            by[t]["s"], by[t]["e"] = min(by[t].get("s", math.inf), a), max(by[t].get("e", 0.0), b)
                        for x in s.get("attributes", []):
                            if x["key"] == "stagescope.replica":
                                by[t]["r"] = str(next(iter(x["value"].values())))
    return by


def _q(xs: list[float], p: float) -> float:
    ys = sorted(xs)
    return ys[max(0, math.ceil(p * len(ys)) - 1)]


def _non_queue_p95(run: Path, by: dict[str, dict[str, Any]]) -> float:
    import polars as pl

    r = pl.read_parquet(run / "results.parquet").select("trace_id", "ttft_ms").drop_nulls()
    return _q([t - by[tr].get("queue", 0.0) for tr, t in r.iter_rows() if tr in by], 0.95)


def _median_at(holds: list[Hold], own: int, others: int) -> float | None:
    """Median hold of the requests that spent at least 70 % of their hold at occupancy ``own+others``."""
    got = []
    for s, e, r in holds:
        hits = 0
        for i in range(40):
            t = s + (e - s) * (i + 0.5) / 40
            o = sum(1 for a, b, x in holds if x == r and a <= t < b)
            hits += o == own and sum(1 for a, b, _ in holds if a <= t < b) - o == others
        if hits >= 28:
            got.append(e - s)
    return statistics.median(got) if len(got) >= 3 else None


def _holds(by: dict[str, dict[str, Any]]) -> list[Hold]:
    return [(v["s"], v["e"], v.get("r", "0")) for v in by.values() if "s" in v]


def _sensitivity(run: Path, spec: str, drift: float) -> tuple[float, float, float]:
    """``(predicted, at slots x(1 - drift), at x(1 + drift))`` from the baseline re-analysed."""
    from stagescope.analysis import queueing as Q
    from stagescope.analysis.api import analyze
    from stagescope.analysis.ingest import load_dataset
    from stagescope.slo import parse_slo

    keep = Q.speed_drift
    Q.speed_drift = lambda *_a, **_k: drift  # type: ignore[assignment]
    try:
        ds = load_dataset(traces=[run / "spans"], metrics=[run / "metrics"], results=[run / "results.parquet"],
                          skip_bad=True)  # fmt: skip
        rep = analyze(ds, parse_slo(spec)[0])
    finally:
        Q.speed_drift = keep
    lever = next(x for x in rep["levers"] if x["lever"] == "scale-out")
    m = re.search(r"give ([\d,]+) to ([\d,]+) ms", lever["rationale"])
    if m is None or lever.get("predicted_p99_ms") is None:
        raise SystemExit(f"slot_sensitivity: {run}: the scale-out model did not replay the slots")
    lo, hi = (float(x.replace(",", "")) for x in m.groups())
    return float(lever["predicted_p99_ms"]), lo, hi


def row(run: Path, drift: float) -> str:
    lc = json.loads((run / "lever_check.json").read_text(encoding="utf-8"))
    base, after = _spans(run), _spans(run / "lever")
    pred, lo, hi = _sensitivity(run, lc["slo"], drift)
    waited = sum(1 for v in after.values() if v.get("queue", 0.0) > 5.0) / max(1, len(after))
    rep = json.loads((run / "report.json").read_text(encoding="utf-8"))
    rationale = next(x for x in rep["levers"] if x["lever"] == "scale-out")["rationale"]
    model = re.search(r"2\+2 busy x([\d.]+)", rationale)
    b2, l22 = _median_at(_holds(base), 2, 0), _median_at(_holds(after), 2, 2)
    own = f"x{l22 / b2:.2f}" if b2 and l22 else "-"
    pi = lc["predicted_interval_ms"] or [None, None]
    band = f"[{pi[0]:,.0f}, {pi[1]:,.0f}]" if None not in pi else ""
    return (f"| {run.name} | {lc['slo']} | {lc['p99_before_ms']:,.0f} | {lc['predicted_p99_ms']:,.0f} {band} | "
            f"{lc['p99_after_ms']:,.0f} | {lc['prediction_error']:+.0%} | {lo:,.0f} / {hi:,.0f} "
            f"({(hi - lo) / pred / (2 * drift):.1f}x) | {waited:.0%} | {_non_queue_p95(run, base):.0f} / "
            f"{_non_queue_p95(run / 'lever', after):.0f} | x{model.group(1) if model else '-'} / {own} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="demo --out folders of llama-slots-busy --apply-lever runs")
    p.add_argument("--drift", type=float, default=0.10, help="slot-time change for the sensitivity (default 0.10)")
    a = p.parse_args(argv)
    if not 0 < a.drift < 0.5:
        print(f"slot_sensitivity: --drift must be between 0 and 0.5, got {a.drift:g}", file=sys.stderr)
        return 2
    for run in a.runs:
        need = [run / "lever_check.json", run / "report.json", run / "results.parquet", run / "lever" / "spans"]
        missing = [str(x) for x in need if not x.exists()]
        if missing:
            print(f"slot_sensitivity: {run} is not a slots-busy --apply-lever run folder (missing {missing[0]})",
                  file=sys.stderr)  # fmt: skip
            return 2
    print(f"| run | SLO | before | predicted [interval] | after | error | slots x{1 - a.drift:g} / x{1 + a.drift:g} "
          "(p95 per slot time) | waited (lever run) | non-queue TTFT p95, before / after | 2+2 slowdown, model / run |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in a.runs:
        print(row(run, a.drift), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
