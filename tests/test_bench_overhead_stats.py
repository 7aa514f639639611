"""benchmarks/overhead.py's interval for the median ratio (overhead_report.py): order statistics at binomial ranks."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "overhead_report.py"


@pytest.fixture(scope="module")
def overhead():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_overhead", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_overhead"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_ranks_and_coverage_match_the_binomial_table(overhead) -> None:  # type: ignore[no-untyped-def]
    xs = [float(i) for i in range(1, 31)]  # x_(i) = i
    random.Random(3).shuffle(xs)
    med, lo, hi, cov = overhead.median_interval(xs)
    assert med == 15.5
    assert (lo, hi) == (10.0, 21.0)  # n = 30: ranks 10 and 21 (P(B <= 9) = 0.0214)
    assert cov == pytest.approx(0.9572, abs=1e-4)
    assert overhead.median_interval([float(i) for i in range(1, 21)])[1:3] == (6.0, 15.0)  # n = 20


def test_too_few_rounds_give_no_interval(overhead) -> None:  # type: ignore[no-untyped-def]
    assert overhead.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])[1:] == (None, None, 0.0)
    assert overhead.median_interval([1.0] * 6)[1:3] == (1.0, 1.0)  # n = 6: ranks 1 and 6 (96.9 %)


def test_coverage_holds_by_simulation(overhead) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    hits = 0
    for _ in range(2000):
        _, lo, hi, _ = overhead.median_interval([rng.lognormvariate(0.0, 0.3) for _ in range(30)])
        hits += lo <= 1.0 <= hi  # the lognormal's median is exp(0) = 1
    assert 0.94 <= hits / 2000 <= 0.975
