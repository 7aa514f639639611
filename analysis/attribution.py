"""Attribution: how much of the tail's excess latency each stage explains.

Per request we first split the SLI's interval (arrival to last byte for ``e2e``, arrival to first
token for ``ttft``) into stages along the **critical path**, then compare requests in the tail with a
baseline of normal requests.

Per-request split: analysis.breakdown (table ``ss_breakdown``, one row per request, milliseconds,
each stage's time on the critical path, ``unattributed``, ``network``).

Tail and baseline: the tail is the samples above the threshold when the SLO is breached (else those
at or above the SLO quantile); the baseline is the samples at or below the median and under the
threshold. ``excess_ms`` is a stage's mean in the tail minus its mean in the baseline; ``share`` is
its part of the summed positive excess (negative excess shares 0). Each row names the stage's kind
(:mod:`~stagescope.analysis.kinds`): a team's own stage is a stage of its own, and its kind decides
the lever rules that apply to it.

For inter-token SLOs the samples are gaps, all of them decode time: the excess is the tail gaps' mean
minus the baseline gaps' mean and goes to ``decode``; the evidence (running batch) is in levers.

Large inputs (over :data:`FULL_BREAKDOWN_LIMIT` samples): a stratified sample is broken down (see
:func:`_subset`): the tail candidates (all of them up to :data:`CANDIDATE_SAMPLE`), the baseline and
the requests between them, each drawn by a hash of the arrival time, which is independent of
latency, and weighted by stratum (``Attribution.weight``). Stage means are then sample means; tail
and baseline counts and mean latencies are always over every sample.

Sampled traces (analysis.weighting): each request's ``sw`` (``1 / sampling_p``) rides along in
``ss_req`` and ``ss_breakdown``, and ``Attribution.weight`` is ``sw`` times the stratum factor (the
one mechanism for both). Where the SLI samples came from a complete source (analysis.sources) the
strata are always formed and each calibrates the traced rows to the complete samples' weight in it.
With weights that vary within a stratum (``Attribution.weighted``) every mean, quantile and fit over
the breakdown is weighted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from stagescope.analysis.batch_fit import BATCH_FIT, batch_fit_sql, step_fit
from stagescope.analysis.breach import SLIView
from stagescope.analysis.breakdown import BREAKDOWN, REQUEST_ATTRIBUTES, build_breakdown, stage_columns
from stagescope.analysis.kinds import stage_catalog
from stagescope.analysis.queueing import uniform_rank_sql
from stagescope.analysis.weighting import mean_sql, stratum_weights
from stagescope.names import (
    KIND_DECODE,
    KIND_NETWORK,
    SOURCE_TRACES,
    STAGE_DECODE,
    STAGE_NETWORK,
    UNATTRIBUTED,
)

__all__ = [
    "BATCH_FIT", "BREAKDOWN", "REQUEST_ATTRIBUTES", "SAMPLE_FACTS", "Attribution", "attribute", "build_breakdown",
    "stage_columns", "step_fit",
]  # fmt: skip


@dataclass
class Attribution:
    """Result of :func:`attribute`; ``columns`` maps stage -> column of ``ss_breakdown``."""

    rows: list[dict[str, Any]]
    tail_n: int
    baseline_n: int
    tail_condition: str
    baseline_condition: str
    columns: dict[str, str] = field(default_factory=dict)
    tail_mean_ms: float | None = None
    baseline_mean_ms: float | None = None
    #: On large inputs ``ss_breakdown`` is a stratified sample (see :func:`_subset`): ``total`` is then
    #: the number of samples in the SLI view and ``candidates`` the number of them above ``lower_ms``.
    lower_ms: float | None = None
    total: int = 0
    view: SLIView | None = None
    candidates: int = 0
    #: A table with the slowest requests left out of a sampled breakdown (for the report's list of
    #: slowest traces; never in the estimates), or None.
    extra: str | None = None
    #: SQL: how many samples each ``ss_breakdown`` row stands for (its sampling weight ``sw`` times
    #: its stratum's weight over the stratum's rows' ``sw``); None when every row stands for one.
    weight: str | None = None
    #: The weights vary within a stratum (sampled traces, or calibration to a complete source): every
    #: statistic over the breakdown must then be weighted.
    weighted: bool = False
    #: :data:`BATCH_FIT` and, for per-request SLIs, :data:`SAMPLE_FACTS` and ``requests`` (the SLO's
    #: requests whether or not they have a sample), over every sample, for the evidence.
    facts: dict[str, Any] = field(default_factory=dict)
    #: stage -> kind (analysis.kinds), for every stage in ``columns`` and ``rows``
    kinds: dict[str, str] = field(default_factory=dict)
    #: what the report should say about the stages read (several kinds for one name, names folded)
    warnings: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[str]:
        """The stages of the breakdown (with a column) of ``kind``."""
        return [s for s in self.columns if self.kinds.get(s) == kind]

    @property
    def complete(self) -> bool:
        """Whether ``ss_breakdown`` holds every sample, each standing for one."""
        return self.weight is None

    @property
    def top(self) -> str | None:
        return self.rows[0]["stage"] if self.rows and self.rows[0]["excess_ms"] > 0 else None


#: Facts about the tail and baseline requests of a per-request SLI that :func:`attribute` gathers in
#: the same pass, for the evidence (``{tail}`` and ``{base}``: the conditions).
SAMPLE_FACTS = {
    "cold_start_share_tail": ("cold_start::INT", "{tail}"),
    "cold_start_share_baseline": ("cold_start::INT", "{base}"),
    "batch_size_tail": ("batch_size", "{tail}"),
    "batch_size_baseline": ("batch_size", "{base}"),
    "batch_size_max": None,  # max(batch_size)
    "queue_depth_tail": ("queue_depth", "{tail}"),
    "queue_depth_baseline": ("queue_depth", "{base}"),
}


def _conditions(
    threshold_ms: float, breached: bool, q_ms: float | None, p50_ms: float | None
) -> tuple[str, str]:
    if breached:
        tail = f"value_ms > {threshold_ms!r}"
    else:
        tail = f"value_ms >= {float(q_ms if q_ms is not None else threshold_ms)!r}"
    med = float(p50_ms) if p50_ms is not None else threshold_ms
    base = f"value_ms <= {min(med, threshold_ms)!r}"
    return tail, base


def _rows(
    excess: dict[str, float | None],
    means: dict[str, tuple[float | None, float | None]],
    kinds: dict[str, str],
) -> list[dict[str, Any]]:
    pos = sum(max(v or 0.0, 0.0) for v in excess.values())
    rows: list[dict[str, Any]] = []
    for stage, ex in excess.items():
        if ex is None:
            continue
        tail_m, base_m = means[stage]
        if not tail_m and not base_m:  # a stage that never runs within the SLI interval
            continue
        rows.append(
            {
                "stage": stage,
                "kind": kinds.get(stage),
                "excess_ms": round(ex, 3),
                "share": round(max(ex, 0.0) / pos, 4) if pos > 0 else 0.0,
                "tail_mean_ms": None if tail_m is None else round(tail_m, 3),
                "baseline_mean_ms": None if base_m is None else round(base_m, 3),
            }
        )
    rows.sort(key=lambda r: (-r["share"], -r["excess_ms"]))
    return rows


def attribute(
    con: duckdb.DuckDBPyConnection, view: SLIView, breached: bool, qs: dict[str, float | None]
) -> Attribution:
    """Excess latency per stage, tail against baseline (see the module docstring); ``qs`` are the
    SLI's quantiles (breach.quantiles)."""
    tail, base = _conditions(view.slo.threshold_ms, breached, qs["q"], qs["p50"])
    calibrate = view.per_request and view.source != SOURCE_TRACES  # samples from a complete source
    large = view.per_request and view.trace_samples > FULL_BREAKDOWN_LIMIT
    lower = _lower(view, qs) if large or calibrate else None
    wt = view.weight
    # counts and mean values of tail and baseline, over every sample (also when the breakdown is a
    # sample); in the same pass, per-request facts for the evidence and, on large inputs, the sizes of
    # the strata and the slowest values
    stats = {
        "tail_n": f"count(*) FILTER (WHERE {tail})", "base_n": f"count(*) FILTER (WHERE {base})",
        "tail_mean": mean_sql("value_ms", tail, wt), "base_mean": mean_sql("value_ms", base, wt),
        "tail_w": f"sum(w) FILTER (WHERE {tail})", "base_w": f"sum(w) FILTER (WHERE {base})",
        **batch_fit_sql(view.weighted),
    }  # fmt: skip
    if view.per_request:
        for k, fact in SAMPLE_FACTS.items():
            stats[k] = (
                "max(batch_size)"
                if fact is None
                else mean_sql(fact[0], fact[1].format(tail=tail, base=base), wt)
            )
        stats["requests"] = (
            f"(SELECT sum({view.request_weight(con)}) FROM requests WHERE {view.request_filter})"
        )
    strata = _strata(lower, base) if lower is not None else ()
    for i, c in enumerate(strata):
        stats[f"stratum{i}"] = f"count(*) FILTER (WHERE {c})"
        stats[f"stratum_w{i}"] = f"coalesce(sum(w) FILTER (WHERE {c}), 0)"
    if large:
        stats["slowest_min"] = f"list_min(max(value_ms, {KEEP_SLOWEST}))"
    row = con.execute(f"SELECT {', '.join(stats.values())} FROM {view.name}").fetchone()
    assert row is not None
    got = dict(zip(stats, row, strict=True))
    tn, bn, tm, bm = got["tail_n"], got["base_n"], got["tail_mean"], got["base_mean"]
    facts = {k: got[k] for k in (*BATCH_FIT, *SAMPLE_FACTS, "requests", "tail_w", "base_w") if k in got}
    if not view.per_request:
        facts.update(step_fit(con, view.name, view.weight))
        ex = None if tm is None or bm is None else tm - bm
        kinds = {STAGE_DECODE: KIND_DECODE}
        rows = _rows({STAGE_DECODE: ex}, {STAGE_DECODE: (tm, bm)}, kinds)
        return Attribution(
            rows, int(tn), int(bn), tail, base, {}, tm, bm, facts=facts, weighted=view.weighted, kinds=kinds
        )
    sub = None
    if large and lower is not None:
        sizes = tuple(got[f"stratum{i}"] for i in range(3))
        if calibrate:  # the sample is drawn from the traced requests: their own strata sizes
            sizes = _traced_strata(con, view, strata)
        sub = _subset(lower, base, sizes, got["slowest_min"])
    cat = stage_catalog(con)
    cols = build_breakdown(con, view, sub.condition if sub else None, cat)
    kinds = {s: cat.kinds[s] for s in cols}
    kinds[STAGE_NETWORK] = KIND_NETWORK
    extra = None
    if sub is not None and sub.forced:  # the slowest requests outside the sample: kept apart
        extra = "ss_breakdown_extra"
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {extra} AS SELECT * FROM {BREAKDOWN} WHERE NOT ({sub.sampled})"
        )
        con.execute(f"DELETE FROM {BREAKDOWN} WHERE NOT ({sub.sampled})")
    varies = con.execute(f"SELECT count(*) FILTER (WHERE sw <> 1) FROM {BREAKDOWN}").fetchone()
    sw = "sw" if varies and varies[0] else "1.0"
    weight: str | None = None
    if strata:  # each stratum weighs what the SLI samples hold in it
        weight = stratum_weights(
            con, [(c, got[f"stratum_w{i}"]) for i, c in enumerate(strata)], BREAKDOWN, sw,
            exact="exact" if calibrate and sub is None else None,  # every traced request is there
        )  # fmt: skip
    elif sw != "1.0":
        weight = sw
    weighted = view.weighted or calibrate or sw != "1.0"
    parts = dict(cols)
    parts[UNATTRIBUTED] = UNATTRIBUTED
    has_net = con.execute(f"SELECT count(network) FROM {BREAKDOWN}").fetchone()
    if has_net and has_net[0]:
        parts[STAGE_NETWORK] = "network"
    bw = weight if weighted else None
    sel = ", ".join(
        f"{mean_sql(f'coalesce({c}, 0)', tail, bw)}, {mean_sql(f'coalesce({c}, 0)', base, bw)}"
        for c in parts.values()
    )
    row = con.execute(f"SELECT {sel} FROM {BREAKDOWN}").fetchone()
    assert row is not None
    excess: dict[str, float | None] = {}
    means: dict[str, tuple[float | None, float | None]] = {}
    for i, stage in enumerate(parts):
        t, b = row[2 * i], row[2 * i + 1]
        means[stage] = (t, b)
        excess[stage] = None if t is None or b is None else t - b
    return Attribution(
        _rows(excess, means, kinds),
        int(tn),
        int(bn),
        tail,
        base,
        cols,
        tm,
        bm,
        sub.lower if sub else None,
        view.count,
        view,
        sub.candidates if sub else 0,
        extra,
        weight,
        weighted,
        facts,
        kinds,
        cat.warnings,
    )


