"""Alerts: the committed rules are what the generator writes, promtool accepts them, and promtool's
rule unit tests show the burn-rate alerts fire (and stay quiet) when they should.

Input series are generated here from :mod:`stagescope.names` (no metric name is spelled out), written
as a promtool test file next to a copy of the committed rules, and run with Debian's promtool 2.42
(``'a+bxn'`` notation; floats compared after ``round(x, 0.001)``; no ``fuzzy_compare``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagescope import names
from stagescope.alerts.build import RULE_FILES, SLO_RULES, build_rules
from stagescope.cli import main
from stagescope.promql import le_regex
from stagescope.slo import load_slo_file

ROOT = Path(__file__).resolve().parents[1]
SLO_FILE = ROOT / "alerts" / "slo.yaml"
GENERATED = ROOT / "alerts" / "generated"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)

SLOS = {s.name: s for s in load_slo_file(SLO_FILE)}
PREDICT, TTFT, ITL = "predict-latency", "generate-ttft", "generate-itl"


def test_committed_rules_match_the_generator(tmp_path: Path) -> None:
    build_rules(SLO_FILE, tmp_path)
    for name in RULE_FILES:
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
            f"alerts/generated/{name} is stale: run `make alerts` and commit the result"
        )


def test_reference_slos_are_the_specified_ones() -> None:
    assert {n: (s.sli, s.spec, s.service, s.route) for n, s in SLOS.items()} == {
        PREDICT: ("e2e", "p99<300ms", "inference", "/v1/predict"),
        TTFT: ("ttft", "ttft:p95<500ms", "inference", "/v1/generate"),
        ITL: ("itl", "itl:p99<60ms", "inference", "/v1/generate"),
    }


def test_every_reference_scenario_slo_is_in_the_slo_file() -> None:
    """alerts/slo.yaml covers the SLO each reference-service scenario is judged by (service/scenarios.py)."""
    from stagescope.service.scenarios import SCENARIOS

    committed = {(s.spec, s.route) for s in SLOS.values()}
    for sc in SCENARIOS.values():
        assert (sc.slo.spec, sc.route) in committed, f"{sc.name}: {sc.slo_spec} on {sc.route}"


@needs_promtool
def test_promtool_check_rules() -> None:
    for name in RULE_FILES:
        proc = subprocess.run(
            [str(PROMTOOL), "check", "rules", str(GENERATED / name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------------
# promtool rule unit tests
# ---------------------------------------------------------------------------------------------------
def _series(slo_name: str, good: str, total: str, status_class: str = "2xx") -> list[dict[str, str]]:
    """Input series for one SLO's histogram: the bucket at the threshold and the count."""
    slo = SLOS[slo_name]
    metric = names.SLI_HISTOGRAM[slo.sli]
    labels = {"job": slo.service or "", names.LABEL_MODEL: "m"}
    if slo.sli == names.SLI_E2E:
        labels |= {names.LABEL_ROUTE: slo.route or "", names.LABEL_STATUS_CLASS: status_class}

    def fmt(suffix: str, extra: dict[str, str]) -> str:
        body = ", ".join(f'{k}="{v}"' for k, v in (labels | extra).items())
        return f"{metric}{suffix}{{{body}}}"

    bound = f"{slo.threshold_s:g}"  # prometheus_client writes 0.3, 0.5, 0.06
    return [
        {"series": fmt("_bucket", {"le": bound}), "values": good},
        {"series": fmt("_count", {}), "values": total},
    ]


def _labels(slo_name: str) -> dict[str, str]:
    slo = SLOS[slo_name]
    return {names.LABEL_SLO: slo.name, names.LABEL_SLI: slo.sli, "job": slo.service or ""}


def _label_str(slo_name: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in _labels(slo_name).items()) + "}"


def _annotations(slo_name: str, alert: str, value: float) -> dict[str, str]:
    """The alert's annotations as promtool expands them (``humanizePercentage`` of the long-window ratio)."""
    groups = yaml.safe_load((GENERATED / SLO_RULES).read_text())["groups"]
    (rule,) = [
        r
        for g in groups
        for r in g["rules"]
        if r.get("alert") == alert and r["labels"][names.LABEL_SLO] == slo_name
    ]
    out = dict(rule["annotations"])
    out["description"] = out["description"].replace(
        "{{ $value | humanizePercentage }}", f"{value * 100:.4g}%"
    )
    return out


