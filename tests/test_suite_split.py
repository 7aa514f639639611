"""The suite's split (tests/conftest.py): the files and functions that run on xdist workers exist,
none of them waits on the clock or drives a service, an unlisted test is ``timing``, and ``make
test`` runs both halves, so no test is dropped."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import PARALLEL_SAFE

TESTS = Path(__file__).resolve().parent
# what makes a test's outcome depend on the wall clock or the CPU it gets
CLOCK = re.compile(
    r"time\.sleep|asyncio\.sleep|monotonic\(|perf_counter\(|Popen\(|\bserve\(|\bdrive\(|"
    r"from (service_support|shutdown_support) import"
)


def _source(entry: str) -> str | None:
    """The text of a listed file, or of a listed function (None where either is missing)."""
    name, _, function = entry.partition("::")
    path = TESTS / name
    if not path.is_file():
        return None
    text = path.read_text()
    if not function:
        return text
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_source_segment(text, node)
    return None


def test_every_parallel_entry_exists() -> None:
    missing = sorted(e for e in PARALLEL_SAFE if _source(e) is None)
    assert not missing, f"listed in tests/conftest.py PARALLEL_SAFE but not in tests/: {missing}"


@pytest.mark.parametrize("entry", sorted(e for e in PARALLEL_SAFE if e != Path(__file__).name))
def test_parallel_entries_do_not_wait_on_the_clock(entry: str) -> None:
    text = _source(entry) or ""
    hits = [f"{i}: {ln.strip()}" for i, ln in enumerate(text.splitlines(), 1) if CLOCK.search(ln)]
    assert not hits, (
        f"{entry} runs beside other tests (PARALLEL_SAFE) but uses the clock or a service: {hits}"
    )


def test_this_file_is_not_marked_timing(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timing") is None


def test_unlisted_tests_are_marked_timing(request: pytest.FixtureRequest) -> None:
    """The hook marks a test of any file not listed (a new one too), and a file's unlisted functions,
    and leaves listed files and functions (every parametrization) alone."""
    from conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, name: str, function: str) -> None:
            self.path, self.originalname, self.name, self.markers = (
                TESTS / name,
                function,
                function + "[x]",
                [],
            )

        def add_marker(self, m: pytest.MarkDecorator) -> None:
            self.markers.append(m.name)

    items = [
        Item("test_service_scenarios.py", "test_healthy_stays_within_its_slo"),
        Item("test_not_written_yet.py", "test_a"),
        Item("test_analysis_plan.py", "test_seed_001_example"),
        Item("test_bad_inputs.py", "test_generic_bad_values"),
        Item("test_bad_inputs.py", "test_http_row"),
    ]
    pytest_collection_modifyitems(request.config, items)  # type: ignore[arg-type]
    assert [i.markers for i in items] == [["timing"], ["timing"], [], [], ["timing"]]


def test_make_test_runs_both_halves() -> None:
    target = (TESTS.parent / "Makefile").read_text().split("\npytest:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not timing" -n' in target and "--dist loadfile" in target, target
    assert "-m timing" in target, target


def test_the_clean_telemetry_env_fixture_names_what_the_telemetry_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest's ``clean_telemetry_env`` clears the instrumentation's own variables, every OTEL_* and
    Prometheus' multiprocess folder; a cache folder or an unrelated variable stays."""
    from conftest import telemetry_env_keys

    from stagescope import names

    for key in (names.ENV_SPANS_DIR, names.ENV_RECORD_QUERY, "OTEL_TRACES_SAMPLER", "PROMETHEUS_MULTIPROC_DIR"):
        monkeypatch.setenv(key, "x")
    monkeypatch.setenv("STAGESCOPE_CACHE_DIR", "/tmp/cache")
    keys = set(telemetry_env_keys())
    assert {names.ENV_SPANS_DIR, names.ENV_RECORD_QUERY, "OTEL_TRACES_SAMPLER", "PROMETHEUS_MULTIPROC_DIR"} <= keys
    assert "STAGESCOPE_CACHE_DIR" not in keys and "PATH" not in keys
