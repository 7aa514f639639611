"""Time to first token and every inter-token gap of a streamed response.

Wrap the async iterator that produces the response's token chunks::

    async def generate(req):
        stream = engine.generate(prompt)                       # async iterator of str / bytes / dicts
        return StreamingResponse(stagescope.instrument_stream(stream), media_type="text/event-stream")

Each chunk is timestamped (``perf_counter_ns``) the moment the wrapped iterator produced it, right
before it is handed to the consumer (the response), and marked on the request's record
(:meth:`RequestRecord.mark_token`). From those marks the publishers derive, in seconds:

* TTFT = first chunk handed out - request arrival at the server (``record.start_ns``), vLLM's
  server-side definition (it includes queueing and prefill);
* one inter-token gap per pair of consecutive chunks (vLLM's inter-token latency, one sample per
  step). A chunk that carries several tokens (``tokens_per_chunk``) is one hand-off: the tokens in it
  reach the client together, so no gap inside a chunk is invented;
* ``record.output_tokens`` = tokens counted over the stream, unless the service set it itself.

Empty ``str``/``bytes`` chunks (keep-alives) count as no token and are not marked. The record is
captured when ``instrument_stream`` is called (inside the request), so it does not matter in which task
the response later iterates. Outside a request (and without ``record=``) chunks pass through untouched.
Nothing of the content is recorded.

A plain (sync) iterator is wrapped as one, and Starlette's ``StreamingResponse`` iterates it in its
threadpool as it does the iterator itself: a ``def`` handler streaming from a sync generator (an
engine's own, ``llama-cpp-python``'s, a ``TextIteratorStreamer``) gets the same figures. Before, the
wrapper took only async iterables, and such a stream failed after its headers with ``TypeError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeVar, overload

from stagescope.instrumentation.record import RequestRecord, current_request, now_ns

__all__ = ["default_tokens_per_chunk", "instrument_stream"]

C = TypeVar("C")


def default_tokens_per_chunk(chunk: Any) -> int:
    """One token per chunk; an empty ``str``/``bytes`` chunk is none."""
    if isinstance(chunk, str | bytes | bytearray) and not chunk:
        return 0
    return 1


@overload
def instrument_stream(
    agen: AsyncIterable[C],
    *,
    record: RequestRecord | None = None,
    tokens_per_chunk: Callable[[C], int] | None = None,
) -> AsyncIterator[C]: ...


@overload
def instrument_stream(
    agen: Iterable[C],
    *,
    record: RequestRecord | None = None,
    tokens_per_chunk: Callable[[C], int] | None = None,
) -> Iterator[C]: ...


def instrument_stream(
    agen: AsyncIterable[C] | Iterable[C],
    *,
    record: RequestRecord | None = None,
    tokens_per_chunk: Callable[[C], int] | None = None,
) -> AsyncIterator[C] | Iterator[C]:
    """Return an iterator yielding ``agen``'s chunks unchanged while marking each token hand-off: an
    async one for an async iterable, a plain one for a plain iterable (a sync generator).

    ``record``: the request record to mark (default: the current request's, captured now).
    ``tokens_per_chunk``: how many tokens a chunk carries (default: one per non-empty chunk).
    """
    rec = current_request() if record is None else record
    count = tokens_per_chunk or default_tokens_per_chunk
    if isinstance(agen, AsyncIterable):
        return _passthrough(agen) if rec is None else _instrumented(agen, rec, count)
    return iter(agen) if rec is None else _instrumented_sync(agen, rec, count)


def _instrumented_sync(gen: Iterable[C], rec: RequestRecord, count: Callable[[C], int]) -> Iterator[C]:
    it = iter(gen)
    tokens = 0
    mark = rec.mark_token
    try:
        for chunk in it:
            t = now_ns()
            n = count(chunk)
            if n > 0:
                mark(t)
                tokens += n
            yield chunk
    finally:
        if rec.output_tokens is None and tokens:
            rec.output_tokens = tokens
        close = getattr(it, "close", None)
        if close is not None:
            close()


async def _passthrough(agen: AsyncIterable[C]) -> AsyncIterator[C]:
    it = aiter(agen)
    try:
        async for chunk in it:
            yield chunk
    finally:
        await _close(it)


async def _instrumented(
    agen: AsyncIterable[C], rec: RequestRecord, count: Callable[[C], int]
) -> AsyncIterator[C]:
    it = aiter(agen)
    tokens = 0
    mark = rec.mark_token
    try:
        while True:
            try:
                chunk = await anext(it)
            except StopAsyncIteration:
                break
            t = now_ns()
            n = count(chunk)
            if n > 0:
                mark(t)
                tokens += n
            yield chunk
    finally:
        if rec.output_tokens is None and tokens:
            rec.output_tokens = tokens
        await _close(it)


async def _close(it: AsyncIterator[Any]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        await aclose()
