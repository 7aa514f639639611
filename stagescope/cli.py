"""The ``stagescope`` command: a thin layer over the library.

Each part of the project owns its commands in a module ``stagescope.<part>.cli`` that defines
``register(subparsers)``; ``register`` adds one sub-parser and sets ``func`` (``args -> exit status``).
Commands parse, delegate to the library, and turn a :class:`~stagescope.errors.UserError` into one line
on stderr with exit status 2, never a traceback.

Optional dependencies (pip extras, :mod:`stagescope.extras`) are imported inside a command's ``func``,
never by ``register``, so every ``--help`` works whatever is installed. Before ``func`` runs, the
command's extra (:data:`~stagescope.extras.COMMAND_EXTRAS`) is checked without importing it; a missing
one is one line naming the ``pip install`` to run, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import typing
from collections.abc import Sequence

from stagescope.errors import EXIT_USAGE, UserError
from stagescope.extras import COMMAND_EXTRAS, require

__all__ = ["COMMAND_MODULES", "OneLineParser", "build_parser", "main", "one_line"]

#: The modules that register sub-commands, in the order ``stagescope --help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "stagescope.demo.cli",  # demo
    "stagescope.service.cli",  # serve
    "stagescope.loadgen.cli",  # load
    "stagescope.analysis.cli",  # analyze
    "stagescope.dashboards.cli",  # dashboards build
    "stagescope.alerts.cli",  # alerts build
    "stagescope.instrumentation.gpu.cli",  # gpu-exporter
)


_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t", 127: "\\x7f"}


def one_line(message: str) -> str:
    """``message`` with control characters escaped: a file name or value holding a newline must not
    turn the one line a user gets into two."""
    return message.translate(_CONTROL)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2, like every other
    bad input (argparse's own prints the usage block first). Sub-parsers inherit the class."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="stagescope",
        description="Find which stage ate your inference latency SLO, and which lever fixes it.",
    )
    from stagescope import __version__

    parser.add_argument("--version", action="version", version=f"stagescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    extra = COMMAND_EXTRAS.get(args.command)
    try:
        if extra is not None:
            require(extra)
        return int(func(args) or 0)
    except ModuleNotFoundError as exc:
        # a third-party module the extra check does not know of (a newer dependency, a broken install)
        top = (exc.name or "").partition(".")[0]
        if not top or top == "stagescope":
            raise
        hint = f": pip install 'stagescope[{extra}]'" if extra else ""
        print(f"stagescope {args.command}: error: needs the Python module {top!r}, which is not installed{hint}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    except UserError as exc:
        print(f"stagescope {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"stagescope {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout piped into e.g. `head`, which left: nothing to report, no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's flush at exit must not raise again
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
