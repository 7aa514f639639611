"""Every key of the stack's config files was checked against the image tag docker-compose.yml pins.

stack/checked-keys.yaml is the one list: per third-party image, the tag checked, the sources read and
the keys found there. These tests fail when compose pins another tag than the one checked, when a
config file's header does not name that image and tag, and when a file, a command-line flag or an
environment variable uses a key that is not in the list for that tag.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CHECKED: dict[str, dict[str, Any]] = yaml.safe_load((ROOT / "stack/checked-keys.yaml").read_text())
COLLECTOR_SECTIONS = ("receivers", "processors", "exporters", "extensions", "connectors")


def key_paths(node: Any, prefix: str = "") -> set[str]:
    """Dotted key paths of a YAML document; "[]" for the items of a list of mappings."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out |= key_paths(v, path) or {path}
    elif isinstance(node, list) and any(isinstance(x, dict | list) for x in node):
        for item in node:
            out |= key_paths(item, prefix + "[]")
    return out


def normalize_collector(path: str) -> str:
    """exporters.file/traces.path -> exporters.file.path; service.pipelines.traces/x.* -> ...traces.*"""
    parts = path.split(".")
    if parts[0] in COLLECTOR_SECTIONS and len(parts) > 1:
        parts[1] = parts[1].split("/")[0]
    if parts[:2] == ["service", "pipelines"] and len(parts) > 2:
        parts[2] = parts[2].split("/")[0]
    return ".".join(parts)


def unchecked_keys(service: str, doc: Any) -> set[str]:
    """Keys of ``doc`` (a config file of ``service``) not in the list checked for its tag."""
    paths = key_paths(doc)
    if service == "otel-collector":
        paths = {normalize_collector(p) for p in paths}
    return paths - set(CHECKED[service]["keys"])


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("-")}


def test_every_third_party_image_has_an_entry_with_the_tag_compose_pins() -> None:
    third_party = {n for n, s in SERVICES.items() if not s["image"].startswith("stagescope")}
    assert third_party == set(CHECKED), third_party ^ set(CHECKED)
    for name, entry in CHECKED.items():
        assert SERVICES[name]["image"] == entry["image"], (
            f"{name}: compose pins {SERVICES[name]['image']}, its config was checked against {entry['image']}"
        )
        assert entry["sources"], name


@pytest.mark.parametrize("service", sorted(CHECKED))
def test_config_files_name_the_tag_they_were_checked_against(service: str) -> None:
    entry = CHECKED[service]
    for rel in entry["files"]:
        header = "".join(ln for ln in (ROOT / rel).read_text().splitlines(True) if ln.startswith("#"))
        assert f"Checked against {entry['image']}" in re.sub(r"\s*\n#\s*", " ", header), rel
        sources = [v.split(":")[0].removeprefix("./") for v in SERVICES[service].get("volumes", [])]
        assert any(rel == s or rel.startswith(s + "/") for s in sources), f"{service} does not mount {rel}"


@pytest.mark.parametrize("service", sorted(CHECKED))
def test_every_config_key_is_in_the_list_checked_for_that_tag(service: str) -> None:
    used: set[str] = set()
    for rel in CHECKED[service]["files"]:
        doc = yaml.safe_load((ROOT / rel).read_text())
        missing = unchecked_keys(service, doc)
        assert not missing, f"{rel}: keys not checked against {CHECKED[service]['image']}: {sorted(missing)}"
        used |= (
            key_paths(doc)
            if service != "otel-collector"
            else {normalize_collector(p) for p in key_paths(doc)}
        )
    # the list holds no stale keys either: each one is used by a file
    assert used == set(CHECKED[service]["keys"]), set(CHECKED[service]["keys"]) - used


@pytest.mark.parametrize("service", sorted(CHECKED))
def test_flags_and_environment_are_in_the_list(service: str) -> None:
    svc, entry = SERVICES[service], CHECKED[service]
    command = svc.get("command", [])
    health = svc.get("healthcheck", {}).get("test", [])[1:]
    health = health if health[:1] not in (["wget"], ["curl"]) else []  # the image's own binary's flags
    used = flags([*command, *health]) if isinstance(command, list) else set()
    assert used <= set(entry.get("flags", [])), used - set(entry.get("flags", []))
    features = {a.split("=", 1)[1] for a in command if a.startswith("--enable-feature=")}
    assert features <= set(entry.get("feature_flags", [])), features
    env = set(svc.get("environment", {}))
    assert env <= set(entry.get("environment", [])), env - set(entry.get("environment", []))


def test_an_unchecked_key_is_caught() -> None:
    """The check itself: a key that is not in the list (a typo, a key of another version) is reported."""
    doc = yaml.safe_load((ROOT / "stack/otel-collector.yaml").read_text())
    assert unchecked_keys("otel-collector", doc) == set()
    bad = copy.deepcopy(doc)
    bad["service"]["telemetry"]["metrics"]["address"] = "0.0.0.0:8888"  # ignored from collector 0.123 on
    bad["exporters"]["file/traces"]["rotation"]["max_size"] = 1
    assert unchecked_keys("otel-collector", bad) == {
        "service.telemetry.metrics.address", "exporters.file.rotation.max_size"
    }  # fmt: skip
    tempo = yaml.safe_load((ROOT / "stack/tempo.yaml").read_text())
    tempo["ingester"] = {"max_block_duration": "5m"}  # a Tempo 2.x block: Tempo 3 refuses to start
    assert unchecked_keys("tempo", tempo) == {"ingester.max_block_duration"}


def test_collector_metrics_use_readers_not_the_removed_address() -> None:
    metrics = yaml.safe_load((ROOT / "stack/otel-collector.yaml").read_text())["service"]["telemetry"][
        "metrics"
    ]
    assert "address" not in metrics
    (reader,) = metrics["readers"]
    assert reader["pull"]["exporter"]["prometheus"]["port"] == 8888
