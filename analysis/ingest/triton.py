"""Triton Inference Server's request timestamps -> one request and its stage intervals.

Triton records the same timestamps in both of its trace modes (triton-inference-server/server
docs/user_guide/trace.md, "Differences in trace contents from Triton's trace output"): the trace
file as ``{"id", "timestamps"}`` objects (:mod:`~stagescope.analysis.ingest.triton_file`), the
OpenTelemetry mode as span events (:mod:`~stagescope.analysis.ingest.triton_otel`). The rules both
readers share live here; the intervals are the ones Triton's own summary tool reports
(server qa/common/trace_summary.py, ``summarize`` and ``HttpFrontend`` / ``GrpcFrontend``).

Per Triton *trace* (one model's handling of the request; an ensemble's composing models and a BLS
model's children are traces of their own):

=================  ==============================================  ======================================
stage              from -> to                                      trace_summary.py
=================  ==============================================  ======================================
``queue``          QUEUE_START -> COMPUTE_START                    QUEUE (the dynamic batcher's wait for a
                                                                   batch to fill is part of it)
``compute_input``  COMPUTE_START -> COMPUTE_INPUT_END              COMPUTE_INPUT
``compute``        COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START       COMPUTE_INFER (without the two inner
                                                                   timestamps: COMPUTE_START -> _END)
``compute_output`` COMPUTE_OUTPUT_START -> COMPUTE_END             COMPUTE_OUTPUT
=================  ==============================================  ======================================

and on the request's own trace, from the HTTP or gRPC frontend (server src/http_server.cc and
src/grpc/infer_handler.cc capture them):

* ``receive``: HTTP_RECV_START -> HTTP_RECV_END (HTTP_RECV: reading the request off the network;
  gRPC has no such hook, the docs say);
* ``deserialize``: HTTP_RECV_END (gRPC: GRPC_WAITREAD_END) -> REQUEST_START, the frontend turning
  the request into a Triton request;
* ``egress``: the last INFER_RESPONSE_COMPLETE (the response handed to the frontend; without it
  REQUEST_END) -> the last HTTP_SEND_END / GRPC_SEND_END (serializing and writing the response);
  for a stream of responses (several sends) only the last write, last send start -> end (the
  stream's other responses are sent while the model still computes).

REQUEST_START -> QUEUE_START and COMPUTE_END -> REQUEST_END (the summary's "handler overhead") are in
no stage: Triton does not say what they are.

The request runs from HTTP_RECV_START (gRPC: GRPC_WAITREAD_END, where trace_summary.py starts
GRPC_INFER; else REQUEST_START) to the last send end: what the client waits for. A backend sends its
response before it reports its compute timestamps and releases the request, so HTTP_SEND_END often
comes before COMPUTE_END and REQUEST_END (a capture of Triton 2.51: ``external/triton/``); those
tails are after the request as the client sees it. Without send timestamps (in-process API) the
request ends at the last of REQUEST_END and INFER_RESPONSE_COMPLETE. Its time to first response
ends at its first send end (else its first INFER_RESPONSE_COMPLETE). A decoupled model streaming
responses has one send per response (the gRPC stream of 2.51 captures a GRPC_SEND_START / _END
pair per response but one INFER_RESPONSE_COMPLETE), and the gaps between the send ends (else
between several INFER_RESPONSE_COMPLETE) are its token gaps. Send timestamps before the request
started are ignored (the HTTP frontend does not capture them for chunked responses:
src/http_server.cc, "FIXME currently send_start_ns / send_end_ns is not captured in evhtp").

Children (a trace whose ``parent_id`` names another: an ensemble's composing models, and the models a
BLS model calls with ``trace=request.trace()``, docs "Tracing for BLS models") put their stages on
the request of their root. A BLS model's children run inside its own compute, so its compute
intervals are cut around each child's REQUEST_START -> REQUEST_END and the children's own queue
and compute show instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

from stagescope import names as N

__all__ = ["Node", "SpanBuffer", "TritonRequest", "build", "children", "request_fields", "span_id"]

#: (stage, start timestamp, end timestamp) of one model's trace, in order.
_MODEL_STAGES: tuple[tuple[str, str, str], ...] = (
    (N.STAGE_QUEUE, N.TRITON_TS_QUEUE_START, N.TRITON_TS_COMPUTE_START),
    (N.STAGE_COMPUTE_INPUT, N.TRITON_TS_COMPUTE_START, N.TRITON_TS_COMPUTE_INPUT_END),
    (N.STAGE_COMPUTE, N.TRITON_TS_COMPUTE_INPUT_END, N.TRITON_TS_COMPUTE_OUTPUT_START),
    (N.STAGE_COMPUTE_OUTPUT, N.TRITON_TS_COMPUTE_OUTPUT_START, N.TRITON_TS_COMPUTE_END),
)
_COMPUTE_STAGES = frozenset({N.STAGE_COMPUTE_INPUT, N.STAGE_COMPUTE, N.STAGE_COMPUTE_OUTPUT})
_SEND_ENDS = (N.TRITON_TS_HTTP_SEND_END, N.TRITON_TS_GRPC_SEND_END)


@dataclass
class Node:
    """One Triton trace: a model's timestamps (name -> every ns it was captured at) and its parent."""

    key: Hashable
    parent: Hashable | None = None
    model: str | None = None
    version: str | None = None
    ts: dict[str, list[int]] = field(default_factory=dict)

    def add(self, name: str, ns: int) -> None:
        self.ts.setdefault(name, []).append(ns)

    def first(self, name: str) -> int | None:
        v = self.ts.get(name)
        return min(v) if v else None

    def last(self, name: str) -> int | None:
        v = self.ts.get(name)
        return max(v) if v else None


