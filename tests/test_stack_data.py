"""./data works for any host uid: stack/data_init.py and stack/lab_entrypoint.py run for real, as root.

The host user is simulated by file ownership: the folders a fresh clone has (data/traces,
data/loadgen) are given to uid 1234, not 1000, as they would be for a user with that uid. Then, as
the containers would:

* data_init.py runs as root (data-init service), with the arguments docker-compose.yml gives it;
* as uid 10001 (the collector and the load generator) the writers' file operations are SIMULATED,
  step by step from their sources: the collector's file exporter (timberjack, which fileexporter
  uses for `rotation`) appends to the existing file, and on rotation renames it, creates the new one
  with the old file's mode, chmods it to that mode and chowns it to the old file's owner; the load
  generator (stagescope.loadgen.results.write_results) writes a temporary file and renames it into
  place. The trace payload is a real OTLP/JSON export request
  (external/otlp/opentelemetry-proto/trace.json);
* as uid 1234 every recorded file is read back and parsed, and the user can delete them.

The processes run as other uids use Debian's /usr/bin/python3 (standard library only): the venv's
interpreter may live under a root-only folder.

Needs root (CI runs as root). Without it, the same check by hand:
`sudo python3 stack/data_init.py --data data --writer 10001:10001 --append-file traces/traces.jsonl traces loadgen`
then `sudo -u '#10001' sh -c 'echo {} >> data/traces/traces.jsonl'` and `cat data/traces/traces.jsonl` as yourself.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SERVICES: dict[str, dict[str, Any]] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
HOST = 1234  # the simulated host user: neither 0, 1000 nor the writers' 10001
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to own files as other uids (see docstring)"
)


SYSTEM_PYTHON = "/usr/bin/python3"
pytestmark = [
    pytestmark,
    pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no /usr/bin/python3"),
]


def as_uid(uid: int, code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as ``uid:uid`` (no supplementary groups), as a container user would."""
    return subprocess.run([SYSTEM_PYTHON, "-c", code, *args], cwd=cwd, user=uid, group=uid, extra_groups=[],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def data_init_args() -> list[str]:
    svc = SERVICES["data-init"]
    assert svc["user"] == "0:0" and svc["entrypoint"] == ["python", "/opt/stagescope/data_init.py"]
    assert (
        "./data:/data" in svc["volumes"]
        and "./stack/data_init.py:/opt/stagescope/data_init.py:ro" in svc["volumes"]
    )
    return list(svc["command"])


@pytest.fixture
def data() -> Iterator[Path]:
    """data/ as a fresh clone has it, owned by the simulated host user, modes as git creates them
    (in a folder other uids can traverse: pytest's own temporary folders are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="stagescope-data-"))
    os.chmod(base, 0o755)
    home = base / "home"
    shutil.copytree(
        ROOT / "data",
        home / "data",
        ignore=lambda d, names: [n for n in names if d.endswith("data") and n not in ("traces", "loadgen")],
    )
    for path in [home, *home.rglob("*")]:
        os.chown(path, HOST, HOST)
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    for sub in ("traces", "loadgen"):
        assert (home / "data" / sub / ".gitkeep").is_file()
    yield home / "data"
    shutil.rmtree(base)


def run_data_init(data: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    args = [a.replace("--data=/data", f"--data={data}") for a in args]
    return subprocess.run([sys.executable, str(ROOT / "stack/data_init.py"), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


COLLECTOR = r"""
import json, os, sys, time
# SIMULATED collector file exporter (fileexporter + timberjack), as uid 10001:
path = "traces/traces.jsonl"
line = json.dumps(json.load(open(sys.argv[1]))) + "\n"
f = os.open(path, os.O_APPEND | os.O_WRONLY)        # openExistingOrNew: the file exists
os.write(f, line.encode()); os.close(f)
old = os.stat(path)                                  # openNew on rotation
backup = "traces/traces-2026-12-01T00-00-00.000-size.jsonl"
os.rename(path, backup)
f = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, old.st_mode & 0o7777)
os.chmod(path, old.st_mode & 0o7777)
os.chown(path, old.st_uid, old.st_gid)
os.write(f, line.encode()); os.close(f)
print("ok")
"""

LOADGEN = r"""
import os
# SIMULATED load generator (loadgen/results.py check_writable + write_results), as uid 10001:
open("loadgen/results.parquet.tmp", "wb").close(); os.unlink("loadgen/results.parquet.tmp")
with open("loadgen/results.parquet.tmp", "wb") as f:
    f.write(b"PAR1" + b"\0" * 8 + b"PAR1")
