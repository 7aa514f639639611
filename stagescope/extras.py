"""The optional parts of stagescope (pip extras), and one clear line when a command's part is missing.

``pip install stagescope`` brings the core only: the telemetry names, the SLO format, OpenTelemetry's
API, SDK and OTLP exporter, prometheus-client, PyYAML and rich. Everything else is an extra, so that a
service owner does not install DuckDB and an incident reviewer does not install FastAPI:

========== ==================================================== ====================================
extra      what it brings                                       commands and APIs it enables
========== ==================================================== ====================================
service    FastAPI/Starlette instrumentation (and orjson for    ``stagescope.instrument_app``,
           the span sink's JSON)                                 ``DynamicBatcher``, streams
otel-fast… opentelemetry-instrumentation-fastapi                 ``mode="otel-fastapi"``
serve      the reference inference service: service + uvicorn,  ``stagescope serve``
           numpy
redis      a real Redis feature store for the reference service ``serve --feature-store redis://``
loadgen    the load generator: numpy, pyarrow (results          ``stagescope load``,
           Parquet), orjson                                      ``stagescope.loadgen``
analysis   breach analysis: DuckDB, polars, pyarrow, numpy,     ``stagescope analyze``,
           orjson, matplotlib (HTML report), httpx (live         ``stagescope.analysis``
           Prometheus)
dashboards grafanalib                                            ``stagescope dashboards build``
gpu        nvidia-ml-py (NVML)                                   ``stagescope gpu-exporter`` reads GPUs
demo       serve + loadgen + analysis + dashboards + httpx       ``stagescope demo``
notebooks  analysis + jupytext, nbclient, nbformat, ipykernel    executing the incident notebook
lab        notebooks + jupyterlab                                ``make lab``
onnx       onnxruntime, onnx, scikit-learn, threadpoolctl,       ``demo --engine onnx``,
           numpy: the onnx engine's model, trained here          ``serve --backend onnx``
llama-cpp  demo + gguf (writes the served random-weight GGUF)   ``demo --engine llama-cpp``
all        every extra above                                     everything
========== ==================================================== ====================================

``alerts build`` needs the core only; ``gpu-exporter`` runs without ``gpu`` (it serves
``stagescope_gpu_exporter_up 0`` and says why). :data:`EXTRAS` mirrors ``pyproject.toml`` (a test
compares them); :func:`require` checks that an extra's modules can be imported, without importing
them, and raises :class:`MissingExtra` naming the ``pip install`` to run.
"""

from __future__ import annotations

import importlib.util

from stagescope.errors import UserError

__all__ = ["COMMAND_EXTRAS", "EXTRAS", "IMPORT_NAMES", "INCLUDES", "MissingExtra", "missing", "modules_of", "require"]

#: Each extra's own distributions (as in ``pyproject.toml``, without the extras it includes).
EXTRAS: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "starlette", "orjson"),
    "otel-fastapi": ("opentelemetry-instrumentation-fastapi",),
    "serve": ("uvicorn", "numpy"),
    "redis": ("redis",),
    "loadgen": ("numpy", "pyarrow", "orjson"),
    "analysis": ("duckdb", "polars", "pyarrow", "numpy", "orjson", "matplotlib", "httpx"),
    "dashboards": ("grafanalib",),
    "gpu": ("nvidia-ml-py",),
    "demo": ("httpx",),
    "notebooks": ("jupytext", "nbclient", "nbformat", "ipykernel"),
    "lab": ("jupyterlab",),
    "onnx": ("onnxruntime", "onnx", "scikit-learn", "threadpoolctl", "numpy"),
    "llama-cpp": ("gguf", "numpy"),
    "all": (),
}
#: The extras an extra includes (``serve = ["stagescope[service]", ...]`` in ``pyproject.toml``).
INCLUDES: dict[str, tuple[str, ...]] = {
    "serve": ("service",),
    "demo": ("serve", "loadgen", "analysis", "dashboards"),
    "notebooks": ("analysis",),
    "lab": ("notebooks",),
    "llama-cpp": ("demo",),
    "all": ("service", "otel-fastapi", "serve", "redis", "loadgen", "analysis", "dashboards", "gpu", "demo",
            "notebooks", "onnx", "llama-cpp"),
}  # fmt: skip
#: Import names that differ from the distribution's name (``-`` -> ``_`` is applied to the rest).
IMPORT_NAMES: dict[str, str] = {
    "nvidia-ml-py": "pynvml",
    "opentelemetry-instrumentation-fastapi": "opentelemetry.instrumentation.fastapi",
    "scikit-learn": "sklearn",
}
#: The extra each ``stagescope`` command needs (commands not listed need the core only).
COMMAND_EXTRAS: dict[str, str] = {
    "demo": "demo",
    "serve": "serve",
    "load": "loadgen",
    "analyze": "analysis",
    "dashboards": "dashboards",
}


class MissingExtra(UserError):
    """A command or feature needs an extra that is not installed; the message names the install line."""

    def __init__(self, extra: str, missing: list[str], what: str = "") -> None:
        self.extra = extra
        self.missing = missing
        super().__init__(
            f"{what + ' ' if what else ''}needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install 'stagescope[{extra}]'"
        )


def modules_of(extra: str) -> dict[str, str]:
    """Distribution -> import name for every distribution ``extra`` brings, included extras too."""
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}")
    out: dict[str, str] = {}
    for inc in INCLUDES.get(extra, ()):
        out.update(modules_of(inc))
    for dist in EXTRAS[extra]:
        out[dist] = IMPORT_NAMES.get(dist, dist.replace("-", "_"))
    return out


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken stub in sys.modules
        return False


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` whose modules cannot be imported here (``[]``: installed)."""
    return [dist for dist, module in modules_of(extra).items() if not _importable(module)]


def require(extra: str, what: str = "") -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported (none is imported).

    ``what`` names the feature in the message (``"--feature-store redis://..."``); the CLI already
    prefixes the command's name."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, absent, what)
