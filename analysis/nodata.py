"""Why an SLO has no samples: the ``no_data_reason`` of a report whose status is ``no_data``.

No data is never a verdict: an SLO with 0 samples is neither met nor breached, and the report says
what was read and at which step the samples ran out, the way a reader would check it by hand:

1. the inputs: an empty folder, a folder without trace files, files without spans;
2. the request spans: spans were read but none is a request (a SERVER span, or a root span);
3. the route and model the SLO is about: not in the data (the routes or models that are);
4. shed or abandoned requests: every request of the route was answered 429, or closed by its client
   before the answer was complete (499): neither is a latency sample;
5. the SLI's attribute: requests exist, none carries what the SLI reads (a TTFT, token gaps); for
   TTFT and inter-token SLOs the LLM engines' spans say why where they can: engine spans in traces
   of their own (a caller without a traceparent), engine spans without a TTFT, SGLang's request
   spans without their attributes.

Only called for an SLO without samples, so its few queries are off the verdict's path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from stagescope import names as N
from stagescope.analysis.breach import request_filter, scope_filter, sql_str
from stagescope.analysis.ingest.engines import ENGINE_CONDITION, SGLANG_ROOT_PATTERN
from stagescope.slo import SLO

__all__ = ["LIST_AT_MOST", "Inputs", "no_data_reason", "read_inputs", "sli_attribute", "top_values"]

#: Routes, models and files named in a reason, at most (the rest are counted).
LIST_AT_MOST = 6
#: The file kinds that hold spans (analysis.ingest.traces.FileSummary.kind).
TRACE_KINDS = ("otlp", "sink", "jaeger")

#: What each SLI reads from a request, in the reason's words.
_SLI_READS = {
    N.SLI_E2E: "a duration",
    N.SLI_TTFT: f"a TTFT ({N.VLLM_ATTR_TTFT} or a stream)",
    N.SLI_ITL: (
        f"inter-token gaps ({N.ATTR_TOKEN_GAPS}, {N.ATTR_ITL_P99} or {N.ATTR_ITL_MEAN}, or vLLM's decode "
        "time over more than one output token)"
    ),
}
#: Per request: whether it has a sample of the SLI (the columns breach.sli_view reads).
SLI_PRESENT = {
    N.SLI_E2E: "duration_ms IS NOT NULL",
    N.SLI_TTFT: "ttft_ms IS NOT NULL",
    N.SLI_ITL: "coalesce(itl_p99_ms, itl_mean_ms) IS NOT NULL",
}


def sli_attribute(sli: str) -> str:
    """What an SLI reads from a request, for messages: ``"a TTFT (gen_ai.latency...)"``."""
    return _SLI_READS[sli]


@dataclass(frozen=True)
class Inputs:
    """What the ingest read: ``text`` in a few words, ``spans`` read (None: not known, the relations
    were built some other way) and, when no trace file was read at all, ``missing`` says why."""

    text: str
    spans: int | None
    missing: str | None = None


def _file_list(paths: Sequence[str]) -> str:
    if len(paths) <= 3:
        return ", ".join(paths)
    try:
        parent = os.path.commonpath([str(Path(p).parent) for p in paths])
    except ValueError:  # absolute and relative paths mixed
        parent = ""
    return (
        f"{len(paths)} files under {parent}"
        if parent
        else f"{len(paths)} files ({', '.join(paths[:3])}, ...)"
    )


def read_inputs(files: Sequence[Any] | None, inputs: Sequence[str | Path] | None) -> Inputs:
    """Summarize the ingest's ``FileSummary`` records (``files``) and the trace paths it was given."""
    if files is None:
        return Inputs("", None)
    traces = [f for f in files if getattr(f, "kind", "") in TRACE_KINDS]
    if not traces:
        why = []
        for p in map(Path, inputs or ()):
            if p.is_dir():
                empty = not any(p.iterdir())
                why.append(
                    f"{p} is an empty folder"
                    if empty
                    else f"{p} holds no trace files (.json, .jsonl, .ndjson)"
                )
        missing = "no trace files read: " + ("; ".join(why) if why else "none given, nor scraped latency histograms of this SLI that answer for it")
        return Inputs(missing, 0, missing)
    read = [f for f in traces if not getattr(f, "skipped", False)]
    spans = sum(int(getattr(f, "spans", 0) or 0) for f in read)
    skipped = len(traces) - len(read)
    text = (
        f"read {_plural(spans, 'span')} from {_file_list([str(f.path) for f in read])}"
        if read
        else "no file could be read"
    )
    return Inputs(text + (f" ({skipped} skipped as bad)" if skipped else ""), spans)


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _has(con: duckdb.DuckDBPyConnection, relation: str) -> bool:
    try:
        con.execute(f"SELECT 1 FROM {relation} LIMIT 0")
    except duckdb.Error:
        return False
    return True


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def top_values(con: duckdb.DuckDBPyConnection, column: str, where: str = "true") -> str:
    """``"/v1/a (300 requests), /v1/b (12)"``: the most frequent values of a ``requests`` column."""
    rows = con.execute(
        f"SELECT {column}, count(*) n FROM requests WHERE {where} GROUP BY 1 ORDER BY n DESC, 1 "
        f"LIMIT {LIST_AT_MOST + 1}"
    ).fetchall()
    parts = [
        f"{'(none)' if v is None else v} ({n}{' requests' if i == 0 else ''})"
        for i, (v, n) in enumerate(rows[:LIST_AT_MOST])
    ]
    if len(rows) > LIST_AT_MOST:
        more = _count(con, f"SELECT count(DISTINCT {column}) FROM requests WHERE {where}") - LIST_AT_MOST
        parts.append(f"and {more} more")
    return ", ".join(parts) if parts else "none"


