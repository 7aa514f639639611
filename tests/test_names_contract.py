"""No metric name is spelled out in Python code outside ``stagescope/names.py``.

Scans every ``.py`` file of the repository (not ``tests/``, whose tables spell expected names on
purpose, nor third-party data in ``external/``, nor the virtualenv) for string literals (f-string parts
included) that contain a metric name: any value of a ``names`` constant that is a metric name (with or
without a ``_bucket``/``_count``/``_sum``/``_created`` suffix), or anything shaped like one of the
families we emit or read (``stagescope_..._seconds``/``_total``/..., ``gen_ai_server_...``,
``DCGM_FI_...``, ``vllm:...``, ``nv_inference_...``). Docstrings are prose and are not scanned;
comments are not string literals.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stagescope import names

REPO = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", "venv", "external", "tests", "build", "dist", ".git", "node_modules", "data", "out"}
ALLOWED = {REPO / "stagescope" / "names.py"}

_PREFIXES = ("stagescope_", "gen_ai_server_", "DCGM_FI_", "vllm:", "llamacpp:", "nv_inference_", "nv_gpu_")
_KNOWN = sorted(
    {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith(_PREFIXES)},
    key=len,
    reverse=True,
)
_SHAPED = re.compile(
    r"(?<![\w:])("
    r"stagescope_[a-z0-9_]*_(?:seconds|total|bytes|ratio|depth|requests|size|ready|up|info)"
    r"|gen_ai_server_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+|vllm:[a-z0-9_]+|llamacpp:[a-z0-9_]+|nv_inference_[a-z0-9_]+"
    r"|nv_gpu_[a-z0-9_]+"
    r")"
)
_KNOWN_RE = re.compile(r"(?<![\w:])(" + "|".join(re.escape(n) for n in _KNOWN) + r")(?![A-Za-z0-9:])")


def python_files(root: Path) -> list[Path]:
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in rel[:-1]):
            continue
        if path.resolve() != path.absolute() and path.resolve().is_relative_to(root):
            continue  # reached through a symlink (stagescope/instrumentation -> instrumentation): seen there
        out.append(path)
    return sorted(out)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def violations(source: str, filename: str) -> list[str]:
    """``file:line: name`` for every metric name inside a non-docstring string literal of ``source``."""
    tree = ast.parse(source, filename)
    docs = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for rx in (_KNOWN_RE, _SHAPED):
                for match in rx.finditer(node.value):
                    found.append(f"{filename}:{node.lineno}: {match.group(1)}")
    return sorted(set(found))


def test_no_metric_name_literal_outside_names_py() -> None:
    files = python_files(REPO)
    assert REPO / "instrumentation" / "metrics.py" in files  # the scan does reach product code
    bad = []
    for path in files:
        if path.resolve() in ALLOWED:
            continue
        bad += violations(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not bad, "metric names must come from stagescope.names:\n" + "\n".join(bad)


def test_the_scan_catches_real_violations() -> None:
    src = '''
"""Module docstring may say stagescope_queue_depth in prose."""
QUERY = "histogram_quantile(0.99, rate(stagescope_stage_duration_seconds_bucket[5m]))"
NEW = "stagescope_made_up_latency_seconds"
def f(model):
    """Reads vllm:num_requests_waiting (prose again)."""
    return f'vllm:num_requests_waiting{{model_name="{model}"}}' + "DCGM_FI_DEV_GPU_UTIL"
OK = "stagescope_request"  # a context variable's name, not a metric
LABEL = names.METRIC_QUEUE_DEPTH
'''
    assert sorted(v.split(": ")[1] for v in violations(src, "x.py")) == [
        "DCGM_FI_DEV_GPU_UTIL",
        "stagescope_made_up_latency_seconds",
        "stagescope_stage_duration_seconds",
        "vllm:num_requests_waiting",
    ]
    assert set(_KNOWN) >= {names.METRIC_REQUEST_DURATION, names.METRIC_GENAI_TTFT, names.VLLM_TTFT}
