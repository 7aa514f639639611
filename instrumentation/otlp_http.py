"""OTLP/HTTP (binary protobuf) trace client: one POST per batch, and what the answer means for a retry.

:class:`OtlpHttpClient` sends ``ExportTraceServiceRequest`` bodies to a collector and classifies the
answer the way the OTLP specification does (``opentelemetry-proto`` ``docs/specification.md``,
"OTLP/HTTP Response" and "OTLP/HTTP Throttling"):

* ``200``: accepted; a ``partial_success`` with ``rejected_spans`` is accepted-but-rejected data that
  must not be retried;
* ``429``, ``502``, ``503``, ``504``: retryable; a ``Retry-After`` header (seconds or an HTTP date)
  gives the wait, else the caller backs off exponentially with jitter;
* every other ``4xx``/``5xx``: not retryable (``400`` means bad data);
* no answer (refused, reset, closed without a response, timed out): retryable.

The retry loop itself lives in :class:`~stagescope.instrumentation.export.BackgroundSpanExporter`,
off the request path. Configuration is the standard environment (read when the client is built):
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as is) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces``
appended), ``..._HEADERS`` (``k=v,k2=v2``, URL-encoded values), ``..._COMPRESSION`` (``gzip``,
``deflate`` or ``none``), ``..._CERTIFICATE``, ``..._CLIENT_KEY`` and ``..._CLIENT_CERTIFICATE`` for TLS,
``..._TIMEOUT`` in seconds as the Python SDK reads it (the specification says milliseconds). Proxies
are not read from the environment.

One keep-alive connection, with ``TCP_NODELAY`` set (headers and body leave at once; Nagle's algorithm
would hold the second segment until the collector's delayed ACK). :meth:`OtlpHttpClient.abort` shuts
the socket of a request in flight from another thread, so a stop never waits out a hanging collector.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import logging
import math
import os
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "RETRYABLE_STATUS",
    "OtlpHttpClient",
    "OtlpHttpConfig",
    "SendOutcome",
    "parse_retry_after",
]

_log = logging.getLogger(__name__)

#: HTTP status codes the OTLP specification lists as retryable; every other 4xx/5xx is not.
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
DEFAULT_TIMEOUT_S = 2.0
_DEFAULT_ENDPOINT = "http://localhost:4318/"
_TRACES_PATH = "v1/traces"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110: delay-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _env(signal_name: str, name: str) -> str:
    return (os.environ.get(signal_name) or os.environ.get(name) or "").strip()


@dataclass(frozen=True)
class OtlpHttpConfig:
    """Where and how to send: the URL of the traces endpoint, headers, timeout (s), compression, TLS files."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str = "none"
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> OtlpHttpConfig:
        """The standard ``OTEL_EXPORTER_OTLP_[TRACES_]*`` variables; ``timeout_s`` when the env sets none."""
        from opentelemetry.util.re import parse_env_headers

        url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not url:
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_ENDPOINT
            url = f"{base.rstrip('/')}/{_TRACES_PATH}"
        raw_timeout = _env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        timeout = timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S
        if raw_timeout:  # as the OpenTelemetry SDK does: a bad value is logged and the default used
            try:
                value = float(raw_timeout)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and value > 0:
                timeout = value
            else:
                _log.warning("OTEL_EXPORTER_OTLP_TIMEOUT=%r is not a positive number of seconds; using %g s",
                             raw_timeout, timeout)  # fmt: skip
        compression = (
            _env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION").lower() or "none"
        )
        if compression not in ("none", "gzip", "deflate"):
            _log.warning("OTEL_EXPORTER_OTLP_COMPRESSION=%r is not gzip, deflate or none; sending uncompressed",
                         compression)  # fmt: skip
            compression = "none"
        headers = dict(
            parse_env_headers(
                _env("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"), liberal=True
            )
        )
        return cls(
            url=url,
            headers=headers,
            timeout_s=timeout,
            compression=compression,
            certificate=_env("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
            or None,
            client_key=_env("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY") or None,
            client_certificate=_env(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
            )
            or None,
        )


@dataclass(frozen=True)
class SendOutcome:
    """What one POST came to: ``ok`` (``rejected`` spans of it refused for good), else ``retryable`` or not,
    with the collector's ``retry_after_s`` when it gave one, and a one-line ``detail`` for the log."""

    ok: bool
    retryable: bool = False
    retry_after_s: float | None = None
    rejected: int = 0
    status: int | None = None
    detail: str = ""


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class OtlpHttpClient:
    """Sends encoded span batches to one OTLP/HTTP traces endpoint (see the module docstring).

    Used from one thread (the exporter's); :meth:`abort` may be called from any other.
    """

    def __init__(self, config: OtlpHttpConfig) -> None:
        self.config = config
        parts = urlsplit(config.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP endpoint must be an http:// or https:// URL, got {config.url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": "stagescope-otlp-http",
            **dict(config.headers),
        }
        if config.compression != "none":
            self._headers["Content-Encoding"] = config.compression
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(cafile=config.certificate)
            if config.client_certificate:
                self._ssl.load_cert_chain(config.client_certificate, config.client_key)
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self.config.url

    def encode(self, spans: Sequence[Any]) -> bytes:
        """The protobuf ``ExportTraceServiceRequest`` of ReadableSpans, compressed as configured."""
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        body = encode_spans(spans).SerializePartialToString()
        if self.config.compression == "gzip":
            return gzip.compress(body, compresslevel=6)
        if self.config.compression == "deflate":
            return zlib.compress(body)
        return body

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            if self._https:
                conn = _NoDelayHTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._ssl)
            else:
                conn = _NoDelayHTTPConnection(self._host, self._port, timeout=timeout_s)
            with self._lock:
                self._conn = conn
        else:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
        return conn

    def send(self, body: bytes, timeout_s: float | None = None) -> SendOutcome:
        """POST one encoded batch; never raises. ``timeout_s`` bounds connect and each read (s)."""
        timeout = (
            self.config.timeout_s if timeout_s is None else max(0.001, min(timeout_s, self.config.timeout_s))
        )
        try:
            conn = self._connection(timeout)
            conn.request("POST", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            detail = "timed out" if isinstance(exc, TimeoutError | socket.timeout) else (
                os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else (str(exc) or type(exc).__name__)
            )  # fmt: skip
            return SendOutcome(ok=False, retryable=True, detail=detail)
        status = resp.status
        if resp.will_close:
            self.close()
        if 200 <= status < 300:
            return SendOutcome(ok=True, status=status, rejected=_rejected_spans(payload))
        retryable = status in RETRYABLE_STATUS
        wait = parse_retry_after(resp.getheader("Retry-After")) if retryable else None
        return SendOutcome(
            ok=False, retryable=retryable, retry_after_s=wait, status=status,
            detail=f"HTTP {status} {resp.reason}".rstrip(),
        )  # fmt: skip

    def abort(self) -> None:
        """Shut the socket of a request in flight (from another thread): its ``send`` returns at once."""
        with self._lock:
            conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _rejected_spans(payload: bytes) -> int:
    """``partial_success.rejected_spans`` of an ``ExportTraceServiceResponse`` (0 when absent or unreadable)."""
    if not payload:
        return 0
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        resp = ExportTraceServiceResponse.FromString(payload)
    except Exception:
        return 0
    return int(resp.partial_success.rejected_spans) if resp.HasField("partial_success") else 0
