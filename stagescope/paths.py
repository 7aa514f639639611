"""Checking, before a run, that its output can be written: one clear line now beats a lost run later."""

from __future__ import annotations

import os
from pathlib import Path

from stagescope.errors import UserError

__all__ = ["cache_root", "ensure_writable_dir", "ensure_writable_file"]


def ensure_writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Create folder ``path`` (and its parents) and prove a file can be written in it.

    ``what`` names the output in the one-line :class:`UserError` (``"<path>: cannot write <what>:
    <reason>"``) raised when the folder cannot be created or written (a file in the way, no permission,
    a read-only file system).
    """
    if str(path) == "":
        raise UserError(f"'': expected a folder for {what}")
    p = Path(path)
    probe = p / f".stagescope-write-test-{os.getpid()}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{p}: cannot write {what}: {exc.strerror or exc}") from None
    return p


def ensure_writable_file(path: str | os.PathLike[str], what: str, *, create_parents: bool = True) -> Path:
    """Prove, before a run, that the file ``path`` can be written at its end; one line if not.

    Refused: an existing directory at ``path``, an existing file that cannot be written, a parent
    that is a file or cannot be created (``create_parents=False``: that does not exist), a folder
    where no file can be created (no permission, read-only file system). A probe file is created
    beside ``path`` and removed; an existing ``path`` is left untouched.
    """
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise UserError(f"{str(path)!r}: expected a file name for {what}")
    if p.is_dir():
        raise UserError(f"{p}: is a directory; give a file name for {what}")
    parent = p.parent
    if not create_parents and not parent.is_dir():
        raise UserError(f"{p}: output folder {parent} does not exist")
    probe = parent / f".{p.name}.stagescope-write-test-{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UserError(f"{p}: cannot write {what}: {exc.strerror or exc}") from None
    return p


def cache_root() -> Path:
    """``$STAGESCOPE_CACHE_DIR``, else ``~/.cache/stagescope``: where built engines and generated
    models are kept between runs (outside the repository)."""
    env = os.environ.get("STAGESCOPE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "stagescope"
