"""``stagescope load``: drive a service open-loop and write one row per request to Parquet.

Thin layer over :func:`stagescope.loadgen.run_load`: parses options, shows a rich progress bar (live
rate, requests in flight, corrected p50/p99), prints the summary table (or ``--json``). Ctrl-C stops
sending; what was recorded is still written (exit status 130). A server that refuses connections
gets one line on stderr and exit status 2, after the results so far are written.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load",
        help="open-loop load generator: replay a real arrival trace or a Poisson/gamma/constant rate",
        description=(
            "Send each request at its intended time whether or not earlier ones were answered, and report "
            "latency from the intended send (corrected) and from the actual send (naive)."
        ),
    )
    p.add_argument("--url", required=True, help="base URL of the service, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--route", default=None, help="path to call (default /v1/generate for LLM traces, else /v1/predict)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="requests per second (with --trace: rescale it to this mean rate)",
    )
    p.add_argument(
        "--arrival",
        default="poisson",
        help="poisson | constant | gamma:CV (synthetic schedules; default poisson)",
    )
    p.add_argument(
        "--trace", default=None, help="arrival trace: Azure LLM CSV, Mooncake JSONL, or a CSV of offsets (s)"
    )
    p.add_argument("--speedup", type=float, default=None, help="replay the trace this many times faster")
    p.add_argument(
        "--duration", type=float, default=None, help="seconds of schedule to run (required without --trace)"
    )
    p.add_argument(
        "--concurrency-cap",
        type=int,
        default=None,
        help="at most N requests in flight (late ones still measured from their intended time)",
    )
    p.add_argument("--out", required=True, help="results Parquet file (one row per request)")
    p.add_argument(
        "--spans-dir",
        default=None,
        help="write CLIENT spans here (default $STAGESCOPE_SPANS_DIR; OTLP if OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    p.add_argument(
        "--repeat-share",
        type=float,
        default=0.0,
        help="share of /v1/predict requests that repeat an earlier input (0-1)",
    )
    p.add_argument(
        "--predict-dim", type=int, default=16, help="number of floats in a generated /v1/predict input"
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a request may take before it counts as failed"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for arrivals and inputs")
    p.add_argument(
        "--realtime",
        action="store_true",
        help="run the sender under SCHED_FIFO for precise send times on a busy machine (root or CAP_SYS_NICE)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import os
    import signal
    import sys

    from rich.console import Console

    from stagescope.errors import UserError
    from stagescope.loadgen.api import build_schedule, run_load
    from stagescope.loadgen.display import LiveProgress, summary_table

    if args.trace is None and args.rate is None:
        raise UserError("give --rate R (with --duration S) or --trace PATH")
    schedule = build_schedule(
        rate=args.rate,
        arrival=args.arrival,
        duration_s=args.duration,
        trace=args.trace,
        speedup=args.speedup,
        seed=args.seed,
    )
    if not len(schedule):
        raise UserError("the schedule is empty: raise --rate or --duration")
    err = Console(stderr=True)
    show = not args.no_progress and err.is_terminal

    async def main() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            with LiveProgress(err, schedule.duration_s, len(schedule), enabled=show) as live:
                return await run_load(
                    args.url,
                    schedule,
                    route=args.route,
                    concurrency_cap=args.concurrency_cap,
                    out=args.out,
                    spans_dir=args.spans_dir,
                    progress=live.update if show else None,
                    stop=stop,
                    timeout_s=args.timeout,
                    repeat_share=args.repeat_share,
                    predict_dim=args.predict_dim,
                    seed=args.seed,
                    realtime=args.realtime,
                )
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    result = asyncio.run(main())
    try:
        if args.json:
            print(json.dumps(result.summary.to_dict(), indent=2), flush=True)
        else:
            out = Console()
            out.print(summary_table(result.summary))
            out.print(
                f"results: {result.out} ({len(result.results)} rows), client spans: {result.spans_written}"
            )
    except BrokenPipeError:  # piped into e.g. head: the results file is written already
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the exit-time flush quiet
    if args.realtime and not result.summary.realtime:
        print("stagescope load: --realtime refused by the system; ran at normal priority", file=sys.stderr)
    if result.error:
        raise UserError(f"{result.error}; results so far written to {result.out}")
    if result.summary.stopped_early:
        print(
            f"stagescope load: {result.summary.stopped_early}; results so far written to {result.out}",
            file=sys.stderr,
        )
        return 130
    return 0
