"""The incident-review notebook executes end to end (jupytext -> nbclient, the venv's python3 kernel)."""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

from stagescope.analysis import synth_scenarios as S

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "notebooks" / "incident_review.py"


@pytest.mark.timeout(300)
def test_incident_review_notebook_runs_on_a_small_dataset(tmp_path: Path) -> None:
    data = S.generate("long-batch-wait", 400, seed=4)
    traces = tmp_path / "spans.jsonl"
    S.write_otlp(data, traces)
    nb = jupytext.read(NOTEBOOK)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "the notebook needs exactly one 'parameters' cell"
    params[0].source += f"\nTRACES = [{str(traces)!r}]\nSLO = 'p99<300ms'\n"
    NotebookClient(
        nb, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        for o in c.get("outputs", [])
    )
    assert "BREACHED" in outputs and "cap-batch-wait" in outputs
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 4


@pytest.mark.timeout(300)
def test_incident_review_notebook_on_no_data_says_so_and_never_met(tmp_path: Path) -> None:
    """An empty span folder: the notebook runs to the end, says NO DATA and why, and never "met"."""
    import re

    empty = tmp_path / "spans"
    empty.mkdir()
    nb = jupytext.read(NOTEBOOK)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    params[0].source += f"\nTRACES = [{str(empty)!r}]\nSLO = 'p99<300ms'\n"
    NotebookClient(
        nb, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        for o in c.get("outputs", [])
    )
    assert "NO DATA -- 0 samples: no trace files read" in outputs and "empty folder" in outputs
    assert not re.search(r"\bmet\b", outputs)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
