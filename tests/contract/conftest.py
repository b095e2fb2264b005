"""The stock stores the contract suites run on: the in-memory fake and PostgreSQL."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.fakes import FakeStock


@pytest.fixture
def memory_stock():
    return FakeStock()


@pytest.fixture
async def postgres_stock(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
    finally:
        await engine.dispose()


@pytest.fixture(
    params=[
        "memory_stock",
        pytest.param("postgres_stock", marks=pytest.mark.postgres),
    ]
)
def stock(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
async def postgres_handoff_stock(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    finally:
        await engine.dispose()


@pytest.fixture
def memory_handoff_stock():
    return FakeStock(handoff=True)


@pytest.fixture(
    params=[
        "memory_handoff_stock",
        pytest.param("postgres_handoff_stock", marks=pytest.mark.postgres),
    ]
)
def handoff_stock(request):
    """A stock store with the hand-off to the warehouse system on."""
    return request.getfixturevalue(request.param)
