"""What the trace-file readers (Jaeger, Zipkin, Triton's trace file) raise on a bad file: one
``file:line: reason`` line, and the internal error a reader raises deep in a document, with the text
that locates it (its line is found in the raw bytes once, at the top of the reader)."""

from __future__ import annotations

from stagescope.errors import UserError

__all__ = ["BadEntry", "TraceFileError", "line_of"]


class TraceFileError(UserError):
    """A bad trace file: ``line`` (1-based) and ``reason`` without the file name."""

    def __init__(self, file: str, line: int, reason: str) -> None:
        super().__init__(f"{file}:{line}: {reason}")
        self.line = line
        self.reason = reason


class BadEntry(Exception):
    """A bad span or entry; ``needle``: text of it to find its line by (empty: line 1)."""

    def __init__(self, message: str, needle: str = "") -> None:
        super().__init__(message)
        self.needle = needle


def line_of(data: bytes, needle: str) -> int:
    """The 1-based line of ``needle``'s first occurrence in ``data`` (1 when empty or absent)."""
    pos = data.find(needle.encode()) if needle else -1
    return data.count(b"\n", 0, pos) + 1 if pos >= 0 else 1
