"""The wheel, installed into a fresh venv outside the repository, works as a library and a CLI.

Builds the wheel from a copy of the checkout's files (tracked and new, not ignored ones: no stale
``build/`` can leak in), installs it with ``pip`` (from pip's cache or PyPI) and runs, from a folder
outside the repository with a clean environment:

* ``[service]`` alone: ``--help`` of every command; the commands that need another extra print one
  line naming it (exit 2); a FastAPI app is instrumented and answers a request.
* ``[all]``: ``stagescope demo --duration 5`` (the arrival trace comes from the package data).

Venvs are kept between runs under ``$STAGESCOPE_TEST_VENVS`` (default ``~/.cache/stagescope/test-venvs``),
one per (Python version, extra, the wheel's exact ``Requires-Dist`` lines that this extra installs): a
venv is reused only for the same dependency set, and every run replaces its stagescope with the wheel just built
(``--no-deps --force-reinstall``), then ``pip check`` confirms the dependencies still satisfy it. A lock
file serializes runs that share one. ``STAGESCOPE_TEST_FRESH_VENV=1`` builds them anew.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [["demo"], ["serve"], ["load"], ["analyze"], ["dashboards"], ["dashboards", "build"],
            ["alerts"], ["alerts", "build"], ["gpu-exporter"]]  # fmt: skip
pytestmark = pytest.mark.slow


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STAGESCOPE_", "OTEL_", "PYTHON", "VIRTUAL_ENV", "PROMETHEUS_"))}  # fmt: skip
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a clean copy of the checkout (symbolic links kept, as git stores them)."""
    src = tmp_path_factory.mktemp("src") / "stagescope"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        a, b = ROOT / rel, src / rel
        if not (a.is_symlink() or a.is_file()):
            continue  # deleted in the work tree, or a submodule
        b.parent.mkdir(parents=True, exist_ok=True)
        if a.is_symlink():
            b.symlink_to(os.readlink(a))
        else:
            shutil.copy2(a, b)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("stagescope-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "stagescope/demo/data/AzureLLMInferenceTrace_conv.csv" in names
    assert "stagescope/demo/data/LICENSE_CC-BY-4.0.txt" in names and "stagescope/demo/data/SOURCE.md" in names
    assert not any(n.startswith(("tests/", "external/")) for n in names)
    return whl


def _requires(whl: Path, extra: str) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that ``pip install 'stagescope[extra]'`` installs: the core's
    and those of ``extra`` and of every extra it includes (``stagescope[...]`` lines followed)."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    lines = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]
    by_extra: dict[str | None, list[str]] = {}
    for ln in lines:
        req, _, marker = ln.partition(";")
        m = re.fullmatch(r'\s*extra == "([^"]+)"\s*', marker) if marker else None
        by_extra.setdefault(m.group(1) if m else None, []).append(req.strip())
    out, todo, seen = set(by_extra.get(None, [])), [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in by_extra.get(e, []):
            inc = re.fullmatch(r"stagescope\[([^\]]+)\]", req)
            if inc:
                todo.extend(inc.group(1).split(","))
            else:
                out.add(f"{req} ({e})")
    return sorted(out)


def _prune(root: Path, extra: str, keep: Path) -> None:
    """Remove this extra's venvs for other dependency sets (an older wheel's), unless one is in use."""
    for old in root.glob(f"{extra}-*.lock"):
        venv = old.with_suffix("")
        if venv == keep:
            continue
        with old.open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(venv, ignore_errors=True)
        # the lock file stays: unlinking it would let a later run lock a new file of the same name
        # while another still holds the old one, and two runs would share one venv unlocked


@contextlib.contextmanager
def venv_with(whl: Path, extra: str) -> Iterator[Path]:
    """A venv holding ``stagescope[extra]`` from ``whl`` (see the module docstring), locked while in use."""
    key = hashlib.sha256(json.dumps([sys.version, extra, _requires(whl, extra)]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("STAGESCOPE_TEST_VENVS", Path.home() / ".cache" / "stagescope" / "test-venvs"))
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"{extra}-{key}"
    with (root / f"{extra}-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = os.environ.get("STAGESCOPE_TEST_FRESH_VENV") == "1"
        if fresh or not (venv / ".complete").exists():
            _prune(root, extra, keep=venv)
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            proc = subprocess.run([*pip, f"{whl}[{extra}]"], capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stderr[-3000:]
            (venv / ".complete").write_text(json.dumps(_requires(whl, extra)))
        else:
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            proc = subprocess.run([*pip, "--no-deps", "--force-reinstall", str(whl)], capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
        check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout[-2000:]
        yield venv


def test_service_extra_alone_every_help_and_one_line_for_the_rest(wheel: Path, tmp_path: Path) -> None:
    with venv_with(wheel, "service") as venv:
        env = _clean_env(venv)
        where = _run([str(venv / "bin" / "python"), "-c", "import stagescope; print(stagescope.__file__)"],
                     cwd=tmp_path, env=env)  # fmt: skip
        assert where.stdout.strip().startswith(str(venv)), where  # the wheel, not the checkout
        exe = str(venv / "bin" / "stagescope")
        for cmd in [[], *COMMANDS]:
            proc = _run([exe, *cmd, "--help"], cwd=tmp_path, env=env, timeout=120)
            assert proc.returncode == 0 and "usage: stagescope" in proc.stdout, (cmd, proc.stderr[-2000:])
        for cmd, extra in ((["load", "--url", "http://127.0.0.1:1", "--rate", "1", "--duration", "1", "--out", "r.parquet"], "loadgen"),
                           (["analyze", "--traces", ".", "--slo", "p99<300ms"], "analysis"),
                           (["dashboards", "build", "--out", "d"], "dashboards"),
                           (["serve"], "serve"), (["demo", "--duration", "5"], "demo")):  # fmt: skip
            proc = _run([exe, *cmd], cwd=tmp_path, env=env, timeout=120)
            assert proc.returncode == 2, (cmd, proc.stderr[-2000:])
            assert proc.stderr.count("\n") == 1 and f"pip install 'stagescope[{extra}]'" in proc.stderr, proc.stderr
        proc = _run([exe, "alerts", "build", "--slo", str(ROOT / "alerts" / "slo.yaml"), "--out", "rules"],
                    cwd=tmp_path, env=env)  # fmt: skip
        assert proc.returncode == 0 and (tmp_path / "rules" / "slo_rules.yml").is_file(), proc.stderr[-2000:]
        # a service owner's app, driven as a server would call it (ASGI), with nothing but [service]
        app = (
            "import asyncio, stagescope\n"
            "from fastapi import FastAPI\n"
            "app = FastAPI()\n"
            "@app.get('/v1/x')\n"
            "async def x():\n"
            "    with stagescope.stage('feature_fetch'):\n"
            "        return {'ok': 1}\n"
            "stagescope.instrument_app(app, service_name='svc')\n"
            "async def call(path):\n"
            "    sent = []\n"
            "    async def receive():\n"
            "        return {'type': 'http.request', 'body': b'', 'more_body': False}\n"
            "    async def send(m):\n"
            "        sent.append(m)\n"
            "    scope = {'type': 'http', 'asgi': {'version': '3.0'}, 'http_version': '1.1', 'method': 'GET',\n"
            "             'scheme': 'http', 'path': path, 'raw_path': path.encode(), 'query_string': b'',\n"
            "             'root_path': '', 'headers': [], 'client': ('127.0.0.1', 1), 'server': ('t', 80)}\n"
            "    await app(scope, receive, send)\n"
            "    return sent[0]['status'], b''.join(m.get('body', b'') for m in sent[1:]).decode()\n"
            "async def main():\n"
            "    assert (await call('/v1/x'))[0] == 200\n"
            "    print((await call('/metrics'))[1])\n"
            "asyncio.run(main())\n"
        )
        proc = _run([str(venv / "bin" / "python"), "-c", app], cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("stagescope_stage_duration_seconds_count{")]
        assert any('stage="feature_fetch"' in ln and ln.endswith(" 1.0") for ln in lines), proc.stdout[-2000:]


def test_all_extras_run_the_demo_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    with venv_with(wheel, "all") as venv:
        env = _clean_env(venv)
        out = tmp_path / "demo"
        proc = _run([str(venv / "bin" / "stagescope"), "demo", "--duration", "5", "--out", str(out)],
                    cwd=tmp_path, env=env, timeout=600)  # fmt: skip
        print(proc.stdout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "SLO p99<300ms" in proc.stdout, proc.stdout
        report = json.loads((out / "report.json").read_text())
        assert report["requests"] > 0 and (out / "results.parquet").is_file()
        assert any((out / "dashboards").glob("*.json"))
