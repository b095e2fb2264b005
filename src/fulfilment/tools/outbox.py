"""``fulfilment outbox prune``: delete the published outbox rows past their retention.

Run by a Kubernetes CronJob (``k8s/outbox-prune-cronjob.yaml``). Unpublished rows are never
deleted, whatever their age: they are events the relay still owes the broker.
"""

from __future__ import annotations

import asyncpg

from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.adapters.postgres.errors import connection_failure
from fulfilment.adapters.postgres.outbox import prune_published
from fulfilment.tools.command import Echo, ToolOptions


async def prune_command(
    options: ToolOptions, *, retention_seconds: float, batch_size: int, echo: Echo
) -> None:
    """Delete rows published more than ``retention_seconds`` ago, ``batch_size`` per transaction.

    Echoes ``outbox prune: <n> published rows older than <s> s deleted``.

    Raises:
        DatabaseUnavailableError, DatabaseRefusedError: PostgreSQL does not answer or refuses.
    """
    try:
        connection = await asyncpg.connect(
            asyncpg_dsn(options.database.url), timeout=options.database.connect_timeout_seconds
        )
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        raise connection_failure(options.database.url, error) from error
    try:
        deleted = await prune_published(
            connection, older_than_seconds=retention_seconds, batch_size=batch_size
        )
    finally:
        await connection.close()
    echo(f"outbox prune: {deleted} published rows older than {retention_seconds:g} s deleted")
