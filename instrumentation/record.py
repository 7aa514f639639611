"""Measure, then publish: the per-request stage record, taken from one monotonic clock.

A :class:`RequestRecord` is plain data. The ASGI middleware opens one per request and makes it the
*current* record (a context variable, so concurrent requests never see each other's); code inside the
request marks stages with :func:`stage`; the dynamic batcher and the stream wrapper add their
intervals to the record they captured at submit time. When the response is fully written the
publishers (OpenTelemetry spans, Prometheus histograms, the embedded file sink) consume the record.

Clock: every ``*_ns`` field is ``time.perf_counter_ns()`` (monotonic, nanoseconds). ``to_wall_ns``
converts one to Unix-epoch nanoseconds through an anchor taken once per process.

Each stage interval is bounded by two timestamps, stated where the interval is recorded:

* ``stage(name, kind=...)`` blocks: entry to exit of the ``with`` block (any name a team picks, with
  the kind of work it is; names and kinds are checked and bounded by
  :mod:`~stagescope.instrumentation.stagenames`);
* ``batch_wait``: enqueued in the batcher -> the batch it joined was closed;
* ``queue``: batch closed -> an executor started running it;
* ``compute``: executor started -> executor returned (model forward on the accelerator);
* ``prefill``: request admitted to the engine -> first token produced;
* ``decode``: first token produced -> last token produced.
"""

from __future__ import annotations

import contextvars
import hashlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from stagescope.instrumentation import stagenames as _stagenames
from stagescope.instrumentation.stagenames import resolve_stage
from stagescope.names import KIND_UNKNOWN, STAGE_KINDS

__all__ = [
    "RequestRecord",
    "StageInterval",
    "current_request",
    "now_ns",
    "reset_current_request",
    "set_current_request",
    "stage",
    "to_wall_ns",
    "validate_stage",
]

_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.perf_counter_ns()
now_ns = time.perf_counter_ns
_new_interval = object.__new__


def to_wall_ns(mono_ns: int) -> int:
    """Convert a ``perf_counter_ns`` reading of this process to Unix-epoch nanoseconds."""
    return _ANCHOR_WALL_NS + (mono_ns - _ANCHOR_MONO_NS)


def validate_stage(name: str, kind: str | None = None) -> str:
    """The name a stage called ``name`` (of ``kind``) is recorded under: ``name`` itself, or the
    overflow name past the process's cap of custom names; ``ValueError`` for a bad name or kind. Call it
    where a stage is declared (at import, at start-up) to fail fast: ``stage()`` and ``add_stage`` never
    raise on the request path, they record a bad stage anyway and log it once."""
    return _stagenames.stage_names().resolve(name, kind)[0]


@dataclass(slots=True)
class StageInterval:
    """One stage of one request: ``start_ns`` and ``end_ns`` on the monotonic clock; ``kind`` one of
    ``names.KINDS`` or ``"unknown"`` (empty: the built-in stage's own kind, see :attr:`stage_kind`)."""

    stage: str
    start_ns: int
    end_ns: int
    kind: str = ""

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def stage_kind(self) -> str:
        """The interval's kind: ``kind``, else the built-in stage's, else ``"unknown"``."""
        return self.kind or STAGE_KINDS.get(self.stage, KIND_UNKNOWN)


