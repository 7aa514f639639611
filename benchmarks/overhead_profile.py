"""Where stagescope's per-request cost goes on the trivial endpoint, in-process and without timing noise.

The overhead benchmark (benchmarks/overhead.py) measures a real uvicorn server under a client; its
rounds move by more than a few microseconds. This script drives the same apps
(benchmarks/overhead_apps.py) through ASGI straight from an asyncio loop, with the request the
benchmark's client sends (``POST /predict``, an 8-byte JSON body), and prints per request:

* ``calls``: Python-level function calls (``sys.setprofile`` "call" events; generators and
  coroutines resumed count again), split by the module that owns the code (stagescope's own, or
  FastAPI/Starlette/the rest), with the top call sites for ``--top``;
* ``bytecodes``: interpreter instructions executed (``sys.settrace`` opcode events over
  ``--count`` requests), all and stagescope's own: a count that other processes cannot disturb;
* ``--instructions``: machine instructions per request (valgrind's callgrind, which counts every
  instruction the process executes): each variant serves ``--count`` and then 3 x ``--count`` requests
  in two fresh processes under callgrind, and the difference over the 2 x ``--count`` requests between
  them is printed (start-up and imports are the same in both and cancel). Load does not change it;
  it takes a few minutes (callgrind runs Python about 50 times slower);
* ``us``: CPU microseconds of this process per request (``time.process_time``, all threads, so the
  span thread's work is in it), best of ``--repeats`` loops of ``--requests`` (no network: the
  Python work only; run it under ``flock /work/notes/measure.lock`` for figures).

What it cannot see: uvicorn's own work (the same in both variants) and anything that only happens in
a real server (its ``send`` is uvicorn's, so the middleware's keep-alive-timer path is not taken here).

Run: ``python benchmarks/overhead_profile.py [--variants bare,stagescope] [--top 40]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from overhead_apps import build_app

__all__ = ["count_calls", "drive", "main"]

_BODY = b'{"x": 1}'
_HEADERS = [
    (b"host", b"bench"),
    (b"content-type", b"application/json"),
    (b"content-length", b"8"),
]


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/predict",
        "raw_path": b"/predict",
        "query_string": b"",
        "root_path": "",
        "headers": list(_HEADERS),
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def drive(app: Any, n: int) -> None:
    """``n`` requests through ``app``, one after another, each checked for a 200."""
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": _BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    for _ in range(n):
        await app(_scope(), receive, send)
    if status.count(200) != n:
        raise SystemExit(f"overhead_profile: {n - status.count(200)} of {n} requests were not answered 200")


def _owner(filename: str) -> str:
    f = filename.replace("\\", "/")
    for part in (
        "stagescope",
        "fastapi",
        "starlette",
        "pydantic",
        "opentelemetry",
        "prometheus_client",
        "anyio",
    ):
        if f"/{part}/" in f:
            return part
    return "other"


def count_calls(
    app: Any, n: int
) -> tuple[collections.Counter[str], collections.Counter[tuple[str, str, int]]]:
    """Python calls made while serving ``n`` requests: per owning package, and per code object."""
    per_owner: collections.Counter[str] = collections.Counter()
    per_code: collections.Counter[tuple[str, str, int]] = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            per_owner[_owner(code.co_filename)] += 1
            per_code[(code.co_filename, code.co_qualname, code.co_firstlineno)] += 1

    _run_hooked(app, n, sys.setprofile, prof)
    return per_owner, per_code


def count_bytecodes(
    app: Any, n: int, per_code: collections.Counter[tuple[str, str, int]] | None = None
) -> tuple[int, int]:
    """Interpreter instructions executed while serving ``n`` requests: all, and in stagescope's code;
    with ``per_code``, stagescope's own counted there per code object as well."""
    counts = [0, 0]
    own: dict[Any, bool] = {}

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            code = frame.f_code
            mine = own.get(code)
            if mine is None:
                mine = own[code] = _owner(code.co_filename) == "stagescope"
            counts[0] += 1
            counts[1] += mine
            if mine and per_code is not None:
                per_code[(code.co_filename, code.co_qualname, code.co_firstlineno)] += 1
        return trace

    _run_hooked(app, n, sys.settrace, trace)
    return counts[0], counts[1]


def _run_hooked(app: Any, n: int, install: Callable[[Any], None], hook: Any) -> None:
    """Serve 200 requests to warm caches (routes, label children), then ``n`` with ``install(hook)``
    in force (sys.setprofile or sys.settrace), removing it after."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive(app, 200))
        install(hook)
        try:
            loop.run_until_complete(drive(app, n))
        finally:
            install(None)
    finally:
        loop.close()


def time_requests(app: Any, n: int, repeats: int) -> float:
    """Best CPU microseconds of this process per request over ``repeats`` loops of ``n`` requests."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive(app, 500))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            loop.run_until_complete(drive(app, n))
            best = min(best, time.process_time() - t0)
    finally:
        loop.close()
    return best / n * 1e6


_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _serve_only(variant: str, n: int) -> int:
    """The body of one callgrind process: build ``variant``, warm it with 200 requests, serve ``n``."""
    with tempfile.TemporaryDirectory(prefix="stagescope-profile-") as spans:
        app = build_app(variant, spans)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(drive(app, 200))
            loop.run_until_complete(drive(app, n))
        finally:
            loop.close()
    return 0


