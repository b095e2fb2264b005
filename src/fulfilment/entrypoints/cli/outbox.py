"""``fulfilment outbox``: the outbox of result events."""

from __future__ import annotations

import typer

from fulfilment.entrypoints.cli.exits import run
from fulfilment.entrypoints.cli.options import settings_or_exit, tool_options
from fulfilment.entrypoints.cli.typer_tweaks import Command, Group

app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="The outbox of result events: ``fulfilment outbox prune`` deletes its published rows"
    " alone (``fulfilment prune`` deletes them and the inbox's old rows).",
)


@app.command("prune", cls=Command)
def outbox_prune() -> None:
    """Delete published outbox rows older than ``FULFILMENT_OUTBOX_RETENTION_SECONDS``, alone.

    The outbox part of ``fulfilment prune``, leaving the inbox as it is: for an outbox that
    grew during an incident, and for the scripts of releases before ``fulfilment prune``,
    whose CronJob (``fulfilment-outbox-prune``) ran this command. In transactions of
    ``FULFILMENT_OUTBOX_PRUNE_BATCH_SIZE`` rows; unpublished rows stay. Needs the database
    **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime role may not delete outbox rows
    (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.outbox import prune_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        prune_command(
            tool_options(settings),
            retention_seconds=settings.outbox_retention_seconds,
            batch_size=settings.outbox_prune_batch_size,
            echo=typer.echo,
        )
    )
