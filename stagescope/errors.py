"""User-facing errors: the CLI prints them as one line on stderr and exits with status 2."""

from __future__ import annotations

__all__ = ["EXIT_NO_DATA", "EXIT_USAGE", "UserError"]

#: Exit status for bad input (bad file, bad option, unknown scenario, port in use ...).
EXIT_USAGE = 2
#: Exit status of a command whose answer is "no data" (an SLO with 0 samples): not a verdict, not a
#: usage error either (the input was valid; it held nothing the SLO is about).
EXIT_NO_DATA = 3


class UserError(Exception):
    """Bad input from the user: the message is shown as-is, without a traceback.

    Name the file (and line, where there is one) in the message: ``"trace.json:12: not JSON"``.
    """
