"""Checking, before a run, that its output can be written: one clear line now beats a lost run later."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from stagescope.errors import UserError

__all__ = ["cache_root", "ensure_writable_dir", "ensure_writable_file", "not_readable_reason"]


def not_readable_reason(path: str | os.PathLike[str]) -> str:
    """Why ``path``, which the user named as an input, is neither a regular file nor a folder, in a
    few words for the one line they get: ``no such file or directory``, ``file name too long``, ``a
    FIFO (named pipe), not a regular file``, ``a symbolic link to '/x', which does not exist`` ...

    Look inputs up with ``os.path.isfile``/``isdir`` (False on any error) and this, not with
    ``Path.is_file()``/``exists()``, which raise ``OSError`` for a name longer than the file system
    allows (Python 3.11: ENAMETOOLONG is not among the errors they ignore).
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)[:200]!r}, which does not exist"
        if exc.errno == errno.ENOENT:
            return "no such file or directory"
        return (exc.strerror or str(exc)).lower()  # file name too long, permission denied, ...
    except ValueError:  # an embedded NUL byte
        return "not a file name"
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(st.st_mode):
            return f"{kind}, not a regular file"
    return "not a regular file or folder"


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
    if os.path.isdir(p):  # not Path.is_dir(): it raises for a name too long (the probe below says so)
        raise UserError(f"{p}: is a directory; give a file name for {what}")
    parent = p.parent
    if not create_parents and not os.path.isdir(parent):
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
