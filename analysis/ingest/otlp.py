"""OTLP/JSON traces -> the flat ``spans`` table, in DuckDB SQL (no per-span Python).

Input: files holding ``ExportTraceServiceRequest`` JSON, one per line (the collector's ``file``
exporter, stagescope's embedded sink) or one (pretty-printed) document per file, optionally gzip.
DuckDB splits the files into JSON objects and parses each object **once** with ``json_transform``
into nested structs (ids, kind and status as text, times as BIGINT, attributes as a list of
``{key, value}`` structs, events as ``{name, ns}``); UNNEST
walks ``resourceSpans -> scopeSpans -> spans``, and the attribute keys of
:data:`~stagescope.analysis.ingest.spans.ATTR_COLUMNS` are pivoted with ``list_position``. (Keep
expressions out of SELECTs that UNNEST: DuckDB evaluates them per output row.) Lenient by design:
unknown fields are ignored, ids are hex in any case (base64 ids, which some protobuf-JSON encoders
write, are converted), 64-bit integers may be strings or numbers, ``kind``/``status.code`` may be
integers or enum names. Values that do not convert become NULL; an export request whose
``resourceSpans``/``scopeSpans``/``spans`` is not a list yields one all-NULL span row. Such rows are
found by :mod:`stagescope.analysis.ingest.traces` and explained, with file and line, by
:mod:`stagescope.analysis.ingest.check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from stagescope.analysis.ingest.spans import ATTR_COLUMNS, INVALID_COLUMNS, SPAN_COLUMNS, STRING_ONLY

__all__ = ["MAX_OBJECT_BYTES", "WRAPPERS", "otlp_spans_sql", "sql_str"]

#: Default largest JSON object (one export request line); DuckDB's read buffers scale with it, so it
#: stays at DuckDB's default and a file with longer lines is retried with a larger bound.
MAX_OBJECT_BYTES: Final = 16 * 1024 * 1024

_SCALAR = '{"stringValue":"VARCHAR","intValue":"VARCHAR","doubleValue":"DOUBLE","boolValue":"BOOLEAN"}'
_ATTR_TYPE = (
    '[{"key":"VARCHAR","value":{"stringValue":"VARCHAR","intValue":"VARCHAR","doubleValue":"DOUBLE",'
    f'"boolValue":"BOOLEAN","arrayValue":{{"values":[{_SCALAR}]}}}}}}]'
)
_SPAN_TYPE = (
    '{"traceId":"VARCHAR","spanId":"VARCHAR","traceState":"VARCHAR","parentSpanId":"VARCHAR",'
    '"name":"VARCHAR","kind":"VARCHAR","startTimeUnixNano":"BIGINT","endTimeUnixNano":"BIGINT","status":{"code":"VARCHAR"},'
    f'"attributes":{_ATTR_TYPE},"events":[{{"name":"VARCHAR","timeUnixNano":"BIGINT"}}]}}'
)
#: One export request, parsed once per line into nested structs (ids/kind/status converted below).
_LINE_TYPE = f'{{"resourceSpans":[{{"resource":{{"attributes":{_ATTR_TYPE}}},"scopeSpans":[{{"spans":[{_SPAN_TYPE}]}}]}}]}}'
#: Envelopes around the export request that readers name: Jaeger v2's query API (``api/v3``) answers
#: ``{"result": TracesData}`` (jaegertracing/jaeger
#: cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/http_gateway.go, ``returnTrace``; its
#: grpc-gateway predecessor streamed one such object per line).
WRAPPERS: Final = ("result",)
_KINDS = {"UNSPECIFIED": 0, "INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS = {"UNSET": 0, "OK": 1, "ERROR": 2}


def sql_str(s: str) -> str:
    """A SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def _enum(expr: str, prefix: str, values: dict[str, int]) -> str:
    cases = " ".join(f"WHEN {sql_str(k)} THEN {v}" for k, v in values.items())
    return (
        f"coalesce(TRY_CAST({expr} AS INTEGER), "
        f"CASE upper(replace(upper({expr}), {sql_str(prefix)}, '')) {cases} END, 0)"
    )


def _hex_id(expr: str) -> str:
    return (
        f"CASE WHEN {expr} IS NULL THEN NULL WHEN {expr} LIKE '%=' "
        f"THEN TRY(lower(hex(from_base64({expr})))) ELSE lower({expr}) END"
    )


def _pivot(typ: str, p: str, col: str = "") -> str:
    """Typed value of the attribute at list position ``p`` (flat value lists sv/iv/dv/bv, see below);
    ``col`` in STRING_ONLY / INVALID_COLUMNS: a non-empty string only / a description of any other value."""
    sv, iv, dv, bv = f"sv[{p}]", f"iv[{p}]", f"dv[{p}]", f"bv[{p}]"
    if col in STRING_ONLY:
        return f"CASE WHEN trim({sv}) <> '' THEN {sv} END"
    if col in INVALID_COLUMNS:
        return (
            f"CASE WHEN trim({sv}) <> '' THEN NULL WHEN {sv} IS NOT NULL THEN 'an empty string' "
            f"WHEN {iv} IS NOT NULL THEN 'the integer ' || {iv} "
            f"WHEN {dv} IS NOT NULL THEN 'the number ' || CAST({dv} AS VARCHAR) "
            f"WHEN {bv} IS NOT NULL THEN 'the boolean ' || CAST({bv} AS VARCHAR) "
            f"WHEN a[{p}].value.arrayValue IS NOT NULL THEN 'a list' ELSE 'a value that is not a string' END"
        )
    if typ == "VARCHAR":
        return f"coalesce({sv}, {iv}, CAST({dv} AS VARCHAR), CAST({bv} AS VARCHAR))"
    if typ == "BIGINT":
        return f"coalesce(TRY_CAST({iv} AS BIGINT), TRY_CAST({dv} AS BIGINT), TRY_CAST({sv} AS BIGINT))"
    if typ == "DOUBLE":
        return f"coalesce({dv}, TRY_CAST({iv} AS DOUBLE), TRY_CAST({sv} AS DOUBLE))"
    if typ == "BOOLEAN":
        return f"coalesce({bv}, TRY_CAST({sv} AS BOOLEAN), TRY_CAST({iv} AS BIGINT) <> 0)"
    if typ == "DOUBLE[]":
        return (
            f'list_transform(a[{p}].value.arrayValue."values", '
            "lambda x: coalesce(x.doubleValue, TRY_CAST(x.intValue AS DOUBLE)))"
        )
    raise ValueError(typ)


