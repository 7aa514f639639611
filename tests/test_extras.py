"""Every command's ``--help`` works with any subset of pip extras; a command whose extra is missing says
which ``pip install`` to run in one line (exit 2); ``stagescope.extras`` matches ``pyproject.toml``.

A subset is emulated in a fresh interpreter by making the modules of every other extra unimportable
(an import hook that raises ``ModuleNotFoundError`` for them, as Python does for a package that is not
installed). The real thing, a wheel installed with ``[service]`` alone into a clean venv, is
``tests/test_wheel.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stagescope.extras import COMMAND_EXTRAS, EXTRAS, INCLUDES, modules_of

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``stagescope.cli.main`` on each argv with the given modules unimportable; prints one JSON line.
_RUNNER = r"""
import contextlib, io, json, sys
blocked, argvs = json.loads(sys.argv[1]), json.loads(sys.argv[2])

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from stagescope.cli import main
out = []
real_stdout = sys.stdout
for argv in argvs:
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            import traceback
            traceback.print_exc()
            rc = "exception"
    out.append({"argv": argv, "rc": rc, "stdout": o.getvalue(), "stderr": e.getvalue()})
real_stdout.write(json.dumps(out) + "\n")
"""

HELP = [["--help"], ["demo", "--help"], ["serve", "--help"], ["load", "--help"], ["analyze", "--help"],
        ["dashboards", "--help"], ["dashboards", "build", "--help"], ["alerts", "build", "--help"],
        ["gpu-exporter", "--help"]]  # fmt: skip

#: The subsets that matter: nothing, each extra a command needs (alone), the library extra alone, all.
SUBSETS = [(), ("service",), ("serve",), ("loadgen",), ("analysis",), ("dashboards",), ("gpu",), ("demo",),
           ("all",)]  # fmt: skip


def _import_names(extras: tuple[str, ...]) -> set[str]:
    return {m for e in extras for m in modules_of(e).values()}


def _blocked(subset: tuple[str, ...]) -> list[str]:
    return sorted(_import_names(tuple(EXTRAS)) - _import_names(subset))


def _probes(tmp: Path) -> list[tuple[str, list[str]]]:
    """One real run per command (command name, argv); each needs the command's extra and no other."""
    trace = tmp / "trace.jsonl"
    trace.write_text("")
    return [
        ("demo", ["demo", "--scenario", "no-such-scenario", "--out", str(tmp / "demo")]),
        ("serve", ["serve", "--list-scenarios"]),
        ("load", ["load", "--url", "http://127.0.0.1:1", "--rate", "5", "--duration", "1",
                  "--out", str(tmp / "r.parquet"), "--no-progress"]),
        ("analyze", ["analyze", "--traces", str(ROOT / "external/otlp/opentelemetry-proto/trace.json"),
                     "--slo", "p99<300ms", "--skip-bad"]),
        ("dashboards", ["dashboards", "build", "--out", str(tmp / "dash")]),
        ("alerts", ["alerts", "build", "--slo", str(ROOT / "alerts/slo.yaml"), "--out", str(tmp / "alerts")]),
    ]  # fmt: skip


def _run(blocked: list[str], argvs: list[list[str]], cwd: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(blocked), json.dumps(argvs)],
                          capture_output=True, text=True, timeout=240, cwd=cwd)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("subset", SUBSETS, ids=lambda s: "+".join(s) or "core")
def test_help_and_missing_extras(subset: tuple[str, ...], tmp_path: Path) -> None:
    available = _import_names(subset)
    probes = _probes(tmp_path)
    runs = _run(_blocked(subset), HELP + [argv for _, argv in probes], tmp_path)
    for r in runs[: len(HELP)]:
        assert r["rc"] == 0, f"{r['argv']} with {subset or 'core'}: {r['stderr'][-2000:]}"
        assert "usage: stagescope" in r["stdout"], r
    for (command, _), r in zip(probes, runs[len(HELP):], strict=True):
        extra = COMMAND_EXTRAS.get(command)
        err = r["stderr"]
        assert "Traceback" not in err, f"{r['argv']} with {subset or 'core'}:\n{err[-3000:]}"
        # an extra is there when its modules are (analysis brings everything loadgen needs)
        if extra is not None and not set(modules_of(extra).values()) <= available:
            assert r["rc"] == 2, r
            assert err.count("\n") == 1, err
            assert f"stagescope {command}: error: needs the '{extra}' extra" in err, err
            assert f"pip install 'stagescope[{extra}]'" in err, err
        else:  # the command ran on its own extra alone: what is left is its own verdict on the input
            assert "needs the" not in err and "not installed" not in err, err
            expected = {"demo": {2}, "serve": {0}, "load": {2}, "analyze": {0, 2, 3}, "dashboards": {0},
                        "alerts": {0}}[command]  # fmt: skip
            assert r["rc"] in expected, r
            if command == "demo":
                assert "unknown scenario 'no-such-scenario'" in err
            if command == "load":
                assert "cannot connect" in err


def test_the_extras_table_is_pyproject() -> None:
    """stagescope.extras.EXTRAS and INCLUDES say exactly what pyproject.toml's extras install."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    own: dict[str, set[str]] = {}
    includes: dict[str, set[str]] = {}
    for extra, reqs in deps.items():
        if extra == "dev":
            continue
        for req in reqs:
            m = re.fullmatch(r"stagescope\[([a-z0-9,-]+)\]", req)
            if m:
                includes.setdefault(extra, set()).update(m.group(1).split(","))
            else:
                own.setdefault(extra, set()).add(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower())
    assert {e: set(d) for e, d in EXTRAS.items() if d} == own
    assert {e: set(i) for e, i in INCLUDES.items()} == includes
    assert set(EXTRAS) == set(deps) - {"dev"}


def test_every_module_an_extra_names_is_installed_in_the_dev_venv() -> None:
    """The import names in stagescope.extras are right (a wrong one would report a missing extra)."""
    from stagescope.extras import missing

    for extra in ("service", "otel-fastapi", "serve", "loadgen", "analysis", "dashboards", "gpu", "demo"):
        assert missing(extra) == [], extra
def test_readme_names_each_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Use it in your service", 1)[1].split("\n## ", 1)[0]
    for extra in EXTRAS:
        assert f"`{extra}`" in section or f"[{extra}" in section or f",{extra}" in section, extra


def test_a_module_the_table_does_not_know_is_one_line_too(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A third-party import failing inside a command (a dependency the extras table lacks) is one line
    naming the command's extra; a missing stagescope module is a bug and stays a traceback."""
    import stagescope.alerts.cli as alerts_cli
    import stagescope.dashboards.cli as dashboards_cli
    from stagescope.cli import main

    def needs_pkg(args: object) -> int:
        raise ModuleNotFoundError("No module named 'grafanalib_next'", name="grafanalib_next.core")

    monkeypatch.setattr(dashboards_cli, "run", needs_pkg)
    assert main(["dashboards", "build", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert err == ("stagescope dashboards: error: needs the Python module 'grafanalib_next', which is not "
                   "installed: pip install 'stagescope[dashboards]'\n")  # fmt: skip

    def broken(args: object) -> int:
        raise ModuleNotFoundError("No module named 'stagescope.nothing'", name="stagescope.nothing")

    monkeypatch.setattr(alerts_cli, "run", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["alerts", "build", "--slo", "s.yaml", "--out", "x"])
