"""The stack's config files: promtool, amtool, collector pipelines, Grafana provisioning, cross-links."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagescope import names
from stagescope.slo import load_slo_file

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "stack"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROM = yaml.safe_load((STACK / "prometheus.yml").read_text())
OTEL = yaml.safe_load((STACK / "otel-collector.yaml").read_text())
PROVISIONING = STACK / "grafana/provisioning"


def mounts(service: str) -> dict[str, str]:
    """container path -> host path of a service's bind mounts."""
    out = {}
    for v in SERVICES[service].get("volumes", []):
        parts = v.split(":")
        if parts[0].startswith("."):
            out[parts[1]] = parts[0]
    return out


def host_file(service: str, container_path: str) -> Path:
    """The repo file a container path of ``service`` is mounted from (longest mount prefix)."""
    best = max(
        (c for c in mounts(service) if container_path == c or container_path.startswith(c + "/")), key=len
    )
    return ROOT / (mounts(service)[best] + container_path[len(best) :])


def prometheus_config_for(tmp: Path, replace: dict[str, str] | None = None) -> Path:
    """stack/prometheus.yml with the rule-file glob pointed at alerts/generated (and addresses replaced)."""
    text = (STACK / "prometheus.yml").read_text()
    rules_dir = host_file("prometheus", "/etc/prometheus/rules")
    text = text.replace("/etc/prometheus/rules/", f"{rules_dir}/")
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    out = tmp / "prometheus.yml"
    out.write_text(text)
    return out


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (.ci/run installs it)")
def test_promtool_checks_the_prometheus_config_and_its_rules(tmp_path: Path) -> None:
    p = subprocess.run(["promtool", "check", "config", str(prometheus_config_for(tmp_path))],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") >= 3  # the config and at least two generated rule files


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool not installed (.ci/run installs it)")
def test_amtool_checks_the_alertmanager_config_compose_mounts() -> None:
    cfg = host_file("alertmanager", "/etc/alertmanager/alertmanager.yml")
    assert cfg == ROOT / "alerts/alertmanager.yml"
    p = subprocess.run(["amtool", "check-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_prometheus_scrapes_the_services_the_rules_and_dashboards_need() -> None:
    jobs = {j["job_name"]: j for j in PROM["scrape_configs"]}
    rules_text = "".join(p.read_text() for p in (ROOT / "alerts/generated").glob("*.yml"))
    for job in set(re.findall(r'job="([^"]+)"', rules_text)):
        assert job in jobs, f"rules select job={job!r}, which no scrape job has"
    for job in ("inference", "otel-collector", "stagescope-gpu-exporter", "dcgm-exporter"):
        assert job in jobs, job
    ports = {
        "inference": "8000", "otel-collector": "8888", "stagescope-gpu-exporter": "9400",
        "dcgm-exporter": "9400", "tempo": "3200", "alertmanager": "9093",
    }  # fmt: skip
    for job in PROM["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            host, port = target.split(":")
            if host != "localhost":
                assert host in SERVICES, f"{job['job_name']}: {host} is not a compose service"
                if host in ports and job["job_name"] != "otel-collector-otlp":
                    assert port == ports[host], target
    assert "--port=8000" in SERVICES["inference"]["command"]
    assert "--port=9400" in SERVICES["stagescope-gpu-exporter"]["command"]
    (am,) = PROM["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # the GPU exporter's max/mean window is the scrape interval of its job
    window = next(a for a in SERVICES["stagescope-gpu-exporter"]["command"] if a.startswith("--window="))
    assert jobs["stagescope-gpu-exporter"]["scrape_interval"] == window.split("=")[1] + "s"


def test_collector_pipelines_use_only_defined_components_in_the_right_order() -> None:
    svc = OTEL["service"]
    for ext in svc.get("extensions", []):
        assert ext in OTEL["extensions"], ext
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for name, pipe in svc["pipelines"].items():
        for kind in used:
            for comp in pipe.get(kind, []):
                assert comp in OTEL[kind], f"pipeline {name}: {kind[:-1]} {comp} is not defined"
                used[kind].add(comp)
        assert pipe["receivers"] and pipe["exporters"], name
        procs = pipe["processors"]
        assert procs[0] == "memory_limiter", f"{name}: memory_limiter must come first"
        assert procs.index("batch") > 0, name
        if "tail_sampling" in procs:
            assert procs.index("tail_sampling") < procs.index("batch"), name
    for kind, comps in used.items():
        assert set(OTEL[kind]) == comps, f"defined but unused {kind}: {set(OTEL[kind]) - comps}"
    traces = svc["pipelines"]["traces"]
    assert {"otlp_grpc/tempo", "file/traces"} <= set(traces["exporters"]) and "tail_sampling" in traces[
        "processors"
    ]
    assert OTEL["receivers"]["otlp"]["protocols"].keys() == {"grpc", "http"}
    assert OTEL["exporters"]["otlp_grpc/tempo"]["endpoint"] == "tempo:4317"
    (reader,) = svc["telemetry"]["metrics"]["readers"]
    assert reader["pull"]["exporter"]["prometheus"]["port"] == 8888  # the port Prometheus scrapes


def test_tail_sampling_keeps_slower_than_the_slo_threshold_and_a_baseline() -> None:
    slos = load_slo_file(ROOT / "alerts/slo.yaml")
    e2e_threshold = min(s.threshold_ms for s in slos if s.sli == names.SLI_E2E)
    policies = {p["type"]: p for p in OTEL["processors"]["tail_sampling"]["policies"]}
    assert policies["latency"]["latency"]["threshold_ms"] == e2e_threshold == 300
    baseline = policies["probabilistic"]["probabilistic"]["sampling_percentage"]
    assert 0 < baseline < 100
    kept = policies["string_attribute"]["string_attribute"]
    assert kept["key"] == names.ATTR_SAMPLED_REASON
    env = SERVICES["inference"]["environment"]  # the service samples by the same rule (exemplars stay valid)
    assert float(env[names.ENV_SLOW_THRESHOLD_MS]) == e2e_threshold
    assert float(env[names.ENV_BASELINE_SAMPLE]) == pytest.approx(baseline / 100)


def test_file_exporter_writes_otlp_json_lines_to_data_traces() -> None:
    fe = OTEL["exporters"]["file/traces"]
    assert fe["format"] == "json" and fe["path"].endswith(".jsonl")
    assert host_file("otel-collector", fe["path"]).parent == ROOT / "data/traces"
    assert host_file("otel-collector", "/etc/otelcol-contrib/config.yaml") == STACK / "otel-collector.yaml"


def test_grafana_datasources_link_exemplars_to_tempo_and_traces_to_metrics() -> None:
    assert host_file("grafana", "/etc/grafana/provisioning/datasources") == PROVISIONING / "datasources"
    (doc,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "datasources").glob("*.yaml")]
    ds = {d["uid"]: d for d in doc["datasources"]}
    assert ds["tempo"]["type"] == "tempo" and ds["tempo"]["url"] == "http://tempo:3200"
    prom = next(d for d in ds.values() if d["type"] == "prometheus")
    assert prom["url"] == "http://prometheus:9090" and prom["isDefault"]
    assert prom["jsonData"]["exemplarTraceIdDestinations"] == [{"name": "trace_id", "datasourceUid": "tempo"}]
    t2m = ds["tempo"]["jsonData"]["tracesToMetrics"]
    assert t2m["datasourceUid"] == prom["uid"] and t2m["queries"]
    assert ds["alertmanager"]["url"] == "http://alertmanager:9093"
    for d in ds.values():
        host = d["url"].split("//")[1].split(":")[0]
        assert host in SERVICES, d["url"]


def test_grafana_provisioning_escapes_dollar_signs() -> None:
    """Grafana expands $VAR in provisioning files; its own $__tags etc. must be written $$."""
    escaped = 0
    for p in PROVISIONING.rglob("*.yaml"):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            assert not re.search(r"(?<!\$)\$(?!\$)", line.replace("$$", "")), f"{p.name}:{n}: unescaped $"
            escaped += line.count("$$")
    assert escaped >= 1  # the traces-to-metrics query uses $$__tags


def test_grafana_dashboard_provider_points_at_the_generated_dashboards() -> None:
    (doc,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "dashboards").glob("*.yaml")]
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    folder = host_file("grafana", provider["options"]["path"])
    assert folder == ROOT / "dashboards/generated"
    dashboards = {p.name: json.loads(p.read_text()) for p in folder.glob("*.json")}
    assert len(dashboards) >= 3
    for name, d in dashboards.items():
        assert d["uid"].startswith("stagescope-") and d["panels"], name
        for var in d.get("templating", {}).get("list", []):
            if var.get("type") == "datasource":
                assert var["query"] == "prometheus", name  # resolved to the provisioned default
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_file("grafana", home).is_file()


def test_metric_names_in_stack_files_come_from_names_py() -> None:
    known = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    for p in [*STACK.rglob("*.y*ml")]:
        for metric in set(re.findall(r"\bstagescope_[a-z_]+", p.read_text())):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            assert base in known, f"{p.relative_to(ROOT)}: {metric} is not in stagescope/names.py"


def test_tempo_config_receives_otlp_grpc_and_stores_on_the_named_volume() -> None:
    tempo = yaml.safe_load((STACK / "tempo.yaml").read_text())
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    assert tempo["server"]["http_listen_port"] == 3200
    assert tempo["storage"]["trace"]["local"]["path"].startswith("/var/tempo")
    assert "tempo-data:/var/tempo" in SERVICES["tempo"]["volumes"]
