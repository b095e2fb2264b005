"""``fulfilment migrate``: the database, created if missing, at the migrations' head."""

from __future__ import annotations

import asyncio

from fulfilment.adapters.postgres.admin import ensure_database
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.tools.command import Echo


async def migrate_command(database_url: str, *, echo: Echo) -> None:
    """Create the database of ``database_url`` if it is missing, then ``alembic upgrade head``.

    Raises:
        DatabaseUnavailableError: the server does not answer or refuses the login.
    """
    await ensure_database(database_url)
    # alembic runs its own event loop (migrations/env.py), so not on this one.
    await asyncio.to_thread(migrate, database_url)
    echo("database migrated to head")