def _expect(slo_name: str, alert: str, value: float | None) -> dict[str, Any]:
    """``exp_alerts`` for ``alert``: firing with the given long-window ratio, or (None) not firing."""
    exp: dict[str, Any] = {"alertname": alert, "exp_alerts": []}
    if value is not None:
        severity = names.SEVERITY_PAGE if alert == names.ALERT_FAST_BURN else names.SEVERITY_TICKET
        exp["exp_alerts"] = [
            {
                "exp_labels": _labels(slo_name) | {names.LABEL_SEVERITY: severity},
                "exp_annotations": _annotations(slo_name, alert, value),
            }
        ]
    return exp


def _ratio_sample(slo_name: str, window: str, value: float) -> dict[str, Any]:
    rule = names.RULE_SLI_ERROR_RATIO_FORMAT.format(window=window)
    return {
        "expr": f'round({rule}{{{names.LABEL_SLO}="{slo_name}"}}, 0.001)',
        "eval_time": "10m",
        "exp_samples": [{"labels": _label_str(slo_name), "value": value}],
    }


PAGE, TICKET = names.ALERT_FAST_BURN, names.ALERT_SLOW_BURN
# 100 requests (or token gaps) per minute; `good` of them at or under the threshold.
CASES: dict[str, dict[str, Any]] = {
    "fast burn pages (20% slow = 20x a 1% budget; the ticket fires too, Alertmanager inhibits it)": {
        "input_series": _series(PREDICT, "0+80x200", "0+100x200"),
        "alert_rule_test": [
            {"eval_time": "10m", **_expect(PREDICT, PAGE, 0.2)},
            {"eval_time": "10m", **_expect(PREDICT, TICKET, 0.2)},
        ],
        "promql_expr_test": [
            _ratio_sample(PREDICT, "5m", 0.2),
            _ratio_sample(PREDICT, "1h", 0.2),
            {
                "expr": f'round({names.RULE_SLO_BUDGET_REMAINING}{{{names.LABEL_SLO}="{PREDICT}"}}, 0.001)',
                "eval_time": "10m",
                "exp_samples": [{"labels": _label_str(PREDICT), "value": -19}],  # 1 - 0.2 / 0.01
            },
        ],
    },
    "slow burn (4% slow = 4x budget) fires only the ticket": {
        "input_series": _series(PREDICT, "0+96x400", "0+100x400"),
        "alert_rule_test": [
            {"eval_time": "3h", **_expect(PREDICT, PAGE, None)},
            {"eval_time": "3h", **_expect(PREDICT, TICKET, 0.04)},
        ],
    },
    "slower burn (2% slow = 2x budget) tickets through 3d and 6h, never pages": {
        "input_series": _series(PREDICT, "0+98x500", "0+100x500"),
        "alert_rule_test": [
            {"eval_time": "7h", **_expect(PREDICT, PAGE, None)},
            {"eval_time": "7h", **_expect(PREDICT, TICKET, 0.02)},
        ],
    },
    "healthy service (0.5% slow) fires nothing": {
        "input_series": _series(PREDICT, "0+199.0x500", "0+200x500")
        + _series(TTFT, "0+99x500", "0+100x500")
        + _series(ITL, "0+999x500", "0+1000x500"),
        "alert_rule_test": [
            {"eval_time": t, **_expect(PREDICT, a, None)}  # no alert of either name, for any SLO
            for t in ("10m", "1h", "7h")
            for a in (PAGE, TICKET)
        ],
    },
    "page stops soon after the burn stops; the ticket keeps firing": {
        "input_series": _series(PREDICT, "0+80x60 4900+100x199", "0+100x260"),
        "alert_rule_test": [
            {"eval_time": "2h", **_expect(PREDICT, PAGE, None)},
            {"eval_time": "2h", **_expect(PREDICT, TICKET, 0.1)},
        ],
    },
    "TTFT SLO (p95 < 500 ms, 5% budget): 50% slow first tokens page through 6h and 30m": {
        "input_series": _series(TTFT, "0+50x200", "0+100x200"),
        "alert_rule_test": [
            {"eval_time": "40m", **_expect(TTFT, PAGE, 0.5)},
            {"eval_time": "40m", **_expect(TTFT, TICKET, 0.5)},  # exactly these: no other SLO fires
        ],
    },
    "ITL SLO (p99 < 60 ms): 20% slow token gaps page": {
        "input_series": _series(ITL, "0+800x200", "0+1000x200"),
        "alert_rule_test": [{"eval_time": "10m", **_expect(ITL, PAGE, 0.2)}],
    },
    "clients that left before their answer (client_closed) are neither good nor bad": {
        "input_series": _series(PREDICT, "0+99.5x200", "0+100x200")
        + _series(PREDICT, "0+0x200", "0+50x200", names.STATUS_CLASS_CLIENT_CLOSED),  # all slow
        "alert_rule_test": [{"eval_time": "1h", **_expect(PREDICT, a, None)} for a in (PAGE, TICKET)],
        "promql_expr_test": [_ratio_sample(PREDICT, "5m", 0.005), _ratio_sample(PREDICT, "1h", 0.005)],
    },
    "no traffic fires nothing (0/0 is no data, not a breach)": {
        "input_series": _series(PREDICT, "0x300", "0x300"),
        "alert_rule_test": [{"eval_time": "2h", **_expect(PREDICT, a, None)} for a in (PAGE, TICKET)],
    },
}


