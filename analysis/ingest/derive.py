"""From the flat ``spans`` table to the pinned analysis relations (SQL only).

* ``requests``: one row per server-side request. A request span is a span that is not a
  load-generator client span and either has kind SERVER and no parent inside its trace other than a
  load-generator client span, or is a local root (no parent) of kind INTERNAL/UNSPECIFIED.
  Such a root that calls a server (a program's own span: a script, a job, another load tool) and has
  no stage spans of its own above that server's span is the client side instead (with stages, it is a
  service's hand-traced request and the server it calls a downstream call): its CLIENT spans down to the first SERVER span are callers like the load
  generator's (``_outer_client``), each SERVER span under one is a request with that caller's
  duration, and the root is no request.
  Load-generator client spans are kind CLIENT with ``stagescope.client=true``, or CLIENT roots of a
  trace that also holds a server span; their duration is ``client_duration_ms``.
  An LLM engine's own span (vLLM's ``llm_request``, SGLang's ``Req <rid>``: the ``gen_ai.latency.*``
  attributes) is a request where it stands alone, and otherwise the sample of the request it sits
  under or beside (its *host*: the engine's HTTP server span, a gateway's): the engine gives TTFT,
  inter-token time and tokens, the host the end-to-end time (see :mod:`.engines`).
* ``stages``: every span whose ``stagescope.stage`` is a non-empty string (any name: a team's own
  stages are stages of their own), with its ``kind`` (see :mod:`~stagescope.analysis.kinds`: the
  span's ``stagescope.stage.kind``, else the kind a built-in name implies, else ``unknown``); for
  engine spans, their stages (front_end, queue, prefill, decode; gateway in a host above the engine)
  from their attributes by engine and version, or from their child spans (:mod:`.engines`), with
  the kinds their names imply; and a ``network`` row (kind network,
  client minus server duration) where a client span exists and the difference is positive (placed
  at the client span's start; only its length is meaningful). A span whose ``stagescope.stage`` is
  there but not a non-empty string (``stage_invalid``) is neither a stage nor a request: its time is
  unattributed, and the ingest names its file in a warning.
* ``token_gaps``: one row per element of ``stagescope.itl.gaps`` (seconds -> ms), with ``running``, the
  element of ``stagescope.itl.running`` beside it (the decode batch the gap's step carried; NULL without).

``requests`` and ``stages`` also carry ``trace_key`` and ``request_key``, and ``requests``
``input_key``: 64-bit integer keys of the trace id, the request (trace and span id of the request
span) and the input hash that the analysis joins and groups on (see analysis.keys). A stage row's
``request_key`` is its request's: the request span is the stage span's parent (as stagescope emits
them), an engine span's host (for the engine's stages, and stage spans under the engine span), or
the request a ``network`` row measures; for a stage span
under a SERVER span that is itself the direct child of a request span (two instrumentations each
opening a SERVER span in one process, as vLLM's ``llm_request`` under ``opentelemetry-instrument``),
that request's; NULL where the parent is not a request span (the analysis then goes by time within
the trace).

Identity: a request is one span id. Copies of one span id (an exporter's retry, or the same request
span written by the service's own tracer provider and by stagescope's sink) are one span (the ingest
keeps one copy before this derivation), and of the SERVER spans of a trace only those without a
parent in it are requests, so an in-process second SERVER span never counts as a second request.
An engine span with a host is that host's sample, never a request of its own (several engine spans
under one host, ``n > 1``, are one request).

Sources: ``vllm`` or ``sglang`` (an engine span is the request or its sample), ``stagescope`` (the
request has stage spans or ``stagescope.*`` attributes), else ``generic``.

``requests.sampling_p`` is the probability that the request's trace was kept: from the ``th``
rejection threshold in the ``ot`` entry of the request span's W3C tracestate (or its engine span's,
where the host's has none: one trace, one sampling decision) (OpenTelemetry's
probability sampling: ``(2^56 - th) / 2^56``); without a ``th``, 1 when ``stagescope.sampled_reason``
is ``slow`` or ``error`` (stagescope keeps those whatever the trace id), else NULL: unknown (a
collector's tail sampling, another vendor's sampler, a service that kept everything without saying
so). ``sampled_reason`` is that attribute as written.
"""

from __future__ import annotations

from stagescope import names
from stagescope.analysis.ingest.engines import engine_hosts_sql, engine_spans_sql, engine_stage_rows_sql
from stagescope.analysis.ingest.otlp import sql_str
from stagescope.analysis.ingest.spans import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    KIND_UNSPECIFIED,
)
from stagescope.analysis.keys import key_sql, request_keys_sql
from stagescope.analysis.kinds import kind_sql

