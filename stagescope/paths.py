"""Checking, before a run, that its output can be written: one clear line now beats a lost run later."""

from __future__ import annotations

import os
from pathlib import Path

from stagescope.errors import UserError

__all__ = ["ensure_writable_dir"]


def ensure_writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Create folder ``path`` (and its parents) and prove a file can be written in it.

    ``what`` names the output in the one-line :class:`UserError` (``"<path>: cannot write <what>:
    <reason>"``) raised when the folder cannot be created or written (a file in the way, no permission,
    a read-only file system).
    """
    p = Path(path)
    probe = p / f".stagescope-write-test-{os.getpid()}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{p}: cannot write {what}: {exc.strerror or exc}") from None
    return p
