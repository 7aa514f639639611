"""StageMetrics' deferred observations (promfast.Pending): what a reader sees is what was observed.

The request path counts the request and stage observations of its own thread in plain Python numbers
and the families add them to prometheus-client's values when the registry is collected. These tests
check, against prometheus-client's own ``Histogram.observe`` on the same values, that nothing is lost
or counted twice: from the owning thread, from other threads at the same time, with scrapes running
concurrently, with exemplars, and when a second StageMetrics shares the families.
"""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.utils import floatToGoString
from prometheus_client.values import MultiProcessValue, MutexValue

from stagescope import names
from stagescope.instrumentation.metrics import _COMPACT_MASK, StageMetrics, status_class
from stagescope.instrumentation.promfast import Pending, deferrable, ns_limit
from stagescope.instrumentation.record import RequestRecord, StageInterval

MS = 1_000_000
LABELS = {"route": "/v1/predict", "model": "", "status_class": "2xx"}


def _record(rng: random.Random) -> RequestRecord:
    end = rng.randrange(1, 3_000) * MS // rng.choice((1, 7, 1000))
    rec = RequestRecord(method="POST", route="/v1/predict", start_ns=0, end_ns=end, status_code=200)
    rec.stages.append(StageInterval("compute", 0, rng.randrange(0, end + 1)))
    return rec


def _count(reg: CollectorRegistry, family: str, labels: dict[str, str]) -> float:
    return reg.get_sample_value(f"{family}_count", labels) or 0.0


def test_owner_thread_observations_reach_every_reader_exactly() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg)
    ref_reg = CollectorRegistry()
    ref = Histogram(
        "r", "r", ("a",), registry=ref_reg, buckets=names.DEFAULT_BUCKETS[names.METRIC_REQUEST_DURATION]
    )
    rng = random.Random(3)
    for k in range(400):
        rec = _record(rng)
        m.request_started()
        m.request_finished(rec)
        ref.labels("x").observe(rec.end_ns / 1e9)  # type: ignore[operator]
        if k % 97 == 0:  # a reader in between sees everything so far
            assert _count(reg, names.METRIC_REQUEST_DURATION, LABELS) == k + 1
    assert m._req_pending, "the owner's observations went through the deferred path"
    for le in (*names.DEFAULT_BUCKETS[names.METRIC_REQUEST_DURATION][:-1], float("inf")):
        key = str(le) if le != float("inf") else "+Inf"
        got = reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_bucket", {**LABELS, "le": key})
        want = ref_reg.get_sample_value("r_bucket", {"a": "x", "le": key})
        assert got == want, le
    got_sum = reg.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_sum", LABELS)
    assert got_sum == pytest.approx(ref_reg.get_sample_value("r_sum", {"a": "x"}))
    stage = {"stage": "compute", "kind": "compute", "model": ""}
    assert _count(reg, names.METRIC_STAGE_DURATION, stage) == 400
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 0
    assert b"stagescope_request_duration_seconds_count" in generate_latest(reg)


def test_in_flight_counts_started_requests_not_yet_finished() -> None:
    reg = CollectorRegistry()
    m = StageMetrics(reg)
    rng = random.Random(4)
    for _ in range(5):
        m.request_started()
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 5
    for _ in range(3):
        m.request_finished(_record(rng))
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 2
    m.request_finished(_record(rng), "ab" * 16)  # a kept trace: at once, with its exemplar
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 1


