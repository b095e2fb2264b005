"""The command line's own typer classes: the help's flags, and a Ctrl-C answered in one line.

Every group and command of ``fulfilment`` is built with :class:`Group` or :class:`Command`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typer.core import TyperCommand, TyperGroup, TyperOption

from fulfilment.entrypoints.cli.exits import fail
from fulfilment.exit_codes import ExitCode

if TYPE_CHECKING:
    # Typer vendors click; its context and help formatter types are reachable only there.
    from typer._click import Context, HelpFormatter


def _blank_flag_types(command: TyperCommand | TyperGroup, ctx: Context) -> None:
    """Show nothing in the type column of a flag's help: it takes no value.

    Typer 0.29's rich help prints a flag's Python type there (``--yes <bool>``), as if the
    option took one; an empty metavar leaves the column blank.
    """
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


class Command(TyperCommand):
    """A sub-command whose help names no type after a flag, and whose Ctrl-C says so.

    typer turns a ``KeyboardInterrupt`` into exit 130 without a word; a command interrupted
    outside :func:`~fulfilment.entrypoints.cli.exits.run` (loading its modules, reading its
    settings) says it in one line, as one inside it does with its own.
    """

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Write the help, with the type column of the flags blank."""
        _blank_flag_types(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Context) -> Any:  # noqa: ANN401 - click's own signature
        """Run the command; a ``KeyboardInterrupt`` out of it exits 130 with one line."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            fail("interrupted (Ctrl-C)", ExitCode.INTERRUPTED)


class Group(TyperGroup):
    """A group of commands whose help names no type after a flag."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Write the help, with the type column of the flags blank."""
        _blank_flag_types(self, ctx)
        super().format_help(ctx, formatter)
