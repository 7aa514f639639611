"""DynamicBatcher: batch sizes, wait caps, queue apart from batch_wait, QueueFull, errors, hooks.

Timing assertions compare intervals with the batcher's own settings and the test's sleeps (tens of
ms) with loose upper bounds; the machine is shared, so nothing here asserts on speed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from stagescope import names
from stagescope.instrumentation.batching import (
    DynamicBatcher,
    QueueFull,
    record_batch_closed,
    record_batch_end,
    record_batch_start,
    record_enqueue,
)
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.record import RequestRecord, reset_current_request, set_current_request

MS = 1_000_000  # ns


def _metrics() -> tuple[CollectorRegistry, StageMetrics]:
    reg = CollectorRegistry()
    return reg, StageMetrics(reg, models=["m"])


async def _submit_in_request(batcher: DynamicBatcher[int, int], item: int) -> tuple[int, RequestRecord]:
    rec = RequestRecord(route="/v1/predict", model="m")
    token = set_current_request(rec)
    try:
        return await batcher.submit(item), rec
    finally:
        reset_current_request(token)


def _stage(rec: RequestRecord, name: str) -> tuple[int, int]:
    (iv,) = [s for s in rec.stages if s.stage == name]
    return iv.start_ns, iv.end_ns


def _check_contiguous(rec: RequestRecord) -> None:
    bw, q, c = _stage(rec, "batch_wait"), _stage(rec, "queue"), _stage(rec, "compute")
    assert bw[1] == q[0] and q[1] == c[0], "batch_wait, queue and compute must tile the batched time"
    assert bw[0] <= bw[1] <= q[1] <= c[1]


def test_full_batches_close_without_waiting() -> None:
    reg, m = _metrics()
    seen: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        seen.append(list(items))
        await asyncio.sleep(0.005)
        return [i * 10 for i in items]

    async def main() -> list[tuple[int, RequestRecord]]:
        b = DynamicBatcher(run, max_batch_size=4, max_wait_ms=10_000, executors=2, model="m", metrics=m)
        await b.start()
        out = await asyncio.gather(*(_submit_in_request(b, i) for i in range(8)))
        await b.stop()
        return out

    out = asyncio.run(main())
    assert [r for r, _ in out] == [i * 10 for i in range(8)]
    assert sorted(map(sorted, seen)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for _, rec in out:
        _check_contiguous(rec)
        assert rec.batch_size == 4
        start, end = _stage(rec, "batch_wait")
        assert end - start < 1_000 * MS  # closed because full, not by the 10 s timer
    assert [rec.queue_depth for _, rec in out[:4]] == [0, 1, 2, 3]
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "m"}) == 2
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_sum", {"model": "m"}) == 8
    assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 0
    busy = reg.get_sample_value(names.METRIC_EXECUTOR_BUSY, {"model": "m"})
    assert busy is not None and busy >= 2 * 0.005


def test_batch_closes_max_wait_after_its_first_item() -> None:
    _, m = _metrics()
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    async def main() -> list[tuple[int, RequestRecord]]:
        b = DynamicBatcher(run, max_batch_size=64, max_wait_ms=60, model="m", metrics=m)
        first = asyncio.create_task(_submit_in_request(b, 0))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(_submit_in_request(b, 1))
        return [await first, await second]

    (r0, rec0), (r1, rec1) = asyncio.run(main())
    assert (r0, r1) == (0, 1) and sizes == [2]
    w0 = _stage(rec0, "batch_wait")
    w1 = _stage(rec1, "batch_wait")
    assert w0[1] == w1[1]  # one batch, one close time
    waited0 = (w0[1] - w0[0]) / MS
    assert 60 <= waited0 < 60 + 150, waited0  # closed at the cap, counted from the first item
    assert (w1[1] - w1[0]) / MS < waited0 - 10  # the second item joined later and waited less


#: the batch's compute (s): long beside a stall of the test's process on a loaded machine, so "at
#: once" (under half of it) and "waited for the executor" (all of it) cannot be mistaken for each other
_COMPUTE_S = 0.3


@pytest.mark.parametrize("executors", [1, 2])
def test_waiting_for_an_executor_is_queue_not_batch_wait(executors: int) -> None:
    _, m = _metrics()

    async def run(items: list[int]) -> list[int]:
        await asyncio.sleep(_COMPUTE_S)
        return items

    async def main() -> list[tuple[int, RequestRecord]]:
        b = DynamicBatcher(run, max_batch_size=1, max_wait_ms=0, executors=executors, model="m", metrics=m)
        return await asyncio.gather(*(_submit_in_request(b, i) for i in range(2)))

    out = asyncio.run(main())
    at_once_ms, compute_ms = _COMPUTE_S * 1e3 / 2, _COMPUTE_S * 1e3 - 1
    for _, rec in out:
        _check_contiguous(rec)
        bw = _stage(rec, "batch_wait")
        assert (bw[1] - bw[0]) / MS < at_once_ms  # full at one item: closes at once
        c = _stage(rec, "compute")
        assert (c[1] - c[0]) / MS >= compute_ms
    queues = sorted((q[1] - q[0]) / MS for q in (_stage(rec, "queue") for _, rec in out))
    if executors == 1:  # the second batch waited for the only executor
        assert queues[0] < at_once_ms and queues[1] >= compute_ms, queues
    else:
        assert queues[1] < at_once_ms, queues  # two executors: nobody waits for one


def test_queue_full_suggests_retry_after_and_recovers() -> None:
    _, m = _metrics()
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        await gate.wait()
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=2, max_wait_ms=0, max_queue=3, executors=1, metrics=m)
        running = [asyncio.create_task(b.submit(i)) for i in range(2)]  # one batch, now executing
        await asyncio.sleep(0.01)
        assert b.running == 1 and b.queue_depth == 0
        waiting = [asyncio.create_task(b.submit(i)) for i in range(2, 5)]
        await asyncio.sleep(0.01)
        assert b.queue_depth == 3
        with pytest.raises(QueueFull) as info:
            await b.submit(99)
        assert info.value.depth == 3 and info.value.retry_after_s > 0
        assert int(info.value.retry_after_header) >= 1
        b.max_queue = 10  # runtime change: room again
        extra = asyncio.create_task(b.submit(5))
        gate.set()
        assert await asyncio.gather(*running, *waiting, extra) == [0, 1, 2, 3, 4, 5]
        await b.stop()

    asyncio.run(main())


def test_run_batch_errors_reach_every_waiter_and_the_batcher_survives() -> None:
    _, m = _metrics()
    calls = 0

    async def run(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("device lost")
        if calls == 2:
            return items[:1]  # wrong length
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=3, max_wait_ms=5, metrics=m)
        first = await asyncio.gather(*(_submit_in_request(b, i) for i in range(3)), return_exceptions=True)
        assert all(isinstance(e, RuntimeError) and str(e) == "device lost" for e in first)
        second = await asyncio.gather(*(b.submit(i) for i in range(3)), return_exceptions=True)
        assert all(isinstance(e, ValueError) and "1 results for 3 items" in str(e) for e in second)
        assert await asyncio.gather(*(b.submit(i) for i in range(3))) == [0, 1, 2]

    asyncio.run(main())


def test_failed_batch_still_records_its_stages() -> None:
    _, m = _metrics()

    async def run(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        raise RuntimeError("oom")

    async def main() -> RequestRecord:
        b = DynamicBatcher(run, max_batch_size=1, max_wait_ms=0, metrics=m)
        rec = RequestRecord()
        token = set_current_request(rec)
        try:
            with pytest.raises(RuntimeError, match="oom"):
                await b.submit(1)
        finally:
            reset_current_request(token)
        return rec

    rec = asyncio.run(main())
    _check_contiguous(rec)
    assert rec.batch_size == 1


def test_settings_change_at_runtime() -> None:
    _, m = _metrics()
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0.03)
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=8, max_wait_ms=5_000, executors=1, metrics=m)
        tasks = [asyncio.create_task(b.submit(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        assert b.queue_depth == 5 and b.running == 0
        b.max_batch_size = 2  # the open batch is cut into 2 + 2; one item keeps waiting
        await asyncio.sleep(0)
        assert sizes == [2] and b.running == 1 and b.queue_depth == 3
        b.executors = 2  # the closed batch waiting for an executor starts now
        await asyncio.sleep(0)
        assert b.running == 2 and b.queue_depth == 1
        b.configure(max_wait_ms=1)  # the leftover item's deadline has passed: it closes right away
        assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
        assert sizes == [2, 2, 1]
        with pytest.raises(ValueError, match="max_wait_ms"):
            b.max_wait_ms = -1
        with pytest.raises(ValueError, match="unknown batcher setting"):
            b.configure(wait=1)

    asyncio.run(main())


def test_cancelled_waiter_leaves_the_open_batch() -> None:
    reg, m = _metrics()
    seen: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        seen.append(items)
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=10, max_wait_ms=40, model="m", metrics=m)
        keep = asyncio.create_task(b.submit(1))
        gone = asyncio.create_task(b.submit(2))
        await asyncio.sleep(0.005)
        assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 2
        gone.cancel()
        await asyncio.sleep(0)
        assert b.queue_depth == 1
        assert await keep == 1

    asyncio.run(main())
    assert seen == [[1]]


def test_stop_drains_the_open_batch_then_refuses() -> None:
    _, m = _metrics()

    async def run(items: list[int]) -> list[int]:
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=10, max_wait_ms=60_000, metrics=m)
        await b.start()
        t = asyncio.create_task(b.submit(7))
        await asyncio.sleep(0)
        await b.stop()  # closes the open batch instead of waiting a minute
        assert t.done() and t.result() == 7
        with pytest.raises(RuntimeError, match="stopped"):
            await b.submit(8)
        await b.start()
        b.max_wait_ms = 1
        assert await b.submit(9) == 9

    asyncio.run(main())


def test_many_concurrent_requests_each_get_their_own_result_and_batch() -> None:
    reg, m = _metrics()
    batches: list[list[int]] = []
    rng = random.Random(7)

    async def run(items: list[int]) -> list[int]:
        batches.append(list(items))
        await asyncio.sleep(rng.uniform(0.001, 0.006))
        return [-i for i in items]

    async def client(b: DynamicBatcher[int, int], i: int) -> tuple[int, int, RequestRecord]:
        await asyncio.sleep(rng.uniform(0, 0.2))
        r, rec = await _submit_in_request(b, i)
        return i, r, rec

    async def main() -> list[tuple[int, int, RequestRecord]]:
        b = DynamicBatcher(run, max_batch_size=8, max_wait_ms=3, executors=3, model="m", metrics=m)
        out = await asyncio.gather(*(client(b, i) for i in range(600)))
        assert b.queue_depth == 0 and b.running == 0
        return out

    out = asyncio.run(main())
    size_of = {i: len(batch) for batch in batches for i in batch}
    assert sorted(i for batch in batches for i in batch) == list(range(600))
    assert max(map(len, batches)) <= 8
    for i, r, rec in out:
        assert r == -i
        assert rec.batch_size == size_of[i]
        assert [s.stage for s in rec.stages] == ["batch_wait", "queue", "compute"]
        _check_contiguous(rec)
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "m"}) == len(batches)
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_sum", {"model": "m"}) == 600


def test_hooks_for_a_teams_own_batcher_record_the_same_intervals() -> None:
    reg, m = _metrics()
    recs = [RequestRecord(model="m"), RequestRecord(model="m")]
    tickets = [record_enqueue(recs[0], at_ns=1_000 * MS, queue_depth=0)]
    token = set_current_request(recs[1])
    try:
        tickets.append(record_enqueue(at_ns=1_004 * MS, queue_depth=1))  # captures the current request
    finally:
        reset_current_request(token)
    record_batch_closed(tickets, at_ns=1_010 * MS)
    record_batch_start(tickets, at_ns=1_025 * MS)
    record_batch_end(tickets, at_ns=1_065 * MS, model="m", metrics=m)
    totals = [r.stage_totals_s() for r in recs]
    assert totals[0] == pytest.approx({"batch_wait": 0.010, "queue": 0.015, "compute": 0.040})
    assert totals[1] == pytest.approx({"batch_wait": 0.006, "queue": 0.015, "compute": 0.040})
    assert [r.batch_size for r in recs] == [2, 2] and [r.queue_depth for r in recs] == [0, 1]
    assert reg.get_sample_value(f"{names.METRIC_BATCH_SIZE}_sum", {"model": "m"}) == 2
    assert reg.get_sample_value(names.METRIC_EXECUTOR_BUSY, {"model": "m"}) == pytest.approx(0.040)
    # no close hook: the batch counts as closed when it starts (no queue time)
    solo = RequestRecord()
    t = [record_enqueue(solo, at_ns=0)]
    record_batch_start(t, at_ns=5 * MS)
    record_batch_end(t, at_ns=6 * MS, metrics=m)
    assert solo.stage_totals_s() == pytest.approx({"batch_wait": 0.005, "queue": 0.0, "compute": 0.001})
    with pytest.raises(ValueError, match="record_batch_start"):
        record_batch_end([record_enqueue(RequestRecord())], metrics=m)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": 0, "max_wait_ms": 1}, "max_batch_size"),
        ({"max_batch_size": 2, "max_wait_ms": -1}, "max_wait_ms"),
        ({"max_batch_size": 2, "max_wait_ms": 1, "executors": 0}, "executors"),
        ({"max_batch_size": 2, "max_wait_ms": 1, "max_queue": 0}, "max_queue"),
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, int], match: str) -> None:
    async def run(items: Sequence[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError, match=match):
        DynamicBatcher(run, **kwargs)  # type: ignore[arg-type]


def test_two_batchers_of_one_model_add_up_in_the_queue_depth_gauge() -> None:
    reg, m = _metrics()
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        await gate.wait()
        return items

    async def main() -> None:
        a = DynamicBatcher(run, max_batch_size=100, max_wait_ms=10_000, model="m", metrics=m)
        b = DynamicBatcher(run, max_batch_size=100, max_wait_ms=10_000, model="m", metrics=m)
        tasks = [asyncio.create_task(x.submit(i)) for x, n in ((a, 3), (b, 2)) for i in range(n)]
        await asyncio.sleep(0.01)
        assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 5
        a.max_wait_ms = 0  # a's open batch closes now and goes to its executor
        await asyncio.sleep(0.01)
        assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 2
        gate.set()
        await b.stop()
        await asyncio.gather(*tasks)
        assert reg.get_sample_value(names.METRIC_QUEUE_DEPTH, {"model": "m"}) == 0

    asyncio.run(main())


def test_stop_without_draining_fails_waiters_and_cancels_running_batches() -> None:
    _, m = _metrics()
    started = asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        started.set()
        await asyncio.sleep(60)
        return items

    async def main() -> None:
        b = DynamicBatcher(run, max_batch_size=1, max_wait_ms=0, executors=1, metrics=m)
        running = asyncio.create_task(_submit_in_request(b, 1))
        await started.wait()
        queued = [asyncio.create_task(b.submit(i)) for i in (2, 3)]
        await asyncio.sleep(0.01)
        assert b.running == 1 and b.queue_depth == 2
        await asyncio.wait_for(b.stop(drain=False), 5)
        for t in (running, *queued):
            with pytest.raises(RuntimeError, match="batcher stopped"):
                await t
        assert b.running == 0 and b.queue_depth == 0

    asyncio.run(main())


def test_the_batchers_model_labels_the_requests_metrics_unless_the_request_names_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An instrumented FastAPI app whose handler never sets a model: the DynamicBatcher's ``model`` labels
    the request histogram and every stage histogram (preprocess too), as well as the batch metrics. A
    request that set ``record.model`` itself keeps it."""
    import httpx
    from fastapi import FastAPI

    import stagescope
    from stagescope.instrumentation.app import instrument_app, uninstrument_app

    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "STAGESCOPE_SPANS_DIR", "STAGESCOPE_MODELS"):
        monkeypatch.delenv(key, raising=False)
    reg = CollectorRegistry()
    app = FastAPI()

    async def run(items: list[int]) -> list[int]:
        await asyncio.sleep(0.002)
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_batch_size=4, max_wait_ms=2, model="ranker-v3")

    @app.post("/v1/score")
    async def score() -> dict[str, int]:
        with stagescope.stage("preprocess"):
            x = 1
        return {"y": await batcher.submit(x)}

    @app.post("/v1/score-own")
    async def score_own() -> dict[str, int]:
        rec = stagescope.current_request()
        assert rec is not None
        rec.model = "reranker"
        return {"y": await batcher.submit(2)}

    instrument_app(app, service_name="scorer", models=["ranker-v3", "reranker"], registry=reg)

    async def traffic() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            for _ in range(3):
                assert (await c.post("/v1/score")).status_code == 200
            assert (await c.post("/v1/score-own")).status_code == 200

    try:
        asyncio.run(traffic())
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in reg.collect() for s in f.samples}
    finally:
        uninstrument_app(app)  # (it also takes stagescope's families off the registry)

    def value(name: str, labels: dict[str, str]) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    count = f"{names.METRIC_REQUEST_DURATION}_count"
    req = {"route": "/v1/score", "status_class": "2xx"}
    assert value(count, {**req, "model": "ranker-v3"}) == 3
    assert value(count, {**req, "model": ""}) is None
    for stage in ("preprocess", "batch_wait", "queue", "compute"):
        labels = {"stage": stage, "kind": names.STAGE_KINDS[stage], "model": "ranker-v3"}
        got = value(f"{names.METRIC_STAGE_DURATION}_count", labels)
        assert got == 3, stage
    own = {"route": "/v1/score-own", "status_class": "2xx", "model": "reranker"}
    assert value(count, own) == 1
    assert value(f"{names.METRIC_STAGE_DURATION}_count", {"stage": "compute", "kind": "compute", "model": "reranker"}) == 1
    assert value(f"{names.METRIC_BATCH_SIZE}_count", {"model": "ranker-v3"}) >= 1
