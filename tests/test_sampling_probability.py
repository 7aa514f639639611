"""Every kept span says with what probability it was kept (OpenTelemetry's ``ot=th:<hex>``), the keep
decision is the consistent ``randomness >= threshold`` rule, and the ingest turns ``th`` into
``requests.sampling_p``.

Thresholds are checked against the table of OpenTelemetry's
``specification/trace/tracestate-probability-sampling.md`` (1-in-N probabilities at precision 4);
the apps are real FastAPI apps through httpx's ASGI transport writing to the embedded sink.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.analysis.ingest import ingest_to_parquet, load_dataset
from stagescope.instrumentation.sampling import (
    DEFAULT_BASELINE_MIN_PER_S,
    DEFAULT_BASELINE_SAMPLE,
    RouteFloor,
    SamplingPolicy,
    parse_tracestate,
    probability_to_threshold,
    threshold_probability,
    threshold_to_th,
)

#: (probability, th at precision 4) from the specification's table.
SPEC_TABLE = [
    (1.0, "0"), (0.5, "8"), (1 / 3, "aaab"), (0.25, "c"), (0.2, "cccd"), (0.125, "e"), (0.1, "e666"),
    (0.0625, "f"), (0.01, "fd70a"), (0.001, "ffbe77"), (0.0001, "fff9724"), (0.00001, "ffff583a"),
    (0.000001, "ffffef39"),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _clean_sampler_env(clean_telemetry_env: None) -> None:
    """Every test starts with none of the sampler's, sink's or OTel's variables set (conftest)."""


@pytest.mark.parametrize(("p", "th"), SPEC_TABLE)
def test_thresholds_follow_the_specification(p: float, th: str) -> None:
    t = probability_to_threshold(p)
    assert threshold_to_th(t) == th
    assert threshold_probability(t) == pytest.approx(p, rel=1e-4)
    assert parse_tracestate(f"ot=th:{th}").th == t


def test_tracestate_parsing_keeps_what_it_does_not_own() -> None:
    got = parse_tracestate("vendor=abc, ot=rv:00112233445566;th:c;x:1 ,other@t=9")
    assert got.th == 0xC0000000000000 and got.rv == 0x00112233445566
    assert got.ot_rest == ("rv:00112233445566", "x:1") and got.others == ("vendor=abc", "other@t=9")
    assert parse_tracestate("ot=th:123456789abcdef0").th is None  # more than 14 digits: invalid
    assert parse_tracestate("ot=rv:1234").rv is None  # rv is exactly 14 digits


def test_keep_decision_is_consistent_with_its_threshold() -> None:
    rng = random.Random(7)
    ids = [rng.getrandbits(128) or 1 for _ in range(40_000)]
    p10 = SamplingPolicy("traceidratio", 0.1, None)
    p20 = SamplingPolicy("traceidratio", 0.2, None)
    kept10 = {t for t in ids if p10.decide(t, None, 0, False)}
    kept20 = {t for t in ids if p20.decide(t, None, 0, False)}
    assert kept10 <= kept20  # a higher ratio keeps every trace a lower one keeps
    share = len(kept10) / len(ids)
    assert abs(share - threshold_probability(p10.threshold)) < 4 * (0.1 * 0.9 / len(ids)) ** 0.5
    assert all((t & (2**56 - 1)) >= p10.threshold for t in kept10)
    ts = p10.tracestate("baseline", next(iter(kept10)), None)
    assert ts == "ot=th:e666"
    assert p10.tracestate("slow", 1, None) == p10.tracestate("error", 1, None) == "ot=th:0"
    # an explicit rv from the caller is the randomness, and is kept in our tracestate
    rv_low = parse_tracestate("ot=rv:00000000000001,vendor=x")
    assert p10.decide(2**56 - 1, None, 0, False, rv_low.rv) is None
    assert p10.tracestate("slow", 2**56 - 1, True, rv_low) == "ot=th:0;rv:00000000000001,vendor=x"


def test_parent_based_keeps_the_callers_threshold_or_says_nothing() -> None:
    pb = SamplingPolicy("parentbased_always_off", 1.0, None)
    tid = 0xABCDEF << 60 | 0xF0000000000000  # randomness 0xf0000000000000
    assert pb.tracestate("baseline", tid, True, parse_tracestate("ot=th:c")) == "ot=th:c"
    # inconsistent (randomness below the caller's threshold): erased, as the specification says
    assert pb.tracestate("baseline", tid, True, parse_tracestate("ot=th:f8")) is None
    assert pb.tracestate("baseline", tid, True, None) is None  # no threshold from the caller: unknown
    assert pb.tracestate("slow", tid, False, None) == "ot=th:0"
    on = SamplingPolicy("always_on", 1.0, None)
    assert on.tracestate("baseline", tid, None) == "ot=th:0"


