"""The feature store the ranker reads before each prediction, and its optional local cache.

* :class:`InProcessFeatureStore`: a table of ``num_entities`` rows held in memory; every read waits
  a SIMULATED network latency drawn from :class:`LatencyModel` (lognormal, plus a slow path hit with
  probability ``feature_slow_prob``: compaction, a cross-zone hop).
* :class:`RedisFeatureStore`: the same table in a real Redis (``--feature-store redis://host:port/db``),
  seeded at start when missing; reads are real round trips, with the latency model's draw added as
  injected latency (fault injection, like a network proxy) so scenarios behave the same.
* :class:`FeatureCache`: a local snapshot of the whole table, bulk-read at start and refreshed in the
  background every ``feature_cache_refresh_s``; reads that hit it skip the store entirely.

Latencies in seconds unless the name says ``_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stagescope.errors import UserError
from stagescope.service.settings import Settings

__all__ = [
    "FeatureCache",
    "FeatureStore",
    "FeatureStoreUnavailable",
    "Features",
    "InProcessFeatureStore",
    "LatencyModel",
    "RedisFeatureStore",
    "make_feature_store",
]

_KEY_PREFIX = "stagescope:features:"
_log = logging.getLogger(__name__)
#: Seconds between attempts to reach a feature store that was down, and between repeated warnings.
RETRY_S = 1.0
WARN_EVERY_S = 60.0


class FeatureStoreUnavailable(Exception):
    """The feature store cannot be reached now; the request is answered 503 with ``Retry-After``."""


@dataclass(frozen=True)
class LatencyModel:
    """Read latency: lognormal(median, sigma), or uniform(slow_min, slow_max) with prob ``slow_prob``."""

    median_ms: float
    sigma: float
    slow_prob: float = 0.0
    slow_min_ms: float = 0.0
    slow_max_ms: float = 0.0

    @classmethod
    def from_settings(cls, s: Settings) -> LatencyModel:
        return cls(s.feature_latency_ms, s.feature_latency_sigma, s.feature_slow_prob,
                   s.feature_slow_min_ms, s.feature_slow_max_ms)  # fmt: skip

    def sample_s(self, rng: random.Random) -> float:
        if self.slow_prob > 0 and rng.random() < self.slow_prob:
            return rng.uniform(self.slow_min_ms, max(self.slow_min_ms, self.slow_max_ms)) / 1000.0
        if self.median_ms <= 0:
            return 0.0
        return self.median_ms * float(np.exp(rng.gauss(0.0, self.sigma))) / 1000.0


def _row(entity: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng((seed, entity)).normal(0.0, 1.0, dim).astype(np.float32)


class FeatureStore(Protocol):
    async def start(self) -> None: ...

    async def get(self, entity: int) -> np.ndarray: ...

    async def scan(self) -> dict[int, np.ndarray]: ...

    async def close(self) -> None: ...


class InProcessFeatureStore:
    """The feature table in memory behind a SIMULATED network latency."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.latency = LatencyModel.from_settings(settings)
        self._rng = random.Random(settings.seed + 1)
        self._table = {e: _row(e, settings.feature_dim, settings.seed) for e in range(settings.num_entities)}

    async def start(self) -> None:
        return None

    async def get(self, entity: int) -> np.ndarray:
        await asyncio.sleep(self.latency.sample_s(self._rng))
        return self._table[entity % self.settings.num_entities]

    async def scan(self) -> dict[int, np.ndarray]:
        """Bulk read of the whole table (one round trip's latency)."""
        await asyncio.sleep(self.latency.sample_s(self._rng))
        return dict(self._table)

    async def close(self) -> None:
        return None


