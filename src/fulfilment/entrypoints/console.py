"""The ``fulfilment`` program's entry point: the command line of :mod:`fulfilment.entrypoints.cli`.

A module of its own that imports nothing before its guard (nor do the packages above it), so
that a Ctrl-C while the command line's modules load (its first few tenths of a second) is
answered as one during a command is: one line and exit 130 (``ExitCode.INTERRUPTED``), not a
``KeyboardInterrupt`` traceback.
"""

from __future__ import annotations

import sys

INTERRUPTED_AT_START = "fulfilment: interrupted (Ctrl-C) before the command started\n"


def main() -> None:
    """Run ``entrypoints.cli.app``; exit 130 with one line if interrupted while it loads."""
    try:
        from fulfilment.entrypoints.cli import app  # noqa: PLC0415 - imported inside the interrupt's guard
    except KeyboardInterrupt:
        # Imported here: before the guard, the import would widen the unguarded moment.
        from fulfilment.exit_codes import ExitCode  # noqa: PLC0415

        sys.stderr.write(INTERRUPTED_AT_START)
        sys.exit(ExitCode.INTERRUPTED)
    app()