def test_concurrent_threads_and_scrapes_lose_nothing() -> None:
    """The owner thread, two other threads and a scraping thread at once: every observation counted once."""
    reg = CollectorRegistry()
    m = StageMetrics(reg)
    m.request_started()  # this thread owns the deferred counts
    m.request_finished(_record(random.Random(0)))
    per_thread = 3000
    stop = threading.Event()

    def serve(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(per_thread):
            m.request_started()
            m.request_finished(_record(rng), "cd" * 16 if rng.random() < 0.05 else None)

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(reg)

    others = [threading.Thread(target=serve, args=(s,)) for s in (1, 2)]
    scraper = threading.Thread(target=scrape)
    scraper.start()
    for t in others:
        t.start()
    serve(9)  # the owner, at the same time
    for t in others:
        t.join()
    stop.set()
    scraper.join()
    want = 1 + 3 * per_thread
    assert _count(reg, names.METRIC_REQUEST_DURATION, LABELS) == want
    assert (
        _count(reg, names.METRIC_STAGE_DURATION, {"stage": "compute", "kind": "compute", "model": ""}) == want
    )
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 0


def test_status_classes_and_shared_families_keep_their_observations() -> None:
    reg = CollectorRegistry()
    a, b = StageMetrics(reg), StageMetrics(reg)  # two instrumented apps on one registry share families
    rng = random.Random(6)
    for code in (200, 404, 503, 200):
        rec = _record(rng)
        rec.status_code = code
        a.request_started()
        a.request_finished(rec)
    b.request_started()
    b.request_finished(_record(rng))
    a.unregister()  # b still uses the families: a's observations stay in them
    for code, n in ((200, 3), (404, 1), (503, 1)):
        assert _count(reg, names.METRIC_REQUEST_DURATION, {**LABELS, "status_class": status_class(code)}) == n
    assert reg.get_sample_value(names.METRIC_INFLIGHT) == 0


def test_only_values_of_this_process_are_deferred() -> None:
    assert deferrable(MutexValue("histogram", "h", "h", (), (), "h"))
    assert MultiProcessValue()._multiprocess is True  # the value class of the multiprocess mode
    assert not deferrable(object())

    class FileValue:  # what a multiprocess child's values look like to Pending
        _multiprocess = True

        def inc(self, amount: float) -> None:  # pragma: no cover - never called
            raise AssertionError

    child = Histogram("h", "h", registry=CollectorRegistry())
    child._sum = FileValue()  # type: ignore[assignment]
    assert Pending(child).ns is None  # its observations go to the child's own observe


def test_bucket_edges_in_nanoseconds_match_observe_in_seconds() -> None:
    """A duration of exactly a bucket's bound, and one nanosecond either side, lands in the bucket
    prometheus-client's ``observe`` puts ``ns / 1e9`` in."""
    bounds = names.DEFAULT_BUCKETS[names.METRIC_REQUEST_DURATION]
    reg = CollectorRegistry()
    got = Histogram("g", "g", registry=reg, buckets=bounds)
    want = Histogram("w", "w", registry=reg, buckets=bounds)
    pend = Pending(got)
    assert pend.ns is not None
    for b in bounds[:-1]:
        limit = ns_limit(b)
        assert limit is not None and limit / 1e9 <= b < (limit + 1) / 1e9
        for ns in (limit - 1, limit, limit + 1, round(b * 1e9)):
            pend.add(ns)
            want.observe(ns / 1e9)
    pend.flush()
    for le in (*bounds[:-1], float("inf")):
        key = str(le) if le != float("inf") else "+Inf"
        assert reg.get_sample_value("g_bucket", {"le": key}) == reg.get_sample_value("w_bucket", {"le": key}), le
    assert reg.get_sample_value("g_sum") == pytest.approx(reg.get_sample_value("w_sum"))


def test_the_owner_empties_its_lists_and_scrapes_between_count_each_once() -> None:
    """Past many compactions (every _COMPACT_MASK + 1 requests on the owner thread) with scrapes in
    between, every observation is counted once and the lists stay short without any scrape."""
    reg = CollectorRegistry()
    m = StageMetrics(reg)
    rng = random.Random(11)
    n = 3 * (_COMPACT_MASK + 1) + 17
    for k in range(n):
        m.request_started()
        m.request_finished(_record(rng))
        if k % 1500 == 0:
            assert _count(reg, names.METRIC_REQUEST_DURATION, LABELS) == k + 1
        assert all(len(p.ns or ()) <= _COMPACT_MASK + 1 for p in m._req_pending.values())
    assert _count(reg, names.METRIC_REQUEST_DURATION, LABELS) == n
    assert _count(reg, names.METRIC_STAGE_DURATION, {"stage": "compute", "kind": "compute", "model": ""}) == n
    assert sum(len(p.ns or ()) for p in m._req_pending.values()) < _COMPACT_MASK + 1


def test_bounds_past_any_duration_still_count_exactly() -> None:
    """Custom buckets may be huge or negative: each still gets a limit (no overflow, no endless loop)
    and the counts match ``observe``."""
    bounds = (-1e300, -0.5, 1e-12, 2.5, 1e12, 1e300, float("inf"))
    reg = CollectorRegistry()
    got = Histogram("g", "g", registry=reg, buckets=bounds)
    want = Histogram("w", "w", registry=reg, buckets=bounds)
    pend = Pending(got)
    assert pend.ns is not None
    for ns in (-(10**18), -600_000_000, -1, 0, 1, 2_500_000_000, 2_500_000_001, 10**18):
        pend.add(ns)
        want.observe(ns / 1e9)
    pend.flush()
    for le in bounds:
        key = floatToGoString(le)
        want_n = reg.get_sample_value("w_bucket", {"le": key})
        assert want_n is not None and reg.get_sample_value("g_bucket", {"le": key}) == want_n, le
