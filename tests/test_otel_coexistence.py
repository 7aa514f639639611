"""OpenTelemetry as users run it: FastAPI's own tracing, a global TracerProvider, the user's own spans,
``opentelemetry-instrument``; on the current FastAPI and on the oldest pyproject.toml allows.

One SERVER span per request, whatever else makes spans in the process; a span the handler makes with
the global ``trace.get_tracer(...)`` is exported and belongs to the request span (its child, or the
child of FastAPI's own operation span under it), in both modes. A global provider can be set once per
process, so each scenario runs in its own process (tests/apps/otel_coexist_app.py: a real app under
uvicorn, real HTTP requests, the SDK's in-memory exporter and stagescope's sink; no OpenTelemetry mocks).
The oldest FastAPI runs from a venv built once per session from pip's cache (its own fastapi and
starlette, everything else from this venv); without it those cases are skipped, saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from packaging.version import Version
from prometheus_client import CollectorRegistry

import stagescope
from stagescope import names
from stagescope.instrumentation.app import uninstrument_app

sys.path.insert(0, str(Path(__file__).parent / "apps"))
from conftest import telemetry_env_keys
from otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "apps" / "otel_coexist_app.py"
#: FastAPI's own spans between a SERVER span and the handler's (its operation spans; the ASGI
#: instrumentation's receive/send spans under opentelemetry-instrument)
FRAMEWORK_SCOPES = ("fastapi", "opentelemetry.instrumentation.asgi", "opentelemetry.instrumentation.fastapi")
USER_SPANS = ("user.lookup", "user.sync")
#: fastapi's pyproject floor needs this starlette (fastapi 0.110.0: starlette>=0.36.3,<0.37)
OLDEST_STARLETTE = "0.36.3"
REQUESTS = 3


def _oldest_fastapi() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"fastapi>=([0-9.]+)"', text)
    assert match, "pyproject.toml names no fastapi floor"
    return match.group(1)


@pytest.fixture(scope="session")
def oldest_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A python with the oldest FastAPI (and its Starlette) in front of this venv's packages."""
    version = _oldest_fastapi()
    venv = tmp_path_factory.mktemp("fastapi-oldest")
    py = venv / "bin" / "python"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        subprocess.run(  # installed before the .pth below, so pip never sees (or touches) this venv
            [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
             "--disable-pip-version-check", f"fastapi=={version}", f"starlette=={OLDEST_STARLETTE}"],
            check=True, timeout=180, capture_output=True,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as exc:
        out = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot build a venv with fastapi=={version} (no network or pip cache?): {out[-200:]!r}")
    site = subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    )
    ours = sysconfig.get_paths()["purelib"]
    (Path(site.decode().strip()) / "_stagescope_venv.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    got = subprocess.check_output([str(py), "-c", "import fastapi; print(fastapi.__version__)"], text=True)
    assert Version(got.strip()) == Version(version)
    return str(py)


@pytest.fixture(params=["current", "oldest"])
def python(request: pytest.FixtureRequest) -> str:
    if request.param == "current":
        return sys.executable
    return str(request.getfixturevalue("oldest_python"))


def _env(**extra: str) -> dict[str, str]:
    """A child process's environment: this one's without any telemetry variable (conftest's list)."""
    drop = set(telemetry_env_keys())
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_scenario(
    python: str,
    scenario: str,
    tmp_path: Path,
    *,
    prefix: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    out = tmp_path / "out.json"
    cmd = [*(prefix or []), python, str(DRIVER), scenario, str(out), str(tmp_path)]
    proc = subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    import fastapi

    want = fastapi.__version__ if python == sys.executable else _oldest_fastapi()
    assert Version(result["versions"]["fastapi"]) == Version(want)  # the scenario ran on that FastAPI
    return result


def check_requests(spans: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` requests, each one SERVER span with stagescope's attributes, its stage span as a child, and
    the handler's own span under it; nothing exported twice, nothing orphaned. Returns the SERVER spans."""
    by_id = {(s["trace"], s["span"]): s for s in spans}
    assert len(by_id) == len(spans), "a span was exported twice"
    servers = [s for s in spans if s["kind"] == "SERVER"]
    assert len(servers) == n, [(s["name"], s["scope"]) for s in servers]
    assert all(s["attrs"].get(names.ATTR_COLD_START) is not None for s in servers), "not annotated"
    assert len({s["trace"] for s in servers}) == n
    for s in spans:  # every parent is exported too (the request spans here have no caller)
        assert (s["kind"] == "SERVER" and not s["parent"]) or (s["trace"], s["parent"]) in by_id, s
    owners = []
    for u in (s for s in spans if s["name"] in USER_SPANS):
        p = by_id[(u["trace"], u["parent"])]
        while p["kind"] != "SERVER":
            assert p["scope"] in FRAMEWORK_SCOPES, f"{u['name']} hangs under {p}"
            p = by_id[(p["trace"], p["parent"])]
        owners.append(p["span"])
    assert sorted(owners) == sorted(s["span"] for s in servers), "one user span per request, under it"
    stage_parents = sorted(s["parent"] for s in spans if names.ATTR_STAGE in s["attrs"])
    assert stage_parents == sorted(s["span"] for s in servers)
    return servers


@pytest.fixture(autouse=True)
def _clean_env(clean_telemetry_env: None) -> None:
    """Every test starts with none of stagescope's, OTel's or FastAPI's telemetry variables set (conftest)."""


def merged(*exports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a reader given several exports sees: a span id written twice is one span."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for spans in exports:
        for s in spans:
            out.setdefault((s["trace"], s["span"]), s)
    return list(out.values())


def test_global_provider_one_server_span_per_request_and_user_spans_under_it(
    python: str, tmp_path: Path
) -> None:
    """The user registered a provider first (FastAPI >= 0.142 then traces by itself): in both modes,
    given no destination stagescope writes into that provider; given a sink, the sink holds each
    request span under the same ids as the user's backend. Read together, each request counts once."""
    result = run_scenario(python, "user-provider", tmp_path)
    native = tuple(int(x) for x in result["versions"]["fastapi"].split(".")[:2]) >= (0, 142)
    for mode in ("fast", "otel-fastapi"):
        alone = result[f"{mode}/none"]
        assert alone["delivers_to_user_provider"]
        servers = check_requests(alone["provider"], REQUESTS)
        if mode == "otel-fastapi":  # the stock instrumentor's span (FastAPI turns its own off)
            assert {s["scope"] for s in servers} == {"opentelemetry.instrumentation.fastapi"}
        else:  # FastAPI's own span where it makes one, else stagescope's
            assert {s["scope"] for s in servers} == {"fastapi" if native else "stagescope"}

        with_sink = result[f"{mode}/sink"]
        assert not with_sink["delivers_to_user_provider"]
        sink, user_side = with_sink["sink"], with_sink["provider"]
        sink_servers = [s for s in sink if s["kind"] == "SERVER"]
        assert len(sink_servers) == REQUESTS and len(sink) == 2 * REQUESTS  # request span + its stage
        assert sorted(s["parent"] for s in sink if s["kind"] != "SERVER") == sorted(
            s["span"] for s in sink_servers
        )
        framework_span = mode == "otel-fastapi" or native
        user_servers = [s for s in user_side if s["kind"] == "SERVER"]
        assert len(user_servers) == (REQUESTS if framework_span else 0)
        if framework_span:  # the same request span on both sides
            assert {(s["trace"], s["span"]) for s in sink_servers} == {
                (s["trace"], s["span"]) for s in user_servers
            }
        check_requests(merged(user_side, sink), REQUESTS)

    from stagescope.analysis.ingest import load_dataset

    sinks = [tmp_path / f"{m}-sink" for m in ("fast", "otel-fastapi")]
    ds = load_dataset(traces=[Path(result["user_export_dir"]), *sinks])
    n, staged = ds.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE request_key IN (SELECT request_key FROM stages)) FROM requests"
    ).fetchone()
    assert (n, staged) == (4 * REQUESTS, 4 * REQUESTS)  # 4 apps x 3 requests: the copies are counted once


@pytest.mark.parametrize("mode", ["fast", "otel-fastapi"])
def test_no_user_provider_user_spans_go_through_stagescope_when_asked(
    python: str, mode: str, tmp_path: Path
) -> None:
    """No provider of their own: the user routes their spans through stagescope with one line
    (``trace.set_tracer_provider(handle.tracer_provider)``). They land in stagescope's sink under the
    request span, and only with the requests that keep their trace (fast mode: the slow ones)."""
    # fast mode: a zero head ratio (only slow requests kept); stagescope's own provider must still record
    # every span (ALWAYS_ON) so the keep decision at the request's end can take them
    sampler = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"} if mode == "fast" else {}
    result = run_scenario(python, f"own-{mode}", tmp_path, env=_env(**sampler))
    got = result[mode]
    kept = (
        got["slow"] if mode == "fast" else got["requests"]
    )  # otel-fastapi: the provider's sampler keeps all
    servers = check_requests(got["sink"], kept)
    if mode == "fast":
        assert {s["attrs"][names.ATTR_SAMPLED_REASON] for s in servers} == {"slow"}


@pytest.mark.parametrize("mode", ["fast", "otel-fastapi"])
def test_opentelemetry_instrument(python: str, mode: str, tmp_path: Path) -> None:
    """``opentelemetry-instrument`` (the distro's provider, OTLP to a collector, FastAPI instrumented at
    import): stagescope hands its spans to that provider instead of opening a second OTLP exporter to
    the same collector; the collector gets one SERVER span per request."""
    receiver = OtlpReceiver()
    try:
        env = _env(
            OTEL_TRACES_EXPORTER="otlp_proto_http", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME="scorer",
        )  # fmt: skip
        launcher = [python, "-c", "from opentelemetry.instrumentation.auto_instrumentation import run; run()"]
        result = run_scenario(python, f"auto-{mode}", tmp_path, prefix=launcher, env=env)
        got = result[mode]
        assert got["app_class"].startswith("opentelemetry.instrumentation.fastapi.")
        assert got["delivers_to_user_provider"]
        servers = check_requests(got["provider"], REQUESTS)
        assert {s["scope"] for s in servers} == {"opentelemetry.instrumentation.fastapi"}
        assert receiver.spans_received == len(got["provider"])  # the collector got what the provider exported
    finally:
        receiver.close()


def _memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _get(app: FastAPI, path: str, n: int = 1) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        for _ in range(n):
            (await client.get(path)).raise_for_status()


def _app_with_user_span(app: FastAPI, provider: TracerProvider) -> FastAPI:
    tracer = provider.get_tracer("user-code")

    @app.get("/x")
    async def x() -> dict[str, bool]:
        with stagescope.stage("compute"), tracer.start_as_current_span("user.lookup"):
            await asyncio.sleep(0)
        return {"ok": True}

    return app


def _tree(spans: list[Any]) -> list[dict[str, Any]]:
    return [
        {"trace": f"{s.context.trace_id:032x}", "span": f"{s.context.span_id:016x}",
         "parent": f"{s.parent.span_id:016x}" if s.parent else "", "kind": s.kind.name, "name": s.name,
         "scope": s.instrumentation_scope.name, "attrs": dict(s.attributes or {})}
        for s in spans
    ]  # fmt: skip


@pytest.fixture
def no_global_provider() -> Iterator[None]:
    assert not hasattr(trace.get_tracer_provider(), "_active_span_processor"), "a test set a global provider"
    yield


@pytest.mark.usefixtures("no_global_provider")
def test_fast_mode_user_span_is_the_request_spans_child_without_a_framework_span() -> None:
    """FastAPI's tracing off (as before 0.142): stagescope's span is the request span and the context it
    attaches makes the handler's span its child (in-process, the app's own provider)."""
    provider, exporter = _memory_provider()
    app = _app_with_user_span(FastAPI(**_no_native_tracing()), provider)
    handle = stagescope.instrument_app(
        app, service_name="s", tracer_provider=provider, baseline_sample=1.0, registry=CollectorRegistry()
    )
    asyncio.run(_get(app, "/x", REQUESTS))
    handle.force_flush()
    servers = check_requests(_tree(list(exporter.get_finished_spans())), REQUESTS)
    assert {s["scope"] for s in servers} == {"stagescope"}
    assert trace.get_current_span() is trace.INVALID_SPAN  # the context is detached after the request
    uninstrument_app(app)


@pytest.mark.usefixtures("no_global_provider")
def test_starlette_opentelemetry_middleware_span_is_the_request_span() -> None:
    """Starlette's own OpenTelemetryMiddleware (1.7 and later) added by the user: stagescope goes just
    inside it, so its span is the request span, not the parent of a second one."""
    otel_mw = pytest.importorskip("starlette.middleware.opentelemetry")
    provider, exporter = _memory_provider()
    app = _app_with_user_span(FastAPI(**_no_native_tracing()), provider)
    app.add_middleware(otel_mw.OpenTelemetryMiddleware, tracer_provider=provider)
    handle = stagescope.instrument_app(
        app, service_name="s", tracer_provider=provider, baseline_sample=1.0, registry=CollectorRegistry()
    )
    asyncio.run(_get(app, "/x", REQUESTS))
    handle.force_flush()
    servers = check_requests(_tree(list(exporter.get_finished_spans())), REQUESTS)
    assert {s["scope"] for s in servers} == {"starlette"}
    uninstrument_app(app)


@pytest.mark.usefixtures("no_global_provider")
def test_fastapi_tracing_with_an_app_provider_is_the_request_span() -> None:
    """FastAPI's own tracing through ``FastAPI(telemetry={"tracer_provider": ...})`` (no global provider):
    its span is the request span; stagescope writes the same identity to its own destination."""
    if not _has_native_tracing():
        pytest.skip("this FastAPI has no telemetry= option (before 0.142)")
    app_provider, app_exporter = _memory_provider()
    ours, our_exporter = _memory_provider()
    app = _app_with_user_span(FastAPI(telemetry={"tracer_provider": app_provider}), app_provider)
    handle = stagescope.instrument_app(
        app, service_name="s", tracer_provider=ours, baseline_sample=1.0, registry=CollectorRegistry()
    )
    asyncio.run(_get(app, "/x", REQUESTS))
    handle.force_flush()
    app_side, our_side = (
        _tree(list(app_exporter.get_finished_spans())),
        _tree(list(our_exporter.get_finished_spans())),
    )
    app_servers = [s for s in app_side if s["kind"] == SpanKind.SERVER.name]
    our_servers = [s for s in our_side if s["kind"] == SpanKind.SERVER.name]
    assert len(app_servers) == len(our_servers) == REQUESTS
    assert {(s["trace"], s["span"]) for s in app_servers} == {(s["trace"], s["span"]) for s in our_servers}
    check_requests(merged(app_side, our_side), REQUESTS)
    uninstrument_app(app)


def _has_native_tracing() -> bool:
    import fastapi

    return tuple(int(x) for x in fastapi.__version__.split(".")[:2]) >= (0, 142)


def _no_native_tracing() -> dict[str, Any]:
    return {"telemetry": {"tracing": False}} if _has_native_tracing() else {}


@pytest.mark.parametrize("through", ["context variable", "public api"])
def test_request_context_attach_detach_both_ways(through: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's context is attached through the default runtime context's variable, or through
    opentelemetry.context's public functions when another runtime context is configured: either way
    the current span has the record's ids while attached, values already current are kept, and detach
    restores the context that was current."""
    from opentelemetry import context as otel_context

    from stagescope.instrumentation import otel_context as oc
    from stagescope.instrumentation.tracing import TracedRecord

    assert oc._VAR is not None  # this environment runs the default runtime context
    if through == "public api":
        monkeypatch.setattr(oc, "_VAR", None)
        monkeypatch.setattr(oc, "_set", None)
        monkeypatch.setattr(oc, "current_context", otel_context.get_current)
    rec = TracedRecord()
    rec.trace_id, rec.span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    key = otel_context.create_key("user-value")
    outer = otel_context.attach(otel_context.set_value(key, "kept"))
    try:
        before = otel_context.get_current()
        token = oc.attach_request_context(rec, oc.current_context())
        ctx = trace.get_current_span().get_span_context()
        assert (ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, ctx.is_remote) == (
            rec.trace_id, rec.span_id, True, False,
        )  # fmt: skip
        assert otel_context.get_value(key) == "kept"
        oc.detach_request_context(token)
        assert otel_context.get_current() is before
    finally:
        otel_context.detach(outer)
