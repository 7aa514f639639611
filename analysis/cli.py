"""``stagescope analyze``: which stage ate the tail, and which lever fixes it.

Exit status 0 whether or not the SLO was breached (the report's ``status`` says which); 3 when the SLO
had no samples (``status`` ``no_data``: no data is never a verdict, and ``no_data_reason`` says why);
2 with one line on stderr for bad input (a file, its line, and what is wrong).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stagescope.errors import EXIT_NO_DATA, UserError
from stagescope.names import STATUS_NO_DATA
from stagescope.validate import http_url, readable_file

__all__ = ["register", "run"]

FORMATS = ("text", "json", "html")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="find the stage that ate the tail latency and the lever that fixes it",
        description=(
            "Analyse traces (OTLP/JSON lines or documents, gzip, directories, stagescope's span sink, "
            "Jaeger JSON) and metrics against an SLO: breached or not, which stage owns the excess latency "
            "of the slow requests, which no-retrain lever fixes it and the predicted quantile after it. "
            "SLIs are server side: e2e = arrival to last byte; ttft = arrival to first token (vLLM's "
            "metric meaning); itl = each gap between consecutive tokens (vLLM's meaning, not a per-request mean). "
            "Exit status: 0 breached or met, 3 no data (0 samples: the report says why), 2 bad input."
        ),
    )
    p.add_argument(
        "--traces", nargs="+", action="extend", default=[], metavar="PATH",
        help="trace files or directories, the option repeatable (without them the scraped latency histograms "
        "answer, with no stage split)",
    )  # fmt: skip
    p.add_argument(
        "--metrics", nargs="+", action="extend", default=[], metavar="PATH",
        help="Prometheus exposition snapshots (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--prometheus", metavar="URL", type=http_url,
        help="a live Prometheus to range-query over the incident window",
    )  # fmt: skip
    p.add_argument(
        "--results", nargs="+", action="extend", default=[], metavar="PATH",
        help="load-generator results.parquet, one per run (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--slo", required=True, metavar="SPEC",
        help="'p99<300ms', 'ttft:p95<500ms', 'itl:p99<60ms' or an SLO YAML file",
    )  # fmt: skip
    p.add_argument(
        "--route", metavar="ROUTE",
        help="check only this route (its template, e.g. /v1/score); by default each route the SLO's SLI "
        "applies to is checked on its own and the report leads with the worst",
    )  # fmt: skip
    p.add_argument("--window", default="1m", help="breach-detection window (default 1m)")
    p.add_argument(
        "--events", metavar="FILE", type=readable_file,
        help="deploys, scale events, model swaps and config changes as JSON lines {time, kind: "
        "deploy|scale|model_swap|config, target, description, ...}: put on the timeline (with those "
        "kube-state-metrics series show) and matched to the breaches that follow them",
    )  # fmt: skip
    p.add_argument(
        "--skip-bad", action="store_true", help="warn about bad files or lines and analyse the rest"
    )
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    p.add_argument("--out", metavar="FILE", help="write the report here instead of stdout")
    p.set_defaults(func=run)


def _check_inputs(args: argparse.Namespace) -> Path | None:
    """What can be checked before reading any trace: the output file, and that Prometheus answers."""
    from stagescope.paths import ensure_writable_file
    from stagescope.validate import check_reachable

    if not (args.traces or args.metrics or args.prometheus or args.results):
        raise UserError("nothing to analyse: give --traces, --metrics, --prometheus or --results")
    out = None
    if args.out is not None:
        out = ensure_writable_file(args.out, "the report", create_parents=False)
    if args.prometheus:
        check_reachable(args.prometheus, "--prometheus")
    return out


def run(args: argparse.Namespace) -> int:
    from stagescope.analysis.api import analyze
    from stagescope.analysis.report import render
    from stagescope.analysis.routes import restrict
    from stagescope.slo import parse_duration_s, parse_slo

    slos = restrict(parse_slo(args.slo), args.route, args.slo)
    try:
        window_s = parse_duration_s(args.window)
    except ValueError as exc:
        raise UserError(f"bad --window: {exc}") from None
    if not 0.001 <= window_s <= 366 * 86400:  # the windows are whole nanoseconds, at least one sample wide
        raise UserError(f"bad --window {args.window[:40]!r}: must be from 1ms to 366d")
    out = _check_inputs(args)
    events = None
    if args.events is not None:  # read and checked in full before any trace is read
        from stagescope.analysis.events_file import read_events_file

        events = read_events_file(args.events)
    try:
        from stagescope.analysis.ingest import load_dataset
    except ImportError as exc:  # the ingest part is a separate module of this package
        raise UserError(f"trace ingest is not available: {exc}") from None
    ds = load_dataset(
        traces=args.traces, metrics=args.metrics, results=args.results,
        prometheus=args.prometheus, skip_bad=args.skip_bad,
    )  # fmt: skip
    report = analyze(ds, slos, route=args.route, window=args.window, events=events)
    text = render(report, args.format)
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{out}: cannot write report: {exc.strerror or exc}") from None
    return EXIT_NO_DATA if report["status"] == STATUS_NO_DATA else 0
