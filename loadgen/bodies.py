"""Request bodies: synthetic prompts of a given token length, and generated ``/v1/predict`` inputs.

Prompts are made of words from a fixed vocabulary, one word per token (the reference service and
most tokenizers count an English word as about one token). A prompt is built from blocks of
``block_tokens`` words; each block's words are a deterministic function of its block id, so
requests whose Mooncake ``hash_ids`` share leading ids get byte-identical prompt prefixes and a
prefix cache can see the reuse. Requests without block ids get blocks of their own (no accidental
sharing).

With a body template (``--body FILE``, or the OpenAI APIs' bodies, :mod:`stagescope.loadgen.template`)
every request's body is the template filled with its prompt, token counts and indexes; its input hash
is the hash of the whole body, as a service that calls ``current_request().set_input(await
req.body())`` computes it.

Content is never recorded: the results keep only :func:`input_hash` (BLAKE2b, 8 bytes, hex), the
same hash the instrumentation puts on ``stagescope.input_hash``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from stagescope.loadgen.limits import BODYLESS_METHODS, METHODS
from stagescope.loadgen.template import BodyTemplate

__all__ = [
    "BODYLESS_METHODS",
    "GENERATE_ROUTE",
    "METHODS",
    "PREDICT_ROUTE",
    "BodyFactory",
    "NoBody",
    "PreparedBody",
    "input_hash",
    "synthetic_prompt",
]

GENERATE_ROUTE = "/v1/generate"
PREDICT_ROUTE = "/v1/predict"

_WORDS = (
    "the of and to in is was for on that with as by at from it an be this are which or have one had "
    "not but what all were when we there can more if no out so said time up use about many then them "
    "these some would make like into has two look write go see number way could people than first "
    "water been call who oil now find long down day did get come made may part over new sound take "
    "only little work know place year live back give most very after thing our just name good "
    "sentence man think say great where help through much before line right too mean old any same "
    "tell boy follow came want show also around form three small set put end does another well large "
    "must big even such because turn here why ask went men read need land different home us move try "
    "kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high"
)
_VOCAB: tuple[str, ...] = tuple(_WORDS.split())  # one token each
_block_cache: dict[tuple[object, ...], str] = {}
_BLOCK_CACHE_MAX = 4096


def input_hash(data: bytes | str) -> str:
    """BLAKE2b-64 hex digest of the model input (what the service records; never the content)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def _block_text(key: tuple[object, ...], n_words: int) -> str:
    cache_key = (*key, n_words)
    text = _block_cache.get(cache_key)
    if text is None:
        rng = random.Random(repr(key))
        text = " ".join(rng.choices(_VOCAB, k=n_words))
        if len(_block_cache) >= _BLOCK_CACHE_MAX:
            _block_cache.clear()
        _block_cache[cache_key] = text
    return text


def synthetic_prompt(
    n_tokens: int, *, hash_ids: Sequence[int] | None = None, block_tokens: int = 512, unique_key: object = 0
) -> str:
    """About ``n_tokens`` words. With ``hash_ids`` block ``k`` is the text of block id ``hash_ids[k]``
    (shared between requests); without, blocks are keyed by ``unique_key`` (one prompt per key)."""
    if n_tokens <= 0:
        return ""
    parts: list[str] = []
    remaining = n_tokens
    k = 0
    while remaining > 0:
        take = min(block_tokens, remaining)
        if hash_ids is not None and k < len(hash_ids):
            key: tuple[object, ...] = ("block", hash_ids[k])
            # a trace's last block is partial: the shared words are the block's first `take` words
            text = _block_text(key, block_tokens)
            if take < block_tokens:
                text = " ".join(text.split(" ", take)[:take])
        else:
            text = _block_text(("unique", unique_key, k), take)
        parts.append(text)
        remaining -= take
        k += 1
    return " ".join(parts)


@dataclass(frozen=True)
class PreparedBody:
    """One request body, ready to send: JSON bytes plus what the results record about it."""

    body: bytes
    input_hash: str
    prompt_tokens: int | None
    output_tokens: int | None
    stream: bool


