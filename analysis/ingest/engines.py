"""LLM engines' own spans (vLLM, SGLang) as requests and stages, wherever they sit in the trace.

An *engine span* is the one span an LLM engine writes per request with its latency breakdown as
``gen_ai.latency.*`` attributes (seconds): vLLM's ``llm_request`` (SERVER), SGLang's request root span
``"[role] Req <rid>"`` (INTERNAL). It is found by its attributes, not its name, so vLLM's
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` naming (``"{operation} {model}"``,
e.g. ``"chat facebook/opt-125m"``; vllm-project/vllm tests/tracing/test_gen_ai_semconv.py @ 2b106481)
reads the same. Each rule below names the upstream file it follows (copies of the excerpts relied
on are in ``external/vllm/upstream`` and ``external/sglang/upstream``, see external/PROVENANCE.md).

**Flavours**, told apart by the attributes present:

* ``v1`` (vLLM V1, vllm-project/vllm vllm/v1/engine/output_processor.py @ d0782260,
  ``OutputProcessor.do_tracing``): the span starts at the front end's ``arrival_time`` (the API
  server, when tokenization starts: docs/design/metrics.md @ 0328b592 "Frontend Stats Collection");
  ``time_to_first_token`` is arrival -> first token (front-end clock), ``time_in_queue`` is
  ``scheduled_ts - queued_ts``, ``time_in_model_prefill`` ``first_token_ts - scheduled_ts``,
  ``time_in_model_decode`` ``last_token_ts - first_token_ts`` (engine-core clock), ``e2e`` arrival ->
  the front end's last iteration. The gap arrival -> ``queued_ts`` (tokenization, the API server,
  the hand-off to the engine core) is in no attribute: it is ``front_end``, placed at the **start**
  of the TTFT window (prefill ends at the first token, the queue before it, the front end before
  that); decode follows the first token, and what remains of ``e2e`` after the last token (the hand
  back to the front end) is ``front_end`` too. Never decode before the first token.
* ``v0`` (vLLM V0, vllm/engine/llm_engine.py @ 0005bbd7 ``create_trace_span``; docs/design/metrics.md
  "Duplicated - Queue Time": ``time_in_queue = now - arrival_time`` at the first schedule): ``time_in_queue`` is arrival -> first scheduled, no prefill
  or decode attributes (``time_in_scheduler``, ``time_in_model_forward/execute`` may be there): queue
  from the start, prefill queue -> first token (``time_to_first_token``), decode first token -> e2e.
* ``sglang`` (sgl-project/sglang python/sglang/srt/observability/req_time_stats.py @ 00ce49e0,
  ``APIServerReqTimeStats.convert_to_gen_ai_span_attrs``; attributes set on the root span by
  python/sglang/srt/managers/tokenizer_manager_components/request_tracing.py @ 2d396b52): same keys,
  other intervals and **no** ``time_in_queue``: ``time_to_first_token`` created -> first token,
  ``time_in_model_prefill`` ``first_token_time - api_server_dispatch_finish_time`` (the scheduler's
  wait queue included), ``time_in_model_decode`` first token -> finished. The gap created -> dispatch
  finished (tokenize, dispatch to the scheduler) is ``front_end``; the queue is only known from the
  child spans below.

**Child spans**, where an engine writes them, replace the attribute-derived stages of their engine
span: vLLM's lifecycle spans ``vllm.request.queue`` / ``.prefill`` / ``.decode`` /
``.wait_remote_kv`` under ``llm_request`` (tests/tracing/test_request_lifecycle_tracing.py @
8d1fa3c4), and SGLang's request-stage slices under the root's thread spans (``tokenize``,
``api_server_dispatch``, ``request_process``, ``prefill_waiting``, ``prefill_forward``,
``chunked_prefill``, ``decode_*``: req_time_stats.py ``RequestStage``; the span tree of
python/sglang/srt/observability/trace.py @ 02a58088); the names and their stages are
``names.ENGINE_CHILD_SPAN_STAGES``. For vLLM the front end before the first child is still added.

**Where the engine span sits** (its *host*, the request it belongs to):

* standalone (``vllm serve --otlp-traces-endpoint``, the caller's CLIENT span or none above it): the
  engine span is the request;
* under a request span of the same trace (a traced gateway or router calling the engine, or vLLM
  with its FastAPI span as parent, vllm-project/vllm#43005): the host is that request (the outermost
  request span above it); the engine span is the sample for TTFT, inter-token time and the engine's
  stages, the host gives the end-to-end time, and the time in the host outside the engine span is a
  stage of its own: ``front_end`` inside the engine's own HTTP server span (no CLIENT span between
  it and the engine span), ``gateway`` in spans above a CLIENT span (another process called the
  engine). TTFT is then measured from the host's start (what the host's caller waited);
* beside an HTTP server span (``opentelemetry-instrument vllm serve`` as released: FastAPI's SERVER
  span and ``llm_request`` are both children of the caller's span, vllm-project/vllm#43005
  "Purpose"; examples/online_serving/opentelemetry/README.md "Instrumentation of FastAPI"): the host
  is the SERVER span with the same parent whose interval holds the engine span's start; its time
  outside the engine is ``front_end``.

A host with several engine spans (``n > 1``: one per sequence) takes its per-request figures from
the one with the earliest first token; all their stages count (they overlap: the attribution's
critical path splits them). The time outside the engine is not added to a host that has stage spans
of its own (``stagescope.stage``): their stages account for it.
"""

