"""docker-compose.yml, Dockerfile and .env.example: what can be proven without a Docker engine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GPU_SERVICES = {"stagescope-gpu-exporter", "dcgm-exporter"}
STACK_SERVICES = {"inference", "loadgen", "otel-collector", "tempo", "prometheus", "alertmanager", "grafana"}


def host_path(volume: str | dict[str, Any]) -> str | None:
    """The host side of a bind mount (None for a named volume)."""
    if isinstance(volume, dict):
        return str(volume["source"]) if volume.get("type") == "bind" else None
    src = volume.split(":", 1)[0]
    return src if src.startswith((".", "/", "~")) else None


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    schema = json.loads((ROOT / "external/schemas/compose-spec.json").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(COMPOSE)]
    assert not errors, "\n".join(errors)
    assert STACK_SERVICES | GPU_SERVICES | {"jupyterlab"} <= set(SERVICES)


def test_every_bind_mount_and_build_context_exists() -> None:
    checked = 0
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            src = host_path(vol)
            if src is not None:
                assert (ROOT / src).exists(), f"{name}: bind mount {src} does not exist"
                checked += 1
        build = svc.get("build")
        if build:
            assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file(), name
    assert checked >= 10


def test_named_volumes_are_declared_and_keep_what_must_persist() -> None:
    declared = set(COMPOSE["volumes"])
    used = {
        v.split(":", 1)[0]
        for svc in SERVICES.values()
        for v in svc.get("volumes", [])
        if isinstance(v, str) and host_path(v) is None
    }
    assert used == declared
    for svc, path in [("prometheus", "/prometheus"), ("grafana", "/var/lib/grafana"),
                      ("alertmanager", "/alertmanager"), ("tempo", "/var/tempo")]:  # fmt: skip
        assert any(v.endswith(":" + path) and host_path(v) is None for v in SERVICES[svc]["volumes"]), svc


def test_every_image_is_pinned_to_a_tag() -> None:
    for name, svc in SERVICES.items():
        image = svc.get("image")
        assert image, f"{name} has no image name (a built image needs a pinned tag too)"
        last = image.rsplit("/", 1)[-1]
        assert ":" in last, f"{name}: {image} has no tag"
        tag = last.split(":", 1)[1]
        assert tag and tag != "latest" and "$" not in tag, f"{name}: {image}"
    text = (ROOT / "Dockerfile").read_text()
    base = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base[0])
    assert "latest" not in (ROOT / "docker-compose.yml").read_text()


def test_every_published_port_is_bound_to_localhost() -> None:
    published = 0
    for name, svc in SERVICES.items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"
            published += 1
    assert published >= 8
    hosts = [str(p).split(":")[1] for s in SERVICES.values() for p in s.get("ports", [])]
    assert len(hosts) == len(set(hosts)), "two services publish the same host port"


def test_gpu_services_sit_under_a_profile_with_the_nvidia_reservation() -> None:
    for name, svc in SERVICES.items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if name in GPU_SERVICES:
            assert svc.get("profiles") == ["gpu"], name
            assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name
        else:
            assert not devices, f"{name} reserves a GPU outside the gpu profile"
    assert SERVICES["jupyterlab"]["profiles"] == ["notebooks"]
    for name in STACK_SERVICES:  # `docker compose up` brings these up with no profile
        assert "profiles" not in SERVICES[name], name


def test_depends_on_targets_exist_with_the_healthcheck_their_condition_needs() -> None:
    conditions = 0
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long depends_on syntax with conditions"
        for target, spec in deps.items():
            assert target in SERVICES, f"{name} depends on unknown service {target}"
            cond = spec["condition"]
            conditions += 1
            if cond == "service_healthy":
                assert "healthcheck" in SERVICES[target], (
                    f"{name} waits for {target} to be healthy: no healthcheck"
                )
                assert SERVICES[target]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), target
            elif cond == "service_completed_successfully":
                assert SERVICES[target].get("restart") == "no", target
            else:
                assert cond == "service_started", (name, target, cond)
            if "profiles" not in svc:  # a default service must not need a profiled one
                assert "profiles" not in SERVICES[target], (name, target)
    assert conditions >= 8
    # the chain the dashboards need: loadgen -> healthy inference; grafana -> healthy prometheus + tempo
    assert SERVICES["loadgen"]["depends_on"]["inference"]["condition"] == "service_healthy"
    assert {"prometheus", "tempo"} <= set(SERVICES["grafana"]["depends_on"])


def test_services_wired_as_production_is() -> None:
    prom_cmd = SERVICES["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in prom_cmd
    assert "stagescope" in SERVICES["inference"]["command"] and "serve" in SERVICES["inference"]["command"]
    load = SERVICES["loadgen"]["command"]
    assert load[:2] == ["stagescope", "load"]
    trace = next(a.split("=", 1)[1] for a in load if a.startswith("--trace="))
    assert (ROOT / trace).is_file() and trace.startswith("external/llm_traces/")
    assert any(
        v.startswith("./external/llm_traces:/app/external/llm_traces") for v in SERVICES["loadgen"]["volumes"]
    )
    for svc in ("inference", "loadgen"):
        assert SERVICES[svc]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    lab = SERVICES["jupyterlab"]["volumes"]
    assert "./analysis:/app/analysis" in lab and "./data:/app/data" in lab
    gpu = SERVICES["stagescope-gpu-exporter"]["command"]
    assert gpu[:2] == ["stagescope", "gpu-exporter"] and "--interval=0.1" in gpu


def test_no_unauthenticated_admin_endpoint_is_published() -> None:
    """Prometheus without lifecycle/admin/write APIs; Alertmanager (/-/reload always on) and Tempo
    (/live-store/prepare-downscale) not published at all (README "Local stack", Safe defaults)."""
    cmd = SERVICES["prometheus"]["command"]
    for flag in ("--web.enable-lifecycle", "--web.enable-admin-api", "--web.enable-remote-write-receiver",
                 "--web.enable-otlp-receiver"):  # fmt: skip
        assert flag not in cmd, flag
    assert "ports" not in SERVICES["alertmanager"] and "ports" not in SERVICES["tempo"]


def test_writers_run_as_the_uid_data_init_prepares_for() -> None:
    init = SERVICES["data-init"]["command"]
    writer = next(a.split("=", 1)[1] for a in init if a.startswith("--writer="))
    for name in ("otel-collector", "loadgen"):
        assert SERVICES[name]["user"] == writer, name
        assert SERVICES[name]["depends_on"]["data-init"]["condition"] == "service_completed_successfully"
    assert {"traces", "loadgen"} <= set(init)
    assert "STAGESCOPE_UID" not in (ROOT / "docker-compose.yml").read_text()  # nothing to set per user


def test_grafana_has_no_anonymous_admin_and_takes_its_password_from_the_environment() -> None:
    env = SERVICES["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"])
    assert not any("ANONYMOUS_ORG_ROLE" in k for k in env)


def test_env_example_documents_every_variable_the_compose_file_reads() -> None:
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", (ROOT / "docker-compose.yml").read_text()))
    documented = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert used and used <= documented, used - documented
    secrets = [
        ln
        for ln in (ROOT / ".env.example").read_text().splitlines()
        if ln.startswith(("GRAFANA_ADMIN_PASSWORD", "JUPYTER_TOKEN"))
    ]
    assert all(ln.endswith("=") for ln in secrets), "no secret value in the example"


def test_dockerfile_is_multi_stage_and_runs_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, re.M)
    assert stages == ["build", "runtime", "lab"]
    runtime = text.split("AS runtime", 1)[1].split("\nFROM ", 1)[0]
    users = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "COPY --from=build /opt/venv" in runtime and 'stagescope", "serve' in runtime
    lab = text.split("AS lab", 1)[1]
    assert re.findall(r"^USER (\S+)$", lab, re.M)[-1].split(":")[0] not in ("0", "root")
    targets = {svc["build"]["target"] for svc in SERVICES.values() if "build" in svc}
    assert targets <= set(stages)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "data", ".git", ".env"} <= set(ignored)


@pytest.mark.parametrize("path", ["data/traces", "data/loadgen"])
def test_output_folders_exist_in_a_fresh_clone(path: str) -> None:
    assert (ROOT / path / ".gitkeep").is_file()
