"""``fulfilment migrate``: the database at the migrations' head, with the runtime role's grants.

The database is created if missing; the runtime role's privileges are those of
``adapters.postgres.privileges`` (docs/security.md, "Least privilege").
"""

from __future__ import annotations

import asyncio

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from fulfilment.adapters.postgres.admin import ensure_database
from fulfilment.adapters.postgres.privileges import (
    GrantSummary,
    RuntimeRoleError,
    UndecidedObjectsError,
)
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo

LOCK_CONFLICTS = frozenset({"40P01", "55P03"})
"""SQLSTATEs of an upgrade that lost a lock to the running services: ``deadlock_detected``
(PostgreSQL aborted the migration, not a worker's transaction) and ``lock_not_available`` (a
revision's ``lock_timeout`` ran out). The upgrade is one transaction, rolled back whole, so it
is tried again, as a Kubernetes Job would be."""

MIGRATE_ATTEMPTS = 5
"""Tries of an upgrade that lost a lock, at most."""

MIGRATE_BUDGET_SECONDS = 120.0
"""No new try once this many seconds passed since the first."""


def lost_a_lock(error: BaseException) -> bool:
    """Whether ``error`` is an upgrade aborted by a lock conflict (:data:`LOCK_CONFLICTS`).

    SQLAlchemy wraps the driver's error: its ``orig`` (or that one's cause, asyncpg's own
    exception) carries the SQLSTATE.
    """
    if not isinstance(error, DBAPIError):
        return False
    for candidate in (error.orig, getattr(error.orig, "__cause__", None)):
        if getattr(candidate, "sqlstate", None) in LOCK_CONFLICTS:
            return True
    return False


GRANTS_SKIPPED = (
    "runtime role grants skipped: FULFILMENT_DATABASE_RUNTIME_ROLE is not set (every process"
    " then needs this URL's rights; docs/security.md, 'Least privilege')"
)


async def migrate_command(database_url: str, *, runtime_role: str, echo: Echo) -> None:
    """Create the database if missing, ``alembic upgrade head``, then grant ``runtime_role``.

    A database it created is named in a line of its own (``created the database <name>``).
    The grants are made in the upgrade's transaction; none when ``runtime_role`` is empty. An
    upgrade that lost a lock to the running services (:func:`lost_a_lock`) is rolled back and
    tried again, at most :data:`MIGRATE_ATTEMPTS` times within :data:`MIGRATE_BUDGET_SECONDS`,
    each try said in a line.

    Raises:
        DatabaseUnavailableError: the server does not answer or refuses the login.
        CommandError: the runtime role cannot take its privileges (exit 2: it does not exist,
            is this URL's user, a superuser, or owns or inherits the tables), or an object of
            the schema has no privilege decision (exit 1); the upgrade is rolled back.
    """
    if await ensure_database(database_url):
        echo(f"created the database {make_url(database_url).database}")

    def said_again(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        echo(f"migration lost a lock to the running services, trying again: {error}".split("\n")[0])

    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(lost_a_lock),
            stop=stop_after_attempt(MIGRATE_ATTEMPTS) | stop_after_delay(MIGRATE_BUDGET_SECONDS),
            wait=wait_random_exponential(multiplier=1, max=10),
            before_sleep=said_again,
            reraise=True,
        ):
            with attempt:
                # alembic runs its own event loop (migrations/env.py), so not on this one.
                summary = await asyncio.to_thread(
                    migrate, database_url, runtime_role=runtime_role or None
                )
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
