"""The demo's flow: run, verdict, optional lever check, ``--all`` table. See :mod:`stagescope.demo.cli`."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stagescope.analysis import intervals as I
from stagescope.analysis.report import status
from stagescope.demo.runner import RunResult, check_port_free, run_scenario
from stagescope.errors import EXIT_NO_DATA, UserError
from stagescope.names import STATUS_NO_DATA
from stagescope.paths import ensure_writable_dir
from stagescope.service.engines import DEFAULT_ENGINE, get_engine

__all__ = ["lever_check", "run_all", "run_one"]

# tables are wide: off a terminal (CI logs, files) do not wrap them at rich's 80-column default
out_console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def _prepare(engine: str) -> None:
    """Build (or find cached) what the engine needs, before any service starts; say what it is."""
    eng = get_engine(engine)
    eng.check_available()
    if eng.name != DEFAULT_ENGINE:
        err_console.print(f"engine [cyan]{eng.name}[/cyan]: preparing (the first run builds its model)")
    what = eng.prepare()
    if what:
        err_console.print(f"  {what}")


def _sizing(engine: str, name: str) -> dict[str, Any]:
    """The engine's settings sizing scenario ``name`` to this machine (one measurement, used for the run
    and its lever check alike), said on stderr."""
    eng = get_engine(engine)
    overrides, what = eng.sizing(eng.get_scenario(name))
    if what:
        err_console.print(f"  {what}")
    return overrides


def _duration(duration_s: float, sized: dict[str, Any]) -> float:
    """The run's duration: the sizing may ask for a longer one (enough arrivals for the SLO's quantile)."""
    from stagescope.demo.runner import run_duration

    dur = run_duration(duration_s, sized)
    if dur > duration_s:
        err_console.print(f"  runs last {dur:g} s (not {duration_s:g}): the sizing asks for enough arrivals for the SLO's quantile")
    return dur


def _run(
    name: str, out: Path, *, duration_s: float, apply_lever: bool, port: int, label: str,
    engine: str = DEFAULT_ENGINE, overrides: dict[str, Any] | None = None,
) -> RunResult:  # fmt: skip
    from stagescope.demo.runner import apply_workload
    from stagescope.loadgen.display import LiveProgress

    eng = get_engine(engine)
    sc, _ = apply_workload(eng.get_scenario(name), overrides)  # its rate as sized to the machine
    ensure_writable_dir(out, "the demo's output there")  # one line, before any output
    if port:
        check_port_free(port)
    lever = f" with {sc.lever} applied" if apply_lever else ""
    err_console.print(
        f"[bold]{label}[/bold] scenario [cyan]{name}[/cyan]{lever}: {eng.label}, "
        f"{sc.rate_rps:g} req/s on {sc.route} replaying the Azure conversation trace's arrivals for {duration_s:g} s"
    )
    with LiveProgress(err_console, duration_s, 0, enabled=err_console.is_terminal) as live:
        result = run_scenario(name, out=out, duration_s=duration_s, apply_lever=apply_lever, port=port or None,
                              progress=live.update, engine=eng.name, overrides=overrides)  # fmt: skip
    if result.archived is not None:
        err_console.print(f"  the earlier run's recordings in {out} were moved to {result.archived}")
    err_console.print(f"  recorded {result.requests_sent} requests into {out}; analysed -> {out / 'report.html'}")
    return result


def _measured(report: dict[str, Any]) -> str:
    return "no data" if status(report) == STATUS_NO_DATA else _ms(report.get("quantile_ms"))


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    from stagescope.analysis.report import headline

    return headline(report)


def _verdict_lever(report: dict[str, Any]) -> dict[str, Any]:
    """The lever entry of the report's verdict ({} without a verdict)."""
    v = report.get("verdict")
    if not v:
        return {}
    return next((x for x in report.get("levers") or [] if x.get("lever") == v.get("lever")), {})


def _predicted(report: dict[str, Any]) -> float | None:
    return _verdict_lever(report).get("predicted_p99_ms")


def _write_dashboards(out: Path) -> None:
    from stagescope.dashboards.build import build_dashboards

    build_dashboards(out / "dashboards")


def _accuracy(report: dict[str, Any]) -> float | None:
    """The served model's eval-set accuracy the service exported during the run (None if it did not)."""
    return ((report.get("model_quality") or {}).get("accuracy") or {}).get("serving")


def _stretch(report: dict[str, Any]) -> float | None:
    """Wall time over CPU time of the tail's batches: the tail's compute p50 (wall, from the spans)
    over the CPU time the service measured for the batch size nearest it (None without both). Above
    1 the batches waited for a core: the machine's other load, which no lever model sees."""
    serving = ((report.get("model_quality") or {}).get("batch_ms") or {}).get("serving") or {}
    comp = ((report.get("evidence") or {}).get("stage_quantiles") or {}).get("compute") or {}
    tail = comp.get("tail_p50_ms")
    cpu = [float(v) for v in serving.values() if v and float(v) > 0]
    if not tail or not cpu:
        return None
    return round(float(tail) / min(cpu, key=lambda v: abs(math.log(v / float(tail)))), 2)


