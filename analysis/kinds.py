"""Stage kinds in the analysis: what each stage's time is, read from the data.

A stage row's ``kind`` (the ``stages`` relation, see :mod:`~stagescope.analysis.ingest.derive`) is
its span's ``stagescope.stage.kind`` when that is one of :data:`~stagescope.names.KINDS`; else the
kind a built-in stage name implies (:data:`~stagescope.names.STAGE_KINDS`: data from before kinds
existed, other emitters, vLLM's and the load generator's derived rows); else ``unknown``. Relations
without a ``kind`` column (built by hand, Parquet written before it existed) get the same answer
from the stage names.

The analysis then treats each stage name as a stage of its own, with one kind: a name whose rows
carry several kinds is ``unknown`` (with a warning), and so is the lever choice for it. The kinds are
read from the stage rows of the requests the breakdown covers, in the scan it makes anyway (a
separate pass over every stage row would cost the verdict more than the plain group-by the
analysis benchmark compares it with). Names past
:data:`MAX_STAGES` (data that puts an id into ``stagescope.stage``) are analysed together as
:data:`~stagescope.names.STAGE_OVERFLOW`, those with the least time first, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from stagescope import names as N
from stagescope.analysis.keys import has_columns

__all__ = [
    "MAX_STAGES", "StageCatalog", "kind_sql", "kinds_of_rows", "row_kind_sql", "stage_catalog", "stage_kinds",
]  # fmt: skip

#: Distinct stage names analysed apart; the rest (least time first) are one stage, STAGE_OVERFLOW.
MAX_STAGES = 64


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def kind_sql(stage: str, kind: str | None = None) -> str:
    """SQL for a stage row's kind from its ``stage`` column and (if any) its span's ``kind`` column."""
    whens = " ".join(f"WHEN {_lit(s)} THEN {_lit(k)}" for s, k in N.STAGE_KINDS.items())
    implied = f"CASE {stage} {whens} ELSE {_lit(N.KIND_UNKNOWN)} END"
    if kind is None:
        return implied
    known = ", ".join(_lit(k) for k in N.KINDS)
    return f"CASE WHEN {kind} IN ({known}) THEN {kind} ELSE {implied} END"


@dataclass
class StageCatalog:
    """The stages of ``stages`` the analysis breaks requests down into.

    ``columns``: stage -> column name of the breakdown (built-in stages first in vocabulary order,
    then the others by name; ``network`` is left out: it lies outside the server-side interval);
    ``kinds``: stage -> kind (``network`` included): first the kind each name implies, then, once
    the breakdown has read the stage rows of the analysed requests, the rows' own (see
    :func:`kinds_of_rows`); ``folded``: stage names analysed as
    :data:`~stagescope.names.STAGE_OVERFLOW`; ``warnings`` for the report."""

    columns: dict[str, str]
    kinds: dict[str, str]
    folded: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[str]:
        """The analysed stages (with a column) of ``kind``."""
        return [s for s in self.columns if self.kinds.get(s) == kind]


def _implied(stage: str) -> str:
    return N.STAGE_KINDS.get(stage, N.KIND_UNKNOWN)


def stage_catalog(con: duckdb.DuckDBPyConnection, table: str = "stages") -> StageCatalog:
    """The stage names of ``table`` (one scan of the names, as cheap as ``SELECT DISTINCT stage``; a
    second one only when there are more than :data:`MAX_STAGES`), each with the kind its name
    implies. The rows' own kinds come from :func:`kinds_of_rows` (or :func:`stage_kinds`)."""
    found = [r[0] for r in con.execute(f"SELECT DISTINCT stage FROM {table} WHERE stage IS NOT NULL").fetchall()]
    kinds = {s: _implied(s) for s in found}
    ordered = [s for s in N.STAGES if s in kinds and s != N.STAGE_NETWORK]
    ordered += sorted(s for s in found if s not in N.STAGE_KINDS)
    folded: list[str] = []
    warnings: list[str] = []
    if len(ordered) > MAX_STAGES:
        ordered, folded = _fold(con, table, ordered, warnings)
        kinds[N.STAGE_OVERFLOW] = N.KIND_UNKNOWN
    return StageCatalog({s: f"c{i}" for i, s in enumerate(ordered)}, kinds, folded, warnings)