def _objects(files: Sequence[str], fmt: str, compression: str, max_object_bytes: int) -> str:
    file_list = "[" + ", ".join(sql_str(f) for f in files) + "]"
    return (
        f"read_json_objects({file_list}, format={sql_str(fmt)}, compression={sql_str(compression)}, "
        f"filename=true, maximum_object_size={max_object_bytes})"
    )


def otlp_spans_sql(
    files: Sequence[str],
    *,
    fmt: str = "newline_delimited",
    compression: str = "auto",
    max_object_bytes: int = MAX_OBJECT_BYTES,
    wrapper: str | None = None,
) -> str:
    """A SELECT yielding the spans table (columns of ``SPAN_COLUMNS``) for OTLP/JSON ``files``.

    ``fmt`` is DuckDB's ``format`` (``newline_delimited`` for lines, ``unstructured`` for documents);
    ``wrapper`` (one of :data:`WRAPPERS`) is the key each object holds the export request under.
    """
    if wrapper is not None and wrapper not in WRAPPERS:
        raise ValueError(wrapper)
    line_type = _LINE_TYPE if wrapper is None else f'{{"{wrapper}":{_LINE_TYPE}}}'
    root = "x" if wrapper is None else f"x.{wrapper}"
    pivots: list[str] = []
    values: list[str] = []
    for col, (typ, keys) in ATTR_COLUMNS.items():
        exprs = []
        for key in keys:
            values.append(f"list_position(ks, {sql_str(key)}) AS p{len(values)}")
            p = f"p{len(values) - 1}"
            exprs.append(f"CASE WHEN {p} IS NOT NULL THEN {_pivot(typ, p, col)} END")
        pivots.append(f"{exprs[0] if len(exprs) == 1 else 'coalesce(' + ', '.join(exprs) + ')'} AS {col}")
    cols = ", ".join(SPAN_COLUMNS)
    return f"""
WITH o AS (
  SELECT filename AS file, json_transform(json, '{line_type}') AS x
  FROM {_objects(files, fmt, compression, max_object_bytes)}
), r AS (
  SELECT file, CASE WHEN {root}.resourceSpans IS NULL
    THEN list_append(list_filter({root}.resourceSpans, lambda z: false), NULL) ELSE {root}.resourceSpans END AS rl
  FROM o
), r1 AS (
  SELECT file, unnest(rl) AS x FROM r
), rs AS (
  SELECT file,
    x.resource.attributes[list_position(list_transform(x.resource.attributes, lambda a: a.key), 'service.name')]
      .value.stringValue AS service,
    CASE WHEN x.scopeSpans IS NULL THEN list_append(list_filter(x.scopeSpans, lambda z: false), NULL)
      ELSE x.scopeSpans END AS scl
  FROM r1
), r2 AS (
  SELECT file, service, unnest(scl) AS ss FROM rs
), rb AS (
  SELECT file, service, CASE WHEN ss.spans IS NULL THEN list_append(list_filter(ss.spans, lambda z: false), NULL)
      ELSE ss.spans END AS spans
  FROM r2
), s AS (
  SELECT file, service, unnest(spans) AS x FROM rb
), t AS (
  SELECT file, service, x.traceId AS tid, x.spanId AS sid, x.traceState AS tstate, x.parentSpanId AS pid,
    x.name AS name, x.kind AS k, x.status.code AS sc, x.startTimeUnixNano AS st, x.endTimeUnixNano AS en,
    x.attributes AS a, x.events AS ev
  FROM s
), u AS (
  SELECT *, list_transform(a, lambda x: x.key) AS ks, list_transform(a, lambda x: x.value.stringValue) AS sv,
    list_transform(a, lambda x: x.value.intValue) AS iv, list_transform(a, lambda x: x.value.doubleValue) AS dv,
    list_transform(a, lambda x: x.value.boolValue) AS bv
  FROM t
), w AS (
  SELECT *, {", ".join(values)} FROM u
), v AS (
  SELECT file, {_hex_id("tid")} AS trace_id, {_hex_id("sid")} AS span_id,
    coalesce({_hex_id("pid")}, '') AS parent_span_id, name,
    {_enum("k", "SPAN_KIND_", _KINDS)} AS kind,
    st AS start_ns, en AS end_ns, service,
    {_enum("sc", "STATUS_CODE_", _STATUS)} AS otel_status, nullif(tstate, '') AS trace_state,
    CASE WHEN len(ev) > 0 THEN list_transform(ev, lambda e: {{'name': e.name, 'ns': e.timeUnixNano}}) END
      AS events,
    {", ".join(pivots)}
  FROM w
)
SELECT {cols} FROM v
"""
