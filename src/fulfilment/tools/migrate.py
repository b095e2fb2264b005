"""``fulfilment migrate``: the database at the migrations' head, with the runtime role's grants.

The database is created if missing; the runtime role's privileges are those of
``adapters.postgres.privileges`` (docs/security.md, "Least privilege").
"""

from __future__ import annotations

import asyncio

from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.admin import ensure_database
from fulfilment.adapters.postgres.privileges import (
    GrantSummary,
    RuntimeRoleError,
    UndecidedObjectsError,
)
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo

GRANTS_SKIPPED = (
    "runtime role grants skipped: FULFILMENT_DATABASE_RUNTIME_ROLE is not set (every process"
    " then needs this URL's rights; docs/security.md, 'Least privilege')"
)


async def migrate_command(database_url: str, *, runtime_role: str, echo: Echo) -> None:
    """Create the database if missing, ``alembic upgrade head``, then grant ``runtime_role``.

    A database it created is named in a line of its own (``created the database <name>``).
    The grants are made in the upgrade's transaction; none when ``runtime_role`` is empty.

    Raises:
        DatabaseUnavailableError: the server does not answer or refuses the login.
        CommandError: the runtime role cannot take its privileges (exit 2: it does not exist,
            is this URL's user, a superuser, or owns or inherits the tables), or an object of
            the schema has no privilege decision (exit 1); the upgrade is rolled back.
    """
    if await ensure_database(database_url):
        echo(f"created the database {make_url(database_url).database}")
    try:
        # alembic runs its own event loop (migrations/env.py), so not on this one.
        summary = await asyncio.to_thread(migrate, database_url, runtime_role=runtime_role or None)
    except RuntimeRoleError as error:
        msg = f"FULFILMENT_DATABASE_RUNTIME_ROLE: {error}; nothing was migrated"
        raise CommandError(msg, ExitCode.BAD_INPUT) from error
    except UndecidedObjectsError as error:
        msg = f"{error}; nothing was migrated"
        raise CommandError(msg) from error
    echo("database migrated to head")
    echo(grants_line(summary))


def grants_line(summary: GrantSummary | None) -> str:
    """What the migration granted, in one line (and its warnings), or that it granted nothing."""
    if summary is None:
        return GRANTS_SKIPPED
    return "\n".join(
        [f"granted {summary.describe()}", *(f"warning: {line}" for line in summary.warnings)]
    )
