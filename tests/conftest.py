"""Which tests may run side by side and which run alone: the ``timing`` marker.

``make test`` runs the suite in two pytest invocations: the tests marked ``timing`` one at a time, as
they always ran, then the rest on pytest-xdist workers (one per core, ``--dist loadfile`` so a
module's fixtures are built once, in one worker). A test is ``timing`` when what it asserts or waits
for depends on the wall clock or on the CPU it gets: a real service driven for N seconds, a latency
or rate bound, a sleep, a readiness deadline. Two workers side by side would slow such a test down
and make it flakier, so every test file not listed in :data:`PARALLEL_SAFE` is marked ``timing``:
a new file runs alone until someone checks it and lists it here. An entry ``file.py::test_name``
lists one test function of a file whose other tests stay ``timing`` (all its parametrizations).

The files listed compute on recorded or synthetic data (DuckDB, polars, promtool, the builders), and
some start a Prometheus or a stdlib HTTP stub they wait for with deadlines of tens of seconds, and
the wheel's test runs a 5 s demo whose exit status and files alone it checks; none asserts on a
duration, a rate or a verdict that a slower CPU could change. ``tests/test_suite_split.py`` checks the list against the files.
"""

from __future__ import annotations

import os

import pytest

#: test files (or ``file::function``) whose tests run on the xdist workers (all else is ``timing``)
PARALLEL_SAFE = frozenset(
    {
        "test_alerts_rules.py",
        "test_analysis_attribution.py",
        "test_analysis_cli.py",
        "test_analysis_cost.py",
        "test_analysis_engine_metrics.py",
        "test_analysis_engines.py",
        "test_analysis_engines_sampled.py",
        "test_analysis_events.py",
        "test_analysis_events_prometheus.py",
        "test_analysis_ingest_bad.py",
        "test_analysis_ingest_metrics.py",
        "test_analysis_ingest_otlp.py",
        "test_analysis_ingest_prometheus_e2e.py",
        "test_analysis_ingest_readers.py",
        "test_analysis_ingest_triton.py",
        "test_analysis_intervals.py",
        "test_analysis_nodata.py",
        "test_analysis_notebook.py",
        "test_analysis_plan.py",
        "test_analysis_queueing.py",
        "test_analysis_report_render.py",
        "test_analysis_routes.py",
        "test_analysis_sampling.py",
        "test_analysis_scenarios.py",
        "test_analysis_stage_kinds.py",
        "test_architecture.py",
        # 17 bad values for every value option, run in-process; the analyze options' accepted values
        # each run a whole analysis (CPU, 35-42 s per option on a loaded machine); the file's served
        # rows and its "refused within 20 s" rows stay timing
        "test_bad_inputs.py::test_generic_bad_values",
        "test_bad_inputs.py::test_cli_row_through_the_executable",  # 17 executable starts, 60 s timeout each
        "test_cli.py",
        # special files and unusable values: each refused in one line before any work (no service)
        "test_cli_bad_input_files.py",
        "test_cpu_budget.py",
        "test_dashboards_build.py",
        "test_engines.py",
        "test_extras.py",
        "test_gcheap.py",
        "test_gpu_dcgm_compat.py",
        # bad variables/arguments: one warning and the default, read in-process (no service, no clock)
        "test_instrumentation_env_fallback.py",
        # query strings on spans: in-process apps through httpx's ASGI transport, span attributes only
        "test_instrumentation_query.py",
        "test_levers_cross.py",
        "test_levers_fleet.py",
        "test_levers_workload.py",
        "test_llama_cpp_gguf.py",
        "test_llama_cpp_levers.py",
        "test_loadgen_traces.py",
        "test_metrics_contract.py",
        "test_names_contract.py",
        "test_stack_configs.py",
        "test_stack_data.py",
        "test_stack_keys.py",
        "test_stack_loader.py",
        "test_suite_split.py",
        # the wheel in fresh venvs (pip, a file lock for a shared venv): --help, one-line refusals and a
        # 5 s demo that must exit 0 with its files written; no latency, rate or verdict asserted
        "test_wheel.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test outside :data:`PARALLEL_SAFE` ``timing`` (it runs alone under ``make test``)."""
    for item in items:
        function = getattr(item, "originalname", None) or item.name
        if item.path.name not in PARALLEL_SAFE and f"{item.path.name}::{function}" not in PARALLEL_SAFE:
            item.add_marker(pytest.mark.timing)


def _telemetry_env() -> frozenset[str]:
    from stagescope import names

    own = {v for k, v in vars(names).items() if k.startswith("ENV_") and isinstance(v, str)}
    return frozenset(own | {"PROMETHEUS_MULTIPROC_DIR", "FASTAPI_OTEL_AUTO_CONFIGURE"})


def telemetry_env_keys() -> list[str]:
    """The variables set in this process that change what stagescope's or OpenTelemetry's telemetry
    does: every ``names.ENV_*`` (the instrumentation's own), every ``OTEL_*``, Prometheus' multiprocess
    folder, FastAPI's auto-configuration. ``STAGESCOPE_CACHE_DIR`` and the like stay."""
    own = _telemetry_env()
    return [k for k in os.environ if k.startswith("OTEL_") or k in own]


@pytest.fixture
def clean_telemetry_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test starts with none of :func:`telemetry_env_keys` set (whatever the shell that runs pytest
    exports); a module opts in with ``pytestmark = pytest.mark.usefixtures("clean_telemetry_env")``."""
    for key in telemetry_env_keys():
        monkeypatch.delenv(key)
