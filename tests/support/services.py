"""Where the test services are, and what a test does when one does not answer.

Shared by every suite's fixtures (a module of its own, since ``conftest`` modules of several
folders cannot be told apart by import).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.parse
import uuid
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

ADMIN_DATABASE_URL = os.environ.get(
    "FULFILMENT_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
AMQP_URL = os.environ.get("FULFILMENT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
AMQP_PORT = urllib.parse.urlsplit(AMQP_URL).port or 5672
"""The test broker's port, which tells the broker's connections among a process's sockets."""
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def service_unavailable(what: str, error: BaseException) -> None:
    """Fail under CI (a missing service must never pass silently); skip elsewhere."""
    message = f"{what} is not reachable: {type(error).__name__}: {error}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


async def admin_execute(sql: str) -> None:
    """Run one statement on the admin database (``FULFILMENT_TEST_DATABASE_URL``)."""
    connection = await asyncpg.connect(ADMIN_DATABASE_URL, timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@contextlib.contextmanager
def throwaway_database(prefix: str, options: str = "") -> Iterator[str]:
    """A new, empty, unmigrated database, dropped on exit; yields its ``postgresql+asyncpg`` URL.

    ``options`` is appended to ``CREATE DATABASE`` (a template or a locale, say). For
    synchronous code only: it runs its statements with ``asyncio.run``.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin_execute(f'CREATE DATABASE "{name}" {options}'.rstrip()))
    url = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql+asyncpg", database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
