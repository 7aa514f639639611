"""Complete sources: where every request of an SLO was counted, its samples come from there.

Traces are usually sampled; two other inputs count every request:

* the load generator's results (``client_results``: one row per request it sent, with the trace id
  it sent in ``traceparent``). Its latency is **client-side**: ``latency_ms`` runs from the intended
  send time (coordinated-omission corrected, so it includes the client's own lateness) and the
  network is in it. The SLO's SLIs are server-side (arrival to last byte, arrival to first token),
  so each client request becomes a server-side sample: the traced server value where its trace was
  kept, else its ``naive_latency_ms`` (``ttft_naive_ms``: actual send to last byte / first token)
  minus the network, the median of that difference over the requests whose trace was kept, and for
  ``e2e`` below stagescope's slow rule (every request slower was kept). Used when
  the results hold at least :data:`MIN_COVERAGE` of the SLO's traced requests;
* the request-duration histograms in the scraped metrics (``stagescope_request_duration_seconds``,
  the TTFT and inter-token histograms, vLLM's ``vllm:e2e_request_latency_seconds`` and kin): the
  server counted every request into a bucket; analysis.histogram_source calibrates the traced
  samples to the buckets' counts.

The traces are complete themselves when every sample was kept with probability 1 (or with no sign
of sampling) and the complete source counts no more requests: the traces are used then (exact and
server-side). Sampling is unknown where a sample has no probability (no ``th``) but there is
evidence of sampling: a ``stagescope.sampled_reason``, probabilities below 1 beside it, or a
complete source counting more requests than the traces hold. That is said in a warning.

The breakdown (which stage ate the time) always comes from the traces; analysis.weighting
calibrates its rows to the samples these sources give.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import duckdb

from stagescope import names as N
from stagescope.analysis.histogram_source import from_histograms as _from_histograms
from stagescope.analysis.keys import has_columns

if TYPE_CHECKING:
    from stagescope.analysis.breach import SLIView

__all__ = ["MIN_COVERAGE", "use_complete_sources"]

#: Share of the SLO's traced requests a load generator's results must hold to be used.
MIN_COVERAGE = 0.9
#: Client-side columns standing for each SLI: (corrected, naive).
_CLIENT_COLUMNS = {N.SLI_E2E: ("latency_ms", "naive_latency_ms"), N.SLI_TTFT: ("ttft_ms", "ttft_naive_ms")}
#: Columns of the load generator's results read here (besides the SLI's own).
_RESULT_NEEDS = ("trace_id", "route", "status", "sent_unix_ns", "intended_unix_ns")


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    row = con.execute(sql).fetchone()
    assert row is not None
    return tuple(row)


def sampling_facts(con: duckdb.DuckDBPyConnection, view: SLIView) -> dict[str, Any]:
    """What the SLO's traced requests say about their sampling: how many, with a known probability,
    kept with one below 1, of unknown probability though ``sampled_reason`` says they were sampled."""
    if view.per_request and has_columns(con, view.name, "pk"):  # one pass over the SLI table
        n, known, below, unknown_sampled, max_w = _one(
            con,
            f"""SELECT count(*), count(*) FILTER (WHERE pk = 0), count(*) FILTER (WHERE pk = 0 AND w > 1),
                       count(*) FILTER (WHERE pk = 2), max(w) FILTER (WHERE pk = 0) FROM {view.name}""",
        )
        return {
            "requests": int(n), "known": int(known), "below_1": int(below),
            "unknown_sampled": int(unknown_sampled), "min_p": None if not max_w else 1.0 / float(max_w),
        }  # fmt: skip
    flt = f"{view.request_filter} AND {view.value_expr} IS NOT NULL"
    if not has_columns(con, "requests", "sampling_p", "sampled_reason"):
        n = _one(con, f"SELECT count(*) FROM requests WHERE {flt}")[0]
        return {"requests": int(n), "known": 0, "below_1": 0, "unknown_sampled": 0, "min_p": None}
    n, known, below, unknown_sampled, min_p = _one(
        con,
        f"""SELECT count(*), count(sampling_p), count(*) FILTER (WHERE sampling_p < 1),
                   count(*) FILTER (WHERE sampling_p IS NULL AND sampled_reason IS NOT NULL), min(sampling_p)
            FROM requests WHERE {flt}""",
    )
    return {
        "requests": int(n), "known": int(known), "below_1": int(below),
        "unknown_sampled": int(unknown_sampled), "min_p": None if min_p is None else float(min_p),
    }  # fmt: skip


def use_complete_sources(con: duckdb.DuckDBPyConnection, view: SLIView) -> None:
    """Replace (or calibrate) ``view``'s samples with a complete source that covers them, and say
    what the traces' sampling is (``view.sampling``, warnings); see the module docstring."""
    facts = sampling_facts(con, view)
    unknown = facts["requests"] - facts["known"]
    evidence = facts["unknown_sampled"] > 0 or (facts["below_1"] > 0 and unknown > 0)
    complete = not view.weighted and not evidence
    estimated = round(view.weight_total, 1) if view.per_request else None
    facts.update(estimated_requests=estimated, unknown=unknown, evidence=evidence)
    view.sampling = facts
    kept = view.count
    used = _from_client_results(con, view, complete) or _from_histograms(con, view, complete)
    if used and complete:  # the traces looked complete, but a complete source counted more
        facts["evidence"] = True
        if not unknown and kept:  # none kept: analysis.api says the figures are the source's alone
            view.warnings.append(
                f"the traces hold {kept} of the {view.weight_total:.0f} requests of SLO {view.slo.spec} the "
                f"{view.source.replace('_', ' ')} count (the others were not kept, or their spans were lost): "
                f"the quantiles come from the {view.source.replace('_', ' ')}"
            )
    if unknown and facts["evidence"]:
        cost = (
            f"the {view.source.replace('_', ' ')} gave the quantiles"
            if view.source != N.SOURCE_TRACES
            else "they count once each, so quantiles and shares lean towards the requests their sampler kept "
            "(pass the load generator's results or the scraped metrics for exact quantiles)"
        )
        view.warnings.append(
            f"{unknown} of {facts['requests']} traced requests have no sampling probability (no OpenTelemetry "
            f"'th' in their tracestate: a collector's tail sampling, another sampler) though the data shows "
            f"sampling: {cost}"
        )
    if view.source == N.SOURCE_TRACES and view.weighted and view.per_request:
        _estimate_note(con, view)


