"""The span file is never corrupt: a full file system, a deleted file or directory.

Full disk: a small tmpfs mounted by the test (as root, where mounting is allowed) is filled up while
the sink writes; else (no mount) a subprocess writes under ``RLIMIT_FSIZE``, a real kernel limit that
cuts a write short and then fails it (EFBIG), the way a full disk does. Either way every line of every
span file must parse, the lost spans are counted (``reason="write_failed"``), the spans in the files
are exactly the ones counted as exported, failures are logged as one line and no traceback, and
writing resumes once there is room again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from prometheus_client import CollectorRegistry

from stagescope import names
from stagescope.instrumentation.metrics import StageMetrics
from stagescope.instrumentation.sink import JsonLinesSpanExporter

_RES = Resource.create({"service.name": "sink-failures"})


def _spans(n: int, start: int) -> list[ReadableSpan]:
    return [
        ReadableSpan(
            name="POST /v1/predict",
            context=SpanContext(start + i, start + i, is_remote=False, trace_flags=TraceFlags(1)),
            resource=_RES,
            kind=SpanKind.SERVER,
            attributes={"stagescope.padding": "x" * 200},
            start_time=1_000_000_000,
            end_time=1_002_000_000,
        )
        for i in range(n)
    ]


def _read_all(directory: Path) -> list[int]:
    """Every span's trace id (int) in every file; fails on any line that does not parse."""
    ids: list[int] = []
    for f in sorted(directory.rglob("spans-*.jsonl")):
        data = f.read_bytes()
        assert not data or data.endswith(b"\n"), f"{f.name} ends inside a line"
        for i, line in enumerate(data.splitlines(), 1):
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise AssertionError(f"{f.name}:{i} does not parse ({exc}): {line[:80]!r}...") from None
            ids += [
                int(s["traceId"], 16)
                for rs in doc["resourceSpans"]
                for ss in rs["scopeSpans"]
                for s in ss["spans"]
            ]
    return ids


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[bool]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield False
        return
    ok = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(path: Path) -> Path:
    """Fill the file system of ``path`` to the last byte with a filler file; returns it."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _dropped(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value(names.METRIC_SPANS_DROPPED, {"exporter": "jsonl", "reason": reason}) or 0


def test_full_filesystem_never_corrupts_the_span_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mnt = tmp_path / "mnt"
    with _tmpfs(mnt, "512k") as mounted:
        if not mounted:
            pytest.skip(
                "cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): the RLIMIT_FSIZE test covers it"
            )
        registry = CollectorRegistry()
        sink = JsonLinesSpanExporter(
            mnt / "spans", metrics=StageMetrics(registry=registry), flush_interval_s=0.05
        )
        try:
            sink.export(_spans(10, 1))
            assert sink.force_flush(10_000) and sink.counter.exported == 10
            filler = _fill(mnt)
            with filler.open("r+b") as f:  # leave room for a few lines, so one is cut short
                f.truncate(max(0, filler.stat().st_size - 12_000))
            with caplog.at_level(logging.WARNING):
                for k in range(40):  # ~2.9 KB a line of 10 spans: fills the rest, then every write fails
                    sink.export(_spans(10, 1000 * (k + 1)))
                    assert sink.force_flush(10_000)
            failed = _dropped(registry, names.DROP_WRITE_FAILED)
            assert failed >= 10 * 20, failed
            assert sink._file.cut >= 1  # a line was cut short by the full disk and truncated away
            written = _read_all(mnt / "spans")
            assert len(written) == sink.counter.exported == 400 + 10 - failed
            lines = [r for r in caplog.records if "writing spans" in r.getMessage()]
            assert len(lines) == 1 and not lines[0].exc_info, [
                r.getMessage() for r in lines
            ]  # one line, no traceback
            # room again: writing resumes by itself
            filler.unlink()
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                sink.export(_spans(10, 99_000))
                assert sink.force_flush(10_000)
            assert sink.counter.exported == 400 + 20 - failed
            assert len(_read_all(mnt / "spans")) == sink.counter.exported
            assert any("works again" in r.getMessage() for r in caplog.records)
        finally:
            sink.shutdown()


_RLIMIT_SCRIPT = textwrap.dedent(
    """
    import json, resource, signal, sys
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
    from stagescope.instrumentation.sink import JsonLinesSpanExporter

    res = Resource.create({"service.name": "sink-failures"})
    def spans(n, start):
        return [ReadableSpan(name="POST /v1/predict", resource=res, kind=SpanKind.SERVER,
                             context=SpanContext(start + i, start + i, is_remote=False, trace_flags=TraceFlags(1)),
                             attributes={"stagescope.padding": "x" * 200}, start_time=1, end_time=2)
                for i in range(n)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    sink = JsonLinesSpanExporter(sys.argv[1], flush_interval_s=0.05)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    for k in range(30):
        sink.export(spans(10, 1000 * (k + 1)))
        sink.force_flush(10_000)
    failed = sink.counter.dropped.get("write_failed", 0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again: writing resumes
    sink.export(spans(10, 99_000))
    sink.force_flush(10_000)
    print(json.dumps({"failed": failed, "exported": sink.counter.exported, "cut": sink._file.cut}))
    sink.shutdown()
    """
)


def test_file_size_limit_never_corrupts_the_span_file(tmp_path: Path) -> None:
    """Where no tmpfs can be mounted this is the full-disk test: the same short write, then a failure."""
    spans_dir = tmp_path / "spans"
    out = subprocess.run(
        [sys.executable, "-c", _RLIMIT_SCRIPT, str(spans_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["failed"] >= 100 and counts["cut"] >= 1, counts
    assert len(_read_all(spans_dir)) == counts["exported"] == 300 + 10 - counts["failed"]
    log = out.stderr
    assert log.count("failed: File too large") == 1 and log.count("works again") == 1, log[-2000:]
    assert "Traceback" not in log and len(log.splitlines()) == 2, log[-2000:]  # one line each, no traceback


def test_deleted_directory_or_file_is_recreated(tmp_path: Path) -> None:
    import shutil

    registry = CollectorRegistry()
    spans_dir = tmp_path / "a" / "spans"
    sink = JsonLinesSpanExporter(spans_dir, metrics=StageMetrics(registry=registry), flush_interval_s=0.05)
    try:
        sink.export(_spans(5, 1))
        assert sink.force_flush(10_000)
        shutil.rmtree(tmp_path / "a")  # the whole directory, parents included
        sink.export(_spans(5, 100))
        assert sink.force_flush(10_000)
        assert sorted(_read_all(spans_dir)) == list(range(100, 105))
        for f in spans_dir.glob("spans-*.jsonl"):
            f.unlink()  # just the file
        sink.export(_spans(5, 200))
        assert sink.force_flush(10_000)
        assert sorted(_read_all(spans_dir)) == list(range(200, 205))
        assert sink.counter.exported == 15 and _dropped(registry, names.DROP_WRITE_FAILED) == 0
    finally:
        sink.shutdown()


def test_a_new_file_per_process_even_with_the_same_pid(tmp_path: Path) -> None:
    """Two services that are both pid 1 (containers) on one volume: files are created exclusively."""
    taken = tmp_path / f"spans-{os.getpid()}-0.jsonl"
    taken.write_bytes(b"")
    sink = JsonLinesSpanExporter(tmp_path, flush_interval_s=0.05)
    try:
        sink.export(_spans(3, 1))
        assert sink.force_flush(10_000)
        assert taken.read_bytes() == b"" and sink.files == [tmp_path / f"spans-{os.getpid()}-1.jsonl"]
    finally:
        sink.shutdown()
