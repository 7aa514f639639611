"""Model lifecycle (loading, weight refreshes, cold starts), the result cache and CPU preprocessing.

Cold start: a request that finds the model not loaded (the first load, or an in-place reload of
refreshed weights) waits for it inside the ``cold_start`` stage and is marked ``cold_start``. With
``prewarm`` the refreshed weights are loaded beside the live model and swapped in, so no request
ever waits; ``/readyz`` answers 503 whenever the model is not loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

import stagescope
from stagescope import names as N
from stagescope.service.backends import Backend
from stagescope.service.settings import Settings

__all__ = ["ModelManager", "ResultCache", "burn_cpu", "hash_fraction", "preprocess"]

_ITERS_PER_MS: list[float] = []  # PBKDF2 iterations per CPU-millisecond, measured once per process


def hash_fraction(input_hash: str, salt: str) -> float:
    """A number in [0, 1) fixed by the input hash: which inputs are heavy, or get large answers."""
    d = hashlib.blake2b(f"{salt}:{input_hash}".encode(), digest_size=8).digest()
    return int.from_bytes(d, "big") / 2**64


def _pbkdf2(iterations: int) -> None:
    # OpenSSL's PBKDF2 runs with the GIL released for its whole loop: real CPU work that neither
    # holds the GIL nor convoys on it (many short GIL-free calls would wait on the event loop's GIL)
    hashlib.pbkdf2_hmac("sha256", b"stagescope", b"preprocess", max(1, iterations))


def _iters_per_ms() -> float:
    """PBKDF2 iterations per CPU-millisecond: measured once per process, then kept current by
    :func:`burn_cpu` from the chunks it runs (this machine's speed drifts by 20 % and more)."""
    if not _ITERS_PER_MS:
        best = 0.0
        for _ in range(3):
            t = time.thread_time()
            _pbkdf2(20000)
            dt = time.thread_time() - t
            if dt > 0:
                best = max(best, 20000 / (dt * 1000.0))
        _ITERS_PER_MS.append(best or 4000.0)
    return _ITERS_PER_MS[0]


def burn_cpu(cpu_ms: float) -> None:
    """Spend ``cpu_ms`` milliseconds of this thread's CPU time (PBKDF2 rounds, GIL released).

    A few long GIL-free calls, each sized at the speed the previous one measured: the first runs
    60 % of the budget at the process's last known speed, the next 95 % of what is left at the
    speed just measured, then short top-ups. One call of 90 % at a speed measured once at start-up
    overshot by 15-27 % whenever the machine ran slower than then (a 30 ms budget cost 34-38 CPU-ms,
    and a pool sized for 0.75 cores needed 0.95)."""
    if cpu_ms <= 0:
        return
    end = time.thread_time() + cpu_ms / 1000.0
    rate = _iters_per_ms()
    share = 0.6
    while (left := end - time.thread_time()) > 0:
        n = max(1, int(share * left * 1000.0 * rate))
        t = time.thread_time()
        _pbkdf2(n)
        dt = time.thread_time() - t
        if dt > 0.0005:  # long enough to time: the speed for the next chunk (and the next call)
            rate = n / (dt * 1000.0)
            _ITERS_PER_MS[0] = rate
        share = 0.95


def preprocess(features: np.ndarray, inputs: list[float], cpu_ms: float) -> np.ndarray:
    """Model input: features, then the standardized request inputs (after ``cpu_ms`` of CPU work,
    standing in for decoding and resizing a real payload)."""
    burn_cpu(cpu_ms)
    dim = features.size
    x = np.zeros(2 * dim, dtype=np.float32)
    x[:dim] = features
    if inputs:
        v = np.asarray(inputs[:dim], dtype=np.float32)
        sd = float(v.std()) or 1.0
        x[dim : dim + v.size] = (v - float(v.mean())) / sd
    return x


class ResultCache:
    """LRU cache of model outputs keyed by input hash, with request coalescing: while one request
    computes an input, identical requests wait for its result instead of recomputing it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[str, np.ndarray] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[np.ndarray | None]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        v = self._d.get(key)
        if v is None:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return v

    async def lookup(self, key: str) -> np.ndarray | None:
        """The cached result, else the result of an identical request being computed now, else None
        (then the caller computes it: :meth:`claim` first, :meth:`settle` after)."""
        v = self.get(key)
        if v is None and (fut := self._inflight.get(key)) is not None:
            v = await asyncio.shield(fut)
        return v

    def claim(self, key: str) -> asyncio.Future[np.ndarray | None] | None:
        """Mark ``key`` as being computed by the caller (None if someone else already does)."""
        if key in self._inflight:
            return None
        fut: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        return fut

    def settle(self, key: str, claim: asyncio.Future[np.ndarray | None], value: np.ndarray | None) -> None:
        """The claimed computation ended (``value`` None when it failed: waiters compute themselves)."""
        if self._inflight.get(key) is claim:
            del self._inflight[key]
        if value is not None:
            self.put(key, value)
        if not claim.done():
            claim.set_result(value)

    def put(self, key: str, value: np.ndarray) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)


class ModelManager:
    """Loads the model at start, refreshes it every ``model_reload_every_s`` (from the first request)."""

    def __init__(self, settings: Settings, backend: Backend, instrumentation: Any = None) -> None:
        self.settings = settings
        self.backend = backend
        self._metrics = getattr(instrumentation, "metrics", None)
        self._ready: asyncio.Event | None = None
        self._traffic: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.loads = 0
        self.on_ready_change: Callable[[bool], None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready is not None and self._ready.is_set()

    def _set_ready(self, ready: bool) -> None:
        assert self._ready is not None
        if ready:
            self._ready.set()
        else:
            self._ready.clear()
        if self._metrics is not None:
            for model in (self.settings.model_name, self.settings.llm_model_name):
                self._metrics.set_model_ready(model, ready)

    async def _load(self) -> None:
        await self.backend.load()
        self.loads += 1
        if self._metrics is not None:
            self._metrics.model_loaded(self.settings.model_name)

    async def start(self) -> None:
        """Begin the first load in the background (the server answers /readyz 503 meanwhile)."""
        self._ready = asyncio.Event()
        self._traffic = asyncio.Event()
        self._set_ready(False)
        self._tasks.append(asyncio.create_task(self._run(), name="model-lifecycle"))

    async def _run(self) -> None:
        await self._load()
        self._set_ready(True)
        every = self.settings.model_reload_every_s
        if every <= 0:
            return
        assert self._traffic is not None
        await self._traffic.wait()
        while True:
            await asyncio.sleep(every)
            if self.settings.prewarm:
                await self._load()  # beside the live model; the swap is instant
            else:
                self._set_ready(False)
                await self._load()
                self._set_ready(True)

    def note_request(self) -> None:
        if self._traffic is not None and not self._traffic.is_set():
            self._traffic.set()

    async def wait_ready(self) -> None:
        """Return once the model is loaded; a request that had to wait is marked cold_start."""
        if self.ready:
            return
        assert self._ready is not None
        rec = stagescope.current_request()
        if rec is not None:
            rec.cold_start = True
        async with stagescope.stage(N.STAGE_COLD_START):
            await self._ready.wait()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
