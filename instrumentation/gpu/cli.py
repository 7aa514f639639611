"""``stagescope gpu-exporter``: serve GPU metrics under dcgm-exporter's names, sampled sub-second."""

from __future__ import annotations

import argparse
from typing import Any

from stagescope import names
from stagescope import validate as V

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gpu-exporter",
        help="serve NVML GPU metrics with dcgm-exporter's names, sampled every --interval seconds",
        description=(
            "A Prometheus endpoint for every GPU NVML reports: the fields of dcgm-exporter's counters CSV "
            "that NVML can provide (same names, types, units and labels), per-process GPU memory and "
            "utilization, and the max and mean utilization over the last --window seconds sampled every "
            "--interval seconds. Without a GPU or driver it keeps serving "
            f"{names.METRIC_GPU_EXPORTER_UP} 0."
        ),
    )
    p.add_argument(
        "--host", default="127.0.0.1", type=V.host, help="address to listen on (default 127.0.0.1)"
    )
    p.add_argument(
        "--port", type=V.port(), default=9400, help="port to listen on (default 9400, as dcgm-exporter)"
    )
    p.add_argument(
        "--interval",
        type=V.number(0.001, 3600),
        default=0.1,
        help="utilization sampling period in seconds (default 0.1)",
    )
    p.add_argument(
        "--window",
        type=V.number(0.001, 86400),
        default=15.0,
        help="seconds of samples behind the max/mean gauges; set it to the scrape interval (default 15)",
    )
    p.add_argument(
        "--collectors",
        default=None,
        metavar="CSV",
        help="dcgm-exporter counters CSV to publish (default: stagescope's, dcgm-exporter's default list plus NVML extras)",
    )
    p.add_argument(
        "--hostname",
        default=None,
        type=_label,
        help="host label value (default: $NODE_NAME, else this machine's name)",
    )
    p.add_argument(
        "--legacy-hostname-label",
        action="store_true",
        help="write the host label as 'Hostname', as dcgm-exporter releases up to 4.5.3-4.8.2 do, for "
        "dashboards written against them (default: 'hostname', as dcgm-exporter HEAD)",
    )
    p.set_defaults(func=run)


def _label(text: str) -> str:
    """The host label's value: text without control characters (it goes into every sample)."""
    return V.check_text(text, "the hostname", error=argparse.ArgumentTypeError)


def run(args: argparse.Namespace) -> int:
    import logging
    import threading

    from stagescope.errors import UserError
    from stagescope.instrumentation.gpu.collector import GpuCollector
    from stagescope.instrumentation.gpu.exposition import serve
    from stagescope.instrumentation.gpu.fields import (
        GPM_FIELDS,
        LABEL_READERS,
        NOT_PROVIDED,
        READERS,
        SAMPLER_FIELDS,
        load_counters_csv,
    )

    if args.window < args.interval:
        raise UserError(f"--window ({args.window:g} s) must be at least --interval ({args.interval:g} s)")
    V.check_bindable(args.host, args.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("stagescope.gpu-exporter")
    counters = load_counters_csv(args.collectors)
    label = names.DCGM_LABEL_HOSTNAME_LEGACY if args.legacy_hostname_label else names.DCGM_LABEL_HOSTNAME
    collector = GpuCollector(
        counters=counters, hostname=args.hostname, hostname_label=label, interval_s=args.interval,
        window_s=args.window,
    )  # fmt: skip
    skipped = [
        c.name
        for c in counters
        if c.name not in READERS
        and c.name not in LABEL_READERS
        and c.name not in SAMPLER_FIELDS
        and c.name not in GPM_FIELDS
    ]
    if skipped and collector.available:
        log.info(
            "not provided by NVML, omitted: %s",
            ", ".join(f"{n} ({NOT_PROVIDED.get(n, 'no NVML reader')})" for n in skipped),
        )
    try:
        server = serve(collector, args.host, args.port)
    except OSError as exc:
        collector.close()
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    log.info(
        "serving http://%s:%d/metrics (%d GPUs, NVML %s)",
        args.host,
        server.server_port,
        len(collector.gpus),
        "ok" if collector.available else "unavailable",
    )
    try:
        threading.Event().wait()
    finally:
        server.shutdown()
        collector.close()
    return 0
