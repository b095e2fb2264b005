"""The command line's own typer classes: the help's flags and arguments, one-line errors.

Every group and command of ``fulfilment`` is built with :class:`Group` or :class:`Command`.
A usage error and a Ctrl-C each print one line, ``fulfilment: <reason>``, as every other
failure of a command does.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NoReturn

from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

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


_STANDALONE: ContextVar[bool] = ContextVar("standalone", default=False)
"""Whether the running ``main`` prints its errors and exits (click's ``standalone_mode``).

Only then is a usage error turned into one line and exit 2; a caller of
``main(standalone_mode=False)`` gets click's ``UsageError``, as click promises.
"""


def _fail_in_one_line(error: UsageError) -> NoReturn:
    """Exit 2 with the usage error on one line, with the command's usage line.

    Typer's rich errors are a box of five lines (usage, hint, then the message framed), unlike
    every other failure of a command.
    """
    message = error.format_message().rstrip(".")
    if error.ctx is None:
        fail(message, ExitCode.BAD_INPUT)
    usage = error.ctx.get_usage().removeprefix("Usage:").strip()
    fail(f"{message}; usage: {usage} (--help says more)", ExitCode.BAD_INPUT)


class Argument(TyperArgument):
    """An argument named in capitals in the usage line and the help: ``FILE...``, ``[DATA]``.

    Typer 0.29 writes a required argument between braces and by its Python name
    (``{files}...``) and gives it its Python type (``<list[Path]>``). Here it goes by its
    metavar (its name in capitals without one), between brackets when optional, with ``...``
    when it takes several, and with no type: the name and the help say what it is.
    """

    @property
    def display_name_raw(self) -> str:
        """``FILE...``: the name in the help, the usage line and the errors that name it."""
        name = self.metavar or (self.name or "").upper()
        return f"{name}..." if self.nargs != 1 else name

    def _usage_display_name(self) -> str:
        return self.display_name_raw if self.required else f"[{self.display_name_raw}]"

    def _rich_display_name(self) -> str:
        return self.display_name_raw

    def display_type_rich(self, ctx: Context) -> str | None:  # noqa: ARG002 - typer's signature
        """No type: ``FILE`` says it, where typer would write ``<path>``."""
        return None


class Command(TyperCommand):
    """A sub-command whose help names no type after a flag, and whose Ctrl-C says so.

    Its arguments are of the class :class:`Argument`: typer builds every argument itself,
    with no way to choose its class, so the command changes the class of the ones it is given.

    typer turns a ``KeyboardInterrupt`` into exit 130 without a word; a command interrupted
    outside :func:`~fulfilment.entrypoints.cli.exits.run` (loading its modules, reading its
    settings) says it in one line, as one inside it does with its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - click's own signature
        """Build the command as typer does, then give its arguments the class :class:`Argument`."""
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                # Argument adds no state, only how the argument is written.
                param.__class__ = Argument
                # With a metavar, typer's rich help adds no "..." of its own.
                param.metavar = param.metavar or (param.name or "").upper()

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
    """A group of commands whose help names no type after a flag; a usage error says one line.

    Its own usage errors and its commands' (an unknown command or option, a missing or
    invalid value) print one line and exit 2. A group called without a command still prints
    its whole help (and exits 2). A caller of ``main(standalone_mode=False)`` gets the
    ``UsageError`` itself.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,  # noqa: FBT001, FBT002 - click's own signature
        windows_expand_args: bool = True,  # noqa: FBT001, FBT002 - click's own signature
        **extra: Any,  # noqa: ANN401 - click's own signature
    ) -> Any:  # noqa: ANN401 - click's own signature
        """Run the command line; in ``standalone_mode``, a usage error is one line and exit 2."""
        token = _STANDALONE.set(standalone_mode)
        try:
            return super().main(
                args,
                prog_name,
                complete_var,
                standalone_mode,
                windows_expand_args,
                **extra,
            )
        finally:
            _STANDALONE.reset(token)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,  # noqa: ANN401 - click's own signature
    ) -> Context:
        """Parse the group's own options; a usage error in them exits 2 with one line."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as error:
            if isinstance(error, NoArgsIsHelpError) or not _STANDALONE.get():
                raise
            _fail_in_one_line(error)

    def invoke(self, ctx: Context) -> Any:  # noqa: ANN401 - click's own signature
        """Run the chosen command; a usage error of its exits 2 with one line."""
        try:
            return super().invoke(ctx)
        except UsageError as error:
            if isinstance(error, NoArgsIsHelpError) or not _STANDALONE.get():
                raise
            _fail_in_one_line(error)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Write the help, with the type column of the flags blank."""
        _blank_flag_types(self, ctx)
        super().format_help(ctx, formatter)
