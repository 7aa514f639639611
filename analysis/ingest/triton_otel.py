"""Triton's OpenTelemetry mode (``--trace-config mode=opentelemetry``): its timestamps are span events.

Layout, as triton-inference-server/server src/tracer.cc builds it (``SampleTrace``,
``Trace::StartSpan``, ``Trace::AddEvent``, ``CaptureTimestamp``) and qa/L0_trace/
opentelemetry_unittest.py checks it (``_check_events``, ``_test_bls_trace``, ``_test_ensemble_trace``);
Triton 2.36 (23.07) and later:

* ``InferRequest``: the root span, started when the frontend samples the request (after it was read),
  holding the frontend's events HTTP_RECV_START, HTTP_RECV_END (so before the span's own start),
  INFER_RESPONSE_COMPLETE, HTTP_SEND_START, HTTP_SEND_END (gRPC: GRPC_WAITREAD_*, GRPC_SEND_*); its
  parent is the caller's span when the request carried a ``traceparent``;
* one span per model, named after it, child of ``InferRequest`` (an ensemble's composing models and a
  BLS model's children: of the calling model's span), with attributes ``triton.model_name``,
  ``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id`` and events
  REQUEST_START, QUEUE_START, REQUEST_END;
* ``compute``, child of its model's span, with COMPUTE_START, COMPUTE_INPUT_END,
  COMPUTE_OUTPUT_START, COMPUTE_END (the backend reports them when the execution is over, so a BLS
  model's children are its model span's children, beside its compute);
* custom-activity spans a backend may open (``..._START`` / ``..._END`` events).

Every one of them is of kind SERVER. Read as plain spans, that is up to three (an ensemble: more)
"requests" per request and no stage at all. This pass, over the spans any reader produced (OTLP,
Jaeger, Zipkin), rebuilds each request's Triton traces from the events and applies the rules of
:mod:`~stagescope.analysis.ingest.triton`: the request span (``InferRequest``, else the top model
span) starts at its first event (HTTP_RECV_START, its arrival), takes the root model as route and model,
its first response as time to first response, and gets one stage child per interval (it ends
with the last send, as in the trace file, not when Triton released the trace); the model,
compute and custom-activity spans under it become INTERNAL, so they are neither requests nor
downstream calls. Event times here are Unix time already (``time_offset_`` + steady clock).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from stagescope import names as N
from stagescope.analysis.ingest.otlp import sql_str
from stagescope.analysis.ingest.spans import KIND_INTERNAL, KIND_SERVER
from stagescope.analysis.ingest.triton import Node, SpanBuffer, build, request_fields

if TYPE_CHECKING:
    from stagescope.analysis.ingest.traces import TraceLoader

__all__ = ["apply"]

_CANDIDATES = f"""
WITH t AS (
  SELECT DISTINCT trace_id FROM spans
  WHERE events IS NOT NULL AND model IS NOT NULL
    AND list_contains(list_transform(events, lambda e: e.name), {sql_str(N.TRITON_TS_REQUEST_START)})
)
SELECT file, trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, model, service, route,
       list_transform(events, lambda e: e.name) AS ev_names, list_transform(events, lambda e: e.ns) AS ev_ns
