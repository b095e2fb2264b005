"""Orders of arrival of the warehouse's shipments and cancellations and the upstream events,
on the in-memory stock store (the rule; ``tests/integration/test_postgres_warehouse_lifecycle.py``
holds PostgreSQL to the same).

1. Every arrival order equivalent to the in-order one (``tests.support.warehouse_histories``;
   docs/design.md, "Orders of arrival") ends with the stock and the statuses of the in-order
   sequence, copies of events anywhere.
2. Any arrival order of anything (more than held, SKUs not held, unknown orders, copies,
   scarce stock) keeps the stock exact: ``on_hand`` = loaded − units taken, ``reserved`` =
   held lines.
3. The arrival orders outside the equivalence differ, as the documentation says.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from fulfilment.domain.lifecycle import ShipKind
from fulfilment.domain.model import StockLevel
from fulfilment.domain.warehouse_events import ShipmentKind, WarehouseCancellationKind
from tests.support.builders import cancellation, order, shipment
from tests.support.fakes import FakeStock
from tests.support.warehouse_commands import warehouse_cancellation, warehouse_shipment
from tests.support.warehouse_event_rows import order_lines
from tests.support.warehouse_histories import (
    SKUS,
    Event,
    any_arrival,
    assert_stock_exact,
    consistent_histories,
    equivalent_arrival,
    mixed_histories,
    settled,
    taken_units,
)

PLENTY = 1_000

PROPERTY = settings(max_examples=300, deadline=None)


async def _applied(loaded: dict[str, int], events: list[Event]) -> tuple[FakeStock, list[object]]:
    stock = FakeStock()
    await stock.put_stock(loaded)
    return stock, [await stock.apply(event) for event in events]


@PROPERTY
@given(data=st.data())
def test_every_equivalent_arrival_order_ends_with_the_in_order_stock_and_statuses(data):
    histories = data.draw(consistent_histories())
    events = data.draw(equivalent_arrival(histories))
    loaded = dict.fromkeys(SKUS, PLENTY)

    in_order, _ = asyncio.run(_applied(loaded, [e for history in histories for e in history]))
    arrived, outcomes = asyncio.run(_applied(loaded, events))

    assert arrived.levels == in_order.levels
    rows = asyncio.run(order_lines(arrived))
    assert settled(rows) == settled(asyncio.run(order_lines(in_order)))
    assert_stock_exact(loaded, arrived.levels, rows, taken_units(outcomes))


@PROPERTY
@given(data=st.data(), scarce=st.booleans())
def test_in_any_arrival_order_the_stock_stays_exact(data, scarce):
    histories = data.draw(mixed_histories())
    events = data.draw(any_arrival(histories))
    loaded = (
        data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))
        if scarce
        else dict.fromkeys(SKUS, PLENTY)
    )

    stock, outcomes = asyncio.run(_applied(loaded, events))

    assert_stock_exact(loaded, stock.levels, asyncio.run(order_lines(stock)), taken_units(outcomes))


# Outside the equivalence: what differs, and why.


async def test_a_whole_cancellation_before_a_shipment_releases_the_units_that_shipped():
    # The warehouse shipped 2 A, then cancelled the rest; its webhooks came the other way round.
    stock = FakeStock()
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    await stock.apply(placed)

    cancelled = await stock.apply(warehouse_cancellation(placed.order_id))
    shipped = await stock.apply(warehouse_shipment(placed.order_id, ("A", 2)))

    assert cancelled.kind is WarehouseCancellationKind.RELEASED
    assert shipped.kind is ShipmentKind.DISCREPANCY
    # In the warehouse's order on_hand would be 8: the 2 units stay counted until adjusted.
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10)}


async def test_a_cancellation_after_the_upstream_shipment_finds_nothing_to_release():
    stock = FakeStock()
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    await stock.apply(placed)

    first = await stock.apply(shipment(placed.order_id))
    late_by_warehouse = await stock.apply(warehouse_cancellation(placed.order_id, ("A", 1)))
    late_by_shop = await stock.apply(cancellation(placed.order_id, ("A", 1)))

    assert first.kind is ShipKind.SHIPPED
    assert late_by_warehouse.kind is WarehouseCancellationKind.IGNORED
    assert str(late_by_shop.kind) == "cancel_after_ship"
    # Cancelled first, on_hand would be 8 and the order shipped 2: the OrderShipped took all 3.
    assert await stock.levels_of(["A"]) == {"A": StockLevel(7)}