from __future__ import annotations

from stagescope import names as N
from stagescope.analysis.ingest.otlp import sql_str
from stagescope.analysis.ingest.spans import KIND_CLIENT, KIND_SERVER

__all__ = [
    "ENGINE_CONDITION",
    "SGLANG_ROOT_PATTERN",
    "engine_hosts_sql",
    "engine_spans_sql",
    "engine_stage_rows_sql",
]

#: SGLang's request root span name: ``f"{role} Req {orig_rid[:8]}"`` (trace.py ``trace_req_start``;
#: ``role`` is empty for a unified server, which leaves a leading space).
SGLANG_ROOT_PATTERN = r"^\s*([A-Za-z_]+ )?Req \S+$"
#: Ancestors walked up from an engine span (or a child span) looking for its host (or its engine).
MAX_DEPTH = 16

_LIFECYCLE = (N.VLLM_SPAN_QUEUE, N.VLLM_SPAN_PREFILL, N.VLLM_SPAN_DECODE, N.VLLM_SPAN_WAIT_REMOTE_KV)
#: A span with an engine's latency attributes (or vLLM's span name); ``s`` is the span. SGLang's
#: request root is one by its name with any ``gen_ai.latency`` time: a request aborted before its
#: first token has only ``e2e`` (req_time_stats.py ``convert_to_gen_ai_span_attrs`` sets each key
#: only when both its timestamps exist), and it is still SGLang's request, of route ``Req``.
ENGINE_CONDITION = (
    f"(s.name = {sql_str(N.VLLM_SPAN_NAME)} OR s.queue_s IS NOT NULL OR s.prefill_s IS NOT NULL "
    "OR s.decode_s IS NOT NULL OR ((s.e2e_s IS NOT NULL OR s.ttft_s IS NOT NULL) "
    f"AND regexp_matches(s.name, {sql_str(SGLANG_ROOT_PATTERN)})))"
)


def _in(names: tuple[str, ...] | list[str]) -> str:
    return "(" + ", ".join(sql_str(n) for n in names) + ")"


def _child_stage(col: str) -> str:
    whens = " ".join(f"WHEN {sql_str(k)} THEN {sql_str(v)}" for k, v in N.ENGINE_CHILD_SPAN_STAGES.items())
    return f"CASE {col} {whens} END"


def _ns(seconds: str) -> str:
    return f"CAST(round(({seconds}) * 1e9) AS BIGINT)"