class BodyFactory:
    """Builds the body of request ``i`` of a schedule for a route.

    ``/v1/generate``: ``{"prompt": <about prompt_tokens words>, "max_tokens": output_tokens,
    "stream": true}``; token counts come from the trace, else ``default_prompt_tokens`` and
    ``default_output_tokens``. Any other route (``/v1/predict``): ``{"inputs": [floats]}`` of
    ``predict_dim`` values; a share ``repeat_share`` of requests reuse one of ``repeat_pool`` earlier
    inputs (a result cache can hit them), the rest are fresh random inputs. With ``template`` (any
    route): the template filled in for request ``i``; ``repeat_share`` then makes a request repeat the
    input (index, prompt and token counts) of one of the first ``repeat_pool`` requests. ``model``
    fills ``{{model}}``.
    """

    def __init__(
        self,
        route: str,
        *,
        prompt_tokens: Sequence[int] | np.ndarray | None = None,
        output_tokens: Sequence[int] | np.ndarray | None = None,
        hash_ids: Sequence[Sequence[int]] | None = None,
        block_tokens: int = 512,
        default_prompt_tokens: int = 128,
        default_output_tokens: int = 32,
        stream: bool = True,
        predict_dim: int = 16,
        repeat_share: float = 0.0,
        repeat_pool: int = 16,
        seed: int = 0,
        template: BodyTemplate | None = None,
        model: str | None = None,
    ) -> None:
        if not 0.0 <= repeat_share <= 1.0:
            raise ValueError(f"repeat_share must be within [0, 1], got {repeat_share}")
        self.route = route
        self.generate = route.rstrip("/").endswith(GENERATE_ROUTE)
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.hash_ids = hash_ids
        self.block_tokens = block_tokens
        self.default_prompt_tokens = default_prompt_tokens
        self.default_output_tokens = default_output_tokens
        self.stream = stream
        self.predict_dim = predict_dim
        self.repeat_share = repeat_share
        self._rng = random.Random(seed)
        self._pool: list[tuple[bytes, str]] = []
        self._pool_size = max(1, repeat_pool)
        self.template = template
        self.model = model
        if template is not None and "model" in template.names and model is None:
            raise ValueError(f"{template.source} uses {{{{model}}}}: give a model name")

    def __call__(self, i: int) -> PreparedBody:
        if self.template is not None:
            return self._templated(i)
        return self._generate(i) if self.generate else self._predict()

    def _templated(self, i: int) -> PreparedBody:
        template = self.template
        assert template is not None
        src = i  # the input this request sends: its own, or a repeat of one of the first requests
        if i >= self._pool_size and self.repeat_share and self._rng.random() < self.repeat_share:
            src = self._rng.randrange(self._pool_size)
        n_in = int(self.prompt_tokens[src]) if self.prompt_tokens is not None else self.default_prompt_tokens
        n_out = int(self.output_tokens[src]) if self.output_tokens is not None else self.default_output_tokens
        n_out = max(n_out, 1)
        values: dict[str, object] = {
            "prompt_tokens": n_in, "output_tokens": n_out, "index": i, "input_index": src,
            "model": self.model or "",
        }  # fmt: skip
        if "prompt" in template.names:
            ids = self.hash_ids[src] if self.hash_ids is not None else None
            values["prompt"] = synthetic_prompt(n_in, hash_ids=ids, block_tokens=self.block_tokens, unique_key=src)
        body = template.render(values)
        return PreparedBody(body, input_hash(body), n_in, n_out, self.stream)

    def _generate(self, i: int) -> PreparedBody:
        n_in = int(self.prompt_tokens[i]) if self.prompt_tokens is not None else self.default_prompt_tokens
        n_out = int(self.output_tokens[i]) if self.output_tokens is not None else self.default_output_tokens
        n_out = max(n_out, 1)
        ids = self.hash_ids[i] if self.hash_ids is not None else None
        prompt = synthetic_prompt(n_in, hash_ids=ids, block_tokens=self.block_tokens, unique_key=i)
        body = orjson.dumps({"prompt": prompt, "max_tokens": n_out, "stream": self.stream})
        return PreparedBody(body, input_hash(prompt), n_in, n_out, self.stream)

    def _predict(self) -> PreparedBody:
        rng = self._rng
        if self._pool and rng.random() < self.repeat_share:
            inputs, digest = rng.choice(self._pool)
        else:
            inputs = orjson.dumps([round(rng.gauss(0.0, 1.0), 6) for _ in range(self.predict_dim)])
            digest = input_hash(inputs)
            if len(self._pool) < self._pool_size:
                self._pool.append((inputs, digest))
        return PreparedBody(b'{"inputs":' + inputs + b"}", digest, None, None, False)


class NoBody:
    """The bodies of ``factory`` without their content, for a GET, HEAD or DELETE with no template:
    an empty body (its ``input_hash`` is the empty body's, as a service hashing ``await req.body()``
    computes it), the token counts and stream flag kept."""

    def __init__(self, factory: BodyFactory) -> None:
        self.factory = factory
        self._hash = input_hash(b"")

    def __call__(self, i: int) -> PreparedBody:
        b = self.factory(i)
        return PreparedBody(b"", self._hash, b.prompt_tokens, b.output_tokens, b.stream)
