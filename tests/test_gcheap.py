"""The startup heap is frozen out of full collections (stagescope.gcheap): by the reference service
once it is ready, by the load generator for its run. Without it a full collection of the reference
service's ~72,000 startup objects paused every request in flight for 55-73 ms."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from stagescope.gcheap import freeze_startup_heap, frozen_heap
from stagescope.loadgen import run_load
from stagescope.loadgen.echo_server import spawn
from stagescope.loadgen.schedule import Schedule
from stagescope.service.app import create_app


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_collects_garbage_first_then_freezes_what_lives() -> None:
    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    kept = _Node()
    count = freeze_startup_heap()
    assert dead() is None, "garbage was frozen for good instead of collected"
    assert count == gc.get_freeze_count() > 1000
    assert not any(o is kept for o in gc.get_objects()), "a frozen object is still walked by collections"


def test_frozen_heap_unfreezes_after_and_keeps_a_freeze_made_before() -> None:
    gc.collect()
    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    with frozen_heap() as count:
        assert count > 1000 and gc.get_freeze_count() > 1000
        gc.collect()
        assert dead() is not None  # frozen as it was: the block does not wait for a full collection
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert dead() is None, "garbage frozen by the block was not given back to the collector"
    freeze_startup_heap()
    with frozen_heap():
        pass
    assert gc.get_freeze_count() > 0


def test_the_reference_service_freezes_its_heap_when_it_has_started(tmp_path: Path) -> None:
    app = create_app(spans_dir=str(tmp_path), registry=CollectorRegistry())
    assert gc.get_freeze_count() == 0

    async def started() -> int:
        async with app.router.lifespan_context(app):  # the service's own startup has run
            return gc.get_freeze_count()

    assert asyncio.run(started()) > 1000


def test_the_load_generator_runs_with_its_heap_frozen_and_unfreezes_after() -> None:
    seen: list[int] = []
    schedule = Schedule(np.arange(5) * 0.05, duration_s=0.25)
    with spawn("--delay-ms", "5") as url:
        run = asyncio.run(
            run_load(
                url, schedule, route="/v1/predict", progress=lambda _: seen.append(gc.get_freeze_count())
            )
        )
    assert run.table.num_rows == 5
    assert seen and min(seen) > 1000, seen
    assert gc.get_freeze_count() == 0
