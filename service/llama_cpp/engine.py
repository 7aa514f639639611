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


#: A long prompt is sized to take this many times the SLO threshold to process, on this machine now.
LONG_PROMPT_OVER_SLO = 2.0
#: Prompt lengths the probe times, after a short warm-up: a prompt step costs more per token the longer
#: it is (1,024 tokens took 0.24 ms each, 4,016 tokens 1.04 ms each, minutes apart on this machine).
PROBE_TOKENS = (512, 2048)


_PROBE_WORDS = ("alpha", "river", "stone", "garden", "window", "orange", "silver", "market", "planet", "yellow",
                "bridge", "candle", "forest", "letter", "summer", "pencil", "rocket", "violet", "harbor", "meadow")  # fmt: skip


def _probe_text(words: int, key: int) -> str:
    """About ``words`` tokens of plain English words (a different text per ``key``); the fit uses the
    token count llama.cpp reports (``prompt_n``), not this estimate."""
    n = len(_PROBE_WORDS)
    return " ".join(_PROBE_WORDS[(k * (key + 3) + k // n) % n] for k in range(words))


def _prompt_step_ms(sc: Scenario) -> list[tuple[int, float]]:
    """``(prompt tokens, ms)`` of one prompt step of each PROBE_TOKENS length on a llama-server with
    scenario ``sc``'s settings, measured now with llama.cpp's own timings (after a warm-up prompt)."""
    import dataclasses
    import json
    import tempfile
    import urllib.request

    from stagescope.errors import UserError
    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gguf_model import ensure_model
    from stagescope.service.llama_cpp.serve import scenario_config
    from stagescope.service.llama_cpp.server import LlamaServer

    build = ensure_server()
    model = ensure_model(build.vocab())
    cfg = dataclasses.replace(scenario_config(sc.name, apply_lever=False), parallel=1, replicas=1)
    got: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="stagescope-llama-probe-") as tmp:
        srv = LlamaServer(build.server, model.path, cfg, log=Path(tmp) / "llama-server.log")
        try:
            srv.wait_ready()
            for i, size in enumerate((64, *PROBE_TOKENS)):
                body = {"prompt": _probe_text(size, i), "max_tokens": 1, "cache_prompt": False}
                req = urllib.request.Request(f"{srv.url}/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
                with urllib.request.urlopen(req, timeout=120) as r:
                    t = json.loads(r.read()).get("timings") or {}
                if i and t.get("prompt_n") and t.get("prompt_ms"):
                    got.append((int(t["prompt_n"]), float(t["prompt_ms"])))
        except OSError as exc:
            raise UserError(f"llama.cpp: the prompt-speed probe failed: {exc}") from None
        finally:
            srv.stop()
    if len(got) < len(PROBE_TOKENS):
        raise UserError("llama.cpp: the prompt-speed probe got no timings (prompt_n, prompt_ms) back")
    return got


def tokens_for(ms: float, probes: list[tuple[int, float]]) -> int:
    """Prompt tokens one step processes in ``ms``, from two probe steps ``(tokens, ms)``: the step's time
    as ``a n + b n^2`` through both (attention grows with the prompt), linear when that bends down."""
    (n1, t1), (n2, t2) = probes[0], probes[-1]
    b = (t2 / n2 - t1 / n1) / (n2 - n1) if n2 != n1 else 0.0
    a = t1 / n1 - b * n1
    if b <= 0 or a <= 0:
        return int(ms * n2 / t2)
    return int((-a + (a * a + 4 * b * ms) ** 0.5) / (2 * b))


def sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    """Size a scenario's long prompts to this machine now (the demo does, before the run and its lever
    check alike): as many tokens as llama.cpp processes in LONG_PROMPT_OVER_SLO x the SLO threshold at
    the speed just measured, within what one step and one slot hold. The speed moved 2.5x with the
    machine's load here (1.00 and 0.41 ms per token for 1,500 tokens), so a fixed length breached on
    one run and not the next. Scenarios without long prompts are not sized."""
    w = sc.workload
    if not w.long_prompt_every:
        return {}, None
    from stagescope.service.llama_cpp.serve import scenario_config

    cfg = scenario_config(sc.name, apply_lever=False)
    probes = _prompt_step_ms(sc)
    target = LONG_PROMPT_OVER_SLO * sc.slo.threshold_ms
    room = min(cfg.batch_size, cfg.ctx_per_slot) - w.max_tokens - 64  # one step; the slot's context
    tokens = max(256, min(room, tokens_for(target, probes)))
    seen = ", ".join(f"{n} tokens in {ms:.0f} ms" for n, ms in probes)
    return {"workload.long_prompt_tokens": tokens}, (
        f"long prompts sized to this machine now: {tokens} tokens each, what llama.cpp processes in one step "
        f"of about {target:.0f} ms ({LONG_PROMPT_OVER_SLO:g} x the SLO threshold) at the speed just measured "
        f"({seen}); the same length in the lever check"
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