#: Names an HTTP server span has when no route matched (semconv: the method alone; "HTTP" for others).
_METHOD_NAMES = ", ".join(f"'{m}'" for m in sorted({*names.HTTP_KNOWN_METHODS, "HTTP"}))

__all__ = ["REQUEST_COLUMNS", "derive_sql", "sampling_p_sql"]

REQUEST_COLUMNS = {
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "service": "VARCHAR",
    "name": "VARCHAR",
    "route": "VARCHAR",
    "model": "VARCHAR",
    "status_code": "INTEGER",
    "is_error": "BOOLEAN",
    "start_unix_ns": "BIGINT",
    "duration_ms": "DOUBLE",
    "ttft_ms": "DOUBLE",
    "itl_mean_ms": "DOUBLE",
    "itl_p99_ms": "DOUBLE",
    "itl_max_ms": "DOUBLE",
    "input_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "batch_size": "BIGINT",
    "queue_depth": "BIGINT",
    "input_hash": "VARCHAR",
    "cold_start": "BOOLEAN",
    "client_duration_ms": "DOUBLE",
    "source": "VARCHAR",
    "sampled_reason": "VARCHAR",
    "sampling_p": "DOUBLE",
    "trace_key": "UBIGINT",
    "input_key": "UBIGINT",
    "request_key": "UBIGINT",
    "escalated": "BOOLEAN",  # stagescope.escalated: a cascade's small model handed the request on
}


_MAX_T = names.SAMPLING_MAX_THRESHOLD


def sampling_p_sql(trace_state: str, reason: str) -> str:
    """SQL: the sampling probability of a span from its tracestate's ``ot=...th:<hex>`` (1 to 14 hex
    digits, padded with trailing zeros to 56 bits), else 1 for stagescope's ``slow``/``error`` keeps,
    else NULL (see the module docstring)."""
    ot = f"regexp_extract({trace_state}, '(?:^|,)[ \\t]*{names.TRACESTATE_OT}=([^,]*)', 1)"
    th = f"nullif(regexp_extract({ot}, '(?:^|;){names.OT_THRESHOLD}:([0-9a-fA-F]{{1,14}})(?:;|$)', 1), '')"
    t = f"TRY_CAST('0x' || rpad({th}, 14, '0') AS UBIGINT)"
    keeps_all = ", ".join(sql_str(r) for r in (names.SAMPLED_SLOW, names.SAMPLED_ERROR))
    return f"coalesce(({_MAX_T} - {t}) / {float(_MAX_T)!r}, CASE WHEN {reason} IN ({keeps_all}) THEN 1.0 END)"


