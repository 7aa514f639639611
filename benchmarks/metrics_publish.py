"""What publishing costs: StageMetrics per request and DynamicBatcher per item (prints µs and ratios).

Run: ``.venv/bin/python benchmarks/metrics_publish.py``. Compares, in one process, side by side:
a bare prometheus-client observation on a cached child, the same with ``.labels()`` each time,
``StageMetrics.request_finished`` for a request with 3 stages (with and without an exemplar), an LLM
request with 100 token gaps, and ``DynamicBatcher.submit`` against awaiting the batch function directly.
Timings on a shared machine are noisy: each figure is the best of 3 runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from stagescope.instrumentation.batching import DynamicBatcher
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.record import RequestRecord, StageInterval

MS = 1_000_000


def per_call_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


async def batcher_per_item_us(n: int = 20_000, concurrency: int = 200) -> tuple[float, float]:
    async def run(items: list[int]) -> list[int]:
        return items

    m = StageMetrics(CollectorRegistry(), models=["m"])
    b: DynamicBatcher[int, int] = DynamicBatcher(run, max_batch_size=32, max_wait_ms=1, metrics=m, model="m")
    best_b = best_d = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n // concurrency):
            await asyncio.gather(*(b.submit(i) for i in range(concurrency)))
        best_b = min(best_b, (time.perf_counter() - t0) / n * 1e6)
        t0 = time.perf_counter()
        for _ in range(n // concurrency):
            await asyncio.gather(*(run([i]) for i in range(concurrency)))
        best_d = min(best_d, (time.perf_counter() - t0) / n * 1e6)
    return best_b, best_d


def main() -> None:
    reg = CollectorRegistry()
    hist = Histogram("bench_seconds", "bench", ["a", "b"], registry=reg)
    child = hist.labels("1", "2")
    bare = per_call_us(lambda: child.observe(0.1), 100_000)
    labelled = per_call_us(lambda: hist.labels("1", "2").observe(0.1), 100_000)

    m = StageMetrics(CollectorRegistry(), models=["m"])
    rec = RequestRecord(route="/v1/predict", model="m", start_ns=0, end_ns=100 * MS, status_code=200)
    rec.stages = [
        StageInterval("preprocess", 0, MS),
        StageInterval("compute", MS, 5 * MS),
        StageInterval("postprocess", 5 * MS, 6 * MS),
    ]
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"

    def publish(tid: str | None) -> None:
        m.request_started()
        m.request_finished(rec, tid)

    plain = per_call_us(lambda: publish(None), 50_000)
    with_ex = per_call_us(lambda: publish(trace_id), 50_000)
    llm = RequestRecord(route="/v1/generate", model="m", start_ns=0, end_ns=1_000 * MS, status_code=200)
    for i in range(101):
        llm.mark_token(100 * MS + i * 10 * MS)
    stream = per_call_us(lambda: (m.request_started(), m.request_finished(llm, trace_id)), 5_000)
    batched, direct = asyncio.run(batcher_per_item_us())

    print(f"bare histogram observation (cached child)      {bare:7.2f} us")
    print(
        f".labels() + observation each time              {labelled:7.2f} us   ({labelled / bare:.1f}x bare)"
    )
    print(f"request_finished, 3 stages (4 observations)    {plain:7.2f} us   ({plain / bare:.1f}x bare)")
    print(f"  same with a trace-id exemplar                {with_ex:7.2f} us   ({with_ex / bare:.1f}x bare)")
    print(
        f"LLM request, 100 gaps, exemplar                {stream:7.1f} us   ({stream / 100 / bare:.1f}x bare per gap)"
    )
    print(
        f"DynamicBatcher.submit per item                 {batched:7.1f} us   (awaiting run_batch directly: {direct:.1f} us)"
    )
    print(f"  batcher overhead per item vs a 5 ms batch: {(batched - direct) / 5000:.2%}")


if __name__ == "__main__":
    main()