@needs_promtool
@pytest.mark.parametrize("case", sorted(CASES))
def test_promtool_rule_unit_tests(case: str, tmp_path: Path) -> None:
    shutil.copy(GENERATED / SLO_RULES, tmp_path / SLO_RULES)
    spec = {
        "rule_files": [SLO_RULES],
        "evaluation_interval": "1m",
        "tests": [{"name": case, "interval": "1m", **CASES[case]}],
    }
    test_file = tmp_path / "slo_rules_test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False, width=200))
    proc = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{case}\n{proc.stdout}\n{proc.stderr}"


@needs_promtool
def test_promtool_unit_test_can_fail(tmp_path: Path) -> None:
    """The harness is not vacuous: claiming the healthy service pages is reported as a failure."""
    shutil.copy(GENERATED / SLO_RULES, tmp_path / SLO_RULES)
    spec = {
        "rule_files": [SLO_RULES],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _series(PREDICT, "0+199.0x100", "0+200x100"),
                "alert_rule_test": [{"eval_time": "10m", **_expect(PREDICT, PAGE, 0.005)}],
            }
        ],
    }
    test_file = tmp_path / "t.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run([str(PROMTOOL), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert proc.returncode != 0 and "FAILED" in (proc.stdout + proc.stderr)


# ---------------------------------------------------------------------------------------------------
# the generator's input checks
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bound", "matches", "misses"),
    [
        (0.3, ["0.3", "0.30"], ["0.03", "0.35", "3", "10.3"]),
        (1.0, ["1", "1.0", "1.00"], ["10", "0.1", "1.5"]),
        (2.5, ["2.5"], ["25", "2.05"]),
        (0.0005, ["0.0005"], ["0.005", "0.00051"]),
    ],
)
def test_le_regex_matches_every_spelling_of_a_bound(
    bound: float, matches: list[str], misses: list[str]
) -> None:
    import re

    pattern = re.compile(f"^(?:{le_regex(bound)})$")  # Prometheus anchors regexes at both ends
    assert all(pattern.match(m) for m in matches), matches
    assert not any(pattern.match(m) for m in misses), misses


def test_threshold_off_the_buckets_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text(
        "slos:\n"
        "  - name: ok\n    service: inference\n    sli: e2e\n    threshold_ms: 300\n    objective: 0.99\n"
        "  - name: off-bucket\n    service: inference\n    sli: ttft\n    threshold_ms: 450\n    objective: 0.95\n"
    )
    assert main(["alerts", "build", "--slo", str(slo), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{slo}:10: slos[1] (off-bucket): threshold_ms 450 is not a bucket boundary of " in err
    assert names.METRIC_GENAI_TTFT in err and "250 ms and 500 ms" in err
    assert not (tmp_path / "out").exists()


def test_bad_window_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text(
        "slos:\n  - {name: a, service: s, sli: e2e, threshold_ms: 250, objective: 0.99, window: 1.5d}\n"
    )
    assert main(["alerts", "build", "--slo", str(slo), "--out", str(tmp_path / "out")]) == 2
    assert "window '1.5d' is not a Prometheus duration" in capsys.readouterr().err


def test_missing_slo_file_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts", "build", "--slo", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    assert "SLO file not found" in capsys.readouterr().err
