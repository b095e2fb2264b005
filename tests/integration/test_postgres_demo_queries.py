"""The demo's looks into the database: outcomes of given events, statuses of given orders,
the stock summed over every SKU, and the outbox rows of a run."""

from __future__ import annotations

from uuid import uuid4

import pytest
from sqlalchemy import text

from builders import order
from fulfilment.adapters.postgres.admin import (
    OutboxEntry,
    StockTotals,
    inbox_outcomes,
    order_statuses,
    outbox_entries_after,
    outbox_last_id,
    outbox_unpublished_after,
    stock_totals,
)
from fulfilment.domain.lifecycle import OrderStatus

pytestmark = pytest.mark.postgres


async def test_an_empty_database_has_no_outcome_no_status_and_no_stock(warehouse):
    assert await inbox_outcomes(warehouse, "fulfilment", [uuid4()]) == {}
    assert await inbox_outcomes(warehouse, "fulfilment", []) == {}
    assert await order_statuses(warehouse, [uuid4()]) == {}
    assert await order_statuses(warehouse, []) == {}
    assert await stock_totals(warehouse) == StockTotals(on_hand=0, reserved=0)
    assert await outbox_last_id(warehouse) == 0
    assert await outbox_entries_after(warehouse, 0) == []
    assert await outbox_unpublished_after(warehouse, 0) == 0


async def test_outcomes_and_statuses_of_the_events_and_orders_asked_for_only(warehouse):
    await warehouse.put_stock({"A": 10, "B": 1})
    reserved, rejected, other = order(("A", 3)), order(("B", 2)), order(("A", 1))
    duplicate = order(("A", 1), order_id=reserved.order_id)
    for command in (reserved, rejected, other, duplicate):
        await warehouse.apply(command)
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


async def test_the_outbox_rows_after_a_last_id_in_id_order_and_those_unpublished(warehouse):
    await warehouse.put_stock({"A": 10})
    before = order(("A", 3))
    await warehouse.apply(before)
    baseline = await outbox_last_id(warehouse)
    reserved, rejected = order(("A", 2)), order(("A", 99))
    await warehouse.apply(reserved)
    await warehouse.apply(rejected)

    entries = await outbox_entries_after(warehouse, baseline)

    assert baseline > 0
    assert [(entry.order_id, entry.routing_key) for entry in entries] == [
        (reserved.order_id, "stock.reserved"),
        (rejected.order_id, "stock.rejected"),
    ]
    assert all(isinstance(entry, OutboxEntry) for entry in entries)
    assert baseline < entries[0].id < entries[1].id
    assert await outbox_last_id(warehouse) == entries[1].id
    assert await outbox_unpublished_after(warehouse, baseline) == 2
    async with warehouse.engine.begin() as connection:
        await connection.execute(
            text("UPDATE outbox SET published_at = now() WHERE id = :id"), {"id": entries[0].id}
        )
    assert await outbox_unpublished_after(warehouse, baseline) == 1
    assert await outbox_unpublished_after(warehouse, 0) == 2  # the row before the baseline too
