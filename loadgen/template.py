"""Request bodies from a JSON file with placeholders (``stagescope load --body FILE``).

The file is any JSON document. A string in it may hold placeholders ``{{name}}`` (spaces inside the
braces allowed), filled in for each request:

================== ===================================================================== ======
placeholder        value                                                                 type
================== ===================================================================== ======
``prompt``         synthetic prompt text of ``prompt_tokens`` words (one word per token;  string
                   requests sharing Mooncake ``hash_ids`` share a prefix)
``prompt_tokens``  the request's prompt length in tokens (trace, else ``--prompt-tokens``) int
``output_tokens``  tokens to generate (trace, else ``--output-tokens``): use for         int
                   ``max_tokens``
``index``          the request's index in the schedule (0, 1, 2 ...)                     int
``input_index``    the index of the input it sends: its own index, or with               int
                   ``--repeat-share`` sometimes an earlier request's (whose prompt and
                   token counts it then repeats, so a cache can hit)
``model``          ``--model``                                                           string
================== ===================================================================== ======

A string that is exactly one placeholder becomes the value with its type (``"max_tokens":
"{{output_tokens}}"`` sends ``"max_tokens": 128``); a placeholder inside a longer string is replaced by
its text (``"Summarize: {{prompt}}"``, ``"user-{{index}}"``). Placeholders work in object keys too
(as text). An unknown ``{{name}}`` is refused, so a typo is not sent as literal text. Example, a
scoring service::

    {"entity_id": "{{input_index}}", "query": "{{prompt}}", "top_k": 10}

The template is compiled once into literal byte pieces and slots; rendering a request joins them
(no JSON tree is walked per request).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from stagescope.errors import UserError

__all__ = ["PLACEHOLDERS", "BodyTemplate"]

#: Placeholder name -> what it is filled with (the README and ``--help`` list these).
PLACEHOLDERS: dict[str, str] = {
    "prompt": "synthetic prompt text of prompt_tokens words",
    "prompt_tokens": "prompt length in tokens",
    "output_tokens": "tokens to generate (max_tokens)",
    "index": "the request's index in the schedule",
    "input_index": "the index of the input it sends (an earlier one when --repeat-share repeats it)",
    "model": "the --model name",
}
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

# a compiled piece: literal JSON bytes, or (name, typed) where typed=True inserts the value as JSON
# and typed=False inserts its text inside an already-open JSON string
_Piece = bytes | tuple[str, bool]
#: Largest body template read (every request's body is built from it, ahead of its send time).
MAX_TEMPLATE_BYTES = 16 * 2**20


class BodyTemplate:
    """A JSON body with ``{{placeholders}}``; :meth:`render` fills them for one request."""

    def __init__(self, doc: Any, source: str = "--body") -> None:
        self.source = source
        self.names: set[str] = set()
        pieces: list[_Piece] = []
        self._compile(doc, pieces)
        merged: list[_Piece] = []
        for p in pieces:  # adjacent literals become one
            if isinstance(p, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] = merged[-1] + p
            else:
                merged.append(p)
        self._pieces = tuple(merged)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> BodyTemplate:
        """Read and compile a template file; bad input is a one-line :class:`UserError` naming the file."""
        p = Path(path)
        try:
            with p.open("rb") as f:
                raw = f.read(MAX_TEMPLATE_BYTES + 1)
        except OSError as exc:
            raise UserError(f"{p}: cannot read the body template: {exc.strerror or exc}") from None
        if len(raw) > MAX_TEMPLATE_BYTES:
            raise UserError(f"{p}: a body template is at most {MAX_TEMPLATE_BYTES // 2**20} MiB")
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UserError(f"{p}: not JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
        try:
            return cls(doc, source=str(p))
        except RecursionError:  # orjson reads 1,024 levels; compiling them recursively does not
            raise UserError(f"{p}: the body template is nested too deeply") from None

    def _text(self, s: str, out: list[_Piece]) -> None:
        """The inside of a JSON string (without its quotes), placeholders as text slots."""
        pos = 0
        for m in _PLACEHOLDER.finditer(s):
            name = self._name(m.group(1))
            out.append(orjson.dumps(s[pos : m.start()])[1:-1])
            out.append((name, False))
            pos = m.end()
        out.append(orjson.dumps(s[pos:])[1:-1])

    def _name(self, name: str) -> str:
        if name not in PLACEHOLDERS:
            known = ", ".join("{{" + n + "}}" for n in PLACEHOLDERS)
            raise UserError(f"{self.source}: unknown placeholder {{{{{name}}}}} (known: {known})")
        self.names.add(name)
        return name

    def _compile(self, v: Any, out: list[_Piece]) -> None:
        if isinstance(v, str):
            m = _PLACEHOLDER.fullmatch(v)
            if m:
                out.append((self._name(m.group(1)), True))
            else:
                out.append(b'"')
                self._text(v, out)
                out.append(b'"')
        elif isinstance(v, dict):
            out.append(b"{")
            for k, (key, item) in enumerate(v.items()):
                out.append(b',"' if k else b'"')
                self._text(key, out)
                out.append(b'":')
                self._compile(item, out)
            out.append(b"}")
        elif isinstance(v, list):
            out.append(b"[")
            for k, item in enumerate(v):
                if k:
                    out.append(b",")
                self._compile(item, out)
            out.append(b"]")
        else:  # numbers, true, false, null
            out.append(orjson.dumps(v))

    def render(self, values: Mapping[str, object]) -> bytes:
        """The body for one request: every placeholder this template uses must be in ``values``."""
        parts: list[bytes] = []
        for p in self._pieces:
            if isinstance(p, bytes):
                parts.append(p)
            else:
                name, typed = p
                value = values[name]
                parts.append(orjson.dumps(value) if typed else orjson.dumps(str(value))[1:-1])
        return b"".join(parts)
