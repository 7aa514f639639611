"""``stagescope demo``: a real service under real traffic breaches its SLO; stagescope finds why.

::

    stagescope demo                                   # one breach scenario, verdict printed
    stagescope demo --scenario saturated --apply-lever
    stagescope demo --all --duration 12               # every scenario, found vs true cause
    stagescope demo --engine onnx --scenario slow-compute --apply-lever   # a real model, real INT8
    stagescope demo --engine llama-cpp --all --apply-lever                # llama.cpp's real LLM server

Progress goes to stderr, the verdict and tables to stdout. Exit status 0 after a verdict, 3 when the
run's analysis had no samples (no data is never a verdict: the printout says why), 2 for bad input.
"""

from __future__ import annotations

import argparse
from typing import Any

from stagescope import validate as V

__all__ = ["DEFAULT_SCENARIO", "register", "run"]

#: The scenario ``make demo`` runs (on the default, simulated engine).
DEFAULT_SCENARIO = "long-batch-wait"


def _engine_names() -> tuple[str, ...]:
    from stagescope.service.engines import ENGINES

    return tuple(ENGINES)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the reference service in a fault scenario under a real trace, and print the verdict",
        description=(
            "Start the reference inference service in a fault scenario on an engine (the SIMULATED "
            "accelerator by default, a real model on ONNX Runtime, or llama.cpp's llama-server serving a "
            "RANDOM-WEIGHT llama), replay a real Azure LLM arrival trace "
            "against it, record spans, metrics and load results to local files, analyse them and print the "
            "verdict. No Docker needed."
        ),
    )
    p.add_argument("--engine", choices=_engine_names(), default="simulated",
                   help="what runs the model: simulated (default; SIMULATED accelerator, fast) or onnx (a real "
                        "digits classifier on ONNX Runtime with real INT8; needs the onnx extra) or llama-cpp "
                        "(llama.cpp's llama-server built here from source, serving a RANDOM-WEIGHT llama: real "
                        "compute, meaningless text; needs the llama-cpp extra, cmake and a C++ compiler; the first "
                        "run builds it, minutes); each engine has its own scenarios")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--scenario", default=None,
                       help=f"scenario to run (default {DEFAULT_SCENARIO}, slow-compute on onnx, llama-long-prompts "
                            "on llama-cpp; "
                            "`stagescope serve --list-scenarios`)")
    which.add_argument("--all", action="store_true", help="run every scenario and compare found vs true cause")
    p.add_argument("--duration", type=V.number(2.0, 3600.0), default=None, metavar="S",
                   help="seconds of load per run (default 20; 12 with --all; an engine's sizing may ask for "
                        "longer: llama-cpp's slot fault runs for 80 arrivals, up to 60 s)")
    p.add_argument("--out", default="out/demo", metavar="DIR", help="output folder (default out/demo)")
    p.add_argument("--apply-lever", action="store_true",
                   help="run again with the recommended lever applied; compare measured and predicted p99")
    p.add_argument("--port", type=V.port(), default=0, help="port for the service (default: a free one)")
    p.set_defaults(func=run)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from stagescope.demo.main import run_all, run_one
    from stagescope.paths import ensure_writable_dir
    from stagescope.service.engines import get_engine

    engine = get_engine(args.engine)
    # `is None`, not `or`: --scenario '' is an unknown scenario (one line), not the default one
    name = engine.default_scenario if args.scenario is None else args.scenario
    scenario = engine.get_scenario(name).name  # one line if unknown
    engine.check_available()
    out = ensure_writable_dir(args.out, "the demo's output there")  # before any scenario starts
    if args.all:
        return run_all(out, duration_s=args.duration or 12.0, apply_lever=args.apply_lever, port=args.port,
                       engine=engine.name)  # fmt: skip
    return run_one(scenario, out, duration_s=args.duration or 20.0, apply_lever=args.apply_lever,
                   port=args.port, engine=engine.name)  # fmt: skip
