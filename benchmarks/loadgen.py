"""Benchmark: can the open-loop load generator hold 1,000 req/s Poisson with tight send timing?

Starts the trivial local endpoint (``stagescope.loadgen.echo_server``, a separate process) and drives
``/v1/predict`` with a Poisson schedule. Prints the achieved rate against the target (ratio) and the
send lag (actual minus intended send) percentiles. Acceptance (issue 5): rate within 2 % of the
target, p99 lag <= 2 ms. The machine is shared, so the figures vary from run to run.

    .venv/bin/python benchmarks/loadgen.py [--rate 1000] [--duration 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from stagescope.loadgen import build_schedule, run_load


async def bench(rate: float, duration: float, out_dir: Path) -> dict[str, object]:
    server = subprocess.Popen(
        [sys.executable, "-m", "stagescope.loadgen.echo_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        schedule = build_schedule(rate=rate, duration_s=duration, arrival="poisson", seed=1)
        run = await run_load(
            f"http://127.0.0.1:{port}", schedule, route="/v1/predict", out=out_dir / "results.parquet"
        )
    finally:
        server.terminate()
        server.wait(5)
    s = run.summary
    lag = s.send_lag_ms
    return {
        "target_rate_rps": rate,
        "scheduled_rate_rps": len(schedule) / duration,
        "achieved_rate_rps": s.achieved_rate_rps,
        "achieved_over_target": s.achieved_rate_rps / rate,
        "sent": s.sent,
        "ok": s.ok,
        "errors": s.errors,
        "send_lag_p50_ms": lag["p50"],
        "send_lag_p99_ms": lag["p99"],
        "send_lag_p999_ms": lag["p999"],
        "send_lag_max_ms": lag["max"],
        "latency_p50_ms": s.latency_ms["p50"],
        "latency_p99_ms": s.latency_ms["p99"],
        "naive_latency_p99_ms": s.naive_latency_ms["p99"],
        "rate_within_2pct": abs(s.achieved_rate_rps / rate - 1.0) <= 0.02,
        "lag_p99_within_2ms": (lag["p99"] or 0.0) <= 2.0,
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(bench(args.rate, args.duration, Path(tmp)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:24s} {value:.4f}" if isinstance(value, float) else f"{key:24s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
