"""A closed-loop client, for comparison only: N workers, each sends its next request when the previous
one is answered (how wrk-style and many LLM benchmark tools drive load).

When the server stalls, the workers stop sending, so only N requests see the stall and the
percentiles hide it (coordinated omission). Its results use the same :class:`RequestResult` rows;
the intended time of each request is its actual send (a closed loop has no schedule).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from stagescope.loadgen.bodies import BodyFactory
from stagescope.loadgen.results import RequestResult
from stagescope.loadgen.runner import send_request, wall_ns
from stagescope.loadgen.spans import new_ids

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
    bodies = bodies or BodyFactory(route)
    target = url.rstrip("/") + route
    results: list[RequestResult] = []
    counter = iter(range(1 << 62))
    end = time.perf_counter_ns() + int(duration_s * 1e9)
    headers = {"content-type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.perf_counter_ns() < end:
            i = next(counter)
            prepared = bodies(i)
            trace_id, span_id = new_ids()
            r = RequestResult(
                request_id=i,
                trace_id=trace_id,
                route=route,
                intended_ns=wall_ns(time.perf_counter_ns()),
                prompt_tokens=prepared.prompt_tokens,
                output_tokens=prepared.output_tokens,
                input_hash=prepared.input_hash,
                span_id=span_id,
            )
            try:
                await send_request(session, target, headers, prepared, r)
            finally:
                results.append(r)
            if r.sent_ns is not None:
                r.intended_ns = r.sent_ns

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return results
