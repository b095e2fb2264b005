"""The demo's looks into the database: outcomes of given events, statuses of given orders,
and the stock summed over every SKU."""

from __future__ import annotations

from uuid import uuid4

import pytest
from pydantic import SecretStr

from builders import order
from fulfilment.adapters.postgres.admin import (
    StockTotals,
    inbox_outcomes,
    order_statuses,
    stock_totals,
)
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.composition import database_options
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.settings import Settings

pytestmark = pytest.mark.postgres


@pytest.fixture
async def warehouse(clean_database):
    engine = create_engine(database_options(Settings(database_url=SecretStr(clean_database))))
    try:
        yield PostgresWarehouse(engine, consumer="fulfilment", retry_budget_seconds=2.0)
    finally:
        await engine.dispose()


async def test_an_empty_database_has_no_outcome_no_status_and_no_stock(warehouse):
    assert await inbox_outcomes(warehouse, "fulfilment", [uuid4()]) == {}
    assert await inbox_outcomes(warehouse, "fulfilment", []) == {}
    assert await order_statuses(warehouse, [uuid4()]) == {}
    assert await order_statuses(warehouse, []) == {}
    assert await stock_totals(warehouse) == StockTotals(on_hand=0, reserved=0)


async def test_outcomes_and_statuses_of_the_events_and_orders_asked_for_only(warehouse):
    await warehouse.put_stock({"A": 10, "B": 1})
    reserved, rejected, other = order(("A", 3)), order(("B", 2)), order(("A", 1))
    duplicate = order(("A", 1), order_id=reserved.order_id)
    for command in (reserved, rejected, other, duplicate):
        await warehouse.reserve(command)
    unknown = uuid4()

    outcomes = await inbox_outcomes(
        warehouse, "fulfilment", [reserved.event_id, rejected.event_id, duplicate.event_id, unknown]
    )
    statuses = await order_statuses(warehouse, [reserved.order_id, rejected.order_id, unknown])

    assert outcomes == {
        reserved.event_id: "reserved",
        rejected.event_id: "rejected",
        duplicate.event_id: "duplicate_order",
    }
    assert await inbox_outcomes(warehouse, "another consumer", [reserved.event_id]) == {}
    assert statuses == {
        reserved.order_id: OrderStatus.RESERVED,
        rejected.order_id: OrderStatus.REJECTED,
    }
    assert await stock_totals(warehouse) == StockTotals(on_hand=11, reserved=4)
