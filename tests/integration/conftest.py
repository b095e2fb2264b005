"""Fixtures of the integration suite's tests against PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings


@pytest.fixture
async def engine(clean_database: str) -> AsyncIterator[AsyncEngine]:
    """The service's engine (``create_engine``, default settings) on the emptied database.

    A module that needs another engine (a plain one, another database) defines its own.
    """
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def stock(engine: AsyncEngine) -> PostgresStock:
    """A ``PostgresStock`` on :func:`engine`: consumer ``fulfilment``, retry budget 2 s."""
    return PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
