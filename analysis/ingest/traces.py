"""Loading trace files into the ``spans`` table, with bad-file handling and per-file summaries.

Each file goes to the reader that claims it (:mod:`~stagescope.analysis.ingest.readers`). OTLP/JSON
files (stagescope's sink files, Jaeger v2's ``result`` envelope) go through the DuckDB SQL path in
groups; a group that fails is retried file by file, and a failing file is diagnosed line by line
(:mod:`~stagescope.analysis.ingest.check`). Bad input raises :class:`~stagescope.errors.UserError`
naming the file and line, or with ``skip_bad`` becomes a warning: the bad lines are dropped and the
file's good lines are still loaded. Once every file is in, the span conventions (Triton's
OpenTelemetry events) run over the spans.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from stagescope.analysis.ingest.check import MAX_NS, MIN_NS, Problem, diagnose_otlp
from stagescope.analysis.ingest.files import SniffedFile, expand_paths, sniff
from stagescope.analysis.ingest.otlp import MAX_OBJECT_BYTES, otlp_spans_sql, sql_str
from stagescope.analysis.ingest.readers import READERS, SPAN_CONVENTIONS, known_formats
from stagescope.errors import UserError
from stagescope.names import ATTR_STAGE, ATTR_STAGE_KIND, KIND_UNKNOWN, KINDS

__all__ = ["FileSummary", "TraceLoader"]


@dataclass
class FileSummary:
    """One input file: ``kind`` is a trace reader's (otlp, sink, jaeger-v3, triton-trace, zipkin,
    jaeger), prometheus or results."""

    path: str
    kind: str
    spans: int = 0
    samples: int = 0
    has_stage_info: bool = False
    skipped: bool = False
    note: str = ""


#: Longest export request (one JSON line) read; DuckDB's read buffers scale with it.
LARGEST_OBJECT_BYTES = 256 * 1024 * 1024

_STAGE_INFO = (
    "bool_or(stage IS NOT NULL OR queue_s IS NOT NULL OR prefill_s IS NOT NULL OR decode_s IS NOT NULL)"
)
_BAD_ROW = (
    "(trace_id IS NULL OR length(trace_id) <> 32 OR try(from_hex(trace_id)) IS NULL "
    "OR span_id IS NULL OR length(span_id) <> 16 OR try(from_hex(span_id)) IS NULL "
    "OR start_ns IS NULL OR end_ns IS NULL "
    f"OR start_ns < {MIN_NS} OR start_ns > {MAX_NS} OR end_ns < start_ns OR end_ns > {MAX_NS})"
)
#: A stage span whose kind attribute is a string outside the vocabulary (read as unknown).
_ODD_KIND = (
    "stage IS NOT NULL AND stage_kind IS NOT NULL AND stage_kind NOT IN ("
    + ", ".join(sql_str(k) for k in (*KINDS, KIND_UNKNOWN))
    + ")"
)


class TraceLoader:
    """Fills ``spans`` in ``con`` from trace files; collects warnings and per-file summaries."""

    def __init__(self, con: duckdb.DuckDBPyConnection, scratch: Path, *, skip_bad: bool) -> None:
        self.con = con
        self.scratch = scratch
        self.skip_bad = skip_bad
        self.warnings: list[str] = []
        self.files: list[FileSummary] = []
        self._otlp: list[SniffedFile] = []  # files read through the OTLP SQL path
        self._wrapper: dict[str, str | None] = {}  # their envelope key (Jaeger v3: "result")
        #: per file: (spans with a stage value that is not a non-empty string, an example of one,
        #: stage spans with a kind outside the vocabulary, an example of one)
        self._stage_values: dict[str, tuple[int, str | None, int, str | None]] = {}
        self._route_values: dict[str, tuple[int, str | None]] = {}  # spans with a non-string http.route

    # ---------------------------------------------------------------- public
    def load(self, paths: Sequence[str | Path]) -> None:
        by_reader: dict[int, list[SniffedFile]] = {}
        for path in expand_paths(list(paths), warnings=self.warnings):
            try:
                sf = sniff(path)
            except UserError as exc:
                self._bad_message(path, str(exc))
                continue
            if sf.kind == "empty":
                self.bad(path, [Problem(1, "empty file, no spans")], "otlp")
            elif sf.reader is None:
                self.bad(path, [Problem(1, f"JSON of an unknown shape: none of {known_formats()}")], "otlp")
            else:
                by_reader.setdefault(id(sf.reader), []).append(sf)
        for reader in READERS:
            if id(reader) in by_reader:
                reader.load(self, by_reader[id(reader)])
        stats = self._file_stats()
        if any(bad for _, _, bad in stats.values()):
            self._validate_rows({f: bad for f, (_, _, bad) in stats.items() if bad})
        for convention in SPAN_CONVENTIONS:
            convention(self)
        self._summarize(self._file_stats())

    # ---------------------------------------------------------------- OTLP
    def load_otlp(self, files: list[SniffedFile], wrapper: str | None = None) -> None:
        """OTLP/JSON files (export requests under ``wrapper`` when given) through the SQL path, in
        groups of the same layout (lines or document, gzip or not)."""
        groups: dict[tuple[bool, bool], list[SniffedFile]] = {}
        for f in files:
            self.files.append(FileSummary(str(f.path), f.kind))
            self._wrapper[str(f.path)] = wrapper
            groups.setdefault((f.lines, f.gzip), []).append(f)
        for (lines, gz), group in groups.items():
            self._otlp.extend(group)
            self._insert_or_split(group, lines, gz, wrapper)

    def _insert_otlp(
        self, files: list[str], lines: bool, gz: bool, wrapper: str | None, as_name: str | None = None
    ) -> None:
        fmt = "newline_delimited" if lines else "unstructured"
        compression = "gzip" if gz else "none"
        size = MAX_OBJECT_BYTES
        while True:
            sql = otlp_spans_sql(
                files, fmt=fmt, compression=compression, max_object_bytes=size, wrapper=wrapper
            )
            if as_name is not None:
                sql = f"SELECT * REPLACE ({sql_str(as_name)} AS file) FROM ({sql})"
            try:
                self.con.execute(f"INSERT INTO spans {sql}")
                return
            except duckdb.Error as exc:  # an export request longer than the object bound: widen it
                if "maximum_object_size" not in str(exc) or size >= LARGEST_OBJECT_BYTES:
                    raise
                size *= 4

    def _insert_or_split(self, files: list[SniffedFile], lines: bool, gz: bool, wrapper: str | None) -> None:
        """Insert a group of files; when DuckDB fails, bisect to the bad files and diagnose them."""
        try:
            self._insert_otlp([str(f.path) for f in files], lines, gz, wrapper)
        except duckdb.Error as exc:
            if len(files) == 1:
                self._recover(files[0], str(exc).splitlines()[0])
                return
            half = len(files) // 2
            self._insert_or_split(files[:half], lines, gz, wrapper)
            self._insert_or_split(files[half:], lines, gz, wrapper)

    def _recover(self, f: SniffedFile, duckdb_error: str = "") -> None:
        """Diagnose a file the SQL path choked on (or left invalid rows of); raise, or (skip_bad) load
        its good lines."""
        clean = self.scratch / f"clean-{hashlib.sha1(str(f.path).encode()).hexdigest()[:12]}.jsonl"
        problems, n_good = diagnose_otlp(
            f.path,
            lines=f.lines,
            good_out=clean if self.skip_bad else None,
            limit=1000 if self.skip_bad else 1,
            wrapper=self._wrapper.get(str(f.path)),
        )
        if not problems:
            detail = f": {duckdb_error}" if duckdb_error else ""
            problems = [Problem(1, f"could not be read as OTLP/JSON{detail}")]
            n_good = 0
        self.bad(f.path, problems, f.kind, clean if n_good else None)

    def _file_stats(self) -> dict[str, tuple[int, bool, int]]:
        """Per file: spans, whether any carries stage information, spans with bad ids or times."""
        rows = self.con.execute(
            f"""SELECT file, count(*), {_STAGE_INFO}, count_if({_BAD_ROW}), count(stage_invalid),
                       any_value(stage_invalid), count_if({_ODD_KIND}), any_value(stage_kind) FILTER ({_ODD_KIND}),
                       count(route_invalid), any_value(route_invalid)
                FROM spans GROUP BY file"""
        ).fetchall()
        self._stage_values = {r[0]: (int(r[4]), r[5], int(r[6]), r[7]) for r in rows}
        self._route_values = {r[0]: (int(r[8]), r[9]) for r in rows}
        return {r[0]: (int(r[1]), bool(r[2]), int(r[3])) for r in rows}

    def _validate_rows(self, bad_files: dict[str, int]) -> None:
        """Files that left spans without valid ids or plausible times: OTLP files are diagnosed line by
        line (and their good lines kept with ``skip_bad``), the others reported as a whole."""
        for f in self._otlp:
            if str(f.path) in bad_files:
                self.con.execute("DELETE FROM spans WHERE file = ?", [str(f.path)])
                self._recover(f)
        for name in sorted(set(bad_files) - {str(f.path) for f in self._otlp}):
            self.con.execute("DELETE FROM spans WHERE file = ?", [name])
            kind = next((s.kind for s in self.files if s.path == name), "jaeger")
            self.bad(
                Path(name),
                [Problem(1, f"{bad_files[name]} spans without valid ids or plausible times")],
                kind,
            )

    # ---------------------------------------------------------------- bad input
    def _bad_message(self, path: Path, message: str) -> None:
        if not self.skip_bad:
            raise UserError(message)
        self.warnings.append(f"skipped: {message}: its spans are not in the analysis")
        self.files.append(FileSummary(str(path), "otlp", skipped=True, note=message))

    def bad(self, path: Path, problems: list[Problem], kind: str, good_lines: Path | None = None) -> None:
        """Raise for bad input, or (skip_bad) warn and read ``good_lines`` (a file of the good lines)."""
        first = problems[0]
        more = f" (and {len(problems) - 1} more bad lines)" if len(problems) > 1 else ""
        message = f"{path}:{first.line}: {first.message}{more}"
        if not self.skip_bad:
            raise UserError(message)
        summary = next((s for s in self.files if s.path == str(path)), None)
        if summary is None:
            summary = FileSummary(str(path), kind)
            self.files.append(summary)
        if good_lines is not None:
            self._insert_otlp([str(good_lines)], True, False, self._wrapper.get(str(path)), as_name=str(path))
            summary.note = f"{len(problems)} bad lines skipped"
            self.warnings.append(
                f"skipped bad lines: {message}; the other lines were read (requests and stages on the bad "
                "lines are missing from the analysis)"
            )
        else:
            summary.skipped = True
            summary.note = message
            self.warnings.append(f"skipped file: {message}: its spans are not in the analysis")

    # ---------------------------------------------------------------- summaries
    def _summarize(self, stats: dict[str, tuple[int, bool, int]]) -> None:
        # No warning for a file without stage information: what that costs depends on the requests,
        # not the file (a load generator's CLIENT spans are the network stage; a file of health checks
        # costs nothing). The analysis says it where it costs the verdict: slow requests of a
        # breached route whose time is in no stage (see analysis.api).
        for s in self.files:
            n, staged, _ = stats.get(s.path, (0, False, 0))
            s.spans, s.has_stage_info = n, staged
            invalid, example, odd, odd_example = self._stage_values.get(s.path, (0, None, 0, None))
            if invalid:
                self.warnings.append(
                    f"{s.path}: {invalid} spans whose {ATTR_STAGE} is not a non-empty string (e.g. {example}): "
                    "not read as stages, so their time counts as unattributed"
                )
            bad_routes, route_example = self._route_values.get(s.path, (0, None))
            if bad_routes:
                self.warnings.append(
                    f"{s.path}: {bad_routes} spans whose http.route is not a non-empty string (e.g. "
                    f"{route_example}): not read as a route; their requests are kept, with the route their "
                    "span name gives"
                )
            if odd:
                self.warnings.append(
                    f"{s.path}: {odd} stage spans whose {ATTR_STAGE_KIND} is not a stage kind (e.g. "
                    f"{odd_example!r}; kinds are {', '.join(KINDS)}): read as the kind their stage name "
                    f"implies, else {KIND_UNKNOWN}"
                )