def _run_cpu(run: RunResult) -> tuple[float | None, float | None]:
    """``(outside cores, engine CPU s per request)`` of a run (analysis.cpu_budget, from the CPU counters
    its gateway exported): the cores work outside the run took beside it at its priority or above, and
    what its engine servers took per request; None where it exported none (the SIMULATED engine, a
    fronted server, a gateway before the competing counter)."""
    from stagescope.analysis import cpu_budget as CB
    from stagescope.analysis.ingest import load_dataset
    from stagescope.names import METRIC_HOST_CPU_COMPETING, STAGE_DECODE, STAGE_PREFILL

    if run.engine == DEFAULT_ENGINE:
        return None, None
    scrapes = sorted((run.out / "metrics").glob("*.prom"))
    if not scrapes or METRIC_HOST_CPU_COMPETING not in scrapes[-1].read_text(encoding="utf-8", errors="replace"):
        return None, None
    ds = load_dataset(traces=[run.out / "spans"], metrics=[run.out / "metrics"], skip_bad=True)
    budget = CB.baseline_budget(ds.con, [STAGE_PREFILL, STAGE_DECODE])
    per = CB.engine_cpu_per_request(ds.con)
    return (None if budget is None else round(budget.outside_cores, 3)), (None if per is None else round(per, 4))


def lever_check(before: RunResult, after: RunResult) -> dict[str, Any]:
    """The ``lever_check.json`` record: measured quantile before and after with their 95 % intervals,
    the predicted one with its interval, the judgement of the measurement by those intervals
    (analysis.intervals.judge: ``within``, ``outside`` by ``outside_by_ms``, or ``too_short`` when
    either interval is unbounded), and the served model's eval-set accuracy before and after (as
    each run's service exported it). ``within_slo_after`` and ``judgement`` are None when the run
    after the lever had no samples (no data is never a verdict: ``no_data_reason_after`` says why)."""
    report = before.report
    v = report.get("verdict") or {}
    q_after = after.report.get("quantile_ms")
    no_data = status(after.report) == STATUS_NO_DATA or q_after is None
    predicted = _predicted(report)
    predicted_iv = _verdict_lever(report).get("interval_ms")
    after_iv = None if no_data else after.report.get("quantile_interval_ms")
    judged = None if no_data else I.judge(q_after, after_iv, predicted, predicted_iv)
    (out_before, cpu_before), (out_after, cpu_after) = _run_cpu(before), _run_cpu(after)
    return {
        "scenario": before.scenario,
        "engine": before.engine,
        "lever": v.get("lever"),
        "slo_ms": report["slo"]["threshold_ms"],
        "slo": report["slo"]["spec"],
        "p99_before_ms": report.get("quantile_ms"),
        "p99_before_interval_ms": report.get("quantile_interval_ms"),
        "predicted_p99_ms": predicted,
        "predicted_interval_ms": predicted_iv,
        "p99_after_ms": q_after,
        "p99_after_interval_ms": after_iv,
        "confidence": I.CONFIDENCE,
        # the measurement judged by the intervals: within / outside by X ms / too short to tell
        "judgement": None if judged is None else dataclasses.asdict(judged),
        # measured after / predicted - 1: how far the lever's effect model was from the engine
        "prediction_error": None if no_data or q_after is None or not predicted else round(q_after / predicted - 1, 4),
        "status_after": status(after.report),
        "within_slo_after": None if no_data else q_after <= report["slo"]["threshold_ms"],
        "no_data_reason_after": after.report.get("no_data_reason") if no_data else None,
        "accuracy_before": _accuracy(report),
        "accuracy_after": _accuracy(after.report),
        "quality_budget_points": report["slo"].get("quality_budget"),
        # a real engine's slow batches: wall over CPU time (the SIMULATED engine has no CPU time to compare)
        "batch_wall_over_cpu_before": _stretch(report) if before.engine != DEFAULT_ENGINE else None,
        "batch_wall_over_cpu_after": _stretch(after.report) if before.engine != DEFAULT_ENGINE else None,
        # the outside load beside each run (cores): the scale-out model assumes the baseline's persists;
        # and the engine servers' CPU s per request (more after the lever: the same work ran slower)
        "outside_cores_before": out_before,
        "outside_cores_after": out_after,
        "engine_cpu_s_per_request_before": cpu_before,
        "engine_cpu_s_per_request_after": cpu_after,
    }


