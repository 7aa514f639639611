"""Entrypoint of the ``jupyterlab`` service (compose profile ``notebooks``).

Two checks before JupyterLab starts, so the notebooks profile needs only what it says:

* ``JUPYTER_TOKEN`` must be set (Jupyter Server reads it from the environment as its login token).
  Compose cannot require it (it interpolates the whole file before applying profiles, so a ``:?``
  there would stop the default stack too); an empty token is one line on stderr and exit 2 here.
* JupyterLab runs as the host user who owns the mounted ``analysis/`` folder, whatever their uid, so
  notebooks it saves and files it writes into ``./data`` belong to that user. It starts as root
  (``user: "0:0"`` in docker-compose.yml) only to drop to that uid and gid. Under rootless Docker,
  where the host user is root inside the container, it stays root.

Standard library only (it runs in the lab image's Python).

usage: python lab_entrypoint.py --owner-of /app/analysis -- jupyter lab ...
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab_entrypoint.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--owner-of", required=True, help="run as the owner of this mounted folder")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("jupyterlab: no command given after --", file=sys.stderr)
        return 2
    if not os.environ.get("JUPYTER_TOKEN", "").strip():
        print("jupyterlab: JUPYTER_TOKEN is empty: set it in .env (see .env.example), then run "
              "`docker compose --profile notebooks up -d`", file=sys.stderr)  # fmt: skip
        return 2
    try:
        owner = os.stat(args.owner_of)
    except OSError as exc:
        print(
            f"jupyterlab: cannot read {args.owner_of} ({exc.strerror}); is analysis/ mounted?",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.setgroups([])
        os.setgid(owner.st_gid)
        os.setuid(owner.st_uid)
    print(f"jupyterlab: running as uid {os.getuid()}:{os.getgid()}, the owner of {args.owner_of}", flush=True)
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
