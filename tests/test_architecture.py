"""Dependencies point one way (CONVENTIONS.md): the core is imported by all; instrumentation never
imports analysis, dashboards or alerts; analysis never imports instrumentation (it reads exported
data, so it works on any service's data)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("instrumentation", "service", "loadgen", "analysis", "dashboards", "alerts", "demo")

#: part -> parts it must never import
FORBIDDEN: dict[str, set[str]] = {
    "instrumentation": {"analysis", "dashboards", "alerts", "service", "loadgen", "demo"},
    "analysis": {"instrumentation", "service", "loadgen", "demo", "dashboards", "alerts"},
    "dashboards": {"instrumentation", "service", "loadgen", "analysis", "demo", "alerts"},
    "alerts": {"instrumentation", "service", "loadgen", "analysis", "demo", "dashboards"},
    "loadgen": {"analysis", "dashboards", "alerts", "service", "demo"},
    "service": {"analysis", "dashboards", "alerts", "loadgen", "demo"},
}


def imported_parts(path: Path) -> set[str]:
    """Parts of stagescope that a module imports (``stagescope.<part>...`` or relative beyond its part)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "stagescope":
                names += [f"stagescope.{a.name}" for a in node.names]
        for name in names:
            bits = name.split(".")
            if bits[0] == "stagescope" and len(bits) > 1 and bits[1] in PARTS:
                out.add(bits[1])
            if bits[0] in PARTS:  # importing a top-level folder by its bare name is a layout bug
                out.add(f"bare:{bits[0]}")
    return out


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_dependency_direction(part: str) -> None:
    bad = []
    for path in sorted((ROOT / part).rglob("*.py")):
        for imp in imported_parts(path):
            if imp.startswith("bare:") or imp in FORBIDDEN[part]:
                bad.append(f"{path.relative_to(ROOT)} imports {imp}")
    assert not bad, "\n".join(bad)


def test_core_imports_no_part_eagerly() -> None:
    for path in sorted((ROOT / "stagescope").glob("*.py")):
        assert not imported_parts(path), f"{path.name} imports a part at module level"


def test_parts_are_linked_into_the_package() -> None:
    for part in PARTS:
        link = ROOT / "stagescope" / part
        assert link.is_symlink() and link.resolve() == (ROOT / part).resolve(), part