def _after_words(check: dict[str, Any]) -> str:
    if check["within_slo_after"] is None:
        return f"no data after the lever: {check['no_data_reason_after'] or 'no samples'}"
    return f"SLO {check['slo_ms']:g} ms: {'met' if check['within_slo_after'] else 'still breached'}"


def _iv(iv: list[float | None] | None) -> str:
    """`` [lo, hi]`` of an interval in ms (an unbounded end: ``?``); ``""`` for none."""
    if not iv:
        return ""
    lo, hi = ("?" if x is None else f"{x:,.0f}" for x in iv)
    return f" [{lo}, {hi}]"


def _judged(check: dict[str, Any]) -> str:
    """The judgement by the intervals in a few words for the ``--all`` table."""
    j = check.get("judgement")
    if not j:
        return "-"
    if j["verdict"] == "within":
        return "within the interval"
    if j["verdict"] == "outside":
        return f"outside by {j['outside_by_ms']:g} ms"
    return "too short to tell"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.2f}%"


#: A lever check's measured quantile within this share of the predicted one keeps the prediction.
PREDICTION_TOLERANCE = 0.25


def _error_words(check: dict[str, Any]) -> str:
    err = check.get("prediction_error")
    if err is None:
        return ""
    kept = "within" if abs(err) <= PREDICTION_TOLERANCE else "NOT within"
    return f"; measured {err:+.0%} from the prediction, {kept} {PREDICTION_TOLERANCE:.0%}"


