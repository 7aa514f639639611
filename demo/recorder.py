"""Record a service's Prometheus metrics over time without a Prometheus server.

The embedded default has no Docker and no Prometheus, yet the analysis wants queue depth, in-flight
requests, batch sizes and accelerator utilization *over time* next to the p99. :class:`MetricsRecorder`
scrapes ``/metrics`` every ``interval_s`` and writes each scrape to ``DIR/scrape-<n>.prom`` with every
sample stamped with the scrape time (Unix milliseconds, as the exposition format allows), which the
analysis ingests like any exposition snapshot, with one sample of this process's own CPU seconds
(``stagescope_process_cpu_seconds_total{role="client"}``: the load generator's). A failed scrape is counted and skipped; it never stops
the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx

from stagescope import names as N

__all__ = ["MetricsRecorder", "stamp_exposition"]


def stamp_exposition(text: str, ts_ms: int) -> str:
    """Append ``ts_ms`` to every sample line that has no timestamp yet; comments pass through."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        # a sample is `name{labels} value [timestamp]`; label values may hold spaces, so only look
        # at what follows the closing brace (or the name).
        _, brace, rest = line.rpartition("}")
        fields = rest.split() if brace else line.split()[1:]
        out.append(line if len(fields) >= 2 else f"{line} {ts_ms}")
    return "\n".join(out) + "\n"


class MetricsRecorder:
    """Scrape ``url`` every ``interval_s`` seconds into ``out_dir`` until stopped."""

    def __init__(self, url: str, out_dir: Path, interval_s: float = 1.0) -> None:
        self.url = url
        self.out_dir = out_dir
        self.interval_s = interval_s
        self.scrapes = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        async with httpx.AsyncClient(timeout=max(0.5, self.interval_s)) as client:
            next_at = time.monotonic()
            while True:
                await self.scrape_once(client)
                next_at += self.interval_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def scrape_once(self, client: httpx.AsyncClient) -> bool:
        ts_ms = int(time.time() * 1000)
        try:
            resp = await client.get(self.url)
            resp.raise_for_status()
        except httpx.HTTPError:
            self.failures += 1
            return False
        self.scrapes += 1
        path = self.out_dir / f"scrape-{self.scrapes:05d}.prom"
        path.write_text(stamp_exposition(resp.text + self._client_cpu(), ts_ms), encoding="utf-8")
        return True

    @staticmethod
    def _client_cpu() -> str:
        """This process's CPU seconds so far (the load generator's, with this recorder) as one sample: on a
        machine the service shares with its client, the scale-out model leaves the servers what the cores
        are less what the gateway and the client take (analysis.cpu_budget)."""
        return f'\n{N.METRIC_PROCESS_CPU}{{{N.LABEL_ROLE}="{N.ROLE_CLIENT}"}} {time.process_time():.6f}\n'

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="stagescope-metrics-recorder")

    async def stop(self) -> None:
        """Stop scraping, after one last scrape so the end of the run is covered."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        async with httpx.AsyncClient(timeout=2.0) as client:
            await self.scrape_once(client)
