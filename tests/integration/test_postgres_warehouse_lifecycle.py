"""The lifecycle with the warehouse's events on PostgreSQL: generated sequences of OrderPlaced,
OrderCancelled, OrderShipped and the warehouse's shipments and cancellations, in every arrival
order, with every kind of copy (a redelivery, the same webhook again, the same shipment or
cancellation under a new webhook id or found by the poll).

1. ``record_shipments()``, ``record_warehouse_cancellations()``, ``ship_orders()`` and
   ``cancel_orders()`` implement the state tables (``fulfilment.domain.lifecycle`` and
   ``fulfilment.domain.warehouse_lifecycle``): for any sequence, PostgreSQL gives every event
   the outcome the in-memory stock store gives it when the events come one after the other,
   and ends with the same stock, orders and lines (quantity and shipped), inbox, webhook
   inbox, shipments, cancellations, discrepancies and result events. Consecutive events of
   one kind share one transaction, as group commit makes them. With the hand-off on, the same
   holds with the requests to the warehouse system.
2. Every arrival order equivalent to the in-order one (``tests.support.warehouse_histories``;
   docs/design.md, "Orders of arrival") ends on PostgreSQL with the stock and statuses of the
   in-order sequence.
3. In any arrival order, with scarce stock and a confused warehouse, the stock is exact:
   ``on_hand`` = loaded − the units shipments took, ``reserved`` = the held lines.
"""

from __future__ import annotations

import asyncio
import json
from itertools import groupby
from typing import Self

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as count_example
from hypothesis import strategies as st

from fulfilment.domain.model import PlaceOrder
from tests.integration.test_postgres_lifecycle import (
    Database,
    Sent,
    _fake_state,
    _move_on,
    handed_off,
)
from tests.support.fakes import FakeStock, RecordedEvent
from tests.support.warehouse_event_rows import (
    cancellations,
    discrepancies,
    order_lines,
    shipments,
    webhook_inbox,
)
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
from tests.support.warehouse_rows import requests_in_database, requests_in_fake

pytestmark = pytest.mark.postgres

PLENTY = 1_000

PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class WarehouseDatabase(Database):
    """The lifecycle's test database, with the warehouse's tables emptied too."""

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        await self.pool.execute(
            "TRUNCATE webhook_inbox, warehouse_shipments, warehouse_shipment_lines,"
            " warehouse_cancellations, warehouse_cancellation_lines, warehouse_discrepancies"
        )
        return self

    async def recorded(self):
        """Everything the warehouse's events are compared by, as the fake's readers give it."""
        return await _recorded(self.pool)

    async def result_bodies(self) -> list[RecordedEvent]:
        """The outbox in publishing order, less what each row mints (event id, time)."""
        rows = await self.pool.fetch(
            "SELECT routing_key, body, traceparent FROM outbox ORDER BY id"
        )
        events = []
        for row in rows:
            body = json.loads(row["body"])
            del body["event_id"], body["occurred_at"]
            events.append(RecordedEvent(row["routing_key"], body, row["traceparent"]))
        return events


async def _recorded(store):
    return (
        await order_lines(store),
        await webhook_inbox(store),
        await shipments(store),
        await cancellations(store),
        await discrepancies(store),
    )


async def _apply_in_runs(stock, events: list[Event]) -> list[object]:
    """Apply ``events`` in arrival order; consecutive events of one kind together, so that group
    commit makes each run one transaction."""
    outcomes: list[object] = []
    for _, run in groupby(events, key=type):
        outcomes += await asyncio.gather(*(stock.apply(event) for event in run))
    return outcomes


def _stock(data, *, scarce: bool) -> dict[str, int]:
    if scarce:
        return data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))
    return dict.fromkeys(SKUS, PLENTY)


def _count_kinds(outcomes: list[object]) -> None:
    for outcome in outcomes:
        count_example(f"{type(outcome).__name__} {outcome.label}")  # type: ignore[attr-defined]