def engine_spans_sql(spans: str) -> list[str]:
    """``_eng`` (one row per engine span: ``source``, ``flavor``, ``first_ns`` the first token's time,
    ``end_eng_ns`` the end of the engine's measured interval) and ``_eng_child`` (child spans mapped to
    a stage, with their engine span ``eng_id``)."""
    kids = _in(_LIFECYCLE)
    sg = sql_str(SGLANG_ROOT_PATTERN)
    children = _in(list(N.ENGINE_CHILD_SPAN_STAGES))
    return [
        f"""CREATE OR REPLACE TEMP TABLE _eng AS
WITH kids AS (SELECT DISTINCT trace_id, parent_span_id AS span_id FROM {spans} WHERE name IN {kids}),
e AS (
  SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, s.service, s.model,
         s.input_tokens, s.output_tokens, s.ttft_s, s.e2e_s, s.queue_s, s.prefill_s, s.decode_s,
         s.trace_state, s.sampled_reason,
         -- SGLang: its root span name, or its attributes (prefill / decode without time_in_queue)
         CASE WHEN regexp_matches(s.name, {sg})
                OR (s.queue_s IS NULL AND (s.prefill_s IS NOT NULL OR s.decode_s IS NOT NULL))
              THEN {sql_str(N.SOURCE_SGLANG)} ELSE {sql_str(N.SOURCE_VLLM)} END AS source
  FROM {spans} s LEFT JOIN kids k USING (trace_id, span_id)
  WHERE s.stage IS NULL AND ({ENGINE_CONDITION} OR k.span_id IS NOT NULL)
)
SELECT *,
  CASE WHEN source = {sql_str(N.SOURCE_SGLANG)} THEN 'sglang'
       WHEN queue_s IS NOT NULL AND (prefill_s IS NOT NULL OR decode_s IS NOT NULL) THEN 'v1'
       WHEN queue_s IS NOT NULL THEN 'v0' ELSE 'none' END AS flavor,
  CASE WHEN ttft_s IS NOT NULL THEN start_ns + {_ns("ttft_s")}
       WHEN queue_s IS NOT NULL AND prefill_s IS NOT NULL THEN start_ns + {_ns("queue_s + prefill_s")} END
    AS first_ns,
  CASE WHEN e2e_s IS NOT NULL THEN start_ns + {_ns("e2e_s")} ELSE end_ns END AS end_eng_ns
FROM e""",
        f"""CREATE OR REPLACE TEMP TABLE _eng_child AS
WITH RECURSIVE up(trace_id, span_id, anc_id, depth) AS (
  SELECT trace_id, span_id, parent_span_id, 1 FROM {spans}
  WHERE stage IS NULL AND name IN {children} AND parent_span_id <> ''
  UNION ALL
  SELECT u.trace_id, u.span_id, p.parent_span_id, u.depth + 1
  FROM up u JOIN {spans} p ON p.trace_id = u.trace_id AND p.span_id = u.anc_id
  WHERE u.depth < {MAX_DEPTH} AND p.parent_span_id <> ''
)
SELECT u.trace_id, u.span_id, arg_min(u.anc_id, u.depth) AS eng_id
FROM up u SEMI JOIN _eng e ON e.trace_id = u.trace_id AND e.span_id = u.anc_id
GROUP BY u.trace_id, u.span_id""",
        f"""CREATE OR REPLACE TEMP TABLE _eng_child AS
SELECT c.trace_id, c.span_id, c.eng_id, s.start_ns, s.end_ns, {_child_stage("s.name")} AS stage
FROM _eng_child c JOIN {spans} s USING (trace_id, span_id)
-- a vLLM lifecycle span belongs to vLLM's span, SGLang's slices to SGLang's root (a team's own span
-- named "tokenize" under llm_request is not SGLang's)
JOIN _eng e ON e.trace_id = c.trace_id AND e.span_id = c.eng_id
WHERE (s.name IN {kids}) = (e.source = {sql_str(N.SOURCE_VLLM)})""",
    ]


