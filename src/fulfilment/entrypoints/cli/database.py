"""The database's upkeep: ``fulfilment prune`` and ``fulfilment migrate``.

Both need the database **owner**'s ``FULFILMENT_DATABASE_URL`` (docs/security.md, "Least
privilege").
"""

from __future__ import annotations

import typer

from fulfilment.entrypoints.cli.exits import run
from fulfilment.entrypoints.cli.options import settings_or_exit, tool_options
from fulfilment.entrypoints.cli.typer_tweaks import Command

app = typer.Typer()
"""Merged into ``fulfilment`` itself (added without a name): ``fulfilment prune``, ..."""


MIGRATE_INTERRUPTED = (
    "interrupted (Ctrl-C): the upgrade and its grants are one transaction, committed whole or"
    " not at all, and a database it created stays; run fulfilment migrate again to finish (it"
    " goes on from the database's revision)"
)
"""What ``fulfilment migrate`` leaves when Ctrl-C stops it (``migrations/env.py``: one
transaction for the whole upgrade)."""


@app.command("prune", cls=Command)
def prune() -> None:
    """Delete what is past its retention: published outbox rows, processed ids, webhook ids.

    Outbox rows published more than ``FULFILMENT_OUTBOX_RETENTION_SECONDS`` ago, inbox rows
    older than ``FULFILMENT_PROCESSED_ID_RETENTION_SECONDS`` whose event could change nothing
    if it came again, and the warehouse's webhook ids (``webhook_inbox``) older than
    ``FULFILMENT_WEBHOOK_INBOX_RETENTION_SECONDS``; in transactions of
    ``FULFILMENT_OUTBOX_PRUNE_BATCH_SIZE`` rows. The warehouse's shipments and cancellations
    are never deleted: they apply each change once by its id, whatever webhook brings it.
    The CronJob ``fulfilment-prune`` runs it hourly; ``fulfilment outbox prune`` does its
    outbox part alone. Needs the database **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime
    role may not delete (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.outbox import prune_all_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        prune_all_command(
            tool_options(settings),
            outbox_retention_seconds=settings.retention.outbox_retention_seconds,
            processed_id_retention_seconds=settings.retention.processed_id_retention_seconds,
            webhook_inbox_retention_seconds=settings.retention.webhook_inbox_retention_seconds,
            batch_size=settings.retention.outbox_prune_batch_size,
            echo=typer.echo,
        )
    )


@app.command(cls=Command)
def migrate() -> None:
    """Create the database if it is missing, then ``alembic upgrade head``, then grant.

    Run it with the **owner** role's ``FULFILMENT_DATABASE_URL`` (the role that owns the
    tables; it needs ``CREATEDB`` only while the database is missing). With
    ``FULFILMENT_DATABASE_RUNTIME_ROLE``, the same transaction gives that role, the worker's
    and the relay's, only the privileges they use (docs/security.md, "Least privilege"); without it,
    one line says that nothing was granted.
    """
    from fulfilment.tools.migrate import migrate_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        migrate_command(
            settings.database.url.get_secret_value(),
            runtime_role=settings.database.runtime_role,
            echo=typer.echo,
        ),
        interrupted=MIGRATE_INTERRUPTED,
    )
