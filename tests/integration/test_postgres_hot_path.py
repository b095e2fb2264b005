"""The reservation's hot path: one statement per order, and no pre-ping to pay for it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import uuid4

import asyncpg
import pytest
from pydantic import SecretStr
from sqlalchemy import event
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.retry import is_transient
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.domain.model import OrderLine, OutcomeKind, ReserveStock, StockLevel
from fulfilment.settings import Settings

POOL_SIZE = 4


class CountingProtocol:
    """Forwards to asyncpg's protocol, recording each call that talks to the server.

    asyncpg's query loggers do not see prepared statements (SQLAlchemy's way of executing), so
    the requests are counted where every one of them goes out: the connection's protocol.
    """

    REQUESTS = frozenset(
        {"prepare", "bind_execute", "bind_execute_many", "bind", "execute", "query"}
        | {"close_statement", "copy_in", "copy_out"}
    )

    def __init__(self, protocol, requests):
        self._protocol = protocol
        self._requests = requests

    def __getattr__(self, name):
        attribute = getattr(self._protocol, name)
        if name not in self.REQUESTS:
            return attribute

        def request(*args, **kwargs):
            self._requests.append(name)
            return attribute(*args, **kwargs)

        return request


def order(*lines):
    return ReserveStock(
        event_id=uuid4(),
        order_id=uuid4(),
        placed_at=datetime(2010, 12, 1, 8, 26, tzinfo=UTC),
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
    )


@pytest.fixture
async def warehouse_with_queries(clean_database):
    """A warehouse whose every request to PostgreSQL is recorded, and its retries."""
    settings = Settings(
        database_url=SecretStr(clean_database),
        database_pool_size=POOL_SIZE,
        retry_budget_seconds=5.0,
    )
    engine = create_engine(settings)
    requests: list[str] = []
    retries: list[BaseException] = []

    @event.listens_for(engine.sync_engine, "connect")
    def count_requests(dbapi_connection, _record):
        driver = dbapi_connection.driver_connection
        driver._protocol = CountingProtocol(driver._protocol, requests)

    warehouse = PostgresWarehouse(
        engine,
        consumer="fulfilment",
        retry_budget_seconds=settings.retry_budget_seconds,
        on_retry=retries.append,
    )
    try:
        yield warehouse, requests, retries
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_reservation_is_one_round_trip_on_a_pooled_connection(warehouse_with_queries):
    warehouse, requests, _ = warehouse_with_queries
    await warehouse.put_stock({"A": 10, "B": 10})
    await warehouse.reserve(order(("A", 1)))  # opens the connection, prepares the statement
    requests.clear()

    outcome = await warehouse.reserve(order(("A", 1), ("B", 2), ("A", 3)))

    assert outcome.kind is OutcomeKind.RESERVED
    assert requests == ["bind_execute"]


@pytest.mark.postgres
async def test_pooled_connections_dropped_by_a_failover_cost_a_retry_not_a_reservation(
    warehouse_with_queries, clean_database
):
    warehouse, _, retries = warehouse_with_queries
    await warehouse.put_stock({"A": 100})
    # Fill the pool with idle connections, as a worker between two bursts has it.
    await asyncio.gather(*(warehouse.reserve(order(("A", 1))) for _ in range(POOL_SIZE)))
    admin_url = make_url(clean_database).set(drivername="postgresql")
    admin = await asyncpg.connect(admin_url.render_as_string(hide_password=False))
    try:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'fulfilment' AND datname = current_database()"
        )
    finally:
        await admin.close()
    assert killed == POOL_SIZE

    outcomes = await asyncio.gather(*(warehouse.reserve(order(("A", 1))) for _ in range(POOL_SIZE)))

    assert [outcome.kind for outcome in outcomes] == [OutcomeKind.RESERVED] * POOL_SIZE
    assert retries
    assert all(is_transient(error) for error in retries)
    assert await warehouse.stock(["A"]) == {"A": StockLevel(100, 2 * POOL_SIZE)}
