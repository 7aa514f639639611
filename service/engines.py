"""Engines the demo and ``stagescope serve`` can run, each with its own scenario table: ONE registry.

An engine is what executes the model: the ``simulated`` accelerator (the default, fast, SIMULATED
everywhere it appears) or a real one (``onnx``: ONNX Runtime on the CPU; ``llama-cpp``: llama.cpp's
``llama-server`` behind the stagescope gateway, :mod:`stagescope.service.llama_cpp`). Each engine brings the
scenarios it can reproduce, with settings sized for it, and says how the demo starts a service on
it. Adding an engine is a new module with its :class:`Engine` and one line in :data:`ENGINES`
(the ``llama-cpp`` engine's :attr:`Engine.command` starts external servers instead of ``stagescope serve``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stagescope.errors import UserError
from stagescope.service.llama_cpp import engine as llama_engine
from stagescope.service.onnx_scenarios import ONNX_SCENARIOS
from stagescope.service.scenarios import SCENARIOS, Scenario

__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "engine_for_backend", "get_engine"]


def _no_missing() -> list[str]:
    return []


def _onnx_missing() -> list[str]:
    from stagescope.service.onnx_model import missing_packages

    return missing_packages()


def _nothing_to_prepare() -> str | None:
    return None


def _no_lever_settings(lever: str | None, report: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def _llama_lever_settings(lever: str | None, report: Mapping[str, Any]) -> dict[str, Any]:
    return dict(llama_engine.lever_settings(lever, report))


def _no_sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    return {}, None


def _onnx_sizing(sc: Scenario) -> tuple[dict[str, Any], str | None]:
    """A heavy request's image count for this machine now (see onnx_backend.size_heavy_items)."""
    if not float(sc.overrides.get("heavy_share", 0.0)):
        return {}, None
    from stagescope.service.onnx_backend import HEAVY_OVER_SLO, size_heavy_items
    from stagescope.service.settings import Settings, apply_overrides

    over = HEAVY_OVER_SLO if sc.heavy_over_slo is None else sc.heavy_over_slo
    target = over * sc.slo.threshold_ms
    items, per_image = size_heavy_items(apply_overrides(Settings(), sc.overrides), target)
    return {"heavy_items": items}, (
        f"heavy requests sized to this machine now: {items} images each, what the served model classifies in "
        f"about {target:.0f} ms ({over:g} x the SLO threshold) at the {per_image:.3f} ms per image just "
        "measured; the same count in the lever check"
    )


def _onnx_prepare() -> str | None:
    from stagescope.service.onnx_model import MODELS, ensure_artifacts

    lines = []
    for model in MODELS:  # every scenario's model, so that no run stops to build one
        art = ensure_artifacts(model=model)
        acc = art.manifest["eval_accuracy"]
        lines.append(f"{model} {art.folder} ({art.manifest['eval_images']} held-out eval images: FP32 accuracy "
                     f"{acc['fp32']:.2%}, INT8 {acc['int8']:.2%})")  # fmt: skip
    return "models " + "; ".join(lines) + "; made as their manifest.json says"


@dataclass(frozen=True)
class Engine:
    """One engine: its name, what it is (for every line the demo prints), its scenarios, the
    ``stagescope serve --backend`` it runs on, and how to tell whether it can run here."""

    name: str
    label: str
    scenarios: Mapping[str, Scenario]
    default_scenario: str
    backend: str
    missing: Callable[[], list[str]] = _no_missing
    install_hint: str = ""
    #: builds (or finds cached) what the engine needs before a service starts; says what, or None
    prepare: Callable[[], str | None] = _nothing_to_prepare
    #: settings that size a scenario to this machine, used for its run and its lever check alike,
    #: and a line saying what was measured (real engines: the hardware sets the cost of the work)
    sizing: Callable[[Scenario], tuple[dict[str, Any], str | None]] = _no_sizing
    #: the command serving a scenario when it is not ``stagescope serve --backend`` (same keywords as
    #: :meth:`serve_command`)
    command: Callable[..., list[str]] | None = None
    #: engine settings carrying a value the analysis chose for the lever it recommends (its report),
    #: applied on top of the scenario's lever change in the lever check
    lever_settings: Callable[[str | None, Mapping[str, Any]], dict[str, Any]] = _no_lever_settings

    def get_scenario(self, name: str) -> Scenario:
        """The scenario called ``name`` on this engine; an unknown one is a UserError listing them."""
        try:
            return self.scenarios[name]
        except KeyError:
            raise UserError(
                f"unknown scenario {name!r} for engine {self.name}; known: {', '.join(self.scenarios)}"
            ) from None

    def check_available(self) -> None:
        """Raise a one-line UserError when this engine cannot run here (a missing extra)."""
        missing = self.missing()
        if missing:
            raise UserError(f"engine {self.name} needs {', '.join(missing)} (not installed): {self.install_hint}")

    def serve_command(
        self, sc: Scenario, *, port: int, spans_dir: Path, apply_lever: bool, overrides: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The command the demo runs to serve scenario ``sc`` on ``port`` (stagescope's default sampling:
        each kept span says with what probability, and the analysis weights them back), with
        ``overrides`` (from :attr:`sizing`) as ``--set``."""
        if self.command is not None:
            return self.command(sc, port=port, spans_dir=spans_dir, apply_lever=apply_lever, overrides=overrides)
        cmd = [
            sys.executable, "-m", "stagescope.cli", "serve", "--backend", self.backend, "--scenario", sc.name,
            "--host", "127.0.0.1", "--port", str(port), "--spans-out", str(spans_dir),
        ]  # fmt: skip
        for k, v in (overrides or {}).items():
            cmd += ["--set", f"{k}={v}"]
        return [*cmd, "--apply-lever"] if apply_lever else cmd


ENGINES: Mapping[str, Engine] = MappingProxyType(
    {
        e.name: e
        for e in (
            Engine("simulated", "reference service, SIMULATED accelerator", SCENARIOS, "long-batch-wait",
                   "simulated"),
            Engine("onnx", "reference service, real digits model on ONNX Runtime (CPU)", ONNX_SCENARIOS,
                   "slow-compute", "onnx", _onnx_missing, "pip install 'stagescope[onnx]'", _onnx_prepare,
                   _onnx_sizing),
            Engine(llama_engine.NAME, llama_engine.LABEL, llama_engine.SCENARIOS, llama_engine.DEFAULT_SCENARIO,
                   llama_engine.NAME, llama_engine.missing, "pip install 'stagescope[llama-cpp]'",
                   llama_engine.prepare, llama_engine.sizing, command=llama_engine.serve_command,
                   lever_settings=_llama_lever_settings),
        )
    }
)  # fmt: skip
DEFAULT_ENGINE = "simulated"


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UserError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}") from None


def engine_for_backend(backend: str) -> Engine:
    """The engine whose scenario table ``stagescope serve --backend B`` uses: the one running on B,
    else the simulated engine's (numpy and torch run the simulated engine's scenarios)."""
    return next((e for e in ENGINES.values() if e.backend == backend), ENGINES[DEFAULT_ENGINE])
