"""A user's FastAPI service living with OpenTelemetry, one scenario per process (a global
TracerProvider can be set only once per process); driven by tests/test_otel_coexistence.py.

``python otel_coexist_app.py SCENARIO OUT.json WORKDIR``; each scenario serves a real app under
uvicorn on 127.0.0.1 (OS-chosen port), sends it requests over HTTP and writes what was exported:

* ``user-provider``: the user has registered an SDK TracerProvider (``trace.set_tracer_provider``,
  in-memory exporter plus an OTLP/JSON file of what it exported) before building the app; then for
  each mode (``fast``, ``otel-fastapi``) and each stagescope destination (``none``: stagescope is given
  none, ``sink``: ``spans_dir=``) an app is instrumented and gets ``REQUESTS`` requests.
* ``own-fast`` / ``own-otel-fastapi``: the user has no provider; stagescope writes to its sink and
  the user routes their own spans through it: ``trace.set_tracer_provider(handle.tracer_provider)``.
  Sampling comes from the environment the test sets (fast mode: ``OTEL_TRACES_SAMPLER=traceidratio``
  with ratio 0, so only slow requests are kept: 3 of 12).
* ``auto-fast`` / ``auto-otel-fastapi``: run under ``opentelemetry-instrument`` (the provider, its
  OTLP exporter and the FastAPI instrumentation come from the environment); an in-memory exporter is
  added to that provider to report what it exported.

Every handler makes its own span with the global ``trace.get_tracer(...)`` inside a stage (async
and sync handlers). Spans are reported as dicts: trace, span, parent (hex), kind, name, scope, and
the attributes whose keys start with ``stagescope.`` or are ``http.route``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import stagescope
from stagescope.instrumentation.app import uninstrument_app
from stagescope.instrumentation.sink import JsonLinesSpanExporter

REQUESTS = 3
#: the own-* scenarios' tail threshold: stagescope's default, so that only a request made slow on
#: purpose (1.5x it) is kept, not a fast one (1 ms) stalled on a loaded machine, as a 60 ms threshold
#: allowed (a first request's lazy set-up can take that long under load)
SLOW_MS = 250.0
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def make_app() -> FastAPI:
    app = FastAPI()
    tracer = trace.get_tracer("user-code")  # through the global provider, whatever it is at call time

    @app.post("/v1/score/{item}")
    async def score(item: int, slow: int = 0) -> dict[str, int]:
        with stagescope.stage("feature_fetch"), tracer.start_as_current_span("user.lookup") as span:
            span.set_attribute("item", item)
            await asyncio.sleep(SLOW_MS * 1.5 / 1000 if slow else 0.001)
        return {"item": item}

    @app.get("/v1/sync/{item}")
    def sync(item: int) -> dict[str, int]:  # runs in the threadpool
        with stagescope.stage("preprocess"), tracer.start_as_current_span("user.sync"):
            pass
        return {"item": item}

    return app


async def serve_and_call(app: FastAPI, paths: list[tuple[str, str]]) -> None:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for method, path in paths:
            r = await client.request(method, path)
            r.raise_for_status()
    server.should_exit = True
    await task


def paths_for(n: int, slow_every: int = 0) -> list[tuple[str, str]]:
    """``n`` requests, async and sync handlers in turn; with ``slow_every``, every that-many-th async
    request is slow (slower than the ``own-*`` scenarios' slow threshold)."""
    out = []
    for i in range(n):
        if i % 2:
            out.append(("GET", f"/v1/sync/{i}"))
        else:
            slow = slow_every and (i // 2) % slow_every == slow_every - 1
            out.append(("POST", f"/v1/score/{i}" + ("?slow=1" if slow else "")))
    return out


def _attrs(attrs: Any) -> dict[str, Any]:
    return {k: v for k, v in dict(attrs or {}).items() if k.startswith("stagescope.") or k == "http.route"}


def from_sdk(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    out = []
    for s in spans:
        assert s.context is not None
        out.append(
            {
                "trace": f"{s.context.trace_id:032x}",
                "span": f"{s.context.span_id:016x}",
                "parent": f"{s.parent.span_id:016x}" if s.parent is not None else "",
                "kind": s.kind.name,
                "name": s.name,
                "scope": s.instrumentation_scope.name if s.instrumentation_scope else "",
                "attrs": _attrs(s.attributes),
            }
        )
    return out


def from_sink(directory: Path) -> list[dict[str, Any]]:
    """Spans of an embedded-sink (OTLP/JSON lines) directory, in the same form."""
    out = []
    for f in sorted(directory.glob("spans-*.jsonl")):
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        attrs = {}
                        for a in s.get("attributes", []):
                            attrs[a["key"]] = next(iter(a["value"].values()), None)
                        out.append(
                            {
                                "trace": s["traceId"],
                                "span": s["spanId"],
                                "parent": s.get("parentSpanId", ""),
                                "kind": KINDS[int(s.get("kind", 0))],
                                "name": s["name"],
                                "scope": ss.get("scope", {}).get("name", ""),
                                "attrs": _attrs(attrs),
                            }
                        )
    return out


def user_provider(workdir: Path) -> dict[str, Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    files = JsonLinesSpanExporter(workdir / "user-export")  # what the user's own backend would get
    provider.add_span_processor(SimpleSpanProcessor(files))
    trace.set_tracer_provider(provider)
    out: dict[str, Any] = {}
    for mode in ("fast", "otel-fastapi"):
        for dest in ("none", "sink"):
            name = f"{mode}/{dest}"
            sink = workdir / name.replace("/", "-")
            app = make_app()
            handle = stagescope.instrument_app(
                app, service_name="scorer", mode=mode, registry=CollectorRegistry(), baseline_sample=1.0,
                spans_dir=sink if dest == "sink" else None,
            )  # fmt: skip
            asyncio.run(serve_and_call(app, paths_for(REQUESTS)))
            handle.force_flush(10)
            uninstrument_app(app)
            provider.force_flush()
            out[name] = {
                "provider": from_sdk(list(memory.get_finished_spans())),
                "sink": from_sink(sink) if dest == "sink" else [],
                "delivers_to_user_provider": handle.tracer_provider is provider,
            }
            memory.clear()
    files.force_flush()
    out["user_export_dir"] = str(workdir / "user-export")
    return out


def own_provider(workdir: Path, mode: str) -> dict[str, Any]:
    sink = workdir / "sink"
    app = make_app()
    handle = stagescope.instrument_app(  # sampling from OTEL_TRACES_SAMPLER, as the test sets it
        app, service_name="scorer", mode=mode, registry=CollectorRegistry(), spans_dir=sink,
        slow_threshold_ms=SLOW_MS,
    )  # fmt: skip
    trace.set_tracer_provider(handle.tracer_provider)  # the user's one line: their spans go with ours
    paths = paths_for(4 * REQUESTS, slow_every=2)
    asyncio.run(serve_and_call(app, paths))
    handle.force_flush(10)
    uninstrument_app(app)
    slow = sum(p.endswith("slow=1") for _, p in paths)
    return {mode: {"sink": from_sink(sink), "requests": len(paths), "slow": slow}, "sink_dir": str(sink)}


def auto_instrumented(mode: str) -> dict[str, Any]:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), f"opentelemetry-instrument set no SDK provider: {provider}"
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    app = make_app()
    handle = stagescope.instrument_app(
        app, service_name="scorer", mode=mode, registry=CollectorRegistry(), baseline_sample=1.0
    )
    asyncio.run(serve_and_call(app, paths_for(REQUESTS)))
    handle.force_flush(10)
    provider.force_flush()
    return {
        mode: {
            "provider": from_sdk(list(memory.get_finished_spans())),
            "delivers_to_user_provider": handle.tracer_provider is provider,
            "app_class": f"{type(app).__module__}.{type(app).__qualname__}",
        }
    }


def main() -> None:
    scenario, out_path, workdir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    import fastapi
    import starlette

    if scenario == "user-provider":
        result = user_provider(workdir)
    elif scenario.startswith("own-"):
        result = own_provider(workdir, scenario.removeprefix("own-"))
    elif scenario.startswith("auto-"):
        result = auto_instrumented(scenario.removeprefix("auto-"))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    result["versions"] = {"fastapi": fastapi.__version__, "starlette": starlette.__version__}
    out_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