class RedisFeatureStore:
    """The feature table in a real Redis; the latency model's draw is injected before each read."""

    def __init__(self, settings: Settings, url: str) -> None:
        from stagescope.extras import require

        require("redis", "--feature-store redis://...")
        import redis.asyncio as aioredis

        self.settings = settings
        self.url = url
        self.latency = LatencyModel.from_settings(settings)
        self._rng = random.Random(settings.seed + 1)
        self._client = aioredis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        self.available = False
        self._last_warning = -WARN_EVERY_S
        self._retry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Seed the table when missing. An unreachable Redis is not fatal: the service keeps serving
        (``/readyz`` 503, ``/v1/predict`` 503) with one warning, and retries every ``RETRY_S``."""
        try:
            await self._seed()
        except Exception as exc:  # redis.exceptions.ConnectionError is not an OSError
            self.available = False
            _log.warning(
                "stagescope serve: warning: feature store %s is unreachable (%s); /readyz and /v1/predict "
                "answer 503 until it is, retrying every %g s",
                self.url, _reason(exc), RETRY_S,
            )  # fmt: skip
            self._last_warning = time.monotonic()
            self._retry = asyncio.create_task(self._reconnect())
            return
        self.available = True

    async def _seed(self) -> None:
        s = self.settings
        present = await self._client.exists(f"{_KEY_PREFIX}{s.num_entities - 1}")
        if not present:
            pipe = self._client.pipeline(transaction=False)
            for e in range(s.num_entities):
                pipe.set(f"{_KEY_PREFIX}{e}", _row(e, s.feature_dim, s.seed).tobytes())
            await pipe.execute()

    async def _reconnect(self) -> None:
        while not self.available:
            await asyncio.sleep(RETRY_S)
            with contextlib.suppress(Exception):
                await self._seed()
                self.available = True
                _log.warning("stagescope serve: feature store %s is reachable again", self.url)

    def _unavailable(self, exc: BaseException) -> FeatureStoreUnavailable:
        now = time.monotonic()
        if self.available or now - self._last_warning >= WARN_EVERY_S:  # then one line a minute at most
            self._last_warning = now
            _log.warning(
                "stagescope serve: warning: feature store %s lost (%s); /readyz and /v1/predict answer 503 "
                "until it is back", self.url, _reason(exc),
            )  # fmt: skip
        if self.available:
            self.available = False
            self._retry = asyncio.create_task(self._reconnect())
        return FeatureStoreUnavailable(f"feature store unavailable: {_reason(exc)}")

    async def get(self, entity: int) -> np.ndarray:
        if not self.available:
            raise FeatureStoreUnavailable(f"feature store {self.url} unavailable")
        await asyncio.sleep(self.latency.sample_s(self._rng))
        try:
            raw = await self._client.get(f"{_KEY_PREFIX}{entity % self.settings.num_entities}")
        except Exception as exc:  # connection lost, timeout: redis-py's errors are not OSErrors
            raise self._unavailable(exc) from None
        if raw is None:
            return np.zeros(self.settings.feature_dim, dtype=np.float32)
        return np.frombuffer(raw, dtype=np.float32)

    async def scan(self) -> dict[int, np.ndarray]:
        n = self.settings.num_entities
        if not self.available:
            raise FeatureStoreUnavailable(f"feature store {self.url} unavailable")
        await asyncio.sleep(self.latency.sample_s(self._rng))
        try:
            raws = await self._client.mget([f"{_KEY_PREFIX}{e}" for e in range(n)])
        except Exception as exc:
            raise self._unavailable(exc) from None
        return {e: np.frombuffer(r, dtype=np.float32) for e, r in enumerate(raws) if r is not None}

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        with contextlib.suppress(Exception):
            await self._client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def make_feature_store(settings: Settings) -> FeatureStore:
    url = settings.feature_store
    if url in ("", "memory"):
        return InProcessFeatureStore(settings)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisFeatureStore(settings, url)
    raise UserError(f"bad --feature-store {url!r}: expected 'memory' or a redis://host:port/db URL")


class FeatureCache:
    """A local snapshot of the feature table, refreshed in the background (stale by at most refresh_s)."""

    def __init__(self, store: FeatureStore, refresh_s: float) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._snapshot: dict[int, np.ndarray] = {}
        self._task: asyncio.Task[None] | None = None
        self.hits = 0
        self.misses = 0

    async def start(self) -> None:
        with contextlib.suppress(FeatureStoreUnavailable):  # filled by the refresh loop once it answers
            self._snapshot = await self.store.scan()
        if self.refresh_s > 0:
            self._task = asyncio.create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            with contextlib.suppress(Exception):
                self._snapshot = await self.store.scan()

    def get(self, entity: int) -> np.ndarray | None:
        row = self._snapshot.get(entity)
        if row is None:
            self.misses += 1
        else:
            self.hits += 1
        return row

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Features:
    """What the request path calls: the cache when enabled and holding the entity, else the store."""

    def __init__(self, settings: Settings, store: FeatureStore | None = None) -> None:
        self.settings = settings
        self.store = store or make_feature_store(settings)
        self.cache = FeatureCache(self.store, settings.feature_cache_refresh_s) if settings.feature_cache else None

    async def start(self) -> None:
        await self.store.start()
        if self.cache is not None:
            await self.cache.start()

    @property
    def ready(self) -> bool:
        """False while the store is known to be unreachable (``/readyz`` answers 503)."""
        return bool(getattr(self.store, "available", True))

    async def get(self, entity: int) -> np.ndarray:
        entity %= self.settings.num_entities
        if self.cache is not None:
            row = self.cache.get(entity)
            if row is not None:
                return row
        return await self.store.get(entity)

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.close()
        await self.store.close()