def scorer() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/score/{ms}")
    async def score(ms: int) -> dict[str, int]:
        with stagescope.stage("feature_fetch"):
            await asyncio.sleep(ms / 1000)
        return {"ms": ms}

    return app


async def _drive(app: FastAPI, paths: list[tuple[str, dict[str, str]]]) -> None:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        for path, headers in paths:
            await client.get(path, headers=headers)


def _lines(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(d.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_sink_spans_carry_th_and_the_ingest_reads_sampling_p(tmp_path: Path) -> None:
    app = scorer()
    spans_dir = tmp_path / "spans"
    handle = stagescope.instrument_app(
        app, service_name="scorer", registry=CollectorRegistry(), spans_dir=spans_dir,
        slow_threshold_ms=150, baseline_sample=0.25,
    )  # fmt: skip
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    paths = [("/v1/score/0", {}) for _ in range(400)] + [("/v1/score/200", {}) for _ in range(5)]
    paths.append(("/v1/score/200", {"traceparent": caller, "tracestate": "vendor=1,ot=rv:ffffffffffffff"}))
    asyncio.run(_drive(app, paths))
    assert handle.force_flush(10)
    handle.shutdown()
    spans = [s for line in _lines(spans_dir) for rs in line["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]]  # fmt: skip
    assert spans and all("traceState" in s for s in spans)  # server and stage spans alike
    by_trace: dict[str, set[str]] = {}
    for s in spans:
        by_trace.setdefault(s["traceId"], set()).add(s["traceState"])
    assert all(len(v) == 1 for v in by_trace.values())  # one tracestate per trace
    states = {next(iter(v)) for v in by_trace.values()}
    assert states == {"ot=th:c", "ot=th:0", "ot=th:0;rv:ffffffffffffff,vendor=1"}
    ds = load_dataset(traces=[spans_dir])
    rows = ds.con.execute(
        "SELECT sampled_reason, sampling_p, count(*) FROM requests GROUP BY ALL ORDER BY 1"
    ).fetchall()
    kept_fast = next(n for r, p, n in rows if r == "baseline")
    assert [(r, p) for r, p, _ in rows] == [("baseline", 0.25), ("slow", 1.0)]
    assert 60 <= kept_fast <= 140  # 25 % of 400 (binomial: 100 +- 35 at 4 sd)
    n_slow = next(n for r, _, n in rows if r == "slow")
    # the six 200 ms requests, and any 0 ms one a loaded machine stalled past the threshold (the
    # first's warm-up, a descheduled moment): kept as slow is right for each request that was, by its
    # own recorded duration, and wrong for any other
    (slow_min_ms,) = ds.con.execute(
        "SELECT min(duration_ms) FROM requests WHERE sampled_reason = 'slow'"
    ).fetchone()
    assert n_slow >= 6 and slow_min_ms >= 150, (n_slow, slow_min_ms)
    # the probability survives a round trip through Parquet, and older Parquet without it reads NULL
    out = ingest_to_parquet([spans_dir], tmp_path / "pq")
    back = load_dataset(traces=[out])
    assert back.con.execute("SELECT sum(1 / sampling_p) FROM requests").fetchone() == pytest.approx(
        (kept_fast * 4 + n_slow,)
    )
    back.close()
    old = tmp_path / "old"
    old.mkdir()
    for f in out.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    ds.con.execute(
        f"COPY (SELECT * EXCLUDE (sampling_p, sampled_reason) FROM requests) TO '{old / 'requests.parquet'}'"
    )
    ds.close()
    legacy = load_dataset(traces=[old])
    assert legacy.con.execute("SELECT count(*), count(sampling_p) FROM requests").fetchone() == (
        kept_fast + n_slow, 0,
    )  # fmt: skip
    mixed = load_dataset(traces=[old, out])
    assert mixed.con.execute("SELECT count(*), count(sampling_p) FROM requests").fetchone() == (
        2 * (kept_fast + n_slow), kept_fast + n_slow,
    )  # fmt: skip
    legacy.close()
    mixed.close()


def test_jaeger_tracestate_tag_and_client_spans(tmp_path: Path) -> None:
    """Jaeger JSON keeps the tracestate in the ``w3c.tracestate`` tag (the collector's translator)."""
    doc = {"data": [{"traceID": "ab" * 16, "processes": {"p1": {"serviceName": "svc"}}, "spans": [{
        "traceID": "ab" * 16, "spanID": "cd" * 8, "operationName": "GET /x", "processID": "p1",
        "startTime": 1_764_460_800_000_000, "duration": 5000, "references": [],
        "tags": [{"key": "span.kind", "value": "server"}, {"key": "w3c.tracestate", "value": "ot=th:8"},
                 {"key": names.ATTR_SAMPLED_REASON, "value": "baseline"}]}]}]}  # fmt: skip
    f = tmp_path / "jaeger.json"
    f.write_text(json.dumps(doc))
    ds = load_dataset(traces=[f])
    assert ds.con.execute("SELECT sampled_reason, sampling_p FROM requests").fetchall() == [("baseline", 0.5)]
    ds.close()


def test_otlp_exporter_path_carries_the_tracestate() -> None:
    """Spans handed to an SDK processor (and so to the OTLP/HTTP exporter) carry the tracestate in
    their context, and OpenTelemetry's own protobuf encoder writes it into ``trace_state``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = scorer()
    handle = stagescope.instrument_app(
        app, service_name="scorer", registry=CollectorRegistry(), tracer_provider=provider,
        slow_threshold_ms=150, baseline_sample=0.5,
    )  # fmt: skip
    asyncio.run(_drive(app, [("/v1/score/0", {}) for _ in range(40)] + [("/v1/score/200", {})]))
    assert handle.force_flush(10)
    spans = list(exporter.get_finished_spans())
    states = {s.context.trace_state.to_header() for s in spans if s.context is not None}
    assert states == {"ot=th:8", "ot=th:0"}
    pb = encode_spans(spans)
    encoded = {s.trace_state for rs in pb.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert encoded == {"ot=th:8", "ot=th:0"}
    handle.shutdown()


def test_default_floor_keeps_a_baseline_on_a_quiet_route_with_truthful_th() -> None:
    """The default raises 1 % on a quiet route so that about 2 baseline traces a second are kept; each
    decision's probability depends only on the requests before it, so 1/p sums to the requests."""
    rng = random.Random(11)
    floor = RouteFloor(DEFAULT_BASELINE_MIN_PER_S, DEFAULT_BASELINE_SAMPLE)
    for rate, seconds in ((40, 60), (2000, 5)):
        kept, weight, n = 0, 0.0, 0
        for sec in range(seconds):
            for _ in range(rate):
                t = floor.threshold(f"/r{rate}", 1000 + sec)
                n += 1
                if (rng.getrandbits(128) & (2**56 - 1)) >= t:
                    kept += 1
                    weight += 1 / threshold_probability(t)
        per_s = kept / seconds
        if rate == 40:  # about 2 a second (the first second keeps all it sees up to the floor)
            assert 1.4 <= per_s <= 3.0, per_s
        else:  # a busy route keeps its 1 %
            assert 0.7 * rate * 0.01 <= per_s <= 1.3 * rate * 0.01, per_s
        assert weight == pytest.approx(n, rel=0.35)  # Horvitz-Thompson: the weights stand for every request
    # what keep() decides, tracestate() writes: the threshold that decided
    policy = SamplingPolicy.resolve(env={})
    assert policy.min_per_s == DEFAULT_BASELINE_MIN_PER_S
    for _ in range(200):
        tid = rng.getrandbits(128) or 1
        reason, t = policy.keep(tid, None, 0, False, route="/quiet")
        if reason is not None:
            assert t is not None and (tid & (2**56 - 1)) >= t
            ts = policy.tracestate(reason, tid, None, None, t)
            assert ts is not None and parse_tracestate(ts).th == t
    explicit = SamplingPolicy.resolve(baseline_sample=0.01, env={})
    assert explicit.min_per_s is None  # a ratio the user chose is that ratio
    assert SamplingPolicy.resolve(env={names.ENV_BASELINE_MIN_PER_S: "0"}).min_per_s == 0


def test_route_floor_threshold_is_its_formula_for_every_count() -> None:
    """RouteFloor answers a busy route (count past per_s / ratio) without its cache: for every count the
    threshold is still probability_to_threshold(max(ratio, min(1, per_s / count)))."""
    for per_s, ratio in ((2.0, 0.01), (3.0, 0.07), (0.5, 0.001), (7.0, 0.33), (2.0, 0.0)):
        floor = RouteFloor(per_s, ratio)
        for count in range(1, 12_000):
            floor._state["/r"] = [5, count - 1, 0]  # the next decision is the count-th of second 5
            want = probability_to_threshold(max(ratio, min(1.0, per_s / count)))
            assert floor.threshold("/r", 5) == want, (per_s, ratio, count)
