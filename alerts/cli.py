"""``stagescope alerts build --slo SLO_FILE --out DIR``: SLO file to Prometheus rule files."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add ``alerts`` (with its ``build`` action) to the ``stagescope`` command."""
    parser = subparsers.add_parser(
        "alerts",
        help="generate SLO burn-rate alerts and recording rules for Prometheus",
        description=(
            "Turn an SLO file into Prometheus rules: SLI error-ratio recording rules (5m ... 3d), "
            "LatencySLOFastBurn (severity=page) and LatencySLOSlowBurn (severity=ticket) per SLO, per-stage "
            "p99/mean rules and the queue-depth series for autoscaling. The SLO threshold must be a bucket "
            "boundary of the histogram its SLI reads."
        ),
    )
    actions = parser.add_subparsers(dest="alerts_action", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="write slo_rules.yml and stage_rules.yml into --out")
    build.add_argument("--slo", required=True, metavar="SLO_FILE", help="SLO YAML file (list 'slos:')")
    build.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    build.add_argument(
        "--runbook-url",
        default=None,
        metavar="URL",
        type=_runbook,
        help="base of the runbook_url annotation (default: alerts/RUNBOOK.md in this repository)",
    )
    build.set_defaults(func=run)


def _runbook(text: str) -> str:
    """A URL or path for the ``runbook_url`` annotation: not empty, no spaces or control characters."""
    if not text.strip() or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(f"expected a URL or path without spaces, got {text[:80]!r}")
    return text


def run(args: argparse.Namespace) -> int:
    from stagescope.alerts.build import build_rules
    from stagescope.alerts.rules import DEFAULT_RUNBOOK

    for path in build_rules(args.slo, args.out, args.runbook_url or DEFAULT_RUNBOOK):
        print(path)
    return 0
