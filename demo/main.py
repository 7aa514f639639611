"""The demo's flow: run, verdict, optional lever check, ``--all`` table. See :mod:`stagescope.demo.cli`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stagescope.analysis.report import status
from stagescope.demo.runner import RunResult, check_port_free, run_scenario
from stagescope.errors import EXIT_NO_DATA, UserError
from stagescope.names import STATUS_NO_DATA
from stagescope.paths import ensure_writable_dir
from stagescope.service.scenarios import SCENARIOS, get_scenario

__all__ = ["lever_check", "run_all", "run_one"]

# tables are wide: off a terminal (CI logs, files) do not wrap them at rich's 80-column default
out_console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def _run(name: str, out: Path, *, duration_s: float, apply_lever: bool, port: int, label: str) -> RunResult:
    from stagescope.loadgen.display import LiveProgress

    sc = get_scenario(name)
    ensure_writable_dir(out, "the demo's output there")  # one line, before any output
    if port:
        check_port_free(port)
    lever = f" with {sc.lever} applied" if apply_lever else ""
    err_console.print(
        f"[bold]{label}[/bold] scenario [cyan]{name}[/cyan]{lever}: reference service (SIMULATED accelerator), "
        f"{sc.rate_rps:g} req/s on {sc.route} replaying the Azure conversation trace's arrivals for {duration_s:g} s"
    )
    with LiveProgress(err_console, duration_s, 0, enabled=err_console.is_terminal) as live:
        result = run_scenario(name, out=out, duration_s=duration_s, apply_lever=apply_lever, port=port or None,
                              progress=live.update)  # fmt: skip
    if result.archived is not None:
        err_console.print(f"  the earlier run's recordings in {out} were moved to {result.archived}")
    err_console.print(f"  recorded {result.requests_sent} requests into {out}; analysed -> {out / 'report.html'}")
    return result


def _measured(report: dict[str, Any]) -> str:
    return "no data" if status(report) == STATUS_NO_DATA else _ms(report.get("quantile_ms"))


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    from stagescope.analysis.report import headline

    return headline(report)


def _predicted(report: dict[str, Any]) -> float | None:
    v = report.get("verdict")
    if not v:
        return None
    return next((x["predicted_p99_ms"] for x in report["levers"] if x["lever"] == v["lever"]), None)


def _write_dashboards(out: Path) -> None:
    from stagescope.dashboards.build import build_dashboards

    build_dashboards(out / "dashboards")


def lever_check(before: RunResult, after: RunResult) -> dict[str, Any]:
    """The ``lever_check.json`` record: measured quantile before and after, and the predicted one.
    ``within_slo_after`` is None when the run after the lever had no samples (no data is never a
    verdict: ``no_data_reason_after`` says why)."""
    report = before.report
    v = report.get("verdict") or {}
    q_after = after.report.get("quantile_ms")
    no_data = status(after.report) == STATUS_NO_DATA or q_after is None
    return {
        "scenario": before.scenario,
        "lever": v.get("lever"),
        "slo_ms": report["slo"]["threshold_ms"],
        "slo": report["slo"]["spec"],
        "p99_before_ms": report.get("quantile_ms"),
        "predicted_p99_ms": _predicted(report),
        "p99_after_ms": q_after,
        "status_after": status(after.report),
        "within_slo_after": None if no_data else q_after <= report["slo"]["threshold_ms"],
        "no_data_reason_after": after.report.get("no_data_reason") if no_data else None,
    }


def _after_words(check: dict[str, Any]) -> str:
    if check["within_slo_after"] is None:
        return f"no data after the lever: {check['no_data_reason_after'] or 'no samples'}"
    return f"SLO {check['slo_ms']:g} ms: {'met' if check['within_slo_after'] else 'still breached'}"


def run_one(name: str, out: Path, *, duration_s: float, apply_lever: bool, port: int) -> int:
    sc = get_scenario(name)
    before = _run(name, out, duration_s=duration_s, apply_lever=False, port=port, label="run")
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
    after = _run(name, out / "lever", duration_s=duration_s, apply_lever=True, port=port, label="lever check")
    check = lever_check(before, after)
    (out / "lever_check.json").write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
    q = "p" + f"{before.report['slo']['objective'] * 100:g}"
    out_console.print(
        f"Lever check ({check['lever']}): {q} before {_ms(check['p99_before_ms'])}, predicted "
        f"{_ms(check['predicted_p99_ms'])}, measured after {_ms(check['p99_after_ms'])} ({_after_words(check)})"
    )
    return 130 if after.interrupted else 0


def run_all(out: Path, *, duration_s: float, apply_lever: bool, port: int) -> int:
    table = Table(title="stagescope demo --all: found vs true cause")
    for col in ("scenario", "true stage", "true lever", "found stage", "found lever", "SLO", "measured",
                "predicted after lever", *(["measured after lever"] if apply_lever else []), "ok"):  # fmt: skip
        table.add_column(col)
    rows: list[dict[str, Any]] = []
    mismatches = 0
    for name, sc in SCENARIOS.items():
        res = _run(name, out / name, duration_s=duration_s, apply_lever=False, port=port, label=name)
        v = res.report.get("verdict") or {}
        found_stage, found_lever = v.get("stage"), v.get("lever")
        ok = (found_stage, found_lever) == (sc.true_stage, sc.lever) and res.report["breached"] == sc.breach
        row: dict[str, Any] = {
            "scenario": name, "true_stage": sc.true_stage, "true_lever": sc.lever, "found_stage": found_stage,
            "found_lever": found_lever, "slo": sc.slo_spec, "measured_ms": res.report.get("quantile_ms"),
            "predicted_ms": _predicted(res.report), "ok": ok,
        }  # fmt: skip
        if apply_lever and sc.lever is not None and ok:
            after = _run(name, out / name / "lever", duration_s=duration_s, apply_lever=True, port=port,
                         label=f"{name} lever")  # fmt: skip
            check = lever_check(res, after)
            (out / name / "lever_check.json").write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
            row["after_ms"] = check["p99_after_ms"]
            ok = ok and bool(check["within_slo_after"])
            row["ok"] = ok
        mismatches += not ok
        rows.append(row)
        table.add_row(
            name, sc.true_stage or "-", sc.lever or "-", found_stage or "-", found_lever or "-", sc.slo_spec,
            _measured(res.report), _ms(row["predicted_ms"]),
            *([_ms(row.get("after_ms"))] if apply_lever else []), "yes" if ok else "[red]NO[/red]",
        )  # fmt: skip
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    out_console.print(table)
    if mismatches:
        print(f"stagescope demo: {mismatches} scenario(s) did not match their true cause", file=sys.stderr)
        return 1
    return 0