def _traced_strata(con: duckdb.DuckDBPyConnection, view: SLIView, strata: tuple[str, ...]) -> tuple[int, ...]:
    """Rows of each stratum among the SLO's traced requests (when the SLI samples are another source's)."""
    src = (
        f"(SELECT CAST({view.value_expr} AS DOUBLE) AS value_ms FROM requests "
        f"WHERE {view.request_filter} AND {view.value_expr} IS NOT NULL)"
    )
    row = con.execute(
        "SELECT " + ", ".join(f"count(*) FILTER (WHERE {c})" for c in strata) + f" FROM {src}"
    ).fetchone()
    return tuple(int(v) for v in row) if row else (0,) * len(strata)


#: Above this many samples the breakdown covers a stratified sample (see :func:`_subset`).
FULL_BREAKDOWN_LIMIT = 200_000
# Sample sizes, fixed whatever the input's size, so the breakdown's cost stops growing with it. Their
# precision: a stratum's mean from n draws has a standard error of sd / sqrt(n), 0.7 % of the stage's
# spread at n = 20,000; the SLO quantile sits near the 90th percentile of the candidates (they start
# at the 1 - 10 * budget quantile), whose rank a sample of 20,000 puts within sqrt(0.9 * 0.1 / 20,000)
# = 0.2 % of the candidates, i.e. within 0.02 % of all samples for a p99 (between p98.98 and p99.02).
#: Baseline requests kept in the breakdown on large inputs (a deterministic hash sample).
BASELINE_SAMPLE = 20_000
#: Tail candidates kept in the breakdown on large inputs; above it a uniform sample of them.
CANDIDATE_SAMPLE = 20_000
#: Requests between the baseline and the candidates kept in the breakdown on large inputs (a sample):
#: they carry a counterfactual quantile that a lever moves below the candidates.
MIDDLE_SAMPLE = 10_000
#: The slowest requests always broken down (the report lists them), in or out of the sample.
KEEP_SLOWEST = 15


