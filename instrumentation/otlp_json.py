"""Encode finished spans as OTLP/JSON (one ``ExportTraceServiceRequest``), as the collector writes it.

The shape is the OTLP "JSON Protobuf Encoding": lowerCamelCase keys, trace and span ids as lowercase
hex, 64-bit integers (``startTimeUnixNano``, ``intValue``) as decimal strings, ``kind`` as the enum
number (1 INTERNAL, 2 SERVER, 3 CLIENT, 4 PRODUCER, 5 CONSUMER), ``status`` ``{}`` when unset and
``parentSpanId`` absent on roots: what the OpenTelemetry Collector's ``file`` exporter writes, so one
reader handles both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - orjson ships with the service extra
    import json

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


__all__ = ["EncodedSpans", "any_value", "encode_attributes", "encode_spans", "span_to_otlp"]

_STATUS_CODE = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def _int(v: int) -> dict[str, Any]:
    return {"intValue": str(v)}


_SCALARS: dict[type, Any] = {
    str: lambda v: {"stringValue": v},
    bool: lambda v: {"boolValue": v},
    int: _int,
    float: lambda v: {"doubleValue": v},
}


def any_value(value: Any) -> dict[str, Any]:
    """One OTLP ``AnyValue``."""
    enc = _SCALARS.get(type(value))
    if enc is not None:
        return enc(value)
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        import base64

        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": encode_attributes(value)}}
    return {"stringValue": str(value)}


def encode_attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not attrs:
        return []
    scalars = _SCALARS
    out = []
    for k, v in attrs.items():
        enc = scalars.get(type(v))
        out.append({"key": k, "value": enc(v) if enc is not None else any_value(v)})
    return out


def span_to_otlp(span: ReadableSpan) -> dict[str, Any]:
    """One span as an OTLP/JSON ``Span`` object."""
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    if parent is not None and parent.span_id:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    out["flags"] = int(ctx.trace_flags) | 0x100 | (0x200 if parent is not None and parent.is_remote else 0)
    out["name"] = span.name
    out["kind"] = span.kind.value + 1
    out["startTimeUnixNano"] = str(span.start_time or 0)
    out["endTimeUnixNano"] = str(span.end_time or 0)
    attrs = encode_attributes(span.attributes)
    if attrs:
        out["attributes"] = attrs
    events = span.events
    if events:
        out["events"] = [
            {"timeUnixNano": str(e.timestamp), "name": e.name, "attributes": encode_attributes(e.attributes)}
            for e in events
        ]
    links = span.links
    if links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": encode_attributes(link.attributes),
            }
            for link in links
        ]
    status = span.status
    code = _STATUS_CODE.get(status.status_code, 0)
    out["status"] = (
        {"code": code, "message": status.description}
        if code and status.description
        else ({"code": code} if code else {})
    )
    return out


class EncodedSpans(NamedTuple):
    """Spans already in OTLP/JSON form (built straight from a record), with their resource and scope."""

    resource: Any  # opentelemetry.sdk.resources.Resource
    scope: Any  # InstrumentationScope | None
    spans: list[dict[str, Any]]


def encode_spans(spans: Sequence[ReadableSpan], encoded: Sequence[EncodedSpans] = ()) -> bytes:
    """One ``ExportTraceServiceRequest`` as compact JSON bytes (no trailing newline): ``spans`` and
    already-encoded ``encoded`` groups, grouped by resource and instrumentation scope."""
    by_resource: dict[int, tuple[Any, dict[Any, list[dict[str, Any]]]]] = {}
    scopes: dict[Any, Any] = {}

    def group(res: Any, scope: Any) -> list[dict[str, Any]]:
        entry = by_resource.get(id(res))
        if entry is None:
            entry = by_resource[id(res)] = (res, {})
        key = (scope.name, scope.version) if scope is not None else None
        scopes[key] = scope
        return entry[1].setdefault(key, [])

    for span in spans:
        group(span.resource, span.instrumentation_scope).append(span_to_otlp(span))
    for enc in encoded:
        group(enc.resource, enc.scope).extend(enc.spans)
    resource_spans = []
    for res, by_scope in by_resource.values():
        scope_spans = []
        for key, encoded_spans in by_scope.items():
            scope = scopes[key]
            scope_obj: dict[str, Any] = {}
            if scope is not None:
                scope_obj["name"] = scope.name
                if scope.version:
                    scope_obj["version"] = scope.version
            item: dict[str, Any] = {"scope": scope_obj, "spans": encoded_spans}
            if scope is not None and scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        rs: dict[str, Any] = {"resource": {"attributes": encode_attributes(res.attributes if res else None)}}
        rs["scopeSpans"] = scope_spans
        if res is not None and res.schema_url:
            rs["schemaUrl"] = res.schema_url
        resource_spans.append(rs)
    return _dumps({"resourceSpans": resource_spans})
