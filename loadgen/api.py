"""Library API of the load generator: build a schedule, run it open-loop, get results and a summary.

>>> schedule = build_schedule(trace="external/llm_traces/azure2023/AzureLLMInferenceTrace_conv.csv",
...                           rate=20.0, duration_s=30.0)                      # doctest: +SKIP
>>> run = await run_load("http://127.0.0.1:8000", schedule, out="out/results.parquet",
...                      spans_dir="out/spans")                                # doctest: +SKIP
>>> run.summary.latency_ms["p99"]                                              # doctest: +SKIP

:func:`load` is the same from synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

from stagescope.errors import UserError
from stagescope.loadgen.bodies import (
    BODYLESS_METHODS,
    GENERATE_ROUTE,
    METHODS,
    PREDICT_ROUTE,
    BodyFactory,
    NoBody,
)
from stagescope.loadgen.openai_api import APIS, default_template, discover_model, endpoint_path, infer_api
from stagescope.loadgen.results import (
    RequestResult,
    Summary,
    check_writable,
    results_table,
    summarize,
    write_results,
)
from stagescope.loadgen.runner import Engine, ProgressSnapshot
from stagescope.loadgen.schedule import MAX_DURATION_S, Schedule, check_size, synthetic_schedule
from stagescope.loadgen.spans import ClientSpanWriter
from stagescope.loadgen.streams import OpenAIStream
from stagescope.loadgen.template import BodyTemplate
from stagescope.loadgen.traces import read_trace
from stagescope.names import ENV_SPANS_DIR
from stagescope.validate import check_http_url, check_span_destination, connect_error

__all__ = ["LoadRun", "Target", "build_schedule", "check_url", "default_route", "load", "resolve_target", "run_load"]


@dataclass
class LoadRun:
    """What a run produced: per-request results, their Arrow table, the summary, and where they went.

    ``error`` is set when the run could not do its job (the server refused connections); the results
    up to that point are still written.
    """

    results: list[RequestResult]
    table: pa.Table
    summary: Summary
    out: Path | None
    spans_written: int
    error: str | None = None


def build_schedule(
    *,
    rate: float | None = None,
    arrival: str = "poisson",
    duration_s: float | None = None,
    trace: str | os.PathLike[str] | None = None,
    speedup: float | None = None,
    seed: int = 0,
) -> Schedule:
    """A synthetic schedule (``rate`` + ``arrival`` + ``duration_s``) or a trace replay.

    A trace is replayed at ``speedup`` times its real pace, or time-scaled so its mean rate is ``rate``
    (not both), and cut at ``duration_s`` seconds of the (scaled) replay.
    """
    if duration_s is not None and not 0 < duration_s <= MAX_DURATION_S:  # also refuses nan and inf
        raise UserError(f"--duration must be a finite number in (0, {MAX_DURATION_S:g}] s, got {duration_s}")
    if trace is None:
        if rate is None or duration_s is None:
            raise UserError("give --rate and --duration for a synthetic schedule, or --trace PATH")
        if speedup is not None:
            raise UserError("--speedup applies to --trace replays only")
        return synthetic_schedule(rate, duration_s, arrival, seed)
    schedule = read_trace(os.fspath(trace))
    if speedup is not None and rate is not None:
        raise UserError("give either --speedup or --rate for a trace replay, not both")
    if speedup is not None:
        schedule = schedule.scaled(speedup)
    elif rate is not None:
        schedule = schedule.scaled_to_rate(rate)
    schedule = schedule.limited(duration_s)
    check_size(len(schedule), schedule.duration_s, f"the replay of {schedule.source}")
    return schedule


def default_route(schedule: Schedule) -> str:
    """``/v1/generate`` when the schedule has token counts (an LLM trace), else ``/v1/predict``."""
    return GENERATE_ROUTE if schedule.prompt_tokens is not None else PREDICT_ROUTE


@dataclass(frozen=True)
class Target:
    """Where requests go: ``origin`` (``http://host:port``), the request target ``path`` (with any
    query), the ``route`` recorded in the results and CLIENT spans (the path without the query), and
    the ``api`` the responses are read as (None: the reference service's, any SSE or NDJSON stream)."""

    origin: str
    path: str
    route: str
    api: str | None


def resolve_target(url: str, route: str | None, api: str | None, schedule: Schedule) -> Target:
    """The request path: ``route`` when given (it overrides the URL's path); else for an OpenAI ``api``
    the endpoint under the URL's path (:func:`~stagescope.loadgen.openai_api.endpoint_path`); else the
    URL's own path when it has one (``http://host:8000/v1/score`` sends to ``/v1/score``); else
    :func:`default_route`. ``api`` None is inferred from a path ending in ``/completions`` or
    ``/chat/completions``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{url}: not an http(s) URL")
    if api is not None and api not in APIS:
        raise UserError(f"unknown --api {api!r}; use {' or '.join(APIS)}")
    if route is not None:
        if not route.startswith("/"):
            raise UserError(f"--route must start with '/', got {route!r}")
        path = route
    elif api is not None:
        path = endpoint_path(parts.path, api)
    elif parts.path not in ("", "/"):
        path = parts.path
    else:
        path = default_route(schedule)
    named = infer_api(path)
    if api is None:
        api = named
    elif named not in (None, api):
        raise UserError(f"--route {path} is the {named} endpoint, not {api}'s")
    base, _, query = path.partition("?")
    if not query and route is None:
        query = parts.query  # the URL's query string travels with its path
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Target(f"{parts.scheme}://{parts.hostname}:{port}", base + (f"?{query}" if query else ""), base, api)


async def check_url(url: str, timeout_s: float = 3.0) -> None:
    """Raise :class:`UserError` (one line) unless a TCP connection to ``url``'s host and port opens."""
    check_http_url(url, "--url")
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
    except TimeoutError:
        raise UserError(f"{url}: no answer to a connection attempt within {timeout_s:g} s") from None
    except OSError as exc:
        raise UserError(f"{url}: {connect_error(exc)}") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _spans_enabled(spans_dir: str | os.PathLike[str] | None) -> bool:
    return spans_dir is not None or bool(
        os.environ.get(ENV_SPANS_DIR)
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


async def run_load(
    url: str,
    schedule: Schedule,
    *,
    route: str | None = None,
    concurrency_cap: int | None = None,
    out: str | os.PathLike[str] | None = None,
    spans_dir: str | os.PathLike[str] | None = None,
    span_writer: ClientSpanWriter | None = None,
    progress: Callable[[ProgressSnapshot], None] | None = None,
    stop: asyncio.Event | None = None,
    timeout_s: float = 60.0,
    grace_s: float = 5.0,
    repeat_share: float = 0.0,
    predict_dim: int = 16,
    stream: bool = True,
    seed: int = 0,
    headers: Mapping[str, str] | None = None,
    check_connect: bool = True,
    realtime: bool = False,
    api: str | None = None,
    body: BodyTemplate | str | os.PathLike[str] | None = None,
    model: str | None = None,
    prompt_tokens: int = 128,
    output_tokens: int = 32,
    method: str = "POST",
) -> LoadRun:
    """Drive ``url`` open-loop with ``schedule``; write ``out`` (Parquet) and CLIENT spans; summarize.

    ``url`` and ``route``: see :func:`resolve_target` (a full URL's path is the route; ``route``
    overrides it). ``api``: ``"openai-completions"`` or ``"openai-chat"`` (default: inferred from the
    path), see :mod:`stagescope.loadgen.openai_api`; ``model`` is sent as its ``model`` (default: the
    first of the server's ``GET /v1/models``). ``body``: a :class:`BodyTemplate` or a template file
    (:mod:`stagescope.loadgen.template`) instead of the default bodies; ``prompt_tokens`` and
    ``output_tokens`` are the sizes of requests whose schedule has none. ``spans_dir``: where the
    embedded sink writes CLIENT spans (default ``$STAGESCOPE_SPANS_DIR``; OTLP/HTTP when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; no spans when none of these is given). ``progress`` is
    called about every 0.25 s from the event loop. Setting ``stop`` ends sending early; what was
    recorded is still written. ``check_connect``: fail fast with :class:`UserError` if the server
    refuses connections before anything is sent. ``realtime``: run the sender and event-loop threads
    under SCHED_FIFO (see :mod:`stagescope.loadgen.runner`; needs root or CAP_SYS_NICE). ``method``:
    the HTTP method (:data:`METHODS`); GET, HEAD and DELETE send no body unless ``body`` gives one.
    """
    method = method.upper() if isinstance(method, str) else method
    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    target = resolve_target(url, route, api, schedule)
    if target.api is not None and method != "POST":
        raise UserError(f"--api {target.api} sends POST requests (the OpenAI API's), not {method}")
    template = body if isinstance(body, BodyTemplate) or body is None else BodyTemplate.from_file(body)
    if not 0.0 <= repeat_share <= 1.0:
        raise UserError(f"--repeat-share must be within [0, 1], got {repeat_share}")
    if concurrency_cap is not None and concurrency_cap < 1:
        raise UserError(f"--concurrency-cap must be at least 1, got {concurrency_cap}")
    if not 0 < timeout_s < float("inf"):
        raise UserError(f"--timeout must be a finite number of seconds > 0, got {timeout_s}")
    if out is not None:
        check_writable(os.fspath(out))
    for name, n in (("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if n < 1:
            raise UserError(f"{name} must be at least 1, got {n}")
    hdrs = dict(headers or {})
    if target.api is not None and os.environ.get("OPENAI_API_KEY") and not any(
        k.lower() == "authorization" for k in hdrs
    ):
        hdrs["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    if span_writer is None and _spans_enabled(spans_dir):
        check_span_destination(spans_dir, "client spans")
        from stagescope.instrumentation.lifecycle import resolve_shutdown_timeout

        try:
            resolve_shutdown_timeout()  # the exporter of the CLIENT spans reads it after the run
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if target.api is None and template is not None and "model" in template.names and model is None:
        raise UserError(f"{template.source} uses {{{{model}}}}: give --model NAME")  # known before connecting
    if check_connect:
        await check_url(target.origin)
    if target.api is not None and model is None and (template is None or "model" in template.names):
        model = await discover_model(target.origin, target.path, target.api, hdrs)
    if template is None and target.api is not None:
        template = default_template(target.api, model)
    if template is not None and "model" in template.names and model is None:
        raise UserError(f"{template.source} uses {{{{model}}}}: give --model NAME")
    bodies = BodyFactory(
        target.route,
        prompt_tokens=schedule.prompt_tokens,
        output_tokens=schedule.output_tokens,
        hash_ids=schedule.hash_ids,
        block_tokens=schedule.block_tokens,
        stream=stream,
        predict_dim=predict_dim,
        repeat_share=repeat_share,
        seed=seed,
        template=template,
        model=model,
        default_prompt_tokens=prompt_tokens,
        default_output_tokens=output_tokens,
    )
    bodyless = method in BODYLESS_METHODS and template is None
    engine = Engine(
        target.origin,
        target.route,
        schedule,
        NoBody(bodies) if bodyless else bodies,
        method=method,
        content_type=not bodyless,
        path=target.path,
        stream=OpenAIStream if target.api is not None else None,
        concurrency_cap=concurrency_cap,
        timeout_s=timeout_s,
        grace_s=grace_s,
        progress=progress,
        headers=hdrs,
        realtime=realtime,
    )
    try:
        results = await engine.run(stop)
    finally:
        # whatever happens, what was recorded is written
        results = engine.results
        table = results_table(results)
        written = write_results(table, os.fspath(out)) if out is not None else None
    covered = (
        schedule.duration_s if engine.stopped_early is None else min(schedule.duration_s, engine.elapsed_s)
    )
    summary = summarize(
        results,
        url=target.origin,
        route=target.route,
        source=schedule.source,
        target_rate_rps=schedule.target_rate_rps,
        schedule_rate_rps=schedule.rate_rps,
        api=target.api,
        model=model,
        duration_s=covered,
        scheduled=len(schedule),
        stopped_early=engine.stopped_early,
        concurrency_cap=concurrency_cap,
        realtime=engine.realtime_active,
    )
    n_spans = 0
    if span_writer is not None or _spans_enabled(spans_dir):
        writer = span_writer or ClientSpanWriter(target.origin, spans_dir=spans_dir, method=method)
        try:
            n_spans = writer.write(results)
        finally:
            if span_writer is None:
                writer.close()
    error = (
        engine.stopped_early if engine.stopped_early and engine.stopped_early != "stopped by user" else None
    )
    return LoadRun(results, table, summary, written, n_spans, error)


def load(url: str, schedule: Schedule, **kwargs: object) -> LoadRun:
    """Synchronous :func:`run_load` (runs its own event loop)."""
    return asyncio.run(run_load(url, schedule, **kwargs))  # type: ignore[arg-type]