def engine_hosts_sql(spans: str, requests0: str) -> list[str]:
    """``_eng_host``: per engine span its host request (``host_id``, a span of ``requests0``, the
    request candidates; the engine span itself when standalone), ``own_id`` the engine's own HTTP
    server span (``front_end`` outside the engine span; NULL when none) and ``gateway`` (a CLIENT span
    lies between host and engine: the host's time outside ``own_id`` is ``gateway``)."""
    return [
        f"""CREATE OR REPLACE TEMP TABLE _eng_up AS
WITH RECURSIVE up(trace_id, eng_id, anc_id, depth, crossed) AS (
  SELECT trace_id, span_id, parent_span_id, 1, false FROM _eng WHERE parent_span_id <> ''
  UNION ALL
  SELECT u.trace_id, u.eng_id, p.parent_span_id, u.depth + 1, u.crossed OR p.kind = {KIND_CLIENT}
  FROM up u JOIN {spans} p ON p.trace_id = u.trace_id AND p.span_id = u.anc_id
  WHERE u.depth < {MAX_DEPTH} AND p.parent_span_id <> ''
)
SELECT u.trace_id, u.eng_id, u.anc_id, u.depth, u.crossed, p.kind,
       r.span_id IS NOT NULL AS is_request
FROM up u JOIN {spans} p ON p.trace_id = u.trace_id AND p.span_id = u.anc_id
LEFT JOIN {requests0} r ON r.trace_id = u.trace_id AND r.span_id = u.anc_id""",
        f"""CREATE OR REPLACE TEMP TABLE _eng_host AS
WITH anc AS (
  SELECT trace_id, eng_id,
         arg_min(anc_id, depth) FILTER (WHERE is_request) AS host_id,
         arg_min(crossed, depth) FILTER (WHERE is_request) AS gateway,
         arg_min(anc_id, depth) FILTER (WHERE kind = {KIND_SERVER} AND NOT crossed) AS own_id
  FROM _eng_up GROUP BY trace_id, eng_id
),
sib AS (  -- a SERVER request span beside the engine span (same parent) whose interval holds its start
  SELECT e.trace_id, e.span_id AS eng_id, arg_max(h.span_id, h.start_ns) AS host_id
  FROM _eng e JOIN {requests0} h ON h.trace_id = e.trace_id AND h.parent_span_id = e.parent_span_id
  WHERE h.span_id <> e.span_id AND h.kind = {KIND_SERVER} AND h.start_ns <= e.start_ns AND e.start_ns <= h.end_ns
    AND NOT EXISTS (SELECT 1 FROM _eng x WHERE x.trace_id = h.trace_id AND x.span_id = h.span_id)
  GROUP BY e.trace_id, e.span_id
)
SELECT e.trace_id, e.span_id AS eng_id,
       coalesce(a.host_id, s.host_id, e.span_id) AS host_id,
       CASE WHEN a.host_id IS NOT NULL THEN a.own_id WHEN s.host_id IS NOT NULL THEN s.host_id END AS own_id,
       coalesce(a.host_id IS NOT NULL AND a.gateway, false) AS gateway
FROM _eng e LEFT JOIN anc a ON a.trace_id = e.trace_id AND a.eng_id = e.span_id
LEFT JOIN sib s ON s.trace_id = e.trace_id AND s.eng_id = e.span_id""",
        # the engine span whose figures a host reports: the earliest first token
        """CREATE OR REPLACE TEMP TABLE _eng_primary AS
SELECT h.trace_id, h.host_id, arg_min(e.span_id, coalesce(e.first_ns, e.start_ns)) AS eng_id,
       min(e.start_ns) AS eng_start, max(e.end_eng_ns) AS eng_end, count(*) AS engines
FROM _eng_host h JOIN _eng e ON e.trace_id = h.trace_id AND e.span_id = h.eng_id
GROUP BY h.trace_id, h.host_id""",
        # hosts other than their engine span: their interval and the engine's own server span's
        f"""CREATE OR REPLACE TEMP TABLE _eng_out AS
SELECT p.trace_id, p.host_id, p.eng_start, p.eng_end, r.start_ns AS h_start, r.end_ns AS h_end,
       o.start_ns AS own_start, o.end_ns AS own_end, h.gateway
FROM _eng_primary p
JOIN _eng_host h ON h.trace_id = p.trace_id AND h.eng_id = p.eng_id
JOIN {requests0} r ON r.trace_id = p.trace_id AND r.span_id = p.host_id
LEFT JOIN {spans} o ON o.trace_id = p.trace_id AND o.span_id = h.own_id
WHERE p.host_id <> p.eng_id""",
    ]


