"""data-init: make ./data/traces and ./data/loadgen writable by the stack's writers, readable by everyone.

The collector (uid 10001 in its image, which has no shell) and the load generator (uid 10001 in the
stagescope image) write into folders bind-mounted from the host, where they belong to whoever cloned
the repository: any uid. This script runs once, as root, in the stagescope image before either starts
(docker-compose.yml, service ``data-init``) and, for each folder:

* keeps its owner (the host user: they can still list, read and delete everything in it), gives it
  the writers' group and mode 2775 (setgid, so new files take that group), and creates it if missing;
* creates the file the collector appends to (``traces/traces.jsonl``) if missing, owned by the
  writer with mode 0644. The collector's file exporter opens an existing file for appending and,
  when it rotates, gives the new file the old one's mode and owner, so every file it writes stays
  readable by any host uid (without this, the first file would be created 0640 or 0600);
* adds read permission for everyone to every file already there (earlier runs, other uids);
* checks, as the writer uid, that it can create a file in the folder and append to that file.

Any failure (a read-only or root-squashed mount, for example) is one line on stderr and exit status 1,
so ``docker compose up`` stops with "service data-init didn't complete successfully" instead of a
collector that silently writes nothing. Bad arguments exit 2. Standard library only (it runs in the
stagescope image's Python, outside any virtualenv the tests use).

usage: python data_init.py --data /data --writer 10001:10001 --append-file traces/traces.jsonl traces loadgen
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

__all__ = ["main", "prepare", "writer_can_write"]

DIR_MODE = 0o2775  # owner and writers' group rwx, others r-x; setgid keeps the writers' group
FILE_MODE = 0o644  # what the collector's file exporter copies to every file it rotates to
PROBE = ".data-init-probe"


def _fail(message: str, status: int = 1) -> None:
    print(f"data-init: {message}", file=sys.stderr)
    raise SystemExit(status)


def _ids(spec: str) -> tuple[int, int]:
    try:
        uid, gid = (int(x) for x in spec.split(":"))
    except ValueError:
        _fail(f"--writer must be UID:GID (numbers), got {spec!r}", 2)
    if uid < 0 or gid < 0:
        _fail(f"--writer must be UID:GID (numbers), got {spec!r}", 2)
    return uid, gid


def prepare(data: Path, folders: list[str], writer: tuple[int, int], append_file: str | None) -> list[str]:
    """Set up each ``data/<folder>`` as described in the module docstring; return what was done."""
    owner = data.stat()
    uid, gid = writer
    done = []
    for name in folders:
        folder = data / name
        if not folder.is_dir():
            folder.mkdir(parents=True)
            os.chown(folder, owner.st_uid, owner.st_gid)
        os.chown(folder, -1, gid)
        os.chmod(folder, DIR_MODE)
        for path in folder.rglob("*"):
            mode = stat.S_IMODE(path.lstat().st_mode)
            if path.is_symlink():
                continue
            extra = 0o555 if path.is_dir() else 0o444
            if mode | extra != mode:
                os.chmod(path, mode | extra)
        done.append(f"{data.name}/{name} (owner uid {folder.stat().st_uid}, group {gid}, mode 2775)")
    if append_file:
        target = data / append_file
        if not target.exists():
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, FILE_MODE))
        os.chown(target, uid, gid)
        os.chmod(target, FILE_MODE)
        done.append(f"{data.name}/{append_file} (owner {uid}:{gid}, mode 0644)")
    return done


def writer_can_write(data: Path, folders: list[str], writer: tuple[int, int], append_file: str | None) -> str:
    """As the writer uid (in a child process), create and remove a file in each folder and open the
    append file for appending; return "" or the first error."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to the writer, try, report through the pipe
        os.close(read_end)
        error = ""
        try:
            os.setgroups([])
            os.setgid(writer[1])
            os.setuid(writer[0])
            for name in folders:
                probe = data / name / PROBE
                os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
                probe.unlink()
            if append_file:
                os.close(os.open(data / append_file, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            error = f"{exc.strerror}: {exc.filename}"
        os.write(write_end, error.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        error = r.read().decode()
    os.waitpid(pid, 0)
    return error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="data_init.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the bind-mounted ./data folder")
    parser.add_argument("--writer", required=True, help="UID:GID the collector and load generator run as")
    parser.add_argument("--append-file", help="file (relative to --data) the collector appends to")
    parser.add_argument("folders", nargs="+", help="folders under --data the writers write into")
    args = parser.parse_args(argv)
    writer = _ids(args.writer)
    data = Path(args.data)
    if not data.is_dir():
        _fail(f"{data} is not a folder (docker-compose.yml mounts ./data there)", 2)
    if os.geteuid() != 0:
        _fail("must run as root (docker-compose.yml runs it with user 0:0)", 2)
    try:
        done = prepare(data, args.folders, writer, args.append_file)
    except OSError as exc:
        _fail(
            f"cannot prepare {exc.filename} ({exc.strerror}); is ./data on a read-only or root-squashed mount?"
        )
    error = writer_can_write(data, args.folders, writer, args.append_file)
    if error:
        _fail(f"uid {writer[0]} still cannot write ({error}); the collector would drop every trace")
    print("data-init: " + "; ".join(done) + f"; writable by {writer[0]}:{writer[1]}, readable by everyone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