@dataclass(slots=True)
class RequestRecord:
    """Everything measured about one request; publishers turn it into spans and metrics.

    ``start_ns``: the server received the request (first ASGI call); ``end_ns``: the last body chunk
    of the response was handed to the server (for a stream: the end of the stream).
    """

    method: str = ""
    route: str = ""  # route template ("/v1/items/{id}"), never the raw path
    start_ns: int = field(default_factory=now_ns)
    end_ns: int | None = None
    status_code: int | None = None
    model: str | None = None  # raw model name; publishers fold it into the configured set
    stages: list[StageInterval] = field(default_factory=list)
    batch_size: int | None = None
    input_hash: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    first_token_ns: int | None = None  # first token handed to the response (TTFT = this - start_ns)
    token_ns: list[int] = field(default_factory=list)  # every token's hand-off time, first included
    cold_start: bool = False
    queue_depth: int | None = None  # requests waiting when this one was enqueued
    error_type: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)  # extra server-span attributes

    def add_stage(self, name: str, start_ns: int, end_ns: int, kind: str | None = None) -> None:
        """Record a stage measured elsewhere (a batcher worker, an engine loop); ``name`` and ``kind``
        as for :class:`stage`."""
        recorded, k = resolve_stage(name, kind)
        self.stages.append(StageInterval(recorded, start_ns, max(start_ns, end_ns), k))

    def set_input(self, data: bytes | str) -> str:
        """Hash the model input (never store it) so repeated inputs can be spotted; returns the hash."""
        raw = data.encode() if isinstance(data, str) else data
        self.input_hash = hashlib.blake2b(raw, digest_size=8).hexdigest()
        return self.input_hash

    def mark_token(self, at_ns: int | None = None) -> None:
        """A token (or chunk of tokens) was handed to the response."""
        t = now_ns() if at_ns is None else at_ns
        if self.first_token_ns is None:
            self.first_token_ns = t
        self.token_ns.append(t)

    @property
    def duration_s(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9

    @property
    def ttft_s(self) -> float | None:
        """Request arrival at the server -> first token handed to the response, in seconds."""
        return None if self.first_token_ns is None else (self.first_token_ns - self.start_ns) / 1e9

    def token_gaps_s(self) -> list[float]:
        """Gaps between consecutive tokens, in seconds (one per gap, vLLM's inter-token latency)."""
        t = self.token_ns
        return [(t[i] - t[i - 1]) / 1e9 for i in range(1, len(t))]

    def stage_totals_s(self) -> dict[str, float]:
        """Total seconds per stage (a stage entered twice is summed)."""
        out: dict[str, float] = {}
        for iv in self.stages:
            out[iv.stage] = out.get(iv.stage, 0.0) + iv.duration_s
        return out


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "stagescope_request", default=None
)


def current_request() -> RequestRecord | None:
    """The record of the request being served in this context, or ``None`` outside a request."""
    return _current.get()


def set_current_request(record: RequestRecord | None) -> contextvars.Token[RequestRecord | None]:
    return _current.set(record)


def reset_current_request(token: contextvars.Token[RequestRecord | None]) -> None:
    _current.reset(token)


class stage:  # lower-case: used like a function: ``with stagescope.stage("preprocess"):``
    """Record a stage of the current request: ``with stage("rerank", kind="compute"): ...`` or
    ``async with``.

    ``name``: a built-in stage (``names.STAGES``, which implies its kind) or any name a team picks
    (a label value: letters, digits, ``_ . : -``); ``kind``: what the time is, one of ``names.KINDS``
    (fetch, cpu, batch_wait, queue, compute, prefill, decode, network, egress, cold_start); it
    decides which levers the analysis considers. A custom name without a kind is recorded with kind
    ``unknown``. A bad name or kind never fails the request: the stage is recorded anyway (a kind
    outside the list as the name's kind, else ``unknown``; a bad name as ``names.STAGE_OVERFLOW``),
    logged once and counted (:mod:`~stagescope.instrumentation.stagenames`); :func:`validate_stage`
    raises ``ValueError`` for them, for a check where stages are declared. Past the process's cap of
    custom names (``STAGESCOPE_MAX_CUSTOM_STAGES``, default 32) new names are recorded as
    ``names.STAGE_OVERFLOW``. Outside a request nothing is recorded, nor after its response was sent
    (a ``BackgroundTasks`` task runs in the request's context: its time is not the request's). The
    interval is recorded even when the block raises.
    """

    __slots__ = ("_record", "_start", "kind", "name")

    def __init__(self, name: str, kind: str | None = None) -> None:
        self.name: str
        self.kind: str
        try:  # resolve_stage's cache read here: a stage() per block is common
            if kind is None:  # the common call, stage(name): a look-up by the name alone, no tuple key
                self.name, self.kind = _stagenames._NAMES._plain[name]  # type: ignore[union-attr]
            else:
                self.name, self.kind = _stagenames._NAMES._cache[(name, kind)]  # type: ignore[union-attr]
        except (AttributeError, KeyError, TypeError):  # no registry yet, a new name, an unhashable one
            self.name, self.kind = resolve_stage(name, kind)
        self._record: RequestRecord | None = None  # set by __enter__, with _start

    def __enter__(self) -> stage:
        rec = _current.get()
        # a record that has ended (its last body chunk sent) is published: work after it (FastAPI's
        # BackgroundTasks, run inside the request's context) is not the request's latency
        self._record = rec if rec is None or rec.end_ns is None else None
        self._start = now_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        end = now_ns()
        rec = self._record
        if rec is not None:  # StageInterval(name, start, end, kind) written out: no __init__ call
            iv = _new_interval(StageInterval)
            iv.stage = self.name
            iv.start_ns = self._start
            iv.end_ns = end
            iv.kind = self.kind
            rec.stages.append(iv)

    async def __aenter__(self) -> stage:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)