@dataclass
class TritonRequest:
    """A request built from its traces: times in the nodes' clock (ns)."""

    start_ns: int
    end_ns: int
    model: str | None
    version: str | None
    stages: list[tuple[str, int, int]]
    ttft_ns: int | None = None
    gaps_ns: list[int] = field(default_factory=list)
    #: intervals whose end timestamp came before their start (left out)
    inverted: int = 0


def span_id(*parts: object) -> str:
    """A 16-hex-digit id from ``parts`` (stable across runs: the same input gives the same ids, so a
    file read twice is recognised as repeated spans)."""
    return hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=8).hexdigest()


def _interval(node: Node, a: str, b: str) -> tuple[int, int] | None:
    s, e = node.first(a), node.last(b)
    return None if s is None or e is None else (s, e)


def _model_stages(node: Node) -> Iterator[tuple[str, int, int]]:
    if (
        node.first(N.TRITON_TS_COMPUTE_INPUT_END) is None
        or node.first(N.TRITON_TS_COMPUTE_OUTPUT_START) is None
    ):
        stages: tuple[tuple[str, str, str], ...] = (
            _MODEL_STAGES[0], (N.STAGE_COMPUTE, N.TRITON_TS_COMPUTE_START, N.TRITON_TS_COMPUTE_END),
        )  # fmt: skip
    else:
        stages = _MODEL_STAGES
    for stage, a, b in stages:
        iv = _interval(node, a, b)
        if iv is not None:
            yield stage, iv[0], iv[1]


def _frontend_stages(root: Node) -> Iterator[tuple[str, int, int]]:
    recv = _interval(root, N.TRITON_TS_HTTP_RECV_START, N.TRITON_TS_HTTP_RECV_END)
    if recv is not None:
        yield N.STAGE_RECEIVE, recv[0], recv[1]
    read_end = root.last(N.TRITON_TS_HTTP_RECV_END) or root.last(N.TRITON_TS_GRPC_WAITREAD_END)
    req_start, req_end = root.first(N.TRITON_TS_REQUEST_START), root.last(N.TRITON_TS_REQUEST_END)
    if read_end is not None and req_start is not None:
        yield N.STAGE_DESERIALIZE, read_end, req_start
    ends = _sends(root, _SEND_ENDS)
    starts = _sends(root, (N.TRITON_TS_HTTP_SEND_START, N.TRITON_TS_GRPC_SEND_START))
    ready = root.last(N.TRITON_TS_INFER_RESPONSE_COMPLETE) or req_end
    if len(ends) > 1 and starts:
        yield N.STAGE_EGRESS, starts[-1], ends[-1]
    elif ready is not None and ends:
        yield N.STAGE_EGRESS, ready, ends[-1]


