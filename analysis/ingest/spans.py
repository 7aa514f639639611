"""The flat ``spans`` table every trace reader produces, and the attribute keys it pivots.

One row per span. Times are Unix **nanoseconds**; attribute-derived durations keep the emitter's
unit (**seconds**, OpenTelemetry convention) and are converted to milliseconds when the analysis
relations are derived (see :mod:`stagescope.analysis.ingest.derive`).

``events`` keeps a span's events (OTLP ``events``, Jaeger ``logs``, Zipkin ``annotations``) as
``{name, ns}`` pairs (Unix ns), NULL for a span without any: servers that put their timestamps in
events (Triton's OpenTelemetry mode, see :mod:`stagescope.analysis.ingest.triton_otel`) are read
from them.

``stage`` holds ``stagescope.stage`` only where it is a non-empty string (any name: a team's own
stages are stages of their own); where the attribute is there with another value (an integer, a
boolean, a list, an empty string) ``stage`` is NULL and ``stage_invalid`` describes the value, so
the ingest can name the file in a warning instead of analysing a made-up stage name. ``route`` and
``route_invalid`` do the same for ``http.route`` (a route template is a string: an integer 5 is not
route "5"); such a request is kept, with the route its span name gives (see
:mod:`~stagescope.analysis.ingest.derive`).
"""

from __future__ import annotations

from typing import Final

from stagescope import names

__all__ = [
    "ATTR_COLUMNS",
    "INVALID_COLUMNS",
    "KIND_CLIENT",
    "KIND_CONSUMER",
    "KIND_INTERNAL",
    "KIND_PRODUCER",
    "KIND_SERVER",
    "KIND_UNSPECIFIED",
    "SPAN_COLUMNS",
    "SPAN_TABLE_DDL",
    "STRING_ONLY",
]

KIND_UNSPECIFIED: Final = 0
KIND_INTERNAL: Final = 1
KIND_SERVER: Final = 2
KIND_CLIENT: Final = 3
KIND_PRODUCER: Final = 4
KIND_CONSUMER: Final = 5

#: Attribute pivots: column -> (SQL type, attribute keys in order of preference).
ATTR_COLUMNS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "stage": ("VARCHAR", (names.ATTR_STAGE,)),
    "stage_kind": ("VARCHAR", (names.ATTR_STAGE_KIND,)),
    "stage_invalid": ("VARCHAR", (names.ATTR_STAGE,)),
    "route": ("VARCHAR", ("http.route",)),
    "route_invalid": ("VARCHAR", ("http.route",)),
    "http_status": ("BIGINT", ("http.response.status_code", "http.status_code")),
    "model": (
        "VARCHAR",
        (names.ATTR_MODEL, names.GENAI_REQUEST_MODEL, "gen_ai.response.model", names.TRITON_ATTR_MODEL_NAME),
    ),
    "batch_size": ("BIGINT", (names.ATTR_BATCH_SIZE,)),
    "queue_depth": ("BIGINT", (names.ATTR_QUEUE_DEPTH,)),
    "input_hash": ("VARCHAR", (names.ATTR_INPUT_HASH,)),
    "cold_start": ("BOOLEAN", (names.ATTR_COLD_START,)),
    "is_client_attr": ("BOOLEAN", (names.ATTR_CLIENT,)),
    "sampled_reason": ("VARCHAR", (names.ATTR_SAMPLED_REASON,)),
    "input_tokens": ("BIGINT", (names.GENAI_USAGE_INPUT_TOKENS, names.VLLM_ATTR_PROMPT_TOKENS)),
    "output_tokens": ("BIGINT", (names.GENAI_USAGE_OUTPUT_TOKENS, names.VLLM_ATTR_COMPLETION_TOKENS)),
    "e2e_s": ("DOUBLE", (names.VLLM_ATTR_E2E,)),
    "ttft_s": ("DOUBLE", (names.VLLM_ATTR_TTFT,)),
    "queue_s": ("DOUBLE", (names.VLLM_ATTR_QUEUE,)),
    "prefill_s": ("DOUBLE", (names.VLLM_ATTR_PREFILL,)),
    "decode_s": ("DOUBLE", (names.VLLM_ATTR_DECODE,)),
    "itl_mean_s": ("DOUBLE", (names.ATTR_ITL_MEAN,)),
    "itl_p99_s": ("DOUBLE", (names.ATTR_ITL_P99,)),
    "itl_max_s": ("DOUBLE", (names.ATTR_ITL_MAX,)),
    "gaps_s": ("DOUBLE[]", (names.ATTR_TOKEN_GAPS,)),
    "gap_running": ("DOUBLE[]", (names.ATTR_TOKEN_RUNNING,)),
    "escalated": ("BOOLEAN", (names.ATTR_ESCALATED,)),  # s4-levers-a: a cascade's escalation
}

#: Columns that hold their attribute only where it is a non-empty string (NULL for other values).
STRING_ONLY: Final[frozenset[str]] = frozenset({"stage", "stage_kind", "route"})
#: Columns that describe their attribute's value ("the integer 5", "an empty string") where it is
#: present but not a non-empty string, and are NULL otherwise.
INVALID_COLUMNS: Final[frozenset[str]] = frozenset({"stage_invalid", "route_invalid"})

#: Column -> SQL type of the flat spans table, in order.
SPAN_COLUMNS: Final[dict[str, str]] = {
    "file": "VARCHAR",
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "parent_span_id": "VARCHAR",  # '' for roots
    "name": "VARCHAR",
    "kind": "INTEGER",  # OTLP SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    "start_ns": "BIGINT",
    "end_ns": "BIGINT",
    "service": "VARCHAR",
    "otel_status": "INTEGER",  # 0 unset, 1 ok, 2 error
    "events": "STRUCT(name VARCHAR, ns BIGINT)[]",  # NULL when the span has none
    "trace_state": "VARCHAR",  # W3C tracestate (its ``ot`` entry's ``th``: the sampling probability)
    **{col: typ for col, (typ, _) in ATTR_COLUMNS.items()},
}

SPAN_TABLE_DDL: Final = "(" + ", ".join(f"{c} {t}" for c, t in SPAN_COLUMNS.items()) + ")"
