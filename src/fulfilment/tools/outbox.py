"""``fulfilment prune`` and ``fulfilment outbox prune``: delete rows past their retention.

``fulfilment prune`` (the Kubernetes CronJob ``k8s/prune-cronjob.yaml``, hourly) deletes the
published outbox rows older than ``FULFILMENT_OUTBOX_RETENTION_SECONDS`` and the inbox's
processed ids older than ``FULFILMENT_PROCESSED_ID_RETENTION_SECONDS`` that are safe to delete
(``adapters.postgres.inbox``), and the warehouse's webhook ids older than
``FULFILMENT_WEBHOOK_INBOX_RETENTION_SECONDS`` (``adapters.postgres.webhook_inbox``).
``fulfilment outbox prune`` does the first alone, as before. Unpublished outbox rows are never
deleted, whatever their age: they are events the relay still owes the broker; nor are the
warehouse's shipments and cancellations, the record by which each is applied once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.adapters.postgres.errors import connection_failure
from fulfilment.adapters.postgres.inbox import prune_processed
from fulfilment.adapters.postgres.outbox import prune_published
from fulfilment.adapters.postgres.webhook_inbox import prune_webhook_ids
from fulfilment.tools.command import Echo, ToolOptions


@asynccontextmanager
async def _connect(options: ToolOptions) -> AsyncIterator[asyncpg.Connection]:
    try:
        connection = await asyncpg.connect(
            asyncpg_dsn(options.database.url), timeout=options.database.connect_timeout_seconds
        )
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        raise connection_failure(
            options.database.url, error, timeout_seconds=options.database.connect_timeout_seconds
        ) from error
    try:
        yield connection
    finally:
        await connection.close()


async def prune_command(
    options: ToolOptions, *, retention_seconds: float, batch_size: int, echo: Echo
) -> None:
    """Delete rows published more than ``retention_seconds`` ago, ``batch_size`` per transaction.

    Echoes ``outbox prune: <n> published rows older than <s> s deleted``.

    Raises:
        DatabaseUnavailableError, DatabaseRefusedError: PostgreSQL does not answer or refuses.
    """
    async with _connect(options) as connection:
        await _prune_outbox(connection, retention_seconds, batch_size, echo)


async def _prune_outbox(
    connection: asyncpg.Connection, retention_seconds: float, batch_size: int, echo: Echo
) -> None:
    deleted = await prune_published(
        connection, older_than_seconds=retention_seconds, batch_size=batch_size
    )
    echo(f"outbox prune: {deleted} published rows older than {retention_seconds:.0f} s deleted")


async def prune_all_command(  # noqa: PLR0913 - each retention of the command, by name
    options: ToolOptions,
    *,
    outbox_retention_seconds: float,
    processed_id_retention_seconds: float,
    webhook_inbox_retention_seconds: float,
    batch_size: int,
    echo: Echo,
) -> None:
    """``fulfilment prune``: the outbox (as :func:`prune_command`), the inbox, the webhook inbox.

    Echoes the outbox's line, then
    ``inbox prune: <n> processed ids older than <s> s deleted (consumer <consumer>)`` and
    ``webhook inbox prune: <n> webhook ids older than <s> s deleted (consumer <consumer>)``,
    the consumer being ``FULFILMENT_CONSUMER_NAME``, whose inboxes they are.

    Raises:
        DatabaseUnavailableError, DatabaseRefusedError: PostgreSQL does not answer or refuses.
    """
    async with _connect(options) as connection:
        await _prune_outbox(connection, outbox_retention_seconds, batch_size, echo)
        deleted = await prune_processed(
            connection,
            consumer=options.consumer,
            older_than_seconds=processed_id_retention_seconds,
            batch_size=batch_size,
        )
        echo(
            f"inbox prune: {deleted} processed ids older than"
            f" {processed_id_retention_seconds:.0f} s deleted (consumer {options.consumer})"
        )
        webhooks = await prune_webhook_ids(
            connection,
            consumer=options.consumer,
            older_than_seconds=webhook_inbox_retention_seconds,
            batch_size=batch_size,
        )
    echo(
        f"webhook inbox prune: {webhooks} webhook ids older than"
        f" {webhook_inbox_retention_seconds:.0f} s deleted (consumer {options.consumer})"
    )