#: Above this relative standard error of the estimated request count, a warning says what it costs.
NOTE_REL_SE = 0.05


def _estimate_note(con: duckdb.DuckDBPyConnection, view: SLIView) -> None:
    """Say how precise the weighted figures are when only the sampled traces give them: the
    Horvitz-Thompson count's standard error (``sqrt(sum(w (w - 1)))``, independent keep decisions)."""
    var, few = _one(con, f"SELECT sum(w * (w - 1)), count(*) FILTER (WHERE w > 1) FROM {view.name}")
    if not view.weight_total or var is None:
        return
    rel = math.sqrt(float(var)) / view.weight_total
    if rel > NOTE_REL_SE:
        view.warnings.append(
            f"the {view.count} kept traces stand for about {view.weight_total:.0f} requests (one standard "
            f"error {rel:.0%}): the figures below the slow threshold rest on the {few} kept at a probability "
            "under 1; the load generator's results or the scraped metrics give exact ones"
        )


# ------------------------------------------------------------------------------ load generator
def _from_client_results(con: duckdb.DuckDBPyConnection, view: SLIView, complete: bool) -> bool:
    cols = _CLIENT_COLUMNS.get(view.slo.sli)
    if cols is None or not view.per_request or not has_columns(con, "client_results", *_RESULT_NEEDS, *cols):
        return False
    n_client = _one(con, "SELECT count(*) FROM client_results")[0]
    if not n_client:
        return False
    corrected, naive = cols
    flt = f"{view.request_filter} AND {view.value_expr} IS NOT NULL"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_traced AS
        SELECT trace_id, min(start_unix_ns) AS start_unix_ns,
               arg_min(CAST({view.value_expr} AS DOUBLE), start_unix_ns) AS value_ms,
               CAST(arg_min(queue_depth, start_unix_ns) AS DOUBLE) AS queue_depth,
               CAST(arg_min(batch_size, start_unix_ns) AS DOUBLE) AS batch_size,
               CAST(arg_min(cold_start, start_unix_ns) AS BOOLEAN) AS cold_start
        FROM requests WHERE {flt} GROUP BY trace_id"""
    )
    traced, matched = _one(
        con,
        "SELECT count(*), count(*) FILTER (WHERE trace_id IN (SELECT trace_id FROM client_results)) FROM ss_traced",
    )
    # no trace of the SLO kept at all (a healthy route at 1 %): the results' requests to its route
    blind = not traced and view.slo.model is None
    if blind and view.slo.route is not None:
        blind = bool(
            _one(con, f"SELECT count(*) FROM client_results WHERE route = {_lit(view.slo.route)}")[0]
        )
    if not blind and (not traced or matched / traced < MIN_COVERAGE):
        if matched:
            view.warnings.append(
                f"the load-generator results hold {matched} of the {traced} traced requests of SLO "
                f"{view.slo.spec}: too few to give its quantiles (they come from the traces)"
            )
        elif traced:  # none: results of another run, where they were sent to these requests' routes
            (other,) = _one(
                con,
                "SELECT count(*) FROM client_results WHERE route IN "
                f"(SELECT DISTINCT route FROM requests WHERE {view.request_filter})",
            )
            if other:
                view.warnings.append(
                    f"the load-generator results hold {other} requests to this route but none of its {traced} "
                    f"traced requests of SLO {view.slo.spec} (another run's results?): not used, the "
                    "quantiles come from the traces"
                )
        return False
    # unmatched requests count where they were sent to the paths the matched ones were: the SLO's
    # scope may hold one route without naming it (analysis.routes), and results of another run's route
    # beside it must not join in
    same_path = (
        "c.route IN (SELECT DISTINCT c2.route FROM client_results c2 SEMI JOIN ss_traced t USING (trace_id))"
    )
    if blind:
        same_path = f"c.route = {_lit(view.slo.route)}" if view.slo.route is not None else "true"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE ss_client AS
        SELECT c.*, t.value_ms AS server_ms, t.start_unix_ns AS server_start, t.queue_depth, t.batch_size,
               t.cold_start
        FROM client_results c LEFT JOIN ss_traced t USING (trace_id)
        WHERE t.trace_id IS NOT NULL OR (
              NOT EXISTS (SELECT 1 FROM requests r WHERE r.trace_id = c.trace_id) AND {same_path})"""
    )
    net, n_in, no_answer, shed = _one(
        con,
        f"""SELECT median({naive} - server_ms) FILTER (WHERE server_ms IS NOT NULL),
                   count(*) FILTER (WHERE status NOT IN (0, 429, {N.STATUS_CODE_CLIENT_CLOSED})), count(*) FILTER (WHERE status = 0),
                   count(*) FILTER (WHERE status = 429)
            FROM ss_client""",
    )
    if complete and n_in <= traced * 1.01 + 1:
        return False  # the traces hold every request the load generator sent: they are complete
    net = max(0.0, float(net or 0.0))
    estimate = f"greatest({naive} - {net!r}, 0)"
    below = _slow_floor(con, view, flt)
    if below is not None:  # a request whose trace was not kept was faster than the slow rule
        estimate = f"least({estimate}, {below!r})"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {view.name} AS
        SELECT coalesce(server_start, sent_unix_ns, intended_unix_ns) AS start_unix_ns,
               coalesce(server_ms, {estimate}, {corrected}) AS value_ms,
               queue_depth, batch_size, cold_start, 1.0 AS w
        FROM ss_client WHERE status NOT IN (0, 429, {N.STATUS_CODE_CLIENT_CLOSED})
          AND coalesce(server_ms, {naive}, {corrected}) IS NOT NULL"""
    )
    view.count_rows(con)
    view.source = N.SOURCE_CLIENT_RESULTS
    view.sampling["network_ms"] = round(net, 3)
    row = _one(
        con,
        f"SELECT quantile_cont({corrected}, [0.5, 0.95, 0.99]) FROM ss_client WHERE status NOT IN (0, 429, {N.STATUS_CODE_CLIENT_CLOSED})",
    )[0]
    view.sampling["client_latency_ms"] = dict(
        zip(
            ("p50", "p95", "p99"),
            (None if v is None else round(float(v), 3) for v in row or [None] * 3),
            strict=True,
        )
    )
    if no_answer:
        view.warnings.append(
            f"{no_answer} load-generator requests got no response (status 0) and are not latency samples"
        )
    if shed and not view.shed:
        view.warnings.append(
            f"{shed} load-generator requests were shed (HTTP 429) and are not latency samples"
        )
    for t in ("ss_traced", "ss_client"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return True


def _slow_floor(con: duckdb.DuckDBPyConnection, view: SLIView, flt: str) -> float | None:
    """For ``e2e``: the shortest request kept by stagescope's slow rule (``sampled_reason`` ``slow``,
    kept whatever its trace id), which is at or above the rule's threshold. Every request that slow was
    kept, so one whose trace was not was faster: its server time is below this, whatever the client
    saw (on a busy machine a client also waits for the server's accept queue and its own event loop)."""
    if view.slo.sli != N.SLI_E2E or not has_columns(con, "requests", "sampled_reason"):
        return None
    row = _one(
        con, f"SELECT min(duration_ms) FROM requests WHERE {flt} AND sampled_reason = {_lit(N.SAMPLED_SLOW)}"
    )
    return None if row[0] is None else float(row[0])
