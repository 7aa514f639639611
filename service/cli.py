"""``stagescope serve``: run the reference inference service under uvicorn.

::

    stagescope serve --scenario slow-feature-store --port 8000 --spans-out out/spans
    stagescope serve --scenario saturated --apply-lever          # with the lever's setting change
    stagescope serve --set max_batch_size=8 --set executors=2    # any setting, see --list-settings
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stagescope import validate as V
from stagescope.errors import UserError

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the reference inference service (FastAPI + uvicorn) in a named fault scenario",
        description="Run the reference inference service, instrumented with stagescope, in a named scenario.",
    )
    p.add_argument("--scenario", default="healthy", help="scenario name (default: healthy; see --list-scenarios)")
    p.add_argument("--apply-lever", action="store_true", help="apply the scenario's lever (its setting change)")
    p.add_argument("--backend", choices=("simulated", "numpy", "torch", "onnx"), default=None,
                   help="model backend: simulated accelerator (default), numpy (real CPU compute), torch, or onnx "
                        "(a real digits classifier on ONNX Runtime with its own scenarios; the onnx extra)")
    p.add_argument("--host", default="127.0.0.1", type=V.host, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=V.port(), default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--spans-out", metavar="DIR", default=None,
                   help="write spans as OTLP/JSON lines into DIR (embedded sink)")
    p.add_argument("--feature-store", metavar="URL", default=None,
                   help="'memory' (default, simulated latency) or redis://host:port/db (real Redis)")
    p.add_argument("--set", dest="assignments", action="append", metavar="KEY=VALUE", default=[],
                   help="override one setting (repeatable), e.g. --set max_batch_size=8")
    p.add_argument("--slow-threshold-ms", type=V.number(0, 3_600_000), default=None,
                   help="keep every trace slower than this (default: the instrumentation's)")
    p.add_argument("--baseline-sample", type=V.number(0, 1), default=None,
                   help="share of the other traces kept (default: the instrumentation's; 1 keeps all)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")
    p.add_argument("--list-settings", action="store_true", help="print the effective settings and exit")
    p.set_defaults(func=run)


def _bind(host: str, port: int) -> Any:
    """The listening socket, made here so a busy port is one clear line before the app is built.

    Made with ``IPPROTO_TCP`` (not protocol 0) and ``TCP_NODELAY``: asyncio sets ``TCP_NODELAY`` on an
    accepted connection only when its socket says IPPROTO_TCP, and without it Nagle's algorithm holds
    a response's body until the client ACKs its headers, which a client delays by up to 40 ms
    (delayed ACK): every keep-alive response after the first took about 40 ms longer.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if port and exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise UserError(f"port {port} on {host} is already in use") from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _check_telemetry(args: argparse.Namespace) -> None:
    """The instrumentation's configuration (arguments, then ``STAGESCOPE_*`` and ``OTEL_*`` variables),
    checked before the port is bound: one line naming the variable, not a traceback at start-up."""
    import os

    from stagescope import names
    from stagescope.instrumentation.app import MODES
    from stagescope.instrumentation.sampling import SamplingPolicy

    mode = os.environ.get(names.ENV_INSTRUMENTATION_MODE, "").strip()
    if mode and mode not in MODES:
        raise UserError(f"{names.ENV_INSTRUMENTATION_MODE}={mode!r}: expected one of {', '.join(MODES)}")
    from stagescope.instrumentation.lifecycle import resolve_shutdown_timeout

    try:
        SamplingPolicy.resolve(slow_threshold_ms=args.slow_threshold_ms, baseline_sample=args.baseline_sample)
        resolve_shutdown_timeout()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    V.check_span_destination(args.spans_out, "spans there")


def run(args: argparse.Namespace) -> int:
    import json

    from stagescope.service.engines import engine_for_backend, get_engine
    from stagescope.service.scenarios import settings_for
    from stagescope.service.settings import parse_assignments

    engine = engine_for_backend(args.backend or "simulated")
    overrides: dict[str, Any] = parse_assignments(args.assignments)
    if args.list_scenarios:
        for sc in engine.scenarios.values():
            print(f"{sc.name:22} {sc.route:13} {sc.rate_rps:5.0f}/s  {sc.slo_spec:15} "
                  f"{sc.true_stage or '-':14} {sc.lever or '-':22} {sc.description}")  # fmt: skip
        return 0
    if args.backend is not None:
        overrides["backend"] = args.backend
    if args.feature_store is not None:
        overrides["feature_store"] = args.feature_store
    engine.get_scenario(args.scenario)  # an unknown name is one line naming the engine's scenarios
    settings = settings_for(args.scenario, apply_lever=args.apply_lever, overrides=overrides, scenarios=engine.scenarios)
    if settings.backend == "onnx":  # one line naming the missing packages, before anything starts
        get_engine("onnx").check_available()
    if args.list_settings:
        print(json.dumps(settings.to_dict(), indent=2, sort_keys=True))
        return 0
    _check_telemetry(args)

    sock = _bind(args.host, args.port)
    import uvicorn

    from stagescope.service.app import create_app

    app = create_app(
        settings, spans_dir=args.spans_out, slow_threshold_ms=args.slow_threshold_ms,
        baseline_sample=args.baseline_sample,
    )  # fmt: skip
    host, port = sock.getsockname()[:2]
    lever = " with its lever applied" if args.apply_lever else ""
    accel = {"simulated": " (SIMULATED accelerator)", "onnx": " (ONNX Runtime, real model)"}.get(settings.backend, "")
    print(
        f"stagescope serve: scenario {args.scenario}{lever}, backend {settings.backend}{accel}, "
        f"listening on http://{host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0
