"""Ingest: trace, metric and load-generator files (or a live Prometheus) -> DuckDB relations.

``load_dataset`` returns a :class:`Dataset` whose connection holds the pinned relations

* ``requests`` (one row per server-side request), ``stages`` (one row per stage interval),
  ``token_gaps`` (one row per inter-token gap), see :mod:`~stagescope.analysis.ingest.derive`;
* ``metric_samples`` (``metric``, ``labels`` MAP, ``value``, ``ts_ms``, ``source``);
* ``client_results`` (the load generator's ``results.parquet`` rows);
* ``spans`` (the flat span table everything above is derived from).

Times are Unix nanoseconds (``*_unix_ns``), durations milliseconds (``*_ms``), metric timestamps
Unix milliseconds (``ts_ms``). Memory stays bounded: DuckDB runs under ``memory_limit`` and spills to
a temporary directory; with ``workdir`` (or automatically for inputs over ``DISK_THRESHOLD_BYTES``)
the tables live in a DuckDB file there. :func:`ingest_to_parquet` writes the relations as Parquet
once, and ``load_dataset(traces=[that_dir])`` reads them back without re-parsing JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from stagescope.analysis.ingest.derive import derive_sql
from stagescope.analysis.ingest.spans import SPAN_TABLE_DDL
from stagescope.analysis.ingest.traces import FileSummary, TraceLoader
from stagescope.analysis.keys import REQUEST_KEY, REQUEST_KEYS, TRACE_KEY, has_columns, key_sql
from stagescope.errors import UserError

__all__ = [
    "DISK_THRESHOLD_BYTES",
    "MANIFEST",
    "Dataset",
    "FileSummary",
    "ingest_to_parquet",
    "load_dataset",
]

#: Inputs larger than this go to a DuckDB file on disk even without ``workdir``.
DISK_THRESHOLD_BYTES = 512 * 1024 * 1024
#: Name of the manifest :func:`ingest_to_parquet` writes beside the Parquet files.
MANIFEST = "stagescope-ingest.json"
_RELATIONS = ("spans", "requests", "stages", "token_gaps", "metric_samples", "client_results")

METRIC_SAMPLES_DDL = (
    "(metric VARCHAR, labels MAP(VARCHAR, VARCHAR), value DOUBLE, ts_ms BIGINT, source VARCHAR)"
)


@dataclass
class Dataset:
    """The ingested data: ``con`` holds the relations; ``warnings``, ``files`` and ``trace_inputs``
    say what was read."""

    con: duckdb.DuckDBPyConnection
    warnings: list[str] = field(default_factory=list)
    files: list[FileSummary] = field(default_factory=list)
    workdir: Path | None = None
    #: The trace paths (files and folders) the dataset was loaded from, as given.
    trace_inputs: list[str] = field(default_factory=list)
    #: Spans the trace files held more than once (same trace and span id: an exporter's retried
    #: batch, overlapping files), each kept once.
    repeated_spans: int = 0
    _tempdir: Path | None = None
    _finalizer: Any = field(default=None, init=False, repr=False)

    def frame(self, relation: str) -> Any:
        """A relation (or a SELECT) as a polars DataFrame."""
        sql = (
            relation
            if relation.lstrip().lower().startswith(("select", "with"))
            else f"SELECT * FROM {relation}"
        )
        return self.con.sql(sql).pl()

    def __post_init__(self) -> None:
        if self._tempdir is not None:  # removed at close(), or when the Dataset is collected / at exit
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._tempdir, ignore_errors=True)

    def close(self) -> None:
        """Close the connection and remove the temporary directory, if one was made."""
        self.con.close()
        if self._tempdir is not None:
            self._finalizer()
            self._tempdir = None

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect(
    db: Path | None, temp: Path, memory_limit: str, threads: int | None
) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(db) if db else ":memory:")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = '{temp / 'duckdb-tmp'}'")
    con.execute("SET preserve_insertion_order = false")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def _input_bytes(paths: Sequence[str | Path]) -> int:
    """Approximate uncompressed input size (gzip counted at 8x, the usual ratio for OTLP JSON)."""
    files: list[Path] = []
    for p in map(Path, paths):  # os.path: Path.is_dir() raises for a name too long (reported later)
        if os.path.isdir(p):
            files.extend(f for f in p.rglob("*") if f.is_file())
        else:
            files.append(p)
    return sum(f.stat().st_size * (8 if f.name.endswith(".gz") else 1) for f in files if os.path.isfile(f))


def _preingested(paths: Sequence[str | Path]) -> list[Path]:
    return [Path(p) for p in paths if os.path.isfile(Path(p) / MANIFEST)]


def load_dataset(
    traces: Sequence[str | Path] = (),
    metrics: Sequence[str | Path] = (),
    results: Sequence[str | Path] = (),
    prometheus: str | None = None,
    window: tuple[int, int] | None = None,
    skip_bad: bool = False,
    workdir: str | Path | None = None,
    *,
    memory_limit: str = "1GB",
    threads: int | None = None,
    prometheus_step_s: float | None = None,
) -> Dataset:
    """Read traces, metrics and load-generator results into DuckDB relations (see the module doc).

    ``window`` (Unix ns) bounds the live Prometheus range queries (default: the span of the ingested
    requests), ``prometheus_step_s`` their resolution. Bad input raises :class:`UserError` naming file
    and line; with ``skip_bad`` it becomes a warning instead. ``workdir`` keeps the DuckDB database
    (``stagescope.duckdb``) and scratch files; ``memory_limit`` and ``threads`` are DuckDB's settings.
    """
    pre = _preingested(traces)
    raw_traces = [p for p in traces if Path(p) not in pre]
    wd = Path(workdir) if workdir is not None else None
    if wd is not None:
        wd.mkdir(parents=True, exist_ok=True)
    # scratch (spill files, cleaned copies of bad files) lives in the workdir when there is one
    tempdir = Path(tempfile.mkdtemp(prefix="stagescope-ingest-", dir=wd))
    db: Path | None = None
    if wd is not None:
        db = wd / "stagescope.duckdb"
        for old in (db, db.with_name(db.name + ".wal")):
            old.unlink(missing_ok=True)
    elif _input_bytes(raw_traces) > DISK_THRESHOLD_BYTES:
        db = tempdir / "stagescope.duckdb"
    con = _connect(db, tempdir, memory_limit, threads)
    ds = Dataset(con, workdir=wd, _tempdir=tempdir, trace_inputs=[str(p) for p in traces])
    try:
        _fill(ds, pre, raw_traces, metrics, results, prometheus, window, skip_bad, tempdir, prometheus_step_s)
    except BaseException:
        ds.close()
        raise
    return ds


def _fill(
    ds: Dataset,
    pre: list[Path],
    raw_traces: Sequence[str | Path],
    metrics: Sequence[str | Path],
    results: Sequence[str | Path],
    prometheus: str | None,
    window: tuple[int, int] | None,
    skip_bad: bool,
    scratch: Path,
    prometheus_step_s: float | None,
) -> None:
    con = ds.con
    con.execute(f"CREATE TABLE spans {SPAN_TABLE_DDL}")
    con.execute(f"CREATE TABLE metric_samples {METRIC_SAMPLES_DDL}")
    loader = TraceLoader(con, scratch, skip_bad=skip_bad)
    loader.load(raw_traces)
    ds.warnings.extend(loader.warnings)
    ds.files.extend(loader.files)
    _dedupe_spans(ds)
    if pre and not raw_traces:
        _view_parquet(ds, pre)
    else:
        for stmt in derive_sql("spans"):
            con.execute(stmt)
        for d in pre:
            _attach_parquet(ds, d)
    if metrics:
        from stagescope.analysis.ingest.prom import load_metric_files

        load_metric_files(ds, metrics, skip_bad=skip_bad)
    if prometheus:
        from stagescope.analysis.ingest.promql import load_prometheus

        load_prometheus(ds, prometheus, window, step_s=prometheus_step_s)
    from stagescope.analysis.ingest.results import load_results

    load_results(ds, results, skip_bad=skip_bad)
    for d in pre:  # small relations saved beside the traces are copied in
        for rel in ("metric_samples", "client_results"):
            if (d / f"{rel}.parquet").is_file():
                con.execute(f"INSERT INTO {rel} SELECT * FROM read_parquet('{d / (rel + '.parquet')}')")


def _dedupe_spans(ds: Dataset) -> None:
    """Keep one copy of each span (trace id and span id) the trace files hold more than once: an
    exporter that retried a batch it had already delivered, two files that overlap (a rotated file and
    its copy), or one request span written by two pipelines (the service's own tracer provider exports
    FastAPI's or the stock instrumentor's SERVER span, and stagescope writes that same span id to its
    sink: a span id names one span). Counted twice, a repeated request span would be two samples. Of
    the copies the longest is kept (the outermost measurement of the same span), then the first file's.
    The check is one pass over the span ids; the table is rewritten only when it finds repeats."""
    con = ds.con
    row = con.execute("SELECT count(*) - count(DISTINCT hash(trace_id, span_id)) FROM spans").fetchone()
    if not row or not row[0]:
        return
    before = con.execute("SELECT count(*) FROM spans").fetchall()[0][0]
    con.execute(
        "CREATE OR REPLACE TABLE spans AS SELECT DISTINCT ON (trace_id, span_id) * FROM spans "
        "ORDER BY trace_id, span_id, end_ns - start_ns DESC, file, start_ns"
    )
    # counted, not warned about: once de-duplicated, a repeat costs the analysis nothing
    ds.repeated_spans = before - con.execute("SELECT count(*) FROM spans").fetchall()[0][0]


def _read_manifest(ds: Dataset, d: Path) -> None:
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        ds.warnings.extend(manifest.get("warnings", []))
        ds.files.extend(FileSummary(**f) for f in manifest.get("files", []))
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"{d / MANIFEST}: unreadable ingest manifest ({exc})") from None


#: The integer keys (analysis.keys) each relation carries where the ingest wrote them, with the
#: columns each is the key of (None: not computable from the row alone; a stage row's request needs
#: its parent span).
_KEYS: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "requests": tuple(REQUEST_KEYS.items()),
    "stages": ((TRACE_KEY, REQUEST_KEYS[TRACE_KEY]), (REQUEST_KEY, None)),
}


#: Columns a relation gained after its first release that the analysis reads as NULL where an older
#: file lacks them (a stage row's kind then comes from its name, see analysis.kinds; a request's
#: sampling probability is then unknown).
_LATER: dict[str, tuple[str, ...]] = {
    "spans": ("trace_state", "sampled_reason"),
    "requests": ("sampled_reason", "sampling_p"),
    "stages": ("kind",),
}
_LATER_TYPES = {"sampling_p": "DOUBLE"}


def _view_parquet(ds: Dataset, dirs: list[Path]) -> None:
    """Relations as views over pre-ingested Parquet (nothing is copied). Where some of the files
    predate the integer keys, the view leaves the keys out (the analysis then joins on trace ids);
    where they predate a later column (:data:`_LATER`: a stage's kind, the sampling probability), it
    is NULL in their rows (and a column no file has is NULL in every row)."""
    ds.con.execute("DROP TABLE spans")
    for rel in ("spans", "requests", "stages", "token_gaps"):
        files = "[" + ", ".join(f"'{d / (rel + '.parquet')}'" for d in dirs) + "]"
        keys = [k for k, _ in _KEYS.get(rel, ())]
        one = [f"read_parquet('{d / (rel + '.parquet')}')" for d in dirs]
        src = f"read_parquet({files})"
        later = _LATER.get(rel, ())
        if later and not all(has_columns(ds.con, f, *later) for f in one):
            src = f"read_parquet({files}, union_by_name = true)"
            missing = [c for c in later if not has_columns(ds.con, src, c)]
            if missing:  # no file has them
                nulls = ", ".join(f"NULL::{_LATER_TYPES.get(c, 'VARCHAR')} AS {c}" for c in missing)
                src = f"(SELECT *, {nulls} FROM {src})"
        if keys and not all(has_columns(ds.con, f, *keys) for f in one):
            src = src if "union_by_name" in src else f"read_parquet({files}, union_by_name = true)"
            present = [k for k in keys if has_columns(ds.con, src, k)]
            cols = f"* EXCLUDE ({', '.join(present)})" if present else "*"
            ds.con.execute(f"CREATE VIEW {rel} AS SELECT {cols} FROM {src}")
        else:
            ds.con.execute(f"CREATE VIEW {rel} AS SELECT * FROM {src}")
    for d in dirs:
        _read_manifest(ds, d)


def _attach_parquet(ds: Dataset, d: Path) -> None:
    """Append a pre-ingested directory's relations (written by :func:`ingest_to_parquet`); keys its
    files lack (written before they existed) are computed."""
    for rel in ("spans", "requests", "stages", "token_gaps"):
        f = d / f"{rel}.parquet"
        if f.is_file():
            ds.con.execute(f"INSERT INTO {rel} BY NAME SELECT * FROM read_parquet('{f}')")
            for key, cols in _KEYS.get(rel, ()):
                if cols is not None:  # stage rows from before keep no request key: matched by time
                    ds.con.execute(
                        f"UPDATE {rel} SET {key} = {key_sql(*cols)} "
                        f"WHERE {key} IS NULL AND {' || '.join(cols)} IS NOT NULL"
                    )
    _read_manifest(ds, d)


def ingest_to_parquet(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    metrics: Sequence[str | Path] = (),
    results: Sequence[str | Path] = (),
    skip_bad: bool = False,
    memory_limit: str = "1GB",
) -> Path:
    """Ingest trace files (and metric snapshots, load-generator results) once into ``out_dir``: one
    Parquet file per relation plus a manifest (files read, warnings). ``load_dataset(traces=[out_dir])``
    then reads them back without parsing JSON (the large relations as views over the Parquet)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(
        traces=paths, metrics=metrics, results=results, skip_bad=skip_bad, workdir=out / ".work",
        memory_limit=memory_limit,
    )  # fmt: skip
    try:
        rels = ["spans", "requests", "stages", "token_gaps"]
        rels += [
            r
            for r in ("metric_samples", "client_results")
            if ds.con.execute(f"SELECT count(*) FROM {r}").fetchall()[0][0]
        ]
        for rel in rels:
            ds.con.execute(f"COPY (SELECT * FROM {rel}) TO '{out / (rel + '.parquet')}' (FORMAT parquet)")
        manifest = {"warnings": ds.warnings, "files": [asdict(f) for f in ds.files]}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    finally:
        ds.close()
        shutil.rmtree(out / ".work", ignore_errors=True)
    return out