FROM spans SEMI JOIN t USING (trace_id)
"""
_UPDATE_COLUMNS = ("start_ns", "end_ns", "model", "route", "ttft_s", "gaps_s", "itl_mean_s", "itl_max_s")
_UPDATE_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
    ("model", pa.string()), ("route", pa.string()), ("ttft_s", pa.float64()), ("gaps_s", pa.list_(pa.float64())),
    ("itl_mean_s", pa.float64()), ("itl_max_s", pa.float64()),
])  # fmt: skip


def _trace_requests(
    spans: dict[str, dict[str, Any]], stages: SpanBuffer
) -> tuple[list[dict[str, Any]], set[str]]:
    """For one trace's spans: its stage rows (into ``stages``), request-span updates and the spans to
    make INTERNAL."""

    def names(r: dict[str, Any]) -> list[str]:
        return r["ev_names"] or []

    models = {sid for sid, r in spans.items() if N.TRITON_TS_REQUEST_START in names(r)}

    def ancestors(sid: str) -> list[str]:
        out, seen = [], {sid}
        p = spans[sid]["parent_span_id"]
        while p and p in spans and p not in seen:
            out.append(p)
            seen.add(p)
            p = spans[p]["parent_span_id"]
        return out

    anc = {sid: ancestors(sid) for sid in spans}
    model_parent = {sid: next((a for a in anc[sid] if a in models), None) for sid in spans}
    nodes: dict[str, Node] = {}
    for sid in models:
        r = spans[sid]
        nodes[sid] = Node(sid, model_parent[sid], r["model"] or r["name"])
    for sid, r in spans.items():
        owner = sid if sid in models else model_parent[sid]
        if owner is None or (sid not in models and N.TRITON_TS_COMPUTE_START not in names(r)):
            continue  # custom activities, and spans outside Triton's
        for name, ns in zip(names(r), r["ev_ns"] or [], strict=False):
            if ns is not None:
                nodes[owner].add(name, ns)
    updates: list[dict[str, Any]] = []
    internal: set[str] = set()
    for top in (sid for sid in models if model_parent[sid] is None):
        req_sid = next((a for a in anc[top] if spans[a]["name"] == N.TRITON_SPAN_ROOT), top)
        req_span = spans[req_sid]
        if req_sid != top:
            for name, ns in zip(names(req_span), req_span["ev_ns"] or [], strict=False):
                if ns is not None:
                    nodes[top].add(name, ns)
        req = build(nodes, top)  # type: ignore[arg-type]  # str keys are Hashable
        if req is None:
            continue
        req.start_ns = min(req.start_ns, req_span["start_ns"])  # the end stays the last send (see triton)
        fields = request_fields(req)
        if req_span["route"] is not None:
            fields["route"] = req_span["route"]
        updates.append({"trace_id": req_span["trace_id"], "span_id": req_sid, **fields})
        stages.stages(req, file=req_span["file"], trace_id=req_span["trace_id"], parent=req_sid,
                      service=req_span["service"])  # fmt: skip
        internal.update(sid for sid in spans if req_sid in anc[sid] and spans[sid]["kind"] == KIND_SERVER)
    return updates, internal


def apply(loader: TraceLoader) -> None:
    """Rebuild Triton's requests from the events of the loaded spans (see the module doc)."""
    con = loader.con
    cur = con.execute(_CANDIDATES)
    cols = [d[0] for d in cur.description]
    by_trace: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in cur.fetchall():
        r = dict(zip(cols, row, strict=True))
        by_trace[r["trace_id"]][r["span_id"]] = r
    if not by_trace:
        return
    stages = SpanBuffer()
    updates: list[dict[str, Any]] = []
    internal: list[dict[str, str]] = []
    for tid, spans in by_trace.items():
        u, i = _trace_requests(spans, stages)
        updates.extend(u)
        internal.extend({"trace_id": tid, "span_id": sid} for sid in i)
    if updates:
        con.register("_triton_req", pa.Table.from_pylist(updates, schema=_UPDATE_SCHEMA))
        try:
            sets = ", ".join(f"{c} = u.{c}" for c in _UPDATE_COLUMNS)
            con.execute(
                f"UPDATE spans SET {sets} FROM _triton_req u "
                "WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
            )
        finally:
            con.unregister("_triton_req")
    if internal:
        con.register("_triton_inner", pa.Table.from_pylist(internal))
        try:
            con.execute(
                f"UPDATE spans SET kind = {KIND_INTERNAL} FROM _triton_inner u "
                "WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
            )
        finally:
            con.unregister("_triton_inner")
    stages.insert(con)
