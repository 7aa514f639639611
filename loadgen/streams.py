"""Reading a streamed response body token by token: when did each token event arrive, and what else
did the server say (its own token count, an error).

A reader is fed the body bytes as they arrive, each piece with the arrival time of its bytes (Unix ns),
and appends one timestamp per token event to ``result.token_ns``: TTFT is the first, the inter-token
gaps are the differences. Nothing of the content is kept.

* :class:`LineStream` (the default, for the reference service and any SSE or NDJSON stream): every
  SSE ``data:`` line and every NDJSON line is one token event, except ``[DONE]``, comments and the
  other SSE fields.
* :class:`OpenAIStream` (``--api openai-completions|openai-chat``): server-sent events as the
  OpenAI streaming API sends them and vLLM, SGLang, llama.cpp's server and TGI serve them. An event is
  the ``data:`` lines up to the blank line that ends it (WHATWG HTML "Server-sent events": one
  leading space stripped, CRLF or LF line ends; CR-only line ends are not read). Each event is a
  JSON chunk; it is a token event when one of its ``choices`` carries output: a non-empty ``text``
  (``/v1/completions``) or a non-empty ``delta.content``, ``delta.reasoning_content`` /
  ``delta.reasoning`` or ``delta.tool_calls`` (``/v1/chat/completions``). So the first chat chunk
  that only announces ``role: assistant`` (vLLM sends it with ``content: ""``), the closing chunk with
  only ``finish_reason``, and the ``usage`` chunk (``choices: []``, sent before ``data: [DONE]`` when
  the request asks ``stream_options: {"include_usage": true}``) are not tokens. ``usage.
  completion_tokens`` is kept as the server's own count of output tokens (a chunk may carry several
  tokens: the gaps are between chunks, as the client receives them, never invented inside one). An
  event ``{"error": ...}`` (vLLM sends one when generation fails mid-stream) or a chunk that is not
  JSON marks the request failed (the error's ``type`` or ``code`` is kept, never its message).

Sources: the OpenAI API reference for ``stream_options.include_usage`` ("an additional chunk will be
streamed before the ``data: [DONE]`` message ... the ``choices`` field will always be an empty
array"); vLLM ``vllm/entrypoints/openai/completion/serving.py`` (``completion_stream_generator``:
``data: {json}\\n\\n`` per output, empty chunks skipped during chunked prefill, the usage chunk with
``choices=[]``, errors as ``data: {error}`` then ``data: [DONE]``) and
``vllm/entrypoints/openai/chat_completion/serving.py`` (the first chunk per choice is
``delta={role, content: ""}``); vLLM's own benchmark client ``vllm/benchmarks/lib/endpoint_request_func.py``
counts any chunk with ``choices`` as a token, the role chunk included; here it is not, because a server
may send it before the first token exists.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from stagescope.loadgen.results import RequestResult

__all__ = ["LineStream", "OpenAIStream", "StreamReader", "has_output", "line_is_token"]

_NON_TOKEN_PREFIXES = (b":", b"event:", b"id:", b"retry:")


class StreamReader(Protocol):
    """Fed a response body piece by piece; records token events on the result it was made for."""

    def feed(self, data: bytes, now_wall: int) -> None: ...

    def close(self, now_wall: int) -> None: ...


def line_is_token(line: bytes) -> bool:
    """One SSE or NDJSON line: a token event unless empty, ``[DONE]``, a comment or another SSE field."""
    s = line.strip()
    if not s or s.startswith(_NON_TOKEN_PREFIXES):
        return False
    if s.startswith(b"data:"):
        s = s[5:].strip()
    return s not in (b"[DONE]", b"")


class LineStream:
    """Every ``data:`` line or NDJSON line is a token event, stamped when its newline arrived."""

    __slots__ = ("_buf", "_tokens")

    def __init__(self, result: RequestResult) -> None:
        if result.token_ns is None:
            result.token_ns = []
        self._tokens = result.token_ns
        self._buf = b""

    def feed(self, data: bytes, now_wall: int) -> None:
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if line_is_token(line):
                self._tokens.append(now_wall)

    def close(self, now_wall: int) -> None:
        if self._buf and line_is_token(self._buf):
            self._tokens.append(now_wall)
        self._buf = b""


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def has_output(choice: Any) -> bool:
    """Whether one streamed ``choices[]`` entry (completions or chat) carries generated output."""
    if not isinstance(choice, dict):
        return False
    if _nonempty_str(choice.get("text")):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    if any(_nonempty_str(delta.get(k)) for k in ("content", "reasoning_content", "reasoning")):
        return True
    calls = delta.get("tool_calls")
    return isinstance(calls, list) and len(calls) > 0


class OpenAIStream:
    """OpenAI-style server-sent events: one token event per chunk that carries output (see the module)."""

    __slots__ = ("_buf", "_data", "_result", "_tokens", "done")

    def __init__(self, result: RequestResult) -> None:
        if result.token_ns is None:
            result.token_ns = []
        self._result = result
        self._tokens = result.token_ns
        self._buf = b""
        self._data: list[bytes] = []
        self.done = False  # data: [DONE] seen

    def feed(self, data: bytes, now_wall: int) -> None:
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                self._dispatch(now_wall)
            elif line.startswith(b":"):
                continue  # a comment (keep-alive ping)
            else:
                name, _, value = line.partition(b":")
                if name == b"data":
                    self._data.append(value[1:] if value.startswith(b" ") else value)

    def close(self, now_wall: int) -> None:
        if self._buf:
            self.feed(b"\n", now_wall)
        self._dispatch(now_wall)  # a last event the body did not end with a blank line

    def _fail(self, why: str) -> None:
        if self._result.error is None:
            self._result.error = why

    def _dispatch(self, now_wall: int) -> None:
        if not self._data:
            return
        payload = b"\n".join(self._data)
        self._data = []
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._fail("stream: an event that is not JSON")
            return
        if not isinstance(chunk, dict):
            return
        err = chunk.get("error")
        if err is not None or chunk.get("object") == "error":
            kind = err.get("type") or err.get("code") if isinstance(err, dict) else chunk.get("type")
            self._fail(f"stream error: {str(kind or 'error')[:60]}")
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            n = usage.get("completion_tokens")
            if isinstance(n, int) and not isinstance(n, bool):
                self._result.usage_output_tokens = n
        choices = chunk.get("choices")
        if isinstance(choices, list) and any(has_output(c) for c in choices):
            self._tokens.append(now_wall)
