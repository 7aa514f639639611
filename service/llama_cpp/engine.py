"""What the demo needs to run the llama.cpp engine: its label, scenarios, readiness and serve command.

``stagescope demo --engine llama-cpp`` prepares the engine once (:func:`prepare`: build or find
``llama-server``, write or find the random-weight model), then runs each scenario as the child
process :func:`serve_command` names (:mod:`.serve`: the servers behind the instrumented gateway),
and drives the gateway with the load generator's OpenAI completions client. :func:`sizing`
(:mod:`.sizing`) sizes a scenario's load or SLO to the machine first.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stagescope.service.llama_cpp.scenarios import COMPLETIONS_ROUTE, LLAMA_SCENARIOS
from stagescope.service.llama_cpp.sizing import MEASURED_PREFIX, sizing, tokens_for
from stagescope.service.llama_cpp.slot_probe import MEASURED_CPU_PREFIX
from stagescope.service.scenarios import Scenario

__all__ = [
    "API",
    "DEFAULT_SCENARIO",
    "LABEL",
    "MEASURED_PREFIX",
    "NAME",
    "ROUTE",
    "SCENARIOS",
    "cannot_run_reason",
    "lever_settings",
    "missing",
    "prepare",
    "serve_command",
    "sizing",
    "tokens_for",
]

NAME = "llama-cpp"
LABEL = "llama.cpp llama-server (real CPU compute; RANDOM-WEIGHT model, meaningless text) behind the stagescope gateway"
SCENARIOS: Mapping[str, Scenario] = LLAMA_SCENARIOS
DEFAULT_SCENARIO = "llama-long-prompts"
ROUTE = COMPLETIONS_ROUTE
#: The load generator's API for this engine.
API = "openai-completions"


def missing() -> list[str]:
    """Distributions of the ``llama-cpp`` extra that cannot be imported here."""
    from stagescope.extras import missing as missing_extra

    return missing_extra("llama-cpp")


def cannot_run_reason() -> str | None:
    """Why the engine cannot run here (one line; a missing extra or build tool), or None."""
    from stagescope.service.llama_cpp.build import cannot_build_reason, find_server

    absent = missing()
    if absent:
        return f"engine llama-cpp needs {', '.join(absent)}: pip install 'stagescope[llama-cpp]'"
    return None if find_server() is not None else cannot_build_reason()


def prepare() -> str:
    """Build (or find) ``llama-server`` and write (or find) the model; say what they are."""
    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gguf_model import ensure_model

    build = ensure_server()
    model = ensure_model(build.vocab())
    m = model.manifest
    return (
        f"llama-server from llama-cpp-python {build.manifest.get('source', '')} ({build.folder}); model "
        f"{model.path} ({m['file']['parameters']:,} RANDOM weights, {m['file']['n_vocab']:,}-token llama "
        "vocabulary; real compute, meaningless text; made as its manifest.json says)"
    )


def lever_settings(lever: str | None, report: Mapping[str, Any]) -> dict[str, int]:
    """Engine settings that make the lever check apply the value the analysis predicted for: for
    ``reduce-batch-tokens`` the running-batch cap it chose (``evidence.running_cap``) as ``parallel``
    (llama.cpp's slots are its running batch). Other levers have no value to pass."""
    from stagescope import names as N

    cap = (report.get("evidence") or {}).get("running_cap")
    if lever == N.LEVER_REDUCE_BATCH_TOKENS and isinstance(cap, int | float) and cap >= 1:
        return {"parallel": int(cap)}
    return {}


def serve_command(
    sc: Scenario, *, port: int, spans_dir: Path, apply_lever: bool, overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """The child process serving scenario ``sc`` on ``port``, every trace kept."""
    cmd = [
        sys.executable, "-m", "stagescope.service.llama_cpp.serve", "--scenario", sc.name,
        "--host", "127.0.0.1", "--port", str(port), "--spans-out", str(spans_dir),
        "--baseline-sample", "1",  # keep every trace: the analysis needs the baseline too
    ]  # fmt: skip
    for k, v in (overrides or {}).items():
        if k.startswith(MEASURED_PREFIX):  # a measurement for the analysis, not an engine setting
            cmd += ["--measured-service", f"{k[len(MEASURED_PREFIX):]}={v}"]
        elif k.startswith(MEASURED_CPU_PREFIX):  # the cores the server got in that measurement
            cmd += ["--measured-cpu", f"{k[len(MEASURED_CPU_PREFIX):]}={v}"]
        else:
            cmd += ["--set", f"{k}={v}"]
    return [*cmd, "--apply-lever"] if apply_lever else cmd