def _engine_clause(con: duckdb.DuckDBPyConnection, slo: SLO, flt: str) -> str:
    """What the LLM engines' spans say about it (analysis.ingest.engines), for an SLO on TTFT or
    inter-token time: engine spans in traces of their own (not with these requests), engine spans
    without a TTFT, spans named like SGLang's request spans without its attributes; else ''."""
    if slo.sli == N.SLI_E2E or not _has(con, "spans"):
        return ""
    try:
        row = con.execute(
            f"""SELECT count(*), count(ttft_s),
                       count(*) FILTER (WHERE trace_id IN (SELECT trace_id FROM requests WHERE {flt}))
                FROM spans s WHERE {ENGINE_CONDITION}"""
        ).fetchone()
        bare = _count(
            con,
            f"SELECT count(*) FROM spans WHERE regexp_matches(name, {sql_str(SGLANG_ROOT_PATTERN)}) "
            "AND ttft_s IS NULL AND prefill_s IS NULL AND decode_s IS NULL",
        )
    except duckdb.Error:  # a spans relation built some other way
        return ""
    n, with_ttft, in_scope = (int(x or 0) for x in row) if row else (0, 0, 0)
    parts = []
    if n and not in_scope:
        parts.append(
            f"{_plural(n, 'LLM engine span')} ({N.VLLM_SPAN_NAME} or SGLang's request span, with gen_ai.latency.*) "
            "were read, none in the traces of these requests: an engine whose caller sent no traceparent "
            "starts a trace of its own (released vLLM does so even under opentelemetry-instrument; "
            "vllm-project/vllm#39905), so its spans are requests of their own route"
        )
    elif n and not with_ttft and slo.sli == N.SLI_TTFT:
        parts.append(
            f"{_plural(n, 'LLM engine span')} were read, none with {N.VLLM_ATTR_TTFT} (aborted requests, or "
            "lifecycle spans without the summary attributes)"
        )
    if bare:
        parts.append(
            f"{_plural(bare, 'span')} named like SGLang's request spans ('Req <rid>') carry no gen_ai.latency.* "
            "attributes (SGLang versions before they were set on the root span): nothing to read a TTFT from"
        )
    return "".join(f"; {p}" for p in parts)


def _scope_words(slo: SLO) -> str:
    parts = [f"{k} {v}" for k, v in (("route", slo.route), ("model", slo.model)) if v is not None]
    return f" on {' and '.join(parts)}" if parts else ""