@dataclass(frozen=True)
class Subset:
    """Which requests a large input's breakdown covers: ``condition`` (SQL on ``value_ms`` and
    ``start_unix_ns``) = the ``sampled`` ones plus, when ``forced``, the slowest few. ``strata`` are
    (condition, number of samples in it) of the three disjoint strata the sample is drawn from."""

    condition: str
    sampled: str
    lower: float
    forced: bool
    strata: tuple[tuple[str, int], ...]

    @property
    def candidates(self) -> int:
        """Samples above ``lower`` (the first stratum)."""
        return self.strata[0][1]


def _lower(view: SLIView, qs: dict[str, float | None]) -> float:
    """Where the tail candidates start: the lowest of the threshold, the SLO quantile and its
    neighbourhood quantile (breach.neighbourhood_quantile): the tail and everything that could be in
    the SLO quantile's neighbourhood."""
    thr = view.slo.threshold_ms
    return min(thr, *(float(v) for v in (qs["q"], qs["near"]) if v is not None))


def _strata(lower: float, base: str) -> tuple[str, str, str]:
    """The conditions of the three disjoint strata: tail candidates, baseline, between them."""
    return f"value_ms > {lower!r}", base, f"value_ms <= {lower!r} AND NOT ({base})"


def _subset(lower: float, base: str, sizes: tuple[Any, ...], slowest_min: float | None) -> Subset:
    """On large inputs, a sample in three strata (:func:`_strata`): the tail candidates (everything
    above ``lower``), all of them up to :data:`CANDIDATE_SAMPLE`, the baseline
    (:data:`BASELINE_SAMPLE`) and the requests between them (:data:`MIDDLE_SAMPLE`); ``sizes`` are
    the strata's numbers of samples. Each is drawn by a hash of the arrival time, which is
    independent of latency, so means over a stratum are unbiased; counterfactual quantiles are the
    matching quantile of the candidates, or a quantile weighted by stratum (see counterfactual).
    When the candidates are sampled, the :data:`KEEP_SLOWEST` slowest (from ``slowest_min`` up) are
    broken down too."""
    strata = tuple((cond, int(n)) for cond, n in zip(_strata(lower, base), sizes, strict=True))
    rank = uniform_rank_sql("start_unix_ns")
    parts = []
    for (cond, n), limit in zip(strata, (CANDIDATE_SAMPLE, BASELINE_SAMPLE, MIDDLE_SAMPLE), strict=True):
        rate = min(1.0, limit / max(n, 1))
        parts.append(f"({cond})" + (f" AND {rank} < {rate!r}" if rate < 1.0 else ""))
    sampled = " OR ".join(f"({p})" for p in parts)
    if strata[0][1] <= CANDIDATE_SAMPLE:
        return Subset(sampled, sampled, lower, False, strata)
    forced = f"value_ms >= {float(slowest_min)!r}" if slowest_min is not None else "false"
    return Subset(f"{sampled} OR {forced}", sampled, lower, True, strata)