os.replace("loadgen/results.parquet.tmp", "loadgen/results.parquet")
print("ok")
"""

READER = r"""
import json, os
lines = 0
for name in sorted(os.listdir("traces")):
    if name.endswith(".jsonl"):
        for ln in open(os.path.join("traces", name)):
            if ln.strip():
                assert json.loads(ln)["resourceSpans"]; lines += 1
print(lines, open("loadgen/results.parquet", "rb").read(4).decode())
os.remove("traces/traces-2026-12-01T00-00-00.000-size.jsonl")
"""


def test_without_data_init_the_collector_cannot_write_for_another_host_uid(data: Path) -> None:
    """The failure this fixes: uid 10001 (or a fixed 1000) writing into a folder a uid-1234 user cloned."""
    p = as_uid(10001, "open('traces/traces.jsonl', 'a')", data)
    assert p.returncode != 0 and "Permission denied" in p.stderr


def test_traces_and_results_are_readable_by_a_host_uid_other_than_1000(data: Path) -> None:
    p = run_data_init(data, data_init_args())
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1 and "writable by 10001:10001" in p.stdout
    traces = data / "traces"
    assert traces.stat().st_uid == HOST and stat.S_IMODE(traces.stat().st_mode) == 0o2775
    assert traces.stat().st_gid == 10001
    first = (traces / "traces.jsonl").stat()
    assert (first.st_uid, first.st_gid, stat.S_IMODE(first.st_mode)) == (10001, 10001, 0o644)

    payload = ROOT / "external/otlp/opentelemetry-proto/trace.json"
    w = as_uid(10001, COLLECTOR, data, str(payload))
    assert w.returncode == 0, w.stderr
    w = as_uid(10001, LOADGEN, data)
    assert w.returncode == 0, w.stderr
    for f in [*traces.iterdir(), data / "loadgen/results.parquet"]:
        assert f.stat().st_mode & stat.S_IROTH, f"{f} not readable by others"
    r = as_uid(HOST, READER, data)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        "2",
        "PAR1",
    ]  # both trace lines (live file and rotated copy), the results file
    # it runs at every `up`: a second run keeps all that, and fixes files other uids left unreadable
    (traces / "old-0600.jsonl").write_text("{}\n")
    os.chmod(traces / "old-0600.jsonl", 0o600)
    assert run_data_init(data, data_init_args()).returncode == 0
    assert (traces / "old-0600.jsonl").stat().st_mode & stat.S_IROTH
    assert (traces / "traces.jsonl").read_bytes().count(b"\n") == 1


def test_data_init_fails_with_one_line(data: Path, tmp_path: Path) -> None:
    (data / "traces/traces.jsonl").mkdir()  # the collector could not append to it
    p = run_data_init(data, data_init_args())
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and p.stderr.startswith("data-init: uid 10001")
    p = run_data_init(data, ["--data=/data", "--writer=collector", "traces"])
    assert p.returncode == 2 and p.stderr.startswith("data-init: --writer must be UID:GID")
    p = run_data_init(tmp_path / "missing", ["--data=/nope", "--writer=10001:10001", "traces"])
    assert p.returncode == 2 and "is not a folder" in p.stderr and "Traceback" not in p.stderr


def lab(env_token: str | None, owner_of: Path) -> subprocess.CompletedProcess[str]:
    svc = SERVICES["jupyterlab"]
    assert svc["user"] == "0:0" and svc["entrypoint"][-2:] == ["--owner-of=/app/analysis", "--"]
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    if env_token is not None:
        env["JUPYTER_TOKEN"] = env_token
    cmd = [sys.executable, str(ROOT / "stack/lab_entrypoint.py"), f"--owner-of={owner_of}", "--",
           "sh", "-c", 'echo "$(id -u) $(id -g) $(id -G)"']  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_jupyterlab_needs_its_token_and_runs_as_the_owner_of_analysis(tmp_path: Path) -> None:
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    os.chown(analysis, HOST, HOST + 1)
    for token in (None, "", "  "):
        p = lab(token, analysis)
        assert p.returncode == 2 and p.stderr.startswith("jupyterlab: JUPYTER_TOKEN is empty"), token
        assert p.stderr.count("\n") == 1 and not p.stdout
    p = lab("t0ken", analysis)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == f"{HOST} {HOST + 1} {HOST + 1}"  # no supplementary groups
