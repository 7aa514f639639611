"""A bad stagescope environment variable in a user's service is one warning and the default, never a
service that does not start (before session 11 ``instrument_app`` raised ``ValueError`` or, for a
spans folder that cannot be created, ``FileNotFoundError``). Arguments are the caller's code: a bad
one still raises. stagescope's own commands refuse bad variables with one line (tests/bad_inputs.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.app import uninstrument_app
from stagescope.instrumentation.lifecycle import DEFAULT_SHUTDOWN_TIMEOUT_S
from stagescope.instrumentation.sampling import DEFAULT_SLOW_THRESHOLD_MS

_DESTINATIONS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", names.ENV_SPANS_DIR)
_ALL = (
    *_DESTINATIONS,
    names.ENV_SLOW_THRESHOLD_MS,
    names.ENV_BASELINE_SAMPLE,
    names.ENV_BASELINE_MIN_PER_S,
    names.ENV_INSTRUMENTATION_MODE,
    names.ENV_SHUTDOWN_TIMEOUT_S,
    names.ENV_RECORD_QUERY,
    "OTEL_TRACES_SAMPLER",
)


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/x")
    async def x() -> dict[str, int]:
        async with stagescope.stage("compute"):
            return {"ok": 1}

    return app


# (variable, bad value, what the warning says, the effective setting the fallback gives)
_ROWS = [
    (names.ENV_SLOW_THRESHOLD_MS, "fast", "is not a number", ("policy.slow_ns", int(DEFAULT_SLOW_THRESHOLD_MS * 1e6))),
    (names.ENV_SLOW_THRESHOLD_MS, "nan", "is not a finite number", ("policy.slow_ns", int(DEFAULT_SLOW_THRESHOLD_MS * 1e6))),
    (names.ENV_SLOW_THRESHOLD_MS, "-1", "must be a finite number >= 0", ("policy.slow_ns", int(DEFAULT_SLOW_THRESHOLD_MS * 1e6))),
    (names.ENV_BASELINE_SAMPLE, "2", "must be a ratio between 0 and 1", None),
    (names.ENV_BASELINE_SAMPLE, "half", "is not a number", None),
    (names.ENV_BASELINE_MIN_PER_S, "-3", "must be >= 0", None),
    (names.ENV_INSTRUMENTATION_MODE, "turbo", "MODE must be one of fast", ("mode", "fast")),
    (names.ENV_SHUTDOWN_TIMEOUT_S, "soon", "is not a number of seconds", ("shutdown", DEFAULT_SHUTDOWN_TIMEOUT_S)),
    (names.ENV_SHUTDOWN_TIMEOUT_S, "-5", "must be a finite number of seconds > 0", ("shutdown", DEFAULT_SHUTDOWN_TIMEOUT_S)),
    (names.ENV_RECORD_QUERY, "maybe", "query strings are not recorded", ("record_query", False)),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1", "no spans are exported", None),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318", "no spans are exported", None),
    (names.ENV_SPANS_DIR, "/proc/nope", "STAGESCOPE_SPANS_DIR='/proc/nope' cannot be used", None),
    (names.ENV_SPANS_DIR, "{file}/sub", "cannot be used (Not a directory)", None),
    (names.ENV_SPANS_DIR, "/tmp/" + "s" * 300, "cannot be used (File name too long)", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("var", "value", "says", "effect"), _ROWS, ids=[f"{r[0]}={r[1][:20]}" for r in _ROWS]
)
def test_a_bad_variable_is_one_warning_and_the_service_runs(
    var: str,
    value: str,
    says: str,
    effect: tuple[str, object] | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in _ALL:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "file").write_text("x")
    if var not in _DESTINATIONS:  # a working destination, so that the only warning is about the variable
        monkeypatch.setenv(names.ENV_SPANS_DIR, str(tmp_path / "spans"))
    monkeypatch.setenv(var, value.replace("{file}", str(tmp_path / "file")))
    app = _app()
    with caplog.at_level(logging.WARNING, logger="stagescope"):
        inst = stagescope.instrument_app(app, service_name="env-svc", registry=CollectorRegistry())
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert var.split("_")[-1] in warnings[0] or "OTLP endpoint" in warnings[0], warnings[0]
        assert says in warnings[0], warnings[0]
        with TestClient(app) as client:
            assert [client.get("/x").status_code for _ in range(3)] == [200, 200, 200]
            assert client.get("/metrics").status_code == 200
        state = inst.state
        if effect is not None:
            what, expected = effect
            got = {
                "policy.slow_ns": inst.policy.slow_ns,
                "mode": inst.mode,
                "shutdown": inst.shutdown_timeout_s,
                "record_query": state.builder.record_query,
            }[what]
            assert got == expected
    finally:
        uninstrument_app(app)


@pytest.mark.parametrize(
    "kwargs",
    [{"slow_threshold_ms": -1.0}, {"baseline_sample": 2.0}, {"mode": "turbo"}, {"shutdown_timeout_s": -5.0},
     {"record_query": 1}],
)  # fmt: skip
def test_a_bad_argument_still_raises(
    kwargs: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(names.ENV_SPANS_DIR, str(tmp_path / "spans"))
    with pytest.raises(ValueError):
        stagescope.instrument_app(_app(), service_name="env-svc", registry=CollectorRegistry(), **kwargs)  # type: ignore[arg-type]


def test_a_bad_spans_dir_argument_still_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _DESTINATIONS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        stagescope.instrument_app(
            _app(), service_name="env-svc", registry=CollectorRegistry(), spans_dir=tmp_path / "file" / "sub"
        )
