"""Every knob of the reference inference service, in one dataclass.

Units are in the field names: ``*_ms`` milliseconds, ``*_s`` seconds, ``*_bytes_per_s`` bytes per
second. Scenarios (:mod:`stagescope.service.scenarios`) are sets of overrides of these fields; the
command line adds ``--set key=value``.

The latency model of the SIMULATED accelerator (see :mod:`stagescope.service.backends`):

* a ``/v1/predict`` batch of ``n`` items, each needing ``k`` work units (``items_per_request``, or
  ``heavy_items`` for the ``heavy_share`` of inputs chosen by input hash), takes
  ``launch_ms + per_item_ms * scale * sum(k)`` of device time, ``scale`` = 0.5 when ``quantize``;
* ``executors`` model instances run batches concurrently on ``devices`` simulated devices
  (instance ``i`` on device ``i % devices``); a device shared by several running batches splits its
  time equally between them (processor sharing), so ``executors > devices`` stretches compute;
* an LLM engine step takes ``decode_step_ms + decode_per_seq_ms * running_decodes`` plus, when it
  prefills, ``prefill_launch_ms + prefill_per_token_ms * prefill_tokens``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from stagescope.errors import UserError
from stagescope.validate import check_number, check_text, parse_bool

__all__ = [
    "BACKENDS",
    "BOUNDS",
    "ONNX_MODELS",
    "ORT_OPTIMIZATION_LEVELS",
    "Settings",
    "apply_overrides",
    "check_feature_store_url",
    "parse_assignments",
]

BACKENDS = ("simulated", "numpy", "torch", "onnx")
#: ``ort_optimization`` values (ONNX Runtime graph optimization levels, see service.onnx_backend).
ORT_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
#: ``onnx_model`` values: the models service.onnx_model can build (its MODELS, same names).
ONNX_MODELS = ("digits-mlp", "digits-ink-mlp")
_HOUR_MS = 3_600_000  # whole numbers, so messages print them as such; a float lower bound keeps
_DAY_S = 86_400  # the setting a float


@dataclass(frozen=True)
class Settings:
    """All settings of one service instance (frozen: derive new ones with :func:`apply_overrides`)."""

    # identity
    service_name: str = "stagescope-reference-service"
    model_name: str = "ranker-sim"
    llm_model_name: str = "llm-sim"
    backend: str = "simulated"  # simulated | numpy | torch | onnx
    seed: int = 0

    # feature store: in-process (simulated latency) or Redis (real round trip + injected latency)
    feature_store: str = "memory"  # "memory" or a redis:// URL
    feature_latency_ms: float = 4.0  # median of the lognormal read latency
    feature_latency_sigma: float = 0.3  # lognormal shape (dimensionless)
    feature_slow_prob: float = 0.0  # share of reads that hit the slow path (compaction, cross-zone)
    feature_slow_min_ms: float = 300.0
    feature_slow_max_ms: float = 600.0
    feature_cache: bool = False  # local snapshot of the feature table, refreshed in the background
    feature_cache_refresh_s: float = 30.0
    num_entities: int = 1000
    feature_dim: int = 16

    # preprocessing (real CPU work, GIL-free, on a pool of threads)
    preprocess_cpu_ms: float = 0.3  # CPU milliseconds per request
    preprocess_workers: int = 4  # threads running preprocessing; 1 serializes it

    # dynamic batching and the accelerator
    max_batch_size: int = 16
    max_batch_wait_ms: float = 5.0
    max_queue: int = 512  # waiting items before 429
    executors: int = 4  # model instances running batches concurrently
    devices: int = 4  # simulated devices the instances share
    launch_ms: float = 30.0  # fixed cost of one batch (a ~30 ms forward pass)
    per_item_ms: float = 1.0  # cost of one work unit
    items_per_request: int = 1  # work units of a normal input
    heavy_share: float = 0.0  # share of inputs (by hash) needing heavy_items work units
    heavy_items: int = 48
    quantize: bool = False  # int8 weights: per-unit cost halved
    result_cache: bool = False  # cache results by input hash
    result_cache_size: int = 4096
    model_dim: int = 256  # numpy/torch backends: hidden width of the real model
    onnx_threads: int = 1  # onnx backend: intra_op_num_threads of the session (cores one batch may use)
    ort_optimization: str = "all"  # onnx backend: graph optimization level (ORT's default); compile-runtime
    onnx_model: str = "digits-mlp"  # onnx backend: which built model is served (ONNX_MODELS)

    # model lifecycle
    model_load_s: float = 0.3  # time one model load takes
    model_reload_every_s: float = 0.0  # weight refresh period (0: never), counted from the first request
    prewarm: bool = True  # load a refreshed model beside the live one and swap (no wait on traffic)

    # response
    response_dim: int = 8  # floats in a normal response
    large_response_share: float = 0.0  # share of inputs (by hash) answered with a large response
    large_response_dim: int = 64000
    egress_bytes_per_s: float = 0.0  # SIMULATED client link bandwidth; 0 = unlimited

    # LLM engine (continuous batching)
    prefill_launch_ms: float = 4.0
    prefill_per_token_ms: float = 0.05
    decode_step_ms: float = 8.0
    decode_per_seq_ms: float = 0.3
    max_running: int = 64  # running sequences (prefilling + decoding)
    max_waiting: int = 512  # sequences waiting for admission before 429
    chunked_prefill: bool = False
    prefill_chunk_tokens: int = 256  # per sequence per step when chunked
    default_max_tokens: int = 32
    max_prompt_tokens: int = 32768
    max_new_tokens: int = 4096

    # HTTP
    max_body_bytes: int = 1_048_576

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}; expected one of {', '.join(BACKENDS)}")
        if self.ort_optimization not in ORT_OPTIMIZATION_LEVELS:
            raise UserError(
                f"setting ort_optimization must be one of {', '.join(ORT_OPTIMIZATION_LEVELS)}, "
                f"got {self.ort_optimization!r}"
            )
        if self.onnx_model not in ONNX_MODELS:
            raise UserError(f"setting onnx_model must be one of {', '.join(ONNX_MODELS)}, got {self.onnx_model!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _TEXT:
                check_text(value, f"setting {f.name}")
            elif f.name in BOUNDS:
                lo, hi = BOUNDS[f.name]
                check_number(value, f"setting {f.name}", lo=lo, hi=hi, integral=isinstance(lo, int))
        for name, least in _ZERO_OR_AT_LEAST.items():
            if 0 < getattr(self, name) < least:
                raise UserError(f"setting {name} must be 0 (off) or at least {least:g}, got {getattr(self, name)!r}")
        if self.num_entities * self.feature_dim > _MAX_FEATURE_FLOATS:
            raise UserError(
                f"settings num_entities x feature_dim = {self.num_entities * self.feature_dim} floats; "
                f"at most {_MAX_FEATURE_FLOATS} (the feature table is held in memory)"
            )
        check_feature_store_url(self.feature_store)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: What each numeric setting may be, ``(lowest, highest)``; an ``int`` lowest means a whole number.
#: Every duration is bounded too: ``launch_ms=1e12`` is not a fault scenario, it is a server that
#: never answers. Sizes are bounded by what one process can hold (the feature table, the numpy model
#: of ``model_dim**2`` floats, a response of ``large_response_dim`` floats).
BOUNDS: dict[str, tuple[float, float]] = {
    "seed": (0, 2**63 - 1),
    "feature_latency_ms": (0.0, _HOUR_MS),
    "feature_latency_sigma": (0.0, 5.0),
    "feature_slow_prob": (0.0, 1.0),
    "feature_slow_min_ms": (0.0, _HOUR_MS),
    "feature_slow_max_ms": (0.0, _HOUR_MS),
    "feature_cache_refresh_s": (0.0, _DAY_S),
    "num_entities": (1, 1_000_000),
    "feature_dim": (1, 4096),
    "preprocess_cpu_ms": (0.0, _HOUR_MS),
    "preprocess_workers": (1, 256),
    "max_batch_size": (1, 65_536),
    "max_batch_wait_ms": (0.0, _HOUR_MS),
    "max_queue": (1, 10_000_000),
    "executors": (1, 1024),
    "devices": (1, 1024),
    "launch_ms": (0.0, _HOUR_MS),
    "per_item_ms": (0.0, _HOUR_MS),
    "items_per_request": (1, 100_000),
    "heavy_share": (0.0, 1.0),
    "heavy_items": (1, 100_000),
    "result_cache_size": (1, 10_000_000),
    "model_dim": (1, 8192),
    "onnx_threads": (1, 1024),
    "model_load_s": (0.0, _DAY_S),
    "model_reload_every_s": (0.0, _DAY_S),
    "response_dim": (1, 1 << 24),
    "large_response_share": (0.0, 1.0),
    "large_response_dim": (1, 1 << 24),
    "egress_bytes_per_s": (0.0, 1e12),
    "prefill_launch_ms": (0.0, _HOUR_MS),
    "prefill_per_token_ms": (0.0, _HOUR_MS),
    "decode_step_ms": (0.0, _HOUR_MS),
    "decode_per_seq_ms": (0.0, _HOUR_MS),
    "max_running": (1, 100_000),
    "max_waiting": (1, 10_000_000),
    "prefill_chunk_tokens": (1, 1_000_000),
    "default_max_tokens": (1, 1_000_000),
    "max_prompt_tokens": (1, 10_000_000),
    "max_new_tokens": (1, 1_000_000),
    "max_body_bytes": (1, 1 << 30),
}
#: Periods and rates where 0 means "off" and a tiny value would busy-loop or never finish a response.
_ZERO_OR_AT_LEAST = {"egress_bytes_per_s": 1000.0, "feature_cache_refresh_s": 0.1, "model_reload_every_s": 1.0}
_TEXT = ("service_name", "model_name", "llm_model_name")
_MAX_FEATURE_FLOATS = 50_000_000


def check_feature_store_url(url: str) -> None:
    """``memory`` (or empty), or a Redis URL redis-py reads: ``redis[s]://[:password@]host[:port][/db]``
    with a port in 1-65535 and a whole-number database, or ``unix:///path/to/socket``."""
    if url in ("", "memory"):
        return
    shown = url if len(url) <= 80 else url[:77] + "..."
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise UserError(f"bad --feature-store {shown!r}: spaces or control characters")
    if url.startswith("unix://"):
        if not url[len("unix://") :].startswith("/"):
            raise UserError(f"bad --feature-store {shown!r}: expected unix:///path/to/redis.sock")
        return
    if not url.startswith(("redis://", "rediss://")):
        raise UserError(f"bad --feature-store {shown!r}: expected 'memory' or a redis://host:port/db URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"bad --feature-store {shown!r}: {exc} (the port must be from 1 to 65535)") from None
    if not parts.hostname:
        raise UserError(f"bad --feature-store {shown!r}: no host (e.g. redis://127.0.0.1:6379/0)")
    if port == 0:
        raise UserError(f"bad --feature-store {shown!r}: the port must be from 1 to 65535")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise UserError(f"bad --feature-store {shown!r}: the database must be a whole number, got {db!r}")


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(Settings)
    return {f.name: hints[f.name] for f in fields(Settings)}


def _coerce(name: str, typ: Any, value: Any) -> Any:
    if isinstance(typ, types.UnionType):  # not used today; keep str as the fallback
        typ = str
    if typ is bool:
        on = parse_bool(value)
        if on is not None:
            return on
        raise UserError(f"setting {name}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise UserError(f"setting {name}: expected an integer, got {value!r}")
        try:
            return int(str(value).replace("_", "")) if not isinstance(value, int) else value
        except ValueError:
            raise UserError(f"setting {name}: expected an integer, got {value!r}") from None
    if typ is float:
        if isinstance(value, bool):
            raise UserError(f"setting {name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise UserError(f"setting {name}: expected a number, got {value!r}") from None
    return str(value)


def apply_overrides(settings: Settings, overrides: Mapping[str, Any]) -> Settings:
    """A copy of ``settings`` with ``overrides`` applied (values may be strings, as from ``--set``)."""
    known = _field_types()
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values = {k: _coerce(k, known[k], v) for k, v in overrides.items()}
    return dataclasses.replace(settings, **values)


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``["max_batch_size=8", ...]`` -> ``{"max_batch_size": "8"}``; a malformed item is a UserError."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"bad --set {item!r}: expected key=value (e.g. max_batch_size=8)")
        out[key.strip()] = value.strip()
    return out