def _lever_run_settings(engine: str, sc: Any, lever: str | None, report: dict[str, Any], sized: dict[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(overrides for the lever run, the lever's settings as applied)``: the engine's sizing plus any
    value the analysis chose for the lever (llama-cpp: its running-batch cap as ``parallel``)."""
    chosen = get_engine(engine).lever_settings(lever, report)
    if chosen:
        err_console.print(f"  the lever check applies the analysis' setting: {chosen}")
    return {**sized, **chosen}, {**dict(sc.lever_overrides), **chosen}


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def run_one(
    name: str, out: Path, *, duration_s: float, apply_lever: bool, port: int, engine: str = DEFAULT_ENGINE
) -> int:
    sc = get_engine(engine).get_scenario(name)
    _prepare(engine)
    sized = _sizing(engine, name)
    duration_s = _duration(duration_s, sized)
    before = _run(name, out, duration_s=duration_s, apply_lever=False, port=port, label="run", engine=engine,
                  overrides=sized)  # fmt: skip
    _write_dashboards(out)
    for line in _verdict_lines(before.report):
        out_console.print(line)
    if before.interrupted:
        err_console.print("interrupted: the report covers what was recorded before Ctrl-C")
        return 130
    if status(before.report) == STATUS_NO_DATA:  # no data is never a verdict, nor a lever to check
        return EXIT_NO_DATA
    if not apply_lever:
        return 0
    verdict = before.report.get("verdict")
    if not verdict or verdict.get("lever") is None:
        out_console.print("No lever to apply: the SLO was met or no lever was found.")
        return 0
    if verdict["lever"] != sc.lever:
        raise UserError(
            f"the recommended lever {verdict['lever']!r} is not the one scenario {name!r} can apply ({sc.lever!r})"
        )
    lever_overrides, applied = _lever_run_settings(engine, sc, verdict["lever"], before.report, sized)
    after = _run(name, out / "lever", duration_s=duration_s, apply_lever=True, port=port, label="lever check",
                 engine=engine, overrides=lever_overrides)  # fmt: skip
    check = {**lever_check(before, after), "lever_settings": applied}
    (out / "lever_check.json").write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
    q = "p" + f"{before.report['slo']['objective'] * 100:g}"
    out_console.print(
        f"Lever check ({check['lever']}): {q} before {_ms(check['p99_before_ms'])}"
        f"{_iv(check['p99_before_interval_ms'])}, predicted {_ms(check['predicted_p99_ms'])}"
        f"{_iv(check['predicted_interval_ms'])}, measured after {_ms(check['p99_after_ms'])}"
        f"{_iv(check['p99_after_interval_ms'])} ({_after_words(check)}{_error_words(check)})"
    )
    if check["judgement"] is not None:
        out_console.print(f"  judged by the {I.CONFIDENCE:.0%} intervals: {check['judgement']['words']}")
    if check["accuracy_before"] is not None or check["accuracy_after"] is not None:
        budget = check["quality_budget_points"]
        out_console.print(
            f"Model accuracy on its held-out eval set: before {_pct(check['accuracy_before'])}, after "
            f"{_pct(check['accuracy_after'])}" + ("" if budget is None else f" (quality budget {budget:g} points)")
        )
    stretch = (check["batch_wall_over_cpu_before"], check["batch_wall_over_cpu_after"])
    if None not in stretch:
        out_console.print(
            f"Slow batches ran at {check['batch_wall_over_cpu_before']:g}x their CPU time in the first run and "
            f"{check['batch_wall_over_cpu_after']:g}x in the lever check (above 1: waiting for a core)"
        )
    outside = (check["outside_cores_before"], check["outside_cores_after"])
    per = (check["engine_cpu_s_per_request_before"], check["engine_cpu_s_per_request_after"])
    if None not in outside:
        out_console.print(
            f"Work outside the runs took {outside[0]:.2f} cores beside the first run and {outside[1]:.2f} beside "
            "the lever check (the prediction assumes the first run's load stays)"
            + (f"; the engine servers took {per[0]:.3f} and {per[1]:.3f} CPU s per request ({per[1] / per[0] - 1:+.0%})"
               if None not in per and per[0] else "")
        )
    return 130 if after.interrupted else 0


def run_all(
    out: Path, *, duration_s: float, apply_lever: bool, port: int, engine: str = DEFAULT_ENGINE
) -> int:
    scenarios = get_engine(engine).scenarios
    _prepare(engine)
    table = Table(title=f"stagescope demo --all ({engine} engine): found vs true cause")
    for col in ("scenario", "true stage", "true lever", "found stage", "found lever", "SLO", "measured",
                "predicted after lever", *(["measured after lever", "after vs predicted", "judged by intervals"] if apply_lever else []),
                "ok"):  # fmt: skip
        table.add_column(col)
    rows: list[dict[str, Any]] = []
    wrong_cause = slo_missed = slo_missed_predicted = 0
    for name, sc in scenarios.items():
        sized = _sizing(engine, name)
        dur = _duration(duration_s, sized)
        res = _run(name, out / name, duration_s=dur, apply_lever=False, port=port, label=name,
                   engine=engine, overrides=sized)  # fmt: skip
        v = res.report.get("verdict") or {}
        found_stage, found_lever = v.get("stage"), v.get("lever")
        ok = (found_stage, found_lever) == (sc.true_stage, sc.lever) and res.report["breached"] == sc.breach
        wrong_cause += not ok
        slo = (res.report.get("slo") or {}).get("spec") or sc.slo_spec  # as sized to the machine
        row: dict[str, Any] = {
            "scenario": name, "true_stage": sc.true_stage, "true_lever": sc.lever, "found_stage": found_stage,
            "found_lever": found_lever, "slo": slo, "measured_ms": res.report.get("quantile_ms"),
            "predicted_ms": _predicted(res.report), "ok": ok,
        }  # fmt: skip
        if apply_lever and sc.lever is not None and ok:
            lever_overrides, applied = _lever_run_settings(engine, sc, found_lever, res.report, sized)
            after = _run(name, out / name / "lever", duration_s=dur, apply_lever=True, port=port,
                         label=f"{name} lever", engine=engine, overrides=lever_overrides)  # fmt: skip
            check = {**lever_check(res, after), "lever_settings": applied}
            (out / name / "lever_check.json").write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
            row["after_ms"] = check["p99_after_ms"]
            row["prediction_error"] = check["prediction_error"]
            row["judgement"] = check["judgement"]
            row["judged"] = _judged(check)
            # a miss the analysis predicted (the lever's predicted quantile above the threshold: the
            # report's plan goes on) is a right prediction; one it did not, or no data after, fails
            predicted_miss = row["predicted_ms"] is not None and row["predicted_ms"] > check["slo_ms"]
            row["slo_missed_as_predicted"] = check["within_slo_after"] is False and predicted_miss
            slo_missed_predicted += row["slo_missed_as_predicted"]
            slo_missed += not check["within_slo_after"] and not row["slo_missed_as_predicted"]
            ok = ok and (bool(check["within_slo_after"]) or row["slo_missed_as_predicted"])
            row["ok"] = ok
        rows.append(row)
        table.add_row(
            name, sc.true_stage or "-", sc.lever or "-", found_stage or "-", found_lever or "-", slo,
            _measured(res.report), _ms(row["predicted_ms"]),
            *([_ms(row.get("after_ms")), _signed(row.get("prediction_error")), row.get("judged", "-")]
              if apply_lever else []),
            "yes" if ok else "[red]NO[/red]",
        )  # fmt: skip
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    out_console.print(table)
    if wrong_cause:
        print(f"stagescope demo: {wrong_cause} scenario(s) did not match their true cause", file=sys.stderr)
    if slo_missed_predicted:
        print(f"stagescope demo: {slo_missed_predicted} lever check(s) left the SLO breached, as the analysis predicted "
              "(the lever alone is not enough: each report's plan says what comes next)")  # fmt: skip
    if slo_missed:
        print(f"stagescope demo: {slo_missed} lever check(s) left the SLO breached (cause found, lever applied)",
              file=sys.stderr)  # fmt: skip
    return 1 if wrong_cause or slo_missed else 0
