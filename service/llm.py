"""A continuous-batching LLM engine on the SIMULATED accelerator (``/v1/generate``).

The engine runs one *step* at a time. In a step every running sequence that already has its first
token decodes one more token, and sequences still in prefill process prompt tokens: all of their
prompt at once, or with ``chunked_prefill`` at most ``prefill_chunk_tokens`` per sequence per step.
A sequence whose prefill completes emits its first token at the end of that step. A step occupies
the simulated device for (seconds)::

    (decode_step_ms + decode_per_seq_ms * decoding) / 1000           # decode part
    + (prefill_launch_ms + prefill_per_token_ms * prefill_tokens) / 1000   # only when prefilling

so long unchunked prompts hold everyone's next token (head-of-line blocking), and the per-step time
(the inter-token gap) grows with the running batch. ``max_running`` bounds the sequences admitted
(prefilling or decoding); the others wait for admission, up to ``max_waiting`` (then 429).

Stage intervals recorded on the request's record, each bounded by two ``perf_counter_ns`` stamps:
``queue``: arrival at the engine -> admitted (a running slot was free); ``prefill``: admitted -> first
token produced (includes waiting for the step in progress); ``decode``: first token -> last token
produced. ``record.batch_size`` is the mean running decode batch over the sequence's decode steps.
Tokens are words of a fixed vocabulary chosen pseudo-randomly: this is a SIMULATED model.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stagescope import names as N
from stagescope.service.backends import SimulatedAccelerator
from stagescope.service.settings import Settings

if TYPE_CHECKING:
    from stagescope.instrumentation.record import RequestRecord

__all__ = ["EngineFull", "LLMEngine", "Sequence"]

now_ns = time.perf_counter_ns  # the clock of every stagescope record

_VOCAB = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "model",
    "token",
    "stream",
    "batch",
    "queue",
    "prefill",
    "decode",
    "cache",
    "tensor",
    "layer",
    "kernel",
    "vector",
    "weight",
    "output",
    "input",
    "signal",
    "answer",
    "value",
    "record",
    "latency",
]


class EngineFull(RuntimeError):
    """``max_waiting`` sequences already wait for admission."""

    def __init__(self, waiting: int, retry_after_s: float) -> None:
        super().__init__(f"generation queue full ({waiting} waiting); retry in {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Sequence:
    """One generation request inside the engine (token stream in ``tokens``; ``None`` ends it)."""

    prompt_tokens: int
    max_tokens: int
    record: RequestRecord | None
    seed: int
    arrival_ns: int = field(default_factory=now_ns)
    admit_ns: int | None = None
    prefilled: int = 0
    generated: int = 0
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    cancelled: bool = False
    finished: bool = False
    running_sum: int = 0
    decode_steps: int = 0
    tokens: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next_word(self) -> str:
        return self._rng.choice(_VOCAB)


class LLMEngine:
    """Continuous batching over one SIMULATED device (see the module docstring for the cost model)."""

    def __init__(self, settings: Settings, accel: SimulatedAccelerator | None = None) -> None:
        self.settings = settings
        self.accel = accel or SimulatedAccelerator(1)
        self._device = self.accel.devices[0]
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self._step_s = settings.decode_step_ms / 1000.0

    # -- cost model -----------------------------------------------------------------------------
    def step_cost_s(self, decoding: int, prefill_tokens: int) -> float:
        s = self.settings
        ms = 0.0
        if decoding or prefill_tokens:
            ms += s.decode_step_ms + s.decode_per_seq_ms * decoding
        if prefill_tokens:
            ms += s.prefill_launch_ms + s.prefill_per_token_ms * prefill_tokens
        return ms / 1000.0

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="llm-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self.running, *self.waiting]:
            seq.tokens.put_nowait(None)
        self.running.clear()
        self.waiting.clear()

    # -- requests -------------------------------------------------------------------------------
    def submit(
        self, prompt_tokens: int, max_tokens: int, record: RequestRecord | None, seed: int
    ) -> Sequence:
        """Queue a generation; raises :class:`EngineFull` past ``max_waiting`` waiting sequences."""
        s = self.settings
        if len(self.waiting) >= s.max_waiting:
            per_seq = max_tokens * max(self._step_s, 0.001) / max(1, s.max_running)
            raise EngineFull(len(self.waiting), len(self.waiting) * per_seq)
        seq = Sequence(max(1, prompt_tokens), max(1, max_tokens), record, seed)
        if record is not None:
            record.queue_depth = len(self.waiting)
        self.waiting.append(seq)
        self._admit()
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """The client went away: drop the sequence at the next step boundary."""
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)

    def _admit(self) -> None:
        t = now_ns()
        while self.waiting and len(self.running) < self.settings.max_running:
            seq = self.waiting.popleft()
            seq.admit_ns = t
            self.running.append(seq)

    # -- the step loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self.running = [q for q in self.running if not q.cancelled]
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._step()

    async def _step(self) -> None:
        s = self.settings
        decoders = [q for q in self.running if q.first_token_ns is not None]
        plan: list[tuple[Sequence, int]] = []
        for q in self.running:
            if q.first_token_ns is None:
                left = q.prompt_tokens - q.prefilled
                plan.append((q, min(left, s.prefill_chunk_tokens) if s.chunked_prefill else left))
        cost = self.step_cost_s(len(decoders), sum(n for _, n in plan))
        self._step_s = cost
        await self._device.run(cost)
        self.steps += 1
        t = now_ns()
        n_dec = len(decoders)
        for q in decoders:
            if q.cancelled:
                continue
            q.generated += 1
            q.running_sum += n_dec
            q.decode_steps += 1
            q.last_token_ns = t
            q.tokens.put_nowait(q.next_word())
            if q.generated >= q.max_tokens:
                self._finish(q)
        for q, n in plan:
            if q.cancelled:
                continue
            q.prefilled += n
            if q.prefilled >= q.prompt_tokens:
                q.first_token_ns = q.last_token_ns = t
                q.generated = 1
                q.tokens.put_nowait(q.next_word())
                if q.generated >= q.max_tokens:
                    self._finish(q)
        self.running = [q for q in self.running if not (q.finished or q.cancelled)]
        self._admit()

    def _finish(self, q: Sequence) -> None:
        q.finished = True
        rec = q.record
        if rec is not None and q.admit_ns is not None and q.first_token_ns is not None:
            rec.add_stage(N.STAGE_QUEUE, q.arrival_ns, q.admit_ns)
            rec.add_stage(N.STAGE_PREFILL, q.admit_ns, q.first_token_ns)
            if q.last_token_ns is not None and q.last_token_ns > q.first_token_ns:
                rec.add_stage(N.STAGE_DECODE, q.first_token_ns, q.last_token_ns)
            if q.decode_steps:
                rec.batch_size = round(q.running_sum / q.decode_steps)
            rec.output_tokens = q.generated
        q.tokens.put_nowait(None)