def row_kind_sql(con: duckdb.DuckDBPyConnection, alias: str = "s", table: str = "stages") -> str:
    """SQL for a stage row's kind: its ``kind`` column where ``table`` has one and it is set, else the
    kind its name implies."""
    implied = kind_sql(f"{alias}.stage")
    return f"coalesce({alias}.kind, {implied})" if has_columns(con, table, "kind") else implied


def kinds_of_rows(
    con: duckdb.DuckDBPyConnection, catalog: StageCatalog, src: str, index: str = "k", kind: str = "kind"
) -> None:
    """Set ``catalog.kinds`` from stage rows in ``src`` that hold the stage's column index (``index``,
    the position in ``catalog.columns``) and the row's kind (``kind``): a stage whose rows carry one
    kind has it, one whose rows carry several is ``unknown`` (with a warning, except the overflow
    stage, which holds many names by design)."""
    stages = list(catalog.columns)
    rows = con.execute(
        f"SELECT {index}, min({kind}), max({kind}) FROM {src} WHERE {index} IS NOT NULL GROUP BY {index}"
    ).fetchall()
    for k, lo, hi in rows:
        stage = stages[int(k)]
        if lo == hi:
            catalog.kinds[stage] = lo if lo in N.KINDS else N.KIND_UNKNOWN
            continue
        catalog.kinds[stage] = N.KIND_UNKNOWN
        if stage == N.STAGE_OVERFLOW and catalog.folded:
            continue
        got = con.execute(f"SELECT list(DISTINCT {kind} ORDER BY {kind}) FROM {src} WHERE {index} = ?", [k]).fetchone()
        listed = ", ".join(str(x) for x in (got[0] if got else None) or ())
        catalog.warnings.append(
            f"stage {stage!r} carries several kinds ({listed}): analysed as kind {N.KIND_UNKNOWN!r}, "
            "so no lever is chosen for it; give each stage name one kind"
        )


def stage_kinds(con: duckdb.DuckDBPyConnection, table: str = "stages") -> StageCatalog:
    """:func:`stage_catalog` with the kinds of every row of ``table`` (a full scan: for notebooks
    and checks; the verdict reads only the analysed requests' rows)."""
    cat = stage_catalog(con, table)
    index = " ".join(f"WHEN {_lit(s)} THEN {i}" for i, s in enumerate(cat.columns))
    other = f" ELSE {list(cat.columns).index(N.STAGE_OVERFLOW)}" if cat.folded else ""
    src = (
        f"(SELECT CASE s.stage {index}{other} END AS k, {row_kind_sql(con, 's', table)} AS kind "
        f"FROM {table} s WHERE s.stage IS NOT NULL)"
    )
    kinds_of_rows(con, cat, src)
    return cat


def _fold(
    con: duckdb.DuckDBPyConnection, table: str, ordered: list[str], warnings: list[str]
) -> tuple[list[str], list[str]]:
    """Keep the :data:`MAX_STAGES` - 1 stages with the most time (built-in ones always), fold the
    rest into STAGE_OVERFLOW."""
    total = dict(
        con.execute(
            f"SELECT stage, sum(end_unix_ns - start_unix_ns) FROM {table} WHERE stage IS NOT NULL GROUP BY stage"
        ).fetchall()
    )
    builtin = [s for s in ordered if s in N.STAGE_KINDS]
    custom = sorted((s for s in ordered if s not in N.STAGE_KINDS), key=lambda s: (-(total.get(s) or 0), s))
    room = MAX_STAGES - 1 - len(builtin)
    keep, folded = custom[:room], custom[room:]
    if N.STAGE_OVERFLOW in keep:  # the emitter's own overflow stage joins the folded ones
        keep.remove(N.STAGE_OVERFLOW)
        folded.append(N.STAGE_OVERFLOW)
    shown = ", ".join(repr(s) for s in folded[:5]) + (", ..." if len(folded) > 5 else "")
    warnings.append(
        f"{len(ordered)} distinct stage names: the {len(builtin) + len(keep)} with the most time are analysed "
        f"apart, the other {len(folded)} ({shown}) together as stage {N.STAGE_OVERFLOW!r} (an id or other "
        "per-request value in stagescope.stage?)"
    )
    return [*builtin, *sorted(keep), N.STAGE_OVERFLOW], folded
