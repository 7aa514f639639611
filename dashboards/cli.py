"""``stagescope dashboards build --out DIR``: write the Grafana dashboards as JSON."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add ``dashboards`` (with its ``build`` action) to the ``stagescope`` command."""
    parser = subparsers.add_parser(
        "dashboards",
        help="generate the Grafana dashboards (latency stages, LLM serving, GPU, SLO)",
        description=(
            "Write the stagescope Grafana dashboards as JSON (grafanalib): inference latency by stage, "
            "LLM serving (TTFT, ITL, TPOT; stagescope and vLLM names), GPU (dcgm-exporter, Triton), SLO "
            "(error budget, burn rates, alerts). Variables: datasource, job, model."
        ),
    )
    actions = parser.add_subparsers(dest="dashboards_action", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="write one <uid>.json per dashboard into --out")
    build.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    build.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stagescope.dashboards.build import build_dashboards

    for path in build_dashboards(args.out):
        print(path)
    return 0
