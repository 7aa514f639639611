"""The middleware builds each request's TracedRecord without the dataclass ``__init__``
(instrumentation/middleware.py ``_open``): it must set every field and slot the constructor sets, to
the same values, so that a field added to RequestRecord or TracedRecord later cannot be left unset."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import stagescope
from stagescope.instrumentation.record import RequestRecord
from stagescope.instrumentation.tracing import TracedRecord

# what the request itself writes (its own values, checked below), or what the constructor leaves unset
_BY_THE_REQUEST = {"method", "route", "start_ns", "end_ns", "status_code", "stages", "route_matched",
                   "scope", "sampled_reason", "trace_state", "trace_id", "span_id", "parent_span_id",
                   "parent_sampled"}  # fmt: skip


# TracedRecord's own slots (the constructor leaves them unset): what a request without another
# instrumentation's span starts with
_OPENED = {"emit_server": True, "live_sampled": False, "live_span": None, "held_spans": None, "caller": None}


def _slots(cls: type) -> list[str]:
    return [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]


def _served_record() -> tuple[TracedRecord, dict[str, Any]]:
    """One request through a real instrumented FastAPI app; the record as the app saw it while it ran
    (``seen``: each slot's value read inside the handler), and the finished record."""
    app = FastAPI()
    records: list[Any] = []
    seen: dict[str, Any] = {}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        rec = stagescope.current_request()
        assert rec is not None
        for name in _slots(type(rec)):
            seen[name] = getattr(rec, name)  # AttributeError here: a slot the middleware left unset
        return {"id": item_id}

    stagescope.instrument_app(app, service_name="t", registry=CollectorRegistry(), record_hook=records.append,
                              slow_threshold_ms=10_000)  # fmt: skip
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/items/7", "raw_path": b"/items/7", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"test")], "client": ("127.0.0.1", 1), "server": ("test", 80),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        pass

    asyncio.run(app(scope, receive, send))
    (rec,) = records
    return rec, seen


def test_every_slot_is_set_as_the_constructor_sets_it() -> None:
    rec, seen = _served_record()
    assert type(rec) is TracedRecord
    default = TracedRecord()
    assert set(seen) == set(_slots(TracedRecord))  # the handler read every slot, none was unset
    fields = {f.name for f in dataclasses.fields(RequestRecord)}
    assert fields <= set(seen)
    assert set(seen) - _BY_THE_REQUEST - fields == set(_OPENED)
    for name in set(seen) - _BY_THE_REQUEST:
        want = getattr(default, name) if name in fields else _OPENED[name]
        assert seen[name] == want, name
        if isinstance(want, (list, dict)):  # a fresh container per request, never a shared one
            assert seen[name] is not want, name


def test_the_request_fields_hold_the_request() -> None:
    rec, seen = _served_record()
    assert (seen["method"], seen["route"], seen["route_matched"]) == ("GET", "/items/{item_id}", True)
    assert seen["end_ns"] is None and seen["status_code"] is None  # not finished while the app ran
    assert seen["scope"] is not None and seen["scope"]["path"] == "/items/7"
    assert rec.end_ns is not None and rec.end_ns >= rec.start_ns and rec.status_code == 200
    assert rec.trace_id > 0 and rec.span_id > 0 and rec.parent_span_id == 0 and rec.parent_sampled is None


def test_records_do_not_share_containers() -> None:
    a, _ = _served_record()
    b, _ = _served_record()
    assert a.stages is not b.stages and a.token_ns is not b.token_ns and a.attributes is not b.attributes