@PROPERTY
@given(data=st.data(), scarce=st.booleans())
def test_postgresql_gives_every_warehouse_event_the_outcome_the_rule_gives_one_after_the_other(
    clean_database, data, scarce
):
    histories = data.draw(mixed_histories())
    events = data.draw(any_arrival(histories))
    stock = _stock(data, scarce=scarce)
    fake = FakeStock()

    async def one_after_the_other():
        await fake.put_stock(stock)
        return [await fake.apply(event) for event in events]

    async def on_postgresql():
        async with WarehouseDatabase(clean_database) as database:
            await database.stock.put_stock(stock)
            outcomes = await _apply_in_runs(database.stock, events)
            return (
                outcomes,
                await database.state(),
                await database.recorded(),
                await database.result_bodies(),
            )

    expected = asyncio.run(one_after_the_other())
    outcomes, state, recorded, result_events = asyncio.run(on_postgresql())

    assert outcomes == expected
    assert state == _fake_state(fake)
    assert recorded == asyncio.run(_recorded(fake))
    assert result_events == [
        RecordedEvent(event.routing_key, event.body, None) for event in fake.result_events
    ]
    _count_kinds(outcomes)


@PROPERTY
@given(data=st.data())
def test_with_the_handoff_postgresql_gives_every_warehouse_event_and_request_what_the_fake_gives(
    clean_database, data
):
    histories = data.draw(mixed_histories())
    events = data.draw(
        handed_off(
            [history for history in histories if history and isinstance(history[0], PlaceOrder)],
            data.draw(any_arrival(histories)),
        )
    )
    stock = dict.fromkeys(SKUS, PLENTY)
    fake = FakeStock(handoff=True)

    async def one_after_the_other():
        await fake.put_stock(stock)
        outcomes = []
        for event in events:
            if isinstance(event, Sent):
                _move_on(fake, event)
                outcomes.append(None)
            else:
                outcomes.append(await fake.apply(event))
        return outcomes

    async def on_postgresql():
        async with WarehouseDatabase(clean_database, handoff=True) as database:
            await database.stock.put_stock(stock)
            outcomes: list[object] = []
            for kind, run in groupby(events, key=type):
                batch = list(run)
                if kind is Sent:
                    for sent in batch:
                        await database.move_on(sent)
                    outcomes += [None] * len(batch)
                else:
                    outcomes += await _apply_in_runs(database.stock, batch)
            return (
                outcomes,
                await database.state(),
                await database.recorded(),
                await requests_in_database(database.pool),
            )

    expected = asyncio.run(one_after_the_other())
    outcomes, state, recorded, requests = asyncio.run(on_postgresql())

    assert outcomes == expected
    assert state == _fake_state(fake)
    assert recorded == asyncio.run(_recorded(fake))
    assert requests == requests_in_fake(fake)
    for kind, *_, status, _ in requests:
        count_example(f"{kind} {status}")


@PROPERTY
@given(data=st.data())
def test_every_equivalent_arrival_order_ends_on_postgresql_with_the_in_order_stock_and_statuses(
    clean_database, data
):
    histories = data.draw(consistent_histories())
    events = data.draw(equivalent_arrival(histories))
    stock = dict.fromkeys(SKUS, PLENTY)
    in_order = FakeStock()

    async def the_in_order_sequence():
        await in_order.put_stock(stock)
        for history in histories:
            for event in history:
                await in_order.apply(event)

    async def as_they_arrive():
        async with WarehouseDatabase(clean_database) as database:
            await database.stock.put_stock(stock)
            outcomes = await _apply_in_runs(database.stock, events)
            levels, _, _ = await database.state()
            return outcomes, levels, await order_lines(database.pool)

    asyncio.run(the_in_order_sequence())
    outcomes, levels, rows = asyncio.run(as_they_arrive())

    assert levels == in_order.levels
    assert settled(rows) == settled(asyncio.run(order_lines(in_order)))
    assert_stock_exact(stock, levels, rows, taken_units(outcomes))
    _count_kinds(outcomes)


@PROPERTY
@given(data=st.data(), scarce=st.booleans())
def test_in_any_arrival_order_the_stock_on_postgresql_stays_exact(clean_database, data, scarce):
    histories = data.draw(mixed_histories())
    events = data.draw(any_arrival(histories))
    stock = _stock(data, scarce=scarce)

    async def as_they_arrive():
        async with WarehouseDatabase(clean_database) as database:
            await database.stock.put_stock(stock)
            outcomes = await _apply_in_runs(database.stock, events)
            levels, _, _ = await database.state()
            shipped = await database.pool.fetch("SELECT sku, shipped FROM stock_levels")
            return outcomes, levels, await order_lines(database.pool), dict(shipped)

    outcomes, levels, rows, shipped = asyncio.run(as_they_arrive())

    taken = taken_units(outcomes)
    assert_stock_exact(stock, levels, rows, taken)
    assert {sku: units for sku, units in shipped.items() if units} == dict(+taken)
