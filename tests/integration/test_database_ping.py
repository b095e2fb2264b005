"""The worker's database ping against the real PostgreSQL: it lies in neither direction.

Each test has a throwaway database of its own, so that the server settings it changes
(``idle_session_timeout``, ``ALLOW_CONNECTIONS``) reach no other test's connections.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from pydantic import SecretStr
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import ENGINE_POOL_SIZE, create_engine
from fulfilment.entrypoints.startup import database_options
from fulfilment.entrypoints.worker import ping_database
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.services import ADMIN_DATABASE_URL, admin_execute

pytestmark = pytest.mark.postgres

IDLE_SESSION_TIMEOUT_SECONDS = 1


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[str]:
    """The name of a new, empty database, dropped at the end (``database_url`` is the probe)."""
    del database_url  # requested only so that the test is skipped without PostgreSQL
    name = f"fulfilment_ping_{uuid.uuid4().hex[:12]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def engine(database: str) -> AsyncIterator[AsyncEngine]:
    url = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql+asyncpg", database=database)
    database = DatabaseSettings(
        url=SecretStr(url.render_as_string(hide_password=False)), connect_timeout_seconds=1
    )
    engine = create_engine(database_options(database, DeadlineSettings()))
    try:
        yield engine
    finally:
        await engine.dispose()


async def fill_pool(engine: AsyncEngine) -> None:
    """Open every connection of the engine's pool at once, and put them back."""
    connections = [await engine.connect() for _ in range(ENGINE_POOL_SIZE)]
    for connection in connections:
        await connection.execute(text("SELECT 1"))
        await connection.close()


async def test_pooled_connections_the_server_closed_while_idle_do_not_fail_the_ping(
    database: str, engine: AsyncEngine
) -> None:
    timeout = f"{IDLE_SESSION_TIMEOUT_SECONDS}s"
    await admin_execute(f"ALTER DATABASE \"{database}\" SET idle_session_timeout = '{timeout}'")
    for _ in range(3):
        await fill_pool(engine)
        await asyncio.sleep(IDLE_SESSION_TIMEOUT_SECONDS + 1)  # the server closes them all

        await ping_database(engine)


async def test_a_database_that_refuses_connections_fails_the_ping(
    database: str, engine: AsyncEngine
) -> None:
    await fill_pool(engine)
    await admin_execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    admin = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database
        )
    finally:
        await admin.close()

    with pytest.raises(sa_exc.DBAPIError):
        await ping_database(engine)
