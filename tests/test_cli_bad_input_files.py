"""Bad inputs that ``tests/bad_inputs.py``'s table cannot hold: special files (a FIFO, a dangling symbolic
link), a metrics value that is valid exposition text but no count, and the few-word reasons shared by
several commands (an unresolvable host, an implausible timestamp). Each case was a traceback or a wrong
reason before session 11; all run in-process through :func:`stagescope.cli.main`.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from stagescope.cli import main

_FIFO = "a FIFO (named pipe), not a regular file"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stagescope.analysis import synth_scenarios as S

    path = tmp_path_factory.mktemp("traces") / "spans.jsonl"
    S.write_otlp(S.generate("saturated", 800, seed=7), path)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return int(code), out, err


def _special(tmp: Path, kind: str) -> Path:
    path = tmp / f"input-{kind}.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp / "gone" / "spans.jsonl")
    return path


_REASON = {
    "fifo": re.escape(_FIFO),
    "dangling": r"a symbolic link to '.*gone/spans\.jsonl', which does not exist",
}


@pytest.mark.parametrize("kind", ["fifo", "dangling"])
@pytest.mark.parametrize("option", ["--traces", "--metrics", "--results", "--events"])
def test_a_special_file_is_named_for_what_it_is(
    option: str, kind: str, tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "no such file or directory" for a FIFO that exists (--traces, --metrics, --results) and
    "not a regular file" without saying what it is (--events). Nothing is read from a FIFO: no hang."""
    special = _special(tmp_path, kind)
    argv = ["analyze", "--traces", str(traces), "--slo", "p99<300ms"]
    argv = (["analyze", "--traces", str(special), "--slo", "p99<300ms"] if option == "--traces"
            else [*argv, option, str(special)])  # fmt: skip
    code, _, err = _run(argv, capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert re.search(rf"input-{kind}\.jsonl: {_REASON[kind]}", lines[0]), lines[0]
    assert "Traceback" not in err


def test_an_infinite_bucket_count_is_no_count(
    tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``+Inf`` is valid exposition text for a value, but not a bucket count: it scaled the traced
    samples' weights by infinity and put ``inf`` into SQL (a DuckDB binder error, a traceback)."""
    family = "stagescope_request_duration_seconds"
    prom = tmp_path / "m.prom"
    prom.write_text(
        f"# TYPE {family} histogram\n"
        f'{family}_bucket{{route="/v1/predict",le="0.1"}} +Inf\n'
        f'{family}_bucket{{route="/v1/predict",le="0.3"}} 5\n'
        f'{family}_bucket{{route="/v1/predict",le="+Inf"}} 10\n'
        f'{family}_count{{route="/v1/predict"}} 10\n'
        f'{family}_sum{{route="/v1/predict"}} 1\n',
        encoding="utf-8",
    )
    code, out, err = _run(
        ["analyze", "--traces", str(traces), "--slo", "p99<300ms", "--metrics", str(prom)], capsys
    )
    assert "Traceback" not in err and code == 0, err
    assert out.startswith("SLO p99<300ms on route /v1/predict: BREACHED"), out[:300]


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
         "cannot resolve host name: Name or service not known"),
        (ConnectionRefusedError(111, "Connection refused"), "cannot connect: Connection refused"),
    ],
)  # fmt: skip
def test_a_failed_connection_says_why(exc: OSError, reason: str) -> None:
    """A host that does not resolve was "cannot connect: Unknown error -2" (``os.strerror`` of an EAI code)."""
    from stagescope.validate import connect_error

    assert connect_error(exc) == reason


@pytest.mark.parametrize(
    ("value", "unit", "guess"),
    [
        (1_764_000_000, "ns", "looks like seconds"),
        (1_764_000_000_000, "ns", "looks like milliseconds"),
        (1_764_000_000_000_000, "ns", "looks like microseconds"),
        (2**63, "ns", "after 2099"),  # was "looks like microseconds"
        (10**22, "ns", "too large for a time in any unit"),
        (
            1_764_000_000_000_000_000,
            "us",
            "looks like nanoseconds",
        ),  # Jaeger/Zipkin: was "looks like microseconds"
        (1_764_000_000_000, "us", "looks like milliseconds"),
        (0, "us", "not a timestamp"),
    ],
)
def test_an_implausible_timestamp_is_guessed_by_its_magnitude(value: int, unit: str, guess: str) -> None:
    from stagescope.analysis.ingest.check import unit_guess

    assert unit_guess(value, unit) == guess