def _attr_intervals() -> str:
    """Per engine span without child stages: its stages from the attributes (absolute ns), by flavour
    (see the module docstring). ``e``: ``_eng`` with ``q``, ``p``, ``d`` in ns (0 when absent)."""
    fe, qu, pr, de = (sql_str(s) for s in (N.STAGE_FRONT_END, N.STAGE_QUEUE, N.STAGE_PREFILL, N.STAGE_DECODE))
    return f"""
SELECT trace_id, span_id, unnest(CASE
  WHEN flavor = 'v1' AND first_ns IS NOT NULL THEN [
    {{'stage': {fe}, 'st': start_ns, 'en': greatest(start_ns, first_ns - p - q)}},
    {{'stage': {qu}, 'st': greatest(start_ns, first_ns - p - q), 'en': greatest(start_ns, first_ns - p)}},
    {{'stage': {pr}, 'st': greatest(start_ns, first_ns - p), 'en': first_ns}},
    {{'stage': {de}, 'st': first_ns, 'en': first_ns + d}},
    {{'stage': {fe}, 'st': first_ns + d, 'en': end_eng_ns}}]
  WHEN flavor = 'v0' THEN [
    {{'stage': {qu}, 'st': start_ns, 'en': start_ns + q}},
    {{'stage': {pr}, 'st': start_ns + q, 'en': coalesce(first_ns, start_ns + q)}},
    {{'stage': {de}, 'st': coalesce(first_ns, end_eng_ns), 'en': CASE WHEN first_ns IS NULL THEN end_eng_ns
                                                              ELSE greatest(first_ns, end_eng_ns) END}}]
  WHEN flavor = 'sglang' AND first_ns IS NOT NULL THEN [
    {{'stage': {fe}, 'st': start_ns, 'en': greatest(start_ns, first_ns - p)}},
    {{'stage': {qu}, 'st': greatest(start_ns, first_ns - p), 'en': greatest(start_ns, first_ns - p + q)}},
    {{'stage': {pr}, 'st': greatest(start_ns, first_ns - p + q), 'en': first_ns}},
    {{'stage': {de}, 'st': first_ns, 'en': first_ns + d}}]
  ELSE [  -- no first token known: the attributes laid end to end from the span's start
    {{'stage': {qu}, 'st': start_ns, 'en': start_ns + q}},
    {{'stage': {pr}, 'st': start_ns + q, 'en': start_ns + q + p}},
    {{'stage': {de}, 'st': start_ns + q + p, 'en': start_ns + q + p + d}}]
  END) AS x
FROM (SELECT *, {_ns("coalesce(queue_s, 0)")} AS q, {_ns("coalesce(prefill_s, 0)")} AS p,
             {_ns("coalesce(decode_s, 0)")} AS d
      FROM _eng e WHERE NOT EXISTS (SELECT 1 FROM _eng_child c WHERE c.trace_id = e.trace_id AND c.eng_id = e.span_id))
"""


def engine_stage_rows_sql(spans: str, staged: str) -> str:
    """A SELECT of stage rows ``(trace_id, stage, st, en, host_id)``: the engines' stages (from their
    attributes or child spans) and the hosts' time outside their engine spans (``front_end`` in the
    engine's own HTTP server span, ``gateway`` above it), for hosts without stage spans of their own
    (``staged``: traces with ``stagescope.stage`` spans). Empty intervals are left out."""
    fe, gw = sql_str(N.STAGE_FRONT_END), sql_str(N.STAGE_GATEWAY)
    lifecycle = _in(_LIFECYCLE)
    return f"""
SELECT trace_id, stage, st, en, host_id FROM (
  SELECT a.trace_id, a.x.stage AS stage, a.x.st AS st, a.x.en AS en, h.host_id
  FROM ({_attr_intervals()}) a JOIN _eng_host h ON h.trace_id = a.trace_id AND h.eng_id = a.span_id
  UNION ALL
  SELECT c.trace_id, c.stage, c.start_ns, c.end_ns, h.host_id
  FROM _eng_child c JOIN _eng_host h ON h.trace_id = c.trace_id AND h.eng_id = c.eng_id
  UNION ALL  -- vLLM with lifecycle spans: arrival -> the first of them is still the front end
  SELECT e.trace_id, {fe}, e.start_ns, min(s.start_ns), h.host_id
  FROM _eng e JOIN {spans} s ON s.trace_id = e.trace_id AND s.parent_span_id = e.span_id AND s.name IN {lifecycle}
  JOIN _eng_host h ON h.trace_id = e.trace_id AND h.eng_id = e.span_id
  GROUP BY e.trace_id, e.span_id, e.start_ns, h.host_id
  UNION ALL  -- the host's time outside its engine spans
  SELECT trace_id, x.stage, x.st, x.en, host_id FROM (
    SELECT trace_id, host_id, unnest([
      {{'stage': {fe}, 'st': own_start, 'en': least(eng_start, own_end)}},
      {{'stage': {fe}, 'st': greatest(eng_end, own_start), 'en': own_end}},
      {{'stage': CASE WHEN gateway THEN {gw} END, 'st': h_start, 'en': least(coalesce(own_start, eng_start), h_end)}},
      {{'stage': CASE WHEN gateway THEN {gw} END, 'st': greatest(coalesce(own_end, eng_end), h_start), 'en': h_end}}
    ]) AS x
    FROM _eng_out WHERE trace_id NOT IN (SELECT trace_id FROM {staged})
  )
) WHERE stage IS NOT NULL AND st IS NOT NULL AND en > st"""
