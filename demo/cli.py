"""``stagescope demo``: a real service under real traffic breaches its SLO; stagescope finds why.

::

    stagescope demo                                   # one breach scenario, verdict printed
    stagescope demo --scenario saturated --apply-lever
    stagescope demo --all --duration 12               # every scenario, found vs true cause

Progress goes to stderr, the verdict and tables to stdout. Exit status 0 after a verdict, 3 when the
run's analysis had no samples (no data is never a verdict: the printout says why), 2 for bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_SCENARIO", "register", "run"]

#: The scenario ``make demo`` runs.
DEFAULT_SCENARIO = "long-batch-wait"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the reference service in a fault scenario under a real trace, and print the verdict",
        description=(
            "Start the reference inference service (SIMULATED accelerator) in a fault scenario, replay a "
            "real Azure LLM arrival trace against it, record spans, metrics and load results to local "
            "files, analyse them and print the verdict. No Docker needed."
        ),
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--scenario", default=DEFAULT_SCENARIO,
                       help=f"scenario to run (default {DEFAULT_SCENARIO}; `stagescope serve --list-scenarios`)")
    which.add_argument("--all", action="store_true", help="run every scenario and compare found vs true cause")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="seconds of load per run (default 20; 12 with --all)")
    p.add_argument("--out", default="out/demo", metavar="DIR", help="output folder (default out/demo)")
    p.add_argument("--apply-lever", action="store_true",
                   help="run again with the recommended lever applied; compare measured and predicted p99")
    p.add_argument("--port", type=int, default=0, help="port for the service (default: a free one)")
    p.set_defaults(func=run)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from stagescope.demo.main import run_all, run_one
    from stagescope.errors import UserError

    if args.duration is not None and not 2.0 <= args.duration <= 3600.0:
        raise UserError(f"--duration must be between 2 and 3600 seconds, got {args.duration:g}")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    out = Path(args.out)
    if args.all:
        return run_all(out, duration_s=args.duration or 12.0, apply_lever=args.apply_lever, port=args.port)
    return run_one(args.scenario, out, duration_s=args.duration or 20.0, apply_lever=args.apply_lever,
                   port=args.port)  # fmt: skip