def derive_sql(spans: str = "spans", kind: str = "TABLE") -> list[str]:
    """Statements creating ``requests``, ``stages`` and ``token_gaps`` (``kind``: TABLE or VIEW)."""
    return [
        # the client side of a trace whose local root is a program's own span (a script, a job, another
        # load tool: INTERNAL or UNSPECIFIED; a queue worker's CONSUMER or PRODUCER span) that calls a server: the root and every span below it down
        # to the first SERVER span; its CLIENT spans with a SERVER child are that server's callers
        f"""CREATE OR REPLACE TEMP TABLE _outer_client AS
WITH RECURSIVE cs(trace_id, span_id, root_id) AS (
  SELECT r.trace_id, r.span_id, r.span_id FROM {spans} r
  WHERE r.parent_span_id = '' AND r.kind IN ({KIND_UNSPECIFIED}, {KIND_INTERNAL}, {KIND_PRODUCER}, {KIND_CONSUMER})
    AND r.stage IS NULL
  UNION
  SELECT s.trace_id, s.span_id, cs.root_id FROM {spans} s JOIN cs
    ON s.trace_id = cs.trace_id AND s.parent_span_id = cs.span_id
  WHERE s.kind <> {KIND_SERVER}
)
SELECT c.trace_id, c.span_id, cs.root_id, (c.end_ns - c.start_ns) / 1e6 AS client_ms, c.start_ns AS client_start
FROM cs JOIN {spans} c ON c.trace_id = cs.trace_id AND c.span_id = cs.span_id
WHERE c.kind = {KIND_CLIENT}
  -- a root with stage spans of its own (above the first SERVER span) is a service doing its work (a
  -- handler traced by hand, INTERNAL by default), not a program calling one: it stays the request and
  -- the SERVER span it calls is a downstream call (a feature store, say)
  AND NOT EXISTS (SELECT 1 FROM cs w JOIN {spans} ws ON ws.trace_id = w.trace_id AND ws.span_id = w.span_id
                  WHERE w.trace_id = cs.trace_id AND w.root_id = cs.root_id AND ws.stage IS NOT NULL)
  AND EXISTS (SELECT 1 FROM {spans} x WHERE x.trace_id = c.trace_id AND x.parent_span_id = c.span_id
              AND x.kind = {KIND_SERVER})""",
        f"""CREATE OR REPLACE TEMP TABLE _client AS
SELECT c.trace_id, max((c.end_ns - c.start_ns) / 1e6) AS client_ms, min(c.start_ns) AS client_start,
       list(c.span_id) AS span_ids
FROM {spans} c
WHERE coalesce(c.is_client_attr, false)
   OR (c.kind = {KIND_CLIENT} AND c.parent_span_id = ''
       AND EXISTS (SELECT 1 FROM {spans} x WHERE x.trace_id = c.trace_id AND x.kind = {KIND_SERVER}))
   OR EXISTS (SELECT 1 FROM _outer_client o WHERE o.trace_id = c.trace_id AND o.span_id = c.span_id)
GROUP BY c.trace_id""",
        f"""CREATE OR REPLACE TEMP TABLE _staged AS
SELECT DISTINCT trace_id FROM {spans} WHERE stage IS NOT NULL""",
        *engine_spans_sql(spans),
        # request candidates: SERVER spans, local roots, and every LLM engine's span (SGLang's is INTERNAL)
        f"""CREATE OR REPLACE TEMP TABLE _cand AS
SELECT s.*, coalesce(o.client_ms, c.client_ms) AS client_ms,
       coalesce(list_contains(c.span_ids, s.parent_span_id), false) AS parent_is_client
FROM {spans} s LEFT JOIN _client c USING (trace_id)
  LEFT JOIN _outer_client o ON o.trace_id = s.trace_id AND o.span_id = s.parent_span_id
WHERE s.stage IS NULL AND s.stage_invalid IS NULL
  AND (s.kind = {KIND_SERVER} OR (s.parent_span_id = '' AND s.kind IN ({KIND_UNSPECIFIED}, {KIND_INTERNAL}))
       OR EXISTS (SELECT 1 FROM _eng e WHERE e.trace_id = s.trace_id AND e.span_id = s.span_id))
  AND NOT coalesce(list_contains(c.span_ids, s.span_id), false)
  -- a program's root span that calls a server is the client side, not a request: the server's span is
  AND NOT EXISTS (SELECT 1 FROM _outer_client o2 WHERE o2.trace_id = s.trace_id AND o2.root_id = s.span_id)""",
        # server spans whose parent is another (non load-generator) span of the trace: downstream calls
        f"""CREATE OR REPLACE TEMP TABLE _inner AS
SELECT c.trace_id, c.span_id, c.parent_span_id FROM _cand c JOIN {spans} p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
WHERE c.kind = {KIND_SERVER} AND c.parent_span_id <> '' AND NOT c.parent_is_client""",
        """CREATE OR REPLACE TEMP TABLE _req0 AS
SELECT * FROM _cand s WHERE NOT EXISTS (SELECT 1 FROM _inner i WHERE i.trace_id = s.trace_id AND i.span_id = s.span_id)""",
        *engine_hosts_sql(spans, "_req0"),
        f"""CREATE OR REPLACE {kind} requests AS
SELECT s.trace_id, s.span_id, s.service, s.name,
  -- SGLang's root span name carries the request id ("[role] Req <rid>"): its route is the name without it
  -- a server span named by its method alone matched no route (HTTP semconv: "{{method}}", "HTTP" for
  -- another method): the route stagescope's metrics give it, not one route per method
  coalesce(s.route, CASE WHEN e.span_id = s.span_id AND e.source = '{names.SOURCE_SGLANG}'
                         THEN trim(regexp_replace(s.name, 'Req \\S+$', 'Req')) END,
           CASE WHEN s.kind = {KIND_SERVER} AND s.name IN ({_METHOD_NAMES}) THEN '{names.UNMATCHED_ROUTE}' END,
           s.name) AS route,
  coalesce(s.model, e.model) AS model,
  CAST(s.http_status AS INTEGER) AS status_code,
  (coalesce(s.http_status, 0) >= 500 OR s.otel_status = 2) AS is_error,
  s.start_ns AS start_unix_ns,
  CASE WHEN e.span_id = s.span_id AND e.e2e_s IS NOT NULL THEN e.e2e_s * 1e3 ELSE (s.end_ns - s.start_ns) / 1e6 END
    AS duration_ms,
  -- an engine's TTFT, from its host's start where the engine span sits under (or beside) another span
  CASE WHEN e.ttft_s IS NOT NULL THEN greatest(e.start_ns - s.start_ns, 0) / 1e6 + e.ttft_s * 1e3
       ELSE s.ttft_s * 1e3 END AS ttft_ms,
  coalesce(s.itl_mean_s * 1e3, CASE WHEN e.output_tokens > 1 THEN e.decode_s * 1e3 / (e.output_tokens - 1) END)
    AS itl_mean_ms,
  s.itl_p99_s * 1e3 AS itl_p99_ms, s.itl_max_s * 1e3 AS itl_max_ms,
  coalesce(s.input_tokens, e.input_tokens) AS input_tokens, coalesce(s.output_tokens, e.output_tokens) AS output_tokens,
  s.batch_size, s.queue_depth, s.input_hash, s.cold_start,
  s.client_ms AS client_duration_ms,
  CASE WHEN e.span_id IS NOT NULL THEN e.source
       WHEN s.trace_id IN (SELECT trace_id FROM _staged) OR s.batch_size IS NOT NULL
         OR s.input_hash IS NOT NULL OR s.queue_depth IS NOT NULL OR s.itl_mean_s IS NOT NULL
         OR s.model IS NOT NULL AND s.cold_start IS NOT NULL THEN 'stagescope'
       ELSE 'generic' END AS source,
  coalesce(s.sampled_reason, e.sampled_reason) AS sampled_reason,
  coalesce({sampling_p_sql("s.trace_state", "s.sampled_reason")},
           {sampling_p_sql("e.trace_state", "e.sampled_reason")}) AS sampling_p,
  {request_keys_sql("s.")},
  s.escalated
FROM _req0 s
LEFT JOIN _eng_primary p ON p.trace_id = s.trace_id AND p.host_id = s.span_id
LEFT JOIN _eng e ON e.trace_id = p.trace_id AND e.span_id = p.eng_id
-- an engine span that belongs to another request is that request's sample, not one of its own
WHERE NOT EXISTS (SELECT 1 FROM _eng_host h WHERE h.trace_id = s.trace_id AND h.eng_id = s.span_id
                  AND h.host_id <> s.span_id)""",
        f"""CREATE OR REPLACE {kind} stages AS
SELECT s.trace_id, s.stage, s.start_ns AS start_unix_ns, s.end_ns AS end_unix_ns,
       (s.end_ns - s.start_ns) / 1e6 AS duration_ms, {key_sql("s.trace_id")} AS trace_key,
       coalesce(r.request_key, ri.request_key,
                CASE WHEN eh.host_id IS NOT NULL THEN {key_sql("s.trace_id", "eh.host_id")} END) AS request_key,
       {kind_sql("s.stage", "s.stage_kind")} AS kind
FROM {spans} s LEFT JOIN requests r ON r.trace_id = s.trace_id AND r.span_id = s.parent_span_id
  LEFT JOIN _inner i ON i.trace_id = s.trace_id AND i.span_id = s.parent_span_id
  LEFT JOIN requests ri ON ri.trace_id = i.trace_id AND ri.span_id = i.parent_span_id
  -- a stage span under an engine span that has a host (the engine's span is not the request)
  LEFT JOIN _eng_host eh ON eh.trace_id = s.trace_id AND eh.eng_id = s.parent_span_id
WHERE s.stage IS NOT NULL
UNION ALL
SELECT x.trace_id, x.stage, x.st, x.en, (x.en - x.st) / 1e6, {key_sql("x.trace_id")}, {key_sql("x.trace_id", "x.host_id")},
       {kind_sql("x.stage")}
FROM ({engine_stage_rows_sql(spans, "_staged")}) x
UNION ALL
SELECT r.trace_id, '{names.STAGE_NETWORK}', c.client_start,
       c.client_start + CAST((r.client_duration_ms - r.duration_ms) * 1e6 AS BIGINT),
       r.client_duration_ms - r.duration_ms, r.trace_key, r.request_key, '{names.KIND_NETWORK}'
FROM requests r JOIN _client c USING (trace_id)
WHERE r.client_duration_ms > r.duration_ms""",
        f"""CREATE OR REPLACE {kind} token_gaps AS
SELECT trace_id, unnest(gaps_s) * 1e3 AS gap_ms, unnest(coalesce(gap_running, [])) AS running
FROM {spans} WHERE gaps_s IS NOT NULL AND stage IS NULL""",
    ]
