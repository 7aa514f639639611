"""Run a llama.cpp scenario: ``replicas`` llama-servers behind the instrumented gateway, until SIGINT.

::

    python -m stagescope.service.llama_cpp.serve --scenario llama-long-prompts [--apply-lever] \\
        [--set parallel=8] [--pin] --port 8000 --spans-out DIR [--baseline-sample 1]
    python -m stagescope.service.llama_cpp.serve --upstream http://127.0.0.1:8080 --slots 4 --port 8000 ...

Builds (or finds cached) ``llama-server`` and the random-weight model first, starts the servers with
the scenario's settings (and its lever's setting change with ``--apply-lever``, then ``--set``
last), waits until each answers ``/health``, then serves the gateway (uvicorn) on ``--port``: the
OpenAI API on ``/v1/completions`` and ``/v1/chat/completions``, ``/readyz``, ``/metrics``. The
servers' logs go to ``--log-dir`` (default: beside ``--spans-out``). SIGINT or SIGTERM stops the
gateway (its span sink flushes) and then the servers. With ``--upstream URL`` (repeatable) the gateway
fronts servers that already run (your own ``llama-server --parallel N``, or any OpenAI-compatible
server) with ``--slots N`` each, and starts none. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stagescope.errors import EXIT_USAGE, UserError

__all__ = ["main", "measured_cpu", "measured_service", "parse_assignments", "scenario_config"]


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings into a dict; a malformed one is a UserError."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def scenario_config(name: str, *, apply_lever: bool, overrides: dict[str, Any] | None = None) -> Any:
    """The :class:`EngineConfig` of scenario ``name`` (with its lever when ``apply_lever``), then ``overrides``."""
    from stagescope.service.llama_cpp.scenarios import get_scenario
    from stagescope.service.llama_cpp.server import EngineConfig

    sc = get_scenario(name)
    if apply_lever and sc.lever is None:
        raise UserError(f"scenario {name!r} has no lever to apply (it does not breach its SLO)")
    cfg = EngineConfig().with_overrides(sc.overrides)
    if apply_lever:
        cfg = cfg.with_overrides(sc.lever_overrides)
    return cfg.with_overrides(overrides or {})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stagescope.service.llama_cpp.serve", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", help="a llama.cpp scenario (stagescope.service.llama_cpp.scenarios)")
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="front this already running server instead of starting llama-servers (repeatable)")
    p.add_argument("--slots", type=int, default=None, help="with --upstream: slots per server (its --parallel)")
    p.add_argument("--apply-lever", action="store_true", help="apply the scenario's lever (its setting change)")
    p.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                   help="override an engine setting (parallel, batch_size, ubatch_size, replicas, threads, ctx_per_slot)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="the gateway's port (0 picks a free one)")
    p.add_argument("--spans-out", metavar="DIR", default=None, help="the gateway's span sink folder")
    p.add_argument("--log-dir", metavar="DIR", default=None, help="llama-server logs (default: beside --spans-out)")
    p.add_argument("--slow-threshold-ms", type=float, default=None)
    p.add_argument("--baseline-sample", type=float, default=None)
    p.add_argument("--measured-service", dest="measured", action="append", default=[], metavar="VARIANT=SECONDS",
                   help="one request's measured service time with every slot busy (variant serving, or a lever "
                        "such as scale-out; VARIANT@OWN+OTHERS: with OWN busy slots on its server and OTHERS on "
                        "the other servers), exported for the analysis' scale-out model (repeatable)")
    p.add_argument("--measured-cpu", dest="measured_cpu", action="append", default=[], metavar="KEY=CORES",
                   help="the cores (CPU s / wall s) the server got in a --measured-service measurement of the same "
                        "key, exported for the scale-out model's CPU budget (repeatable)")
    p.add_argument("--pin", action="store_true",
                   help="pin each llama-server to cores of its own, where the cores this process may use hold "
                        "--threads for every server (server.placement); the gateway is not pinned")
    p.add_argument("--print-config", action="store_true", help="print the engine settings as JSON and exit")
    return p  # fmt: skip


def measured_service(items: list[str]) -> dict[str, float]:
    """``VARIANT=SECONDS`` (or ``VARIANT@OWN+OTHERS=SECONDS``) strings into a dict; a malformed one or a
    time that is not a positive number of seconds is a UserError."""
    return _positive_by_key(items, "--measured-service", "seconds")


def measured_cpu(items: list[str]) -> dict[str, float]:
    """``KEY=CORES`` strings (keys as for :func:`measured_service`) into a dict; a malformed key or a share
    that is not a positive number of cores is a UserError."""
    return _positive_by_key(items, "--measured-cpu", "cores")


def _positive_by_key(items: list[str], flag: str, unit: str) -> dict[str, float]:
    """``KEY=NUMBER`` strings, each key an occupancy key, each number positive and finite, into a dict."""
    from stagescope.service.llama_cpp.slot_probe import parse_occupancy_key

    out: dict[str, float] = {}
    for key, value in parse_assignments(items).items():
        parse_occupancy_key(key)  # a UserError if malformed
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not 0.0 < number < float("inf"):
            raise UserError(f"{flag} {key}= must be a positive number of {unit}, got {value!r}")
        out[key] = number
    return out


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from stagescope.service.llama_cpp.build import ensure_server
    from stagescope.service.llama_cpp.gateway import create_gateway_app
    from stagescope.service.llama_cpp.gguf_model import ensure_model
    from stagescope.service.llama_cpp.server import LlamaServer, placement

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    if args.baseline_sample is not None and not 0.0 <= args.baseline_sample <= 1.0:
        raise UserError(f"--baseline-sample must be between 0 and 1, got {args.baseline_sample:g}")
    measured = measured_service(args.measured)
    cpu = measured_cpu(args.measured_cpu)
    if args.upstream:
        return _front(args, measured, cpu)
    if not args.scenario:
        raise UserError("give --scenario NAME (start llama-servers) or --upstream URL --slots N (front running ones)")
    cfg = scenario_config(args.scenario, apply_lever=args.apply_lever, overrides=parse_assignments(args.assignments))
    if args.print_config:
        print(json.dumps(cfg.__dict__, indent=2))
        return 0
    build = ensure_server()
    model = ensure_model(build.vocab())
    log_dir = Path(args.log_dir) if args.log_dir else (Path(args.spans_out).parent if args.spans_out else Path("."))
    servers: list[LlamaServer] = []
    cpus = placement(cfg.replicas, cfg.threads) if args.pin else None
    try:
        for i in range(cfg.replicas):
            servers.append(LlamaServer(build.server, model.path, cfg, log=log_dir / f"llama-server-{i}.log",
                                       cpus=cpus[i] if cpus else None))  # fmt: skip
        for s in servers:
            s.wait_ready()
        pinned = ("pinned to cores " + ", ".join("+".join(map(str, sorted(c))) for c in cpus)
                  if cpus else "not pinned")  # fmt: skip
        print(f"llama.cpp: {cfg.replicas} llama-server(s) ready ({' '.join(s.url for s in servers)}, {pinned}); model "
              f"{model.path.name} (RANDOM WEIGHTS: real compute, meaningless text); settings {cfg.__dict__}",
              flush=True)  # fmt: skip
        app = create_gateway_app(
            [s.url for s in servers], cfg.parallel, spans_dir=args.spans_out,
            slow_threshold_ms=args.slow_threshold_ms, baseline_sample=args.baseline_sample,
            measured_service_s=measured, measured_cpu_cores=cpu,
            engine_pids={i: s.proc.pid for i, s in enumerate(servers)},
        )  # fmt: skip
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        for s in servers:
            s.stop()
    return 0


def _front(args: argparse.Namespace, measured: dict[str, float], cpu: dict[str, float]) -> int:
    import uvicorn

    from stagescope.service.llama_cpp.gateway import create_gateway_app

    if args.scenario or args.apply_lever or args.assignments:
        raise UserError("--upstream fronts running servers: --scenario, --apply-lever and --set do not apply")
    if args.slots is None or args.slots < 1:
        raise UserError("--upstream needs --slots N (N >= 1: the slots of each server, its --parallel)")
    for u in args.upstream:
        if not u.startswith(("http://", "https://")):
            raise UserError(f"--upstream must be an http(s) URL, got {u!r}")
    app = create_gateway_app(args.upstream, args.slots, spans_dir=args.spans_out,
                             slow_threshold_ms=args.slow_threshold_ms, baseline_sample=args.baseline_sample,
                             measured_service_s=measured, measured_cpu_cores=cpu)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _serve(args)
    except UserError as exc:
        print(f"llama.cpp serve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