def no_data_reason(
    con: duckdb.DuckDBPyConnection,
    slo: SLO,
    *,
    files: Sequence[Any] | None = None,
    inputs: Sequence[str | Path] | None = None,
) -> str:
    """One line: why ``slo`` has no samples in the relations of ``con`` (see the module docstring).
    ``files`` are the ingest's ``FileSummary`` records and ``inputs`` the trace paths it was given
    (None when the relations were built some other way)."""
    got = read_inputs(files, inputs)
    if got.missing:
        return got.missing
    tail = f"; {got.text}" if got.text else ""
    n_req = _count(con, "SELECT count(*) FROM requests") if _has(con, "requests") else 0
    if n_req == 0:
        if got.spans == 0:
            return f"no spans in the trace files{tail}"
        n_spans = _count(con, "SELECT count(*) FROM spans") if _has(con, "spans") else 0
        try:
            n_client = _count(con, "SELECT count(*) FROM spans WHERE coalesce(is_client_attr, false)")
        except duckdb.Error:  # a spans relation built without the column
            n_client = 0
        if n_spans and n_client == n_spans:
            return (
                f"{_plural(n_spans, 'span')}, all of them the load generator's CLIENT spans ({N.ATTR_CLIENT}): "
                f"the service's own spans are in none of the files read{tail}"
            )
        if n_spans:
            try:  # a SERVER span that carries stagescope.stage is a stage span by the ingest's rule
                n_staged = _count(con, "SELECT count(*) FROM spans WHERE kind = 2 AND "
                                       "(stage IS NOT NULL OR stage_invalid IS NOT NULL)")  # fmt: skip
            except duckdb.Error:  # a spans relation built without the columns
                n_staged = 0
            staged = (
                f"; {_plural(n_staged, 'SERVER span')} carry {N.ATTR_STAGE}, which makes a span a stage, not a "
                "request: set it on the spans inside the request, never on its SERVER span"
                if n_staged else ""
            )  # fmt: skip
            return (
                f"{_plural(n_spans, 'span')}, none of them a request span (a SERVER span, or a root span without "
                f"a parent){staged}{tail}"
            )
        return f"no request in the data{tail}"
    for col, value in (("route", slo.route), ("model", slo.model)):
        if value is not None and not _count(
            con, f"SELECT count(*) FROM requests WHERE {col} = {sql_str(value)}"
        ):
            eng = _engine_clause(con, slo, "true") if col == "route" else ""
            return f"{col} {value} not in the data: {col}s seen are {top_values(con, col)}{eng}{tail}"
    where = _scope_words(slo)
    n_scope = _count(con, f"SELECT count(*) FROM requests WHERE {scope_filter(slo)}")
    if n_scope == 0:  # the route and the model are in the data, never together
        on_route = f"route = {sql_str(str(slo.route))}"
        return (
            f"no request{where}: models on route {slo.route} are {top_values(con, 'model', on_route)}{tail}"
        )
    n_kept = _count(con, f"SELECT count(*) FROM requests WHERE {request_filter(slo)}")
    if n_kept == 0:
        n_shed = _count(con, f"SELECT count(*) FROM requests WHERE status_code = 429 AND {scope_filter(slo)}")
        n_closed = n_scope - n_shed
        shed = "shed (HTTP 429)"
        closed = f"closed by their client before the answer was complete (status {N.STATUS_CODE_CLIENT_CLOSED})"
        how = shed if not n_closed else closed if not n_shed else f"{shed}: {n_shed}, or {closed}: {n_closed}"
        return f"all {_plural(n_scope, 'request')}{where} were {how}, and those are not latency samples{tail}"
    others = ""
    if slo.route is not None and slo.sli != N.SLI_E2E:
        with_it = con.execute(
            f"SELECT route FROM requests WHERE {SLI_PRESENT[slo.sli]} GROUP BY 1 ORDER BY count(*) DESC "
            f"LIMIT {LIST_AT_MOST}"
        ).fetchall()
        if with_it:
            others = f" (routes with such samples: {', '.join(str(r[0]) for r in with_it)})"
    eng = _engine_clause(con, slo, request_filter(slo))
    return (
        f"{_plural(n_kept, 'request span')} seen{where}, none with {sli_attribute(slo.sli)}{others}{eng}{tail}"
    )
