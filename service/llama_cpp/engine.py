"""What the demo needs to run the llama.cpp engine: its label, scenarios, readiness and serve command.

``stagescope demo --engine llama-cpp`` prepares the engine once (:func:`prepare`: build or find
``llama-server``, write or find the random-weight model), then runs each scenario as the child
process :func:`serve_command` names (:mod:`.serve`: the servers behind the instrumented gateway),
and drives the gateway with the load generator's OpenAI completions client.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stagescope.service.llama_cpp.scenarios import COMPLETIONS_ROUTE, LLAMA_SCENARIOS
from stagescope.service.scenarios import Scenario

__all__ = [
    "API",
    "DEFAULT_SCENARIO",
    "LABEL",
    "NAME",
    "ROUTE",
    "SCENARIOS",
    "cannot_run_reason",
    "lever_settings",
    "missing",
    "prepare",
    "serve_command",
    "sizing",
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


#: A long prompt is sized to take this many times the SLO threshold to process, on this machine now.
LONG_PROMPT_OVER_SLO = 2.0
#: Prompt tokens of the probe that measures the prompt-processing speed (about a long prompt's length).
PROBE_TOKENS = 1024


def _prompt_ms_per_token(sc: Scenario) -> float:
    """Milliseconds per prompt token of a llama-server with scenario ``sc``'s settings, measured now:
    one server, a short warm-up prompt, then a PROBE_TOKENS-token prompt (llama.cpp's own timings)."""
    import dataclasses
    import json
    import tempfile
    import urllib.request

    from stagescope.errors import UserError
    from stagescope.loadgen.bodies import synthetic_prompt
    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gguf_model import ensure_model
    from stagescope.service.llama_cpp.serve import scenario_config
    from stagescope.service.llama_cpp.server import LlamaServer

    build = ensure_server()
    model = ensure_model(build.vocab())
    cfg = dataclasses.replace(scenario_config(sc.name, apply_lever=False), parallel=1, replicas=1)
    with tempfile.TemporaryDirectory(prefix="stagescope-llama-probe-") as tmp:
        srv = LlamaServer(build.server, model.path, cfg, log=Path(tmp) / "llama-server.log")
        try:
            srv.wait_ready()
            timings: dict[str, Any] = {}
            for i, size in enumerate((64, PROBE_TOKENS)):
                body = {"prompt": synthetic_prompt(size, unique_key=("probe", i)), "max_tokens": 1, "cache_prompt": False}
                req = urllib.request.Request(f"{srv.url}/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
                with urllib.request.urlopen(req, timeout=120) as r:
                    timings = json.loads(r.read()).get("timings") or {}
        except OSError as exc:
            raise UserError(f"llama.cpp: the prompt-speed probe failed: {exc}") from None
        finally:
            srv.stop()
    n, ms = timings.get("prompt_n"), timings.get("prompt_ms")
    if not n or not ms:
        raise UserError("llama.cpp: the prompt-speed probe got no timings (prompt_n, prompt_ms) back")
    return float(ms) / float(n)


def sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    """Size a scenario's long prompts to this machine now (the demo does, before the run and its lever
    check alike): as many tokens as llama.cpp processes in LONG_PROMPT_OVER_SLO x the SLO threshold at
    the speed just measured, within what one step and one slot hold. The speed moved 2.5x with the
    machine's load here (1.00 and 0.41 ms per token), so a fixed length breached on one run and not the
    next. Scenarios without long prompts are not sized."""
    w = sc.workload
    if not w.long_prompt_every:
        return {}, None
    from stagescope.service.llama_cpp.serve import scenario_config

    cfg = scenario_config(sc.name, apply_lever=False)
    per_token = _prompt_ms_per_token(sc)
    room = min(cfg.batch_size, cfg.ctx_per_slot) - w.max_tokens - 64  # one step; the slot's context
    tokens = max(256, min(room, int(LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms / per_token)))
    return {"workload.long_prompt_tokens": tokens}, (
        f"long prompts sized to this machine now: {tokens} tokens each, what llama.cpp processes in about "
        f"{tokens * per_token:.0f} ms ({LONG_PROMPT_OVER_SLO:g} x the SLO threshold at most) at the "
        f"{per_token:.3f} ms per prompt token just measured; the same length in the lever check"
    )


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
        cmd += ["--set", f"{k}={v}"]
    return [*cmd, "--apply-lever"] if apply_lever else cmd