def _sends(node: Node, names: tuple[str, ...]) -> list[int]:
    """Sorted send timestamps of the request (none before its REQUEST_START: not captured)."""
    floor = node.first(N.TRITON_TS_REQUEST_START) or 0
    return sorted(t for n in names for t in node.ts.get(n, []) if t >= floor)


def _cut(iv: tuple[int, int], holes: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """``iv`` without the (sorted, possibly overlapping) ``holes``."""
    s, e = iv
    for hs, he in holes:
        if he <= s or hs >= e:
            continue
        if hs > s:
            yield s, hs
        s = max(s, he)
        if s >= e:
            return
    if s < e:
        yield s, e


def children(nodes: dict[Hashable, Node]) -> dict[Hashable, list[Hashable]]:
    """Parent key -> keys of its children (compute once per file, pass to :func:`build`)."""
    kids: dict[Hashable, list[Hashable]] = {}
    for k, n in nodes.items():
        if n.parent is not None and n.parent != k:
            kids.setdefault(n.parent, []).append(k)
    return kids


def _subtree(kids: dict[Hashable, list[Hashable]], root: Hashable) -> dict[Hashable, list[Hashable]]:
    """Children of every node reachable from ``root`` (each node once, cycles ignored)."""
    out: dict[Hashable, list[Hashable]] = {}
    todo = [root]
    while todo:
        k = todo.pop()
        if k in out:
            continue
        out[k] = kids.get(k, [])
        todo.extend(out[k])
    return out


def build(
    nodes: dict[Hashable, Node], root: Hashable, family: dict[Hashable, list[Hashable]] | None = None
) -> TritonRequest | None:
    """The request whose own trace is ``nodes[root]``, with the stages of every trace under it
    (``family``: :func:`children` of ``nodes``, computed here when not given); None when the traces
    hold no timestamp at all."""
    tree = _subtree(children(nodes) if family is None else family, root)
    top = nodes[root]
    stages: list[tuple[str, int, int]] = []
    inverted = 0
    for key, kids in tree.items():
        node = nodes[key]
        holes = sorted(iv for iv in (_interval(nodes[c], N.TRITON_TS_REQUEST_START, N.TRITON_TS_REQUEST_END)
                                     for c in kids) if iv is not None)  # fmt: skip
        found = list(_model_stages(node)) + (list(_frontend_stages(node)) if key == root else [])
        for stage, s, e in found:
            if e < s:
                inverted += 1
                continue
            pieces = _cut((s, e), holes) if holes and stage in _COMPUTE_STAGES else iter([(s, e)])
            stages.extend((stage, a, b) for a, b in pieces if b > a)
    every = [t for key in tree for ts in nodes[key].ts.values() for t in ts]
    if not every:
        return None
    start = (
        top.first(N.TRITON_TS_HTTP_RECV_START)
        or top.first(N.TRITON_TS_GRPC_WAITREAD_END)
        or top.first(N.TRITON_TS_REQUEST_START)
        or min(every)
    )
    start = min([start, *(s for _, s, _ in stages)])
    sent = _sends(top, _SEND_ENDS)
    done = [t for t in (top.last(n) for n in (N.TRITON_TS_REQUEST_END, N.TRITON_TS_INFER_RESPONSE_COMPLETE)) if t]
    end = max(sent or done or [max(every)])
    completes = sorted(top.ts.get(N.TRITON_TS_INFER_RESPONSE_COMPLETE, []))
    responses = sent if len(sent) > 1 or not completes else completes
    first = sent[0] if sent else (completes[0] if completes else None)
    return TritonRequest(
        start_ns=start,
        end_ns=end,
        model=top.model,
        version=top.version,
        stages=stages,
        ttft_ns=first - start if first is not None and first >= start else None,
        gaps_ns=[b - a for a, b in pairwise(responses)] if len(responses) > 1 else [],
        inverted=inverted,
    )


def request_fields(req: TritonRequest, offset_ns: int = 0) -> dict[str, object]:
    """The request span's columns a Triton request sets (times moved by ``offset_ns``; seconds for the
    latency attributes, as the spans table keeps them)."""
    gaps = [g / 1e9 for g in req.gaps_ns]
    return {
        "start_ns": req.start_ns + offset_ns,
        "end_ns": req.end_ns + offset_ns,
        "model": req.model,
        "route": req.model,
        "ttft_s": None if req.ttft_ns is None else req.ttft_ns / 1e9,
        "gaps_s": gaps or None,
        "itl_mean_s": sum(gaps) / len(gaps) if gaps else None,
        "itl_max_s": max(gaps) if gaps else None,
    }


#: The spans-table columns a Triton request row sets, and those of a stage row (the others stay NULL).
_REQUEST_COLS = ("file", "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "service",
                 "otel_status", "model", "route", "ttft_s", "gaps_s", "itl_mean_s", "itl_max_s")  # fmt: skip
_STAGE_COLS = ("file", "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "service",
               "otel_status", "stage")  # fmt: skip


class SpanBuffer:
    """Spans-table rows as tuples, turned into columns once (a dict per row cost more than the rules)."""

    def __init__(self) -> None:
        self.requests: list[tuple[object, ...]] = []
        self.stage_rows: list[tuple[object, ...]] = []

    def __len__(self) -> int:
        return len(self.requests) + len(self.stage_rows)

    def request(
        self, req: TritonRequest, *, file: str, trace_id: str, span: str, service: str | None, offset_ns: int = 0
    ) -> None:
        """The request's own SERVER span (name ``InferRequest``, as Triton's OpenTelemetry root)."""
        from stagescope.analysis.ingest.spans import KIND_SERVER

        f = request_fields(req, offset_ns)
        self.requests.append((file, trace_id, span, "", N.TRITON_SPAN_ROOT, KIND_SERVER, f["start_ns"], f["end_ns"],
                              service, 0, f["model"], f["route"], f["ttft_s"], f["gaps_s"], f["itl_mean_s"],
                              f["itl_max_s"]))  # fmt: skip

    def stages(
        self, req: TritonRequest, *, file: str, trace_id: str, parent: str, service: str | None, offset_ns: int = 0
    ) -> None:
        """One INTERNAL child of ``parent`` per stage interval (``stagescope.stage`` set); span ids
        are the parent's xor the interval's number (unique in the trace, the same on every read)."""
        from stagescope.analysis.ingest.spans import KIND_INTERNAL

        base = int(parent, 16)
        self.stage_rows.extend(
            (file, trace_id, f"{base ^ (i << 40) ^ i:016x}", parent, stage, KIND_INTERNAL, st + offset_ns,
             en + offset_ns, service, 0, stage)
            for i, (stage, st, en) in enumerate(req.stages, 1)
        )  # fmt: skip

    def insert(self, con: object) -> None:
        """Append the rows to ``con``'s ``spans``."""
        for rows, cols in ((self.requests, _REQUEST_COLS), (self.stage_rows, _STAGE_COLS)):
            if rows:
                _insert(con, dict(zip(cols, map(list, zip(*rows, strict=True)), strict=True)), len(rows))


def _insert(con: object, columns: dict[str, list[object]], n: int) -> None:
    import pyarrow as pa

    from stagescope.analysis.ingest.jaeger import SPAN_SCHEMA

    arrays = [pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type) for f in SPAN_SCHEMA]
    try:
        con.register("_triton_rows", pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA))  # type: ignore[attr-defined]
        con.execute("INSERT INTO spans SELECT * FROM _triton_rows")  # type: ignore[attr-defined]
    finally:
        con.unregister("_triton_rows")  # type: ignore[attr-defined]
