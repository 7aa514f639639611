"""The suite's split (tests/conftest.py): the files that run on xdist workers exist, none of them
waits on the clock or drives a service, and ``make test`` runs both halves, so none is dropped."""

from __future__ import annotations

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


def test_every_parallel_file_exists() -> None:
    missing = sorted(n for n in PARALLEL_SAFE if not (TESTS / n).is_file())
    assert not missing, f"listed in tests/conftest.py PARALLEL_SAFE but not in tests/: {missing}"


@pytest.mark.parametrize("name", sorted(n for n in PARALLEL_SAFE if n != Path(__file__).name))
def test_parallel_files_do_not_wait_on_the_clock(name: str) -> None:
    hits = [f"{i}: {ln.strip()}" for i, ln in enumerate((TESTS / name).read_text().splitlines(), 1)
            if CLOCK.search(ln)]  # fmt: skip
    assert not hits, f"{name} runs beside other tests (PARALLEL_SAFE) but uses the clock or a service: {hits}"


def test_this_file_is_not_marked_timing(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timing") is None


def test_make_test_runs_both_halves() -> None:
    target = (TESTS.parent / "Makefile").read_text().split("\npytest:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not timing" -n' in target and "--dist loadfile" in target, target
    assert "-m timing" in target, target


def test_unlisted_files_are_marked_timing(request: pytest.FixtureRequest) -> None:
    """The hook marks a test of any file not listed (a new one too) and leaves a listed one alone."""
    from conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, name: str) -> None:
            self.path, self.markers = TESTS / name, []

        def add_marker(self, m: pytest.MarkDecorator) -> None:
            self.markers.append(m.name)

    items = [
        Item("test_service_scenarios.py"),
        Item("test_not_written_yet.py"),
        Item("test_analysis_plan.py"),
    ]
    pytest_collection_modifyitems(request.config, items)  # type: ignore[arg-type]
    assert [i.markers for i in items] == [["timing"], ["timing"], []]
