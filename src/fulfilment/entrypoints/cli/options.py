"""What every command reads before it runs: the settings, and the tools' options built from them."""

from __future__ import annotations

from typing import Annotated

import typer

from fulfilment.entrypoints.cli.exits import fail
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import Settings, SettingsError, load_settings
from fulfilment.tools.command import ToolOptions


def settings_or_exit() -> Settings:
    """Validated settings, or exit 2 naming every bad variable on one line."""
    try:
        return load_settings()
    except SettingsError as error:
        fail(f"invalid settings: {'; '.join(str(error).splitlines())}", ExitCode.BAD_INPUT)


def tool_options(settings: Settings) -> ToolOptions:
    """What the tools take from ``settings``: the broker, the database, the inbox's consumer."""
    from fulfilment.entrypoints.startup import database_options  # noqa: PLC0415 - loads SQLAlchemy

    return ToolOptions(
        amqp_url=settings.amqp_url.get_secret_value(),
        database=database_options(settings),
        consumer=settings.consumer_name,
    )


YesOption = Annotated[
    bool, typer.Option("--yes", help="Do it; without this flag the command is a dry run.")
]


OperatorOption = Annotated[
    str | None,
    typer.Option(
        help="Your name, for the audit table; recorded beside the OS user and host, "
        "which are always read from the environment."
    ),
]
