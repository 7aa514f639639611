"""A closed-loop client, for comparison only: N workers, each sends its next request when the previous
one is answered (how wrk-style and many LLM benchmark tools drive load).

When the server stalls, the workers stop sending, so only N requests see the stall and the
percentiles hide it (coordinated omission). Its results use the same :class:`RequestResult` rows;
the intended time of each request is its actual send (a closed loop has no schedule).
"""

from __future__ import annotations

import asyncio
import time

from stagescope.loadgen.bodies import BodyFactory
from stagescope.loadgen.http import ConnectionPool, Exchange, build_request, origin_and_path, wall_ns
from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.spans import new_ids, traceparent

__all__ = ["run_closed_loop"]


async def run_closed_loop(
    url: str,
    route: str,
    *,
    concurrency: int,
    duration_s: float,
    bodies: BodyFactory | None = None,
    timeout_s: float = 60.0,
) -> list[RequestResult]:
    """Run ``concurrency`` back-to-back workers against ``url + route`` for ``duration_s`` seconds."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    factory = bodies or BodyFactory(route)
    origin, base_path, host_header = origin_and_path(url)
    pool = ConnectionPool(origin, timeout_s=timeout_s)
    results: list[RequestResult] = []
    counter = iter(range(1 << 62))
    end = time.perf_counter_ns() + int(duration_s * 1e9)

    async def worker() -> None:
        while time.perf_counter_ns() < end:
            i = next(counter)
            body = factory(i)
            trace_id, span_id = new_ids()
            headers = {"Content-Type": "application/json", "traceparent": traceparent(trace_id, span_id)}
            payload = build_request("POST", base_path + route, host_header, body.body, headers)
            now = wall_ns()
            r = RequestResult(
                request_id=i,
                trace_id=trace_id,
                route=route,
                intended_ns=now,
                sent_ns=now,
                prompt_tokens=body.prompt_tokens,
                output_tokens=body.output_tokens,
                input_hash=body.input_hash,
                span_id=span_id,
            )
            await pool.fetch(Exchange(payload, r, lambda ex: results.append(ex.result)))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        pool.close()
    return results
