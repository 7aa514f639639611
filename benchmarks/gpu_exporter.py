"""GPU exporter cost, against a FAKE NVML (simulated GPUs): scrape time and sampling CPU share.

Prints, from one run:

- the median time of one full scrape (collect + text exposition) of 8 simulated GPUs with every field
  of the counters CSV and two processes each (goal: at most 5 ms);
- the CPU cost of the 100 ms sampling thread on those 8 GPUs as a share of one core (goal: at most 2 %),
  measured as process CPU time with the sampler running minus the same idle period without it, and
  cross-checked from the median cost of one sampling round x rounds per second.

The fake's NVML calls are Python functions: this measures the exporter's own overhead, not the
driver's ioctl cost. On a GPU machine, ``--nvml real`` runs the same measurements against the real
NVML (every GPU the driver reports) and writes the scrape text to ``--dump``.

Usage: ``.venv/bin/python benchmarks/gpu_exporter.py [--nvml fake|real] [--gpus 8] [--scrapes 300]
[--seconds 10] [--dump FILE]``
"""

from __future__ import annotations

import argparse
import statistics
import time

from stagescope.instrumentation.gpu import GpuCollector, generate_text
from stagescope.instrumentation.gpu.fake_nvml import FakeGpu, FakeNvml


def make_collector(n_gpus: int, interval_s: float) -> GpuCollector:
    gpus = [FakeGpu(util_gpu=40 + i, processes=[(1000 + i, 2 * 1024**3, 50, 10), (2000 + i, 1024**3, 5, 1)])
            for i in range(n_gpus)]  # fmt: skip
    return GpuCollector(
        FakeNvml(gpus), hostname="bench", interval_s=interval_s, window_s=15.0, start_sampler=False
    )


def idle_cpu(seconds: float) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvml", choices=["fake", "real"], default="fake", help="FAKE NVML (default) or pynvml")
    ap.add_argument("--gpus", type=int, default=8, help="simulated GPUs (fake NVML only)")
    ap.add_argument("--dump", default=None, help="write one scrape's text here")
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each CPU measurement period")
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()

    if args.nvml == "real":
        c = GpuCollector(hostname="bench", interval_s=args.interval, window_s=15.0, start_sampler=False)
        if c.sampler is None:
            raise SystemExit(f"real NVML unavailable: {c.unavailable_reason}")
        label = f"REAL NVML: {len(c.gpus)} GPUs ({', '.join(sorted({g.labels.get('modelName', '?') for g in c.gpus}))})"
    else:
        c = make_collector(args.gpus, args.interval)
        label = f"FAKE NVML: {args.gpus} simulated GPUs"
    assert c.sampler is not None
    for _ in range(150):  # a full 15 s window of samples, so the scrape does all its work
        c.sampler.sample_once()
    body = generate_text(c)
    if args.dump:
        with open(args.dump, "wb") as f:
            f.write(body)
    n_samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    for _ in range(20):
        generate_text(c)
    scrape_ms = []
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        generate_text(c)
        scrape_ms.append((time.perf_counter() - t0) * 1e3)
    round_us = []
    for _ in range(300):
        t0 = time.perf_counter()
        c.sampler.sample_once()
        round_us.append((time.perf_counter() - t0) * 1e6)

    idle_cpu_s, idle_wall = idle_cpu(args.seconds)  # baseline: same process, sampler stopped
    w0, c0 = time.perf_counter(), time.process_time()
    c.sampler.start()
    time.sleep(args.seconds)
    c.sampler.stop()
    run_cpu_s, run_wall = time.process_time() - c0, time.perf_counter() - w0
    share = max(0.0, run_cpu_s / run_wall - idle_cpu_s / idle_wall)
    share_from_rounds = statistics.median(round_us) / 1e6 / args.interval
    c.close()

    med = statistics.median(scrape_ms)
    print(f"gpu exporter benchmark ({label}, every field, {n_samples} samples/scrape, "
          f"{len(body) / 1024:.1f} KiB)")  # fmt: skip
    print(f"  scrape median {med:.2f} ms  min {min(scrape_ms):.2f} ms  p90 {statistics.quantiles(scrape_ms, n=10)[-1]:.2f} ms  "
          f"(goal <= 5 ms: {med / 5.0:.2f}x of budget)")  # fmt: skip
    print(
        f"  sampling every {args.interval * 1e3:.0f} ms: {share * 100:.2f}% of one core "
        f"(process CPU over {args.seconds:g} s, idle baseline subtracted; goal <= 2%: {share / 0.02:.2f}x of budget)"
    )
    print(
        f"  cross-check: one sampling round median {statistics.median(round_us):.0f} us "
        f"-> {share_from_rounds * 100:.2f}% of one core at {1 / args.interval:.0f} rounds/s"
    )


if __name__ == "__main__":
    main()