def count_instructions(variant: str, n: int) -> float:
    """Machine instructions per request of ``variant``: callgrind's totals of two processes serving
    ``n`` and ``3 n`` requests after the same warm-up, their difference over ``2 n``."""
    totals = []
    for k in (n, 3 * n):
        cmd = [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, os.path.abspath(__file__), "--serve-only", variant, "--count", str(k),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        m = _COLLECTED.search(done.stderr)
        if done.returncode != 0 or m is None:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise SystemExit(f"overhead_profile: callgrind run of {variant} failed: {tail[0]}")
        totals.append(int(m.group(1)))
    return (totals[1] - totals[0]) / (2 * n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="bare,stagescope", help="comma list (default bare,stagescope)")
    p.add_argument("--requests", type=int, default=3000, help="requests per timed loop (default 3000)")
    p.add_argument("--repeats", type=int, default=9, help="timed loops, best kept (default 9)")
    p.add_argument("--count", type=int, default=1000, help="requests to count calls over (default 1000)")
    p.add_argument(
        "--top", type=int, default=0, help="list the N most-called code objects of the last variant"
    )
    p.add_argument(
        "--by-function",
        type=int,
        default=0,
        metavar="N",
        help="list the N code objects of stagescope's own with the most bytecodes per request (last variant)",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="count machine instructions per request under valgrind's callgrind instead (minutes)",
    )
    p.add_argument("--serve-only", default="", help=argparse.SUPPRESS)  # one callgrind process's body
    p.add_argument("--no-time", action="store_true", help="count calls only")
    args = p.parse_args()
    if args.requests < 1 or args.repeats < 1 or args.count < 1 or args.top < 0 or args.by_function < 0:
        print(
            "overhead_profile: --requests, --repeats and --count must be >= 1, --top and --by-function >= 0",
            file=sys.stderr,
        )
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.serve_only:
        variants = [args.serve_only]
    for v in variants:
        if v not in ("bare", "stock", "stagescope"):
            print(f"overhead_profile: unknown variant {v!r} (bare, stock, stagescope)", file=sys.stderr)
            return 2
    if args.instructions and shutil.which("valgrind") is None:
        print(
            "overhead_profile: --instructions needs valgrind on PATH (apt-get install valgrind)",
            file=sys.stderr,
        )
        return 2
    for k in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_ENDPOINT",
              "STAGESCOPE_SPANS_DIR", "STAGESCOPE_SLOW_THRESHOLD_MS", "STAGESCOPE_BASELINE_SAMPLE"):  # fmt: skip
        os.environ.pop(k, None)
    if args.serve_only:
        return _serve_only(args.serve_only, args.count)
    if args.instructions:
        print(f"machine instructions per request (callgrind; {args.count} and {3 * args.count} requests)")
        got = [(v, count_instructions(v, args.count)) for v in variants]
        for v, ir in got:
            ratio = f"{got[0][1] / ir:.3f} of {got[0][0]}'s speed" if ir else ""
            print(f"{v:<12} {ir:>12,.0f}  {ratio}")
        for v, ir in got[1:]:
            print(f"{v} - {got[0][0]}: {ir - got[0][1]:+,.0f} instructions per request")
        return 0
    with tempfile.TemporaryDirectory(prefix="stagescope-profile-") as spans:
        rows = []
        per_code: collections.Counter[tuple[str, str, int]] = collections.Counter()
        ops_by_code: collections.Counter[tuple[str, str, int]] = collections.Counter()
        for v in variants:
            ops_by_code = collections.Counter()
            app = build_app(v, spans)
            owners, per_code = count_calls(app, args.count)
            total = sum(owners.values()) / args.count
            own = owners["stagescope"] / args.count
            ops, own_ops = count_bytecodes(app, args.count, ops_by_code if args.by_function else None)
            us = float("nan") if args.no_time else time_requests(app, args.requests, args.repeats)
            rows.append((v, total, own, ops / args.count, own_ops / args.count, us))
        print(f"load average {os.getloadavg()[0]:.2f}; {args.count} requests counted, "
              f"best of {args.repeats} x {args.requests} timed (CPU time)")  # fmt: skip
        print(
            f"{'variant':<12} {'calls/req':>10} {'stagescope':>11} {'bytecodes':>10} {'stagescope':>11} {'us/req':>8}"
        )
        base = rows[0]
        for v, total, own, ops, own_ops, us in rows:
            print(f"{v:<12} {total:>10.1f} {own:>11.1f} {ops:>10.0f} {own_ops:>11.0f} {us:>8.1f}")
        for v, total, _own, ops, _own_ops, us in rows[1:]:
            print(
                f"{v} - {base[0]}: {total - base[1]:+.1f} calls, {ops - base[3]:+.0f} bytecodes, "
                f"{us - base[5]:+.1f} us per request"
            )
        if args.top:
            print(f"\ntop {args.top} code objects of {variants[-1]}, calls per request:")
            for (fn, qual, line), c in per_code.most_common(args.top):
                short = fn.split("site-packages/")[-1].split("i14-otel/")[-1]
                print(f"{c / args.count:7.2f}  {short}:{line} {qual}")
        if args.by_function:
            print(f"\nstagescope's own bytecodes per request in {variants[-1]}, by code object:")
            for (fn, qual, line), c in ops_by_code.most_common(args.by_function):
                short = fn.replace("\\", "/").rsplit("/stagescope/", 1)[-1]
                print(f"{c / args.count:7.1f}  {short}:{line} {qual}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
