"""Prometheus text exposition that keeps dcgm-exporter's counter names, and the HTTP endpoint.

prometheus_client's ``generate_latest`` writes every counter family as ``NAME_total``. dcgm-exporter
(Go, client_golang) writes its counters under their bare names (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``),
and dashboards query those names. :func:`generate_text` writes a counter family under the name its
samples carry: bare when the collector added samples named like the family, ``NAME_total`` when they
carry the suffix (stagescope's own counters). Everything else follows the text format 0.0.4.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE", "generate_text", "serve"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger(__name__)


def _escape_value(v: str) -> str:
    if "\\" not in v and "\n" not in v and '"' not in v:
        return v
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def generate_text(registry: Collector) -> bytes:
    """Text exposition of ``registry`` (any object with ``collect()``), counters named as emitted."""
    out: list[str] = []
    label_text: dict[tuple[tuple[str, str], ...], str] = {}  # a GPU's label set repeats in every family
    for metric in registry.collect():
        mtype = metric.type
        name = metric.name
        if mtype == "counter" and not any(s.name == name for s in metric.samples):
            name = name + "_total"
        if mtype == "unknown":
            mtype = "untyped"
        helptext = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {helptext}\n# TYPE {name} {mtype}\n")
        for s in metric.samples:
            if s.labels:
                key = tuple(s.labels.items())
                lab = label_text.get(key)
                if lab is None:
                    lab = label_text[key] = ",".join(f'{k}="{_escape_value(v)}"' for k, v in key)
                out.append(f"{s.name}{{{lab}}} {floatToGoString(s.value)}\n")
            else:
                out.append(f"{s.name} {floatToGoString(s.value)}\n")
    return "".join(out).encode("utf-8")


def serve(registry: Collector, host: str = "127.0.0.1", port: int = 9400) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (and ``/`` with a pointer to it) on ``host:port`` from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] in ("/metrics", "/metrics/"):
                try:
                    body, ctype, code = generate_text(registry), CONTENT_TYPE, 200
                except Exception as exc:  # never let a scrape take the exporter down
                    log.exception("scrape failed")
                    body, ctype, code = f"scrape failed: {exc}\n".encode(), "text/plain", 500
            elif self.path == "/":
                body, ctype, code = b"stagescope gpu-exporter: see /metrics\n", "text/plain", 200
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: Prometheus scrapes often
            log.debug(format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="stagescope-gpu-http", daemon=True).start()
    return server
