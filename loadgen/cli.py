"""``stagescope load``: drive a service open-loop and write one row per request to Parquet.

Any HTTP service: ``--url`` is the endpoint (``http://host:8000/v1/score``), ``--body FILE`` a JSON
template of the request (:mod:`stagescope.loadgen.template`). OpenAI-compatible servers (vLLM, SGLang,
llama.cpp, TGI): ``--api openai-completions|openai-chat`` streams and measures TTFT and inter-token
gaps (:mod:`stagescope.loadgen.openai_api`).

Thin layer over :func:`stagescope.loadgen.run_load`: parses options, shows a rich progress bar (live
rate, requests in flight, corrected p50/p99), prints the summary table (or ``--json``). Ctrl-C stops
sending; what was recorded is still written (exit status 130). A server that refuses connections
gets one line on stderr and exit status 2, after the results so far are written; a run in which not one
request was answered OK (every answer an error status or a timeout) exit status 3, after the results.
"""

from __future__ import annotations

import argparse
from typing import Any

from stagescope import validate as V
from stagescope.loadgen.limits import MAX_DURATION_S, MAX_RATE_RPS, MAX_TOKENS, METHODS

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
    p.add_argument(
        "--url", required=True, type=V.http_url,
        help="the endpoint, e.g. http://127.0.0.1:8000/v1/score (its path is the route); a URL without a "
        "path calls --route, else /v1/generate for LLM traces and /v1/predict otherwise (the reference "
        "service); with --api also the server or its OpenAI base URL (http://host:8000/v1)",
    )  # fmt: skip
    p.add_argument(
        "--route", default=None, type=V.route, help="path to call instead of the URL's path (an override)"
    )
    p.add_argument(
        "--api", choices=("openai-completions", "openai-chat"), default=None,
        help="an OpenAI-compatible server's streaming /v1/completions or /v1/chat/completions (vLLM, SGLang, "
        "llama.cpp, TGI): SSE chunks read token by token, [DONE], usage (default: inferred from a path "
        "ending in /completions or /chat/completions)",
    )  # fmt: skip
    p.add_argument(
        "--model", default=None, type=_model_name,
        help="model name the API asks for (default with --api: the first of GET /v1/models; fills {{model}})",
    )  # fmt: skip
    p.add_argument(
        "--method", default="POST", type=str.upper, choices=METHODS,
        help="HTTP method (default POST); GET, HEAD and DELETE send no body unless --body gives one",
    )  # fmt: skip
    p.add_argument(
        "--body", default=None, metavar="FILE",
        help="JSON request body with placeholders {{prompt}} {{prompt_tokens}} {{output_tokens}} {{index}} "
        "{{input_index}} {{model}}; a string that is exactly one placeholder takes the value's type",
    )  # fmt: skip
    p.add_argument(
        "--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
        help="extra request header (repeatable), e.g. 'Authorization: Bearer KEY' ($OPENAI_API_KEY is "
        "sent as a bearer token with --api when no Authorization header is given)",
    )  # fmt: skip
    p.add_argument(
        "--prompt-tokens", type=V.integer(1, MAX_TOKENS), default=128,
        help="prompt length of requests whose schedule has no token counts (synthetic schedules; default 128)",
    )  # fmt: skip
    p.add_argument(
        "--output-tokens", type=V.integer(1, MAX_TOKENS), default=32,
        help="max_tokens of requests whose schedule has no token counts (default 32)",
    )  # fmt: skip
    p.add_argument(
        "--rate",
        type=V.number(0, MAX_RATE_RPS, lo_open=True),
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
    p.add_argument("--speedup", type=V.number(0, MAX_RATE_RPS, lo_open=True), default=None, help="replay the trace this many times faster")
    p.add_argument(
        "--duration", type=V.number(0, MAX_DURATION_S, lo_open=True), default=None, help="seconds of schedule to run (required without --trace)"
    )
    p.add_argument(
        "--concurrency-cap",
        type=V.integer(1, 1_000_000),
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
        type=V.number(0, 1),
        default=0.0,
        help="share of /v1/predict requests that repeat an earlier input (0-1)",
    )
    p.add_argument(
        "--predict-dim", type=V.integer(1, 1 << 20), default=16, help="number of floats in a generated /v1/predict input"
    )
    p.add_argument(
        "--timeout", type=V.number(0.001, 86400), default=60.0, help="seconds a request may take before it counts as failed"
    )
    p.add_argument("--seed", type=V.integer(0, 2**63 - 1), default=0, help="random seed for arrivals and inputs")
    p.add_argument(
        "--realtime",
        action="store_true",
        help="run the sender under SCHED_FIFO for precise send times on a busy machine (root or CAP_SYS_NICE)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _model_name(text: str) -> str:
    """A model name for the request bodies: text without control characters."""
    return V.check_text(text, "the model name", max_len=1024, error=argparse.ArgumentTypeError)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import os
    import signal
    import sys

    from rich.console import Console

    from stagescope.errors import UserError
    from stagescope.loadgen.api import build_schedule, run_load
    from stagescope.loadgen.display import LiveProgress, rate_line, summary_table

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
    headers: dict[str, str] = {}
    for h in args.headers:
        name, sep, value = h.partition(":")
        if not sep or not name.strip() or any(c in h for c in "\r\n"):
            raise UserError(f"--header must be 'NAME: VALUE', got {h!r}")
        headers[name.strip()] = value.strip()
    body = None
    if args.body is not None:
        from stagescope.loadgen.template import BodyTemplate

        body = BodyTemplate.from_file(args.body)
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
                    api=args.api,
                    body=body,
                    model=args.model,
                    headers=headers,
                    prompt_tokens=args.prompt_tokens,
                    output_tokens=args.output_tokens,
                    method=args.method,
                )
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    result = asyncio.run(main())
    try:
        if args.json:
            print(json.dumps(result.summary.to_dict(), indent=2), flush=True)
        else:
            out = Console(width=None if sys.stdout.isatty() else 200)  # off a terminal: no wrapping at 80
            out.print(summary_table(result.summary))
            out.print(rate_line(result.summary), highlight=False)
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
    return _none_ok(result.summary, result.out)


def _none_ok(summary: Any, out: Any) -> int:
    """Exit status 3 (as analyze's "no data") and one line when requests were sent and not one was
    answered OK: a wrong path or method (every answer a 404 or 405) must not look like a run; 0 else."""
    import sys

    if not summary.sent or summary.ok:
        return 0
    answers = ", ".join(f"{k} x{v:,}" for k, v in sorted(summary.status_counts.items())) or "no answer"
    print(
        f"stagescope load: none of the {summary.sent:,} requests was answered OK ({answers}): check the --url "
        f"(its path is the route), --method, --body{' and --timeout' if 'timeout' in summary.status_counts else ''}; "
        f"results written to {out}",
        file=sys.stderr,
    )
    return 3
