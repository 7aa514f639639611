"""OTLP/JSON ingest benchmark: spans per second and peak memory of ``load_dataset``.

Writes ``--requests`` synthetic requests as OTLP/JSON lines (8 spans each: a load-generator CLIENT
span, the SERVER span and six stage spans; 512 spans per export request, ~340 bytes per span) with
``stagescope.analysis.synth.write_otlp_lines``, then ingests the file in a child process (so its
peak RSS is the ingest's alone) and prints wall time, CPU time, spans/s by wall clock and per CPU
second, and peak memory. A ratio, not a timed test: on a shared machine the wall-clock rate depends on
what else runs; the CPU-second rate does much less.

    .venv/bin/python benchmarks/ingest.py --requests 1000000 --workdir /tmp/ingest-bench
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from stagescope.analysis.synth import SynthSpan, request_spans, write_otlp_lines
from stagescope.names import ATTR_BATCH_SIZE, ATTR_INPUT_HASH, ATTR_MODEL, ATTR_QUEUE_DEPTH

_CHILD = r"""
import json, resource, sys, time
from stagescope.analysis.ingest import load_dataset
t0, c0 = time.time(), time.process_time()
ds = load_dataset(traces=[sys.argv[1]], workdir=sys.argv[2] or None, memory_limit=sys.argv[3])
wall, cpu = time.time() - t0, time.process_time() - c0
spans, requests, stages = (ds.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                           for t in ("spans", "requests", "stages"))
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "spans": spans, "requests": requests, "stages": stages,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
ds.close()
"""


def synthetic_spans(n: int, seed: int = 1) -> Iterator[SynthSpan]:
    rng = random.Random(seed)
    t0 = 1_764_000_000_000_000_000
    for i in range(n):
        queue = rng.expovariate(1 / 10.0)
        stages = [
            ("feature_fetch", 0.0, 5.0), ("preprocess", 5.0, 3.0), ("batch_wait", 8.0, 10.0),
            ("queue", 18.0, queue), ("compute", 18.0 + queue, 20.0), ("postprocess", 38.0 + queue, 2.0),
        ]  # fmt: skip
        yield from request_spans(
            f"{rng.getrandbits(128):032x}", t0 + i * 1_000_000, stages,
            attributes={ATTR_MODEL: "m", ATTR_BATCH_SIZE: 4, ATTR_QUEUE_DEPTH: 3,
                        ATTR_INPUT_HASH: f"{rng.getrandbits(64):016x}"},
            client_ms=45.0 + queue,
        )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000, help="synthetic requests (8 spans each)")
    ap.add_argument("--workdir", default="", help="ingest work directory (default: automatic)")
    ap.add_argument("--memory-limit", default="1GB", help="DuckDB memory limit for the ingest")
    ap.add_argument("--keep", metavar="FILE", help="write the OTLP file here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "spans.jsonl"
        t = time.time()
        n = write_otlp_lines(path, synthetic_spans(args.requests))
        print(
            f"wrote {n:,} spans ({path.stat().st_size / 2**20:,.0f} MiB) in {time.time() - t:.1f} s",
            flush=True,
        )
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), args.workdir, args.memory_limit],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"ingested {r['spans']:,} spans -> {r['requests']:,} requests, {r['stages']:,} stage rows")
    print(f"wall {r['wall_s']:.1f} s: {r['spans'] / r['wall_s']:,.0f} spans/s (goal >= 200,000)")
    print(f"cpu  {r['cpu_s']:.1f} s: {r['spans'] / r['cpu_s']:,.0f} spans per CPU second")
    print(f"peak memory {r['max_rss_mb']:,.0f} MB (goal <= 2,048 MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
