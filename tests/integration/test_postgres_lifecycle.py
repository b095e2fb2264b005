"""The lifecycle on PostgreSQL: generated sequences of OrderPlaced, OrderCancelled and
OrderShipped events, in every arrival order, with duplicates.

Three promises, each a property test on the real database:

1. The SQL functions implement the state table: for any sequence, PostgreSQL gives every event
   the outcome the in-memory warehouse (which runs ``fulfilment.domain.lifecycle``) gives it
   when the events come one after the other, and ends with the same stock, inbox, orders,
   lines and tombstones. Consecutive events of one kind share one transaction, as group commit
   makes them, so each function is held to the answers of its batch applied one by one.
2. With enough stock, the arrival order does not matter within what the contract promises. Two
   arrival orders are equivalent when they hold the same events (redeliveries anywhere) and,
   for every order, each delivery of its OrderShipped comes after the first delivery of each of
   its OrderCancelled events. That is: place and cancel commute, in any order and any number;
   cancel and ship do not (a cancel after the shipment is ``cancel_after_ship``, one before it
   gives stock back); a shipment before its OrderPlaced is ``not_reserved`` and dead-lettered,
   and the operator replays it after the order came (modelled by delivering again, at the end,
   every shipment that was only ever ``not_reserved``). Every equivalent arrival order leaves
   the stock and every order's reserved and shipped lines of the in-order sequence (place, then
   the cancels, then the shipment); an order cancelled whole holds nothing either way, ending
   ``released`` after its reservation or ``rejected`` (reason ``cancelled``) before it.
3. With the hand-off to the warehouse system on, the same holds for the requests: for any
   sequence, in which the dispatcher moves some orders' fulfilment-order requests on
   (``sending``, ``accepted`` or ``failed``) between the events, PostgreSQL gives every event
   the outcome the fake (which runs ``fulfilment.domain.handoff``) gives it, and ends with the
   same stock, inbox, orders and requests (kind, order, cause, lines, status).
4. With scarce stock and any arrival order (shipments before cancels included), the stock
   invariants hold (``0 <= reserved <= on_hand``; ``reserved`` is the lines of the reserved
   orders; ``on_hand`` went down by exactly the shipped lines), and every order ends in a state
   the table allows for its own events in their arrival order: the one it gives when the stock
   sufficed at its placement, or the one it gives when it did not.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from dataclasses import dataclass
from itertools import groupby
from typing import Self

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as count_example
from hypothesis import strategies as st
from pydantic import SecretStr

from builders import CANCELLED_AT, PLACED_AT, SHIPPED_AT
from fakes import InMemoryWarehouse
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.domain.handoff import RequestStatus
from fulfilment.domain.lifecycle import (
    CancelOrder,
    OrderState,
    ShipKind,
    ShipOrder,
    apply_cancelled,
    apply_placed,
    apply_shipped,
)
from fulfilment.domain.model import OrderLine, ReserveStock, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import Settings
from warehouse_rows import requests_in_database, requests_in_fake

pytestmark = pytest.mark.postgres

SKUS = ("A", "B", "a")
PLENTY = 1_000

Event = ReserveStock | CancelOrder | ShipOrder


def _lines(draw, skus, most: int) -> tuple[OrderLine, ...]:
    line = st.tuples(st.sampled_from(skus), st.integers(1, most))
    return tuple(OrderLine(sku, n) for sku, n in draw(st.lists(line, min_size=1, max_size=3)))


@st.composite
def orders(draw, *, skus=SKUS):
    """The events of a few orders: each placed once, cancelled 0-3 times (whole or lines,
    SKUs it does not hold included), shipped at most once; per order, in-order."""
    histories: list[list[Event]] = []
    for _ in range(draw(st.integers(1, 4))):
        order_id = uuid.uuid4()
        history: list[Event] = [
            ReserveStock(uuid.uuid4(), order_id, PLACED_AT, _lines(draw, skus, 4))
        ]
        for _ in range(draw(st.integers(0, 3))):
            whole = draw(st.integers(0, 3)) == 0
            lines = None if whole else _lines(draw, skus, 3)
            history.append(CancelOrder(uuid.uuid4(), order_id, CANCELLED_AT, lines))
        if draw(st.booleans()):
            history.append(ShipOrder(uuid.uuid4(), order_id, SHIPPED_AT))
        histories.append(history)
    return histories


def _with_redeliveries(draw, events: list[Event]) -> list[Event]:
    """``events`` with some delivered again, each copy later than its first delivery."""
    arrived = list(events)
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(0, len(arrived) - 1))
        # Often right behind it, in the same batch, as a redelivery racing its first delivery.
        later = st.integers(index + 1, len(arrived))
        arrived.insert(draw(st.one_of(st.just(index + 1), later)), arrived[index])
    return arrived


@st.composite
def any_arrival(draw, histories):
    """Every event of ``histories``, in any order, with redeliveries."""
    events = draw(st.permutations([event for history in histories for event in history]))
    return _with_redeliveries(draw, events)


@st.composite
def equivalent_arrival(draw, histories):
    """An arrival order the contract makes equivalent to the in-order one: any order, except
    that each order's shipment (every delivery of it) follows the first delivery of each of its
    cancels."""
    events = list(draw(st.permutations([event for history in histories for event in history])))
    for history in histories:
        ship = history[-1]
        if not isinstance(ship, ShipOrder):
            continue
        events.remove(ship)
        last_cancel = max(
            (events.index(event) for event in history if isinstance(event, CancelOrder)),
            default=-1,
        )
        events.insert(draw(st.integers(last_cancel + 1, len(events))), ship)
    # A redelivery comes after its first delivery, and a copy inserted before an event leaves
    # the order of the first deliveries as it is: the condition still holds.
    return _with_redeliveries(draw, events)


async def _apply(warehouse, event: Event):
    if isinstance(event, ReserveStock):
        return await warehouse.apply(event)
    if isinstance(event, CancelOrder):
        return await warehouse.apply(event)
    return await warehouse.apply(event)


async def _apply_in_runs(warehouse, events: list[Event]) -> list[object]:
    """Apply ``events`` in arrival order; consecutive events of one kind together, so that group
    commit makes each run one transaction (the warehouse has one slot)."""
    outcomes: list[object] = []
    for _, run in groupby(events, key=type):
        outcomes += await asyncio.gather(*(_apply(warehouse, event) for event in run))
    return outcomes


def _replays(events: list[Event], outcomes: list[object]) -> list[ShipOrder]:
    """The shipments that were only ever ``not_reserved``: the operator replays them."""
    answers: dict[uuid.UUID, set[ShipKind]] = {}
    for event, outcome in zip(events, outcomes, strict=True):
        if isinstance(event, ShipOrder):
            answers.setdefault(event.event_id, set()).add(outcome.kind)
    ships = {event.event_id: event for event in events if isinstance(event, ShipOrder)}
    return [
        ships[event_id] for event_id, kinds in answers.items() if kinds == {ShipKind.NOT_RESERVED}
    ]


class Database:
    """A PostgresWarehouse on the test database, emptied first, and what its tables hold."""

    def __init__(self, url: str, *, handoff: bool = False) -> None:
        self._options = database_options(Settings(database_url=SecretStr(url)))
        self._handoff = handoff

    async def __aenter__(self) -> Self:
        self._engine = create_engine(self._options)
        self.pool = await create_pool(self._options)
        await self.pool.execute(
            "TRUNCATE inbox_messages, reservation_lines, reservations, stock_levels,"
            " tombstone_lines, outbox, warehouse_requests"
        )
        self.warehouse = PostgresWarehouse(
            self._engine,
            consumer="fulfilment",
            retry_budget_seconds=2.0,
            pool=self.pool,
            pool_size=1,
            handoff=self._handoff,
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.pool.close()
        await self._engine.dispose()

    async def state(self):
        """Stock, inbox, and per order (status, event id, reason, skus, lines, tombstone)."""
        stock = {
            row["sku"]: StockLevel(row["on_hand"], row["reserved"])
            for row in await self.pool.fetch("SELECT sku, on_hand, reserved FROM stock_levels")
        }
        inbox = dict(await self.pool.fetch("SELECT event_id, outcome FROM inbox_messages"))
        lines = _by_order(await self.pool.fetch("SELECT * FROM reservation_lines"))
        tombstones = _by_order(await self.pool.fetch("SELECT * FROM tombstone_lines"))
        rows = await self.pool.fetch(
            "SELECT order_id, status, event_id, reason, skus, tombstone FROM reservations"
        )
        orders = {
            row["order_id"]: (
                row["status"],
                row["event_id"],
                row["reason"],
                tuple(row["skus"]),
                lines.get(row["order_id"], {}),
                None
                if row["tombstone"] is None
                else ("order" if row["tombstone"] == "order" else tombstones[row["order_id"]]),
            )
            for row in rows
        }
        return stock, inbox, orders

    async def result_events(self):
        """The outbox in publishing order: (order id, routing key, body) per row."""
        rows = await self.pool.fetch(
            "SELECT event_id, order_id, routing_key, body FROM outbox ORDER BY id"
        )
        assert len({row["event_id"] for row in rows}) == len(rows)
        return [(row["order_id"], row["routing_key"], json.loads(row["body"])) for row in rows]

    async def move_on(self, sent: Sent) -> None:
        """The dispatcher's step ``sent``, on the rows (its own store is tested on its own)."""
        await self.pool.execute(
            "UPDATE warehouse_requests SET status = $2, attempts = 1, body = '\\x7b7d',"
            " first_attempt_at = now(), last_attempt_at = now()"
            " WHERE order_id = $1 AND kind = 'fulfilment_order' AND status = 'pending'",
            sent.order_id,
            str(sent.status),
        )


def _by_order(rows) -> dict[uuid.UUID, dict[str, int]]:
    grouped: dict[uuid.UUID, dict[str, int]] = {}
    for row in rows:
        grouped.setdefault(row["order_id"], {})[row["sku"]] = row["quantity"]
    return grouped


def _fake_state(fake: InMemoryWarehouse):
    orders = {
        order_id: (
            str(r.status),
            r.event_id,
            None if r.reason is None else str(r.reason),
            r.skus,
            dict(r.lines),
            None
            if r.tombstone is None
            else ("order" if r.tombstone.lines is None else dict(r.tombstone.lines)),
        )
        for order_id, r in fake.reservations.items()
    }
    inbox = {event_id: outcome for (_, event_id), outcome in fake.inbox.items()}
    return dict(fake.levels), inbox, orders


def _run(coroutine):
    return asyncio.run(coroutine)


@dataclass(frozen=True)
class Sent:
    """The dispatcher moved an order's pending fulfilment-order request on to ``status``."""

    order_id: uuid.UUID
    status: RequestStatus


def _move_on(fake: InMemoryWarehouse, sent: Sent) -> None:
    request = fake.fulfilment_order(sent.order_id)
    if request is not None and request.status is RequestStatus.PENDING:
        request.status = sent.status


@st.composite
def handed_off(draw, histories, events: list[Event]) -> list[Event | Sent]:
    """``events`` with the dispatcher moving most orders' fulfilment orders on, each after the
    first delivery of its ``OrderPlaced``: often right after it, so that cancels come later."""
    arrived: list[Event | Sent] = list(events)
    for history in histories:
        if draw(st.integers(0, 3)) == 0:
            continue
        status = draw(
            st.sampled_from([RequestStatus.SENDING, RequestStatus.ACCEPTED, RequestStatus.FAILED])
        )
        placed = arrived.index(history[0]) + 1
        at = draw(st.one_of(st.just(placed), st.integers(placed, len(arrived))))
        arrived.insert(at, Sent(history[0].order_id, status))
    return arrived


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(data=st.data(), scarce=st.booleans())
def test_postgresql_gives_every_event_the_outcome_the_state_table_gives_one_after_the_other(
    clean_database, data, scarce
):
    histories = data.draw(orders(skus=(*SKUS, "UNKNOWN") if scarce else SKUS))
    events = data.draw(any_arrival(histories))
    stock = (
        data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))
        if scarce
        else dict.fromkeys(SKUS, PLENTY)
    )
    fake = InMemoryWarehouse()

    async def one_after_the_other():
        await fake.put_stock(stock)
        return [await _apply(fake, event) for event in events]

    async def on_postgresql():
        async with Database(clean_database) as database:
            await database.warehouse.put_stock(stock)
            outcomes = await _apply_in_runs(database.warehouse, events)
            return outcomes, await database.state()

    expected = _run(one_after_the_other())
    outcomes, state = _run(on_postgresql())

    assert outcomes == expected
    assert state == _fake_state(fake)


@PROPERTY
@given(data=st.data(), scarce=st.booleans())
def test_with_the_handoff_postgresql_gives_every_event_and_request_what_the_fake_gives(
    clean_database, data, scarce
):
    histories = data.draw(orders(skus=(*SKUS, "UNKNOWN") if scarce else SKUS))
    events = data.draw(handed_off(histories, data.draw(any_arrival(histories))))
    stock = (
        data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))
        if scarce
        else dict.fromkeys(SKUS, PLENTY)
    )
    fake = InMemoryWarehouse(handoff=True)

    async def one_after_the_other():
        await fake.put_stock(stock)
        outcomes = []
        for event in events:
            if isinstance(event, Sent):
                _move_on(fake, event)
                outcomes.append(None)
            else:
                outcomes.append(await _apply(fake, event))
        return outcomes

    async def on_postgresql():
        async with Database(clean_database, handoff=True) as database:
            await database.warehouse.put_stock(stock)
            outcomes: list[object] = []
            for kind, run in groupby(events, key=type):
                batch = list(run)
                if kind is Sent:
                    for sent in batch:
                        await database.move_on(sent)
                    outcomes += [None] * len(batch)
                else:
                    outcomes += await _apply_in_runs(database.warehouse, batch)
            return outcomes, await database.state(), await requests_in_database(database.pool)

    expected = _run(one_after_the_other())
    outcomes, state, requests = _run(on_postgresql())

    assert outcomes == expected
    assert state == _fake_state(fake)
    assert requests == requests_in_fake(fake)
    for kind, *_, status, _ in requests:
        count_example(f"{kind} {status}")


@PROPERTY
@given(data=st.data())
def test_with_enough_stock_every_equivalent_arrival_order_gives_the_in_order_result(
    clean_database, data
):
    histories = data.draw(orders())
    events = data.draw(equivalent_arrival(histories))
    stock = dict.fromkeys(SKUS, PLENTY)
    in_order = InMemoryWarehouse()

    async def the_in_order_sequence():
        await in_order.put_stock(stock)
        for history in histories:
            for event in history:
                await _apply(in_order, event)

    async def as_they_arrive():
        async with Database(clean_database) as database:
            await database.warehouse.put_stock(stock)
            outcomes = await _apply_in_runs(database.warehouse, events)
            await _apply_in_runs(database.warehouse, _replays(events, outcomes))
            return await database.state(), await database.result_events()

    _run(the_in_order_sequence())
    (levels, inbox, rows), result_events = _run(as_they_arrive())
    expected_levels, _, expected_rows = _fake_state(in_order)

    assert levels == expected_levels
    assert _holdings(rows) == _holdings(expected_rows)
    told = _holdings_told(result_events)
    assert told == {
        order_id: held for order_id, held in _holdings(rows).items() if order_id in told
    }
    # Only orders that never held anything nor were rejected (tombstones) told nothing.
    assert {order_id for order_id, row in rows.items() if row[0] != "cancelled"} == set(told)
    assert {uuid.UUID(body["causation_id"]) for _, _, body in result_events} <= set(inbox)


def _holdings_told(result_events) -> dict[uuid.UUID, tuple[str, dict[str, int]]]:
    """Per order, what its result events say it holds, read in publishing order.

    Fails unless each order's events follow the table: a ``stock.reserved`` or
    ``stock.rejected`` first, then releases of units it held, each with the status it left,
    and at most one ``stock.shipped`` of everything it still held, last.
    """
    told: dict[uuid.UUID, tuple[str, dict[str, int]]] = {}
    for order_id, routing_key, body in result_events:
        lines = {line["sku"]: line["quantity"] for line in body.get("lines", [])}
        status, held = told.get(order_id, (None, {}))
        if routing_key in {"stock.reserved", "stock.rejected"}:
            assert status is None, (order_id, routing_key, status)
            told[order_id] = ("reserved", lines) if lines else ("nothing", {})
            continue
        assert status == "reserved", (order_id, routing_key, status)
        if routing_key == "stock.shipped":
            assert lines == held
            told[order_id] = ("shipped", lines)
            continue
        assert routing_key == "stock.released"
        assert lines
        assert all(0 < units <= held.get(sku, 0) for sku, units in lines.items())
        remaining = {sku: units - lines.get(sku, 0) for sku, units in held.items()}
        remaining = {sku: units for sku, units in remaining.items() if units > 0}
        assert body["order_status"] == ("reserved" if remaining else "released")
        told[order_id] = ("reserved", remaining) if remaining else ("nothing", {})
    return told


def _holdings(rows) -> dict[uuid.UUID, tuple[str, dict[str, int]]]:
    """Per order, what it holds (``reserved``), what left (``shipped``), or nothing."""
    held = {}
    for order_id, (status, _, _, _, lines, _) in rows.items():
        if status in {"reserved", "shipped"}:
            held[order_id] = (status, lines)
        else:
            held[order_id] = ("nothing", {})
    return held


@PROPERTY
@given(data=st.data())
def test_with_scarce_stock_the_invariants_hold_and_every_order_ends_as_the_table_allows(
    clean_database, data
):
    histories = data.draw(orders(skus=(*SKUS, "UNKNOWN")))
    events = data.draw(any_arrival(histories))
    stock = data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))

    async def as_they_arrive():
        async with Database(clean_database) as database:
            await database.warehouse.put_stock(stock)
            outcomes = await _apply_in_runs(database.warehouse, events)
            replayed = _replays(events, outcomes)
            await _apply_in_runs(database.warehouse, replayed)
            return await database.state(), replayed

    (levels, _, rows), replayed = _run(as_they_arrive())

    reserved: Counter[str] = Counter()
    shipped: Counter[str] = Counter()
    for status, _, _, _, lines, _ in rows.values():
        if status == "reserved":
            reserved.update(lines)
        elif status == "shipped":
            shipped.update(lines)
    for sku, level in levels.items():
        assert 0 <= level.reserved <= level.on_hand
        assert level.reserved == reserved[sku]
        assert level.on_hand == stock[sku] - shipped[sku]
    for history in histories:
        order_id = history[0].order_id
        own = [event for event in [*events, *replayed] if event.order_id == order_id]
        status, _, reason, _, lines, _ = rows[order_id]
        assert (status, reason, lines) in _allowed_ends(own)


def _allowed_ends(events: list[Event]) -> list[tuple[str, str | None, dict[str, int]]]:
    """The ends the state table gives an order's own events (first deliveries, in arrival
    order): with every SKU stocked plentifully at its placement, or with none in stock."""
    ends = []
    for stock in (
        {sku: StockLevel(PLENTY) for sku in SKUS},
        {sku: StockLevel(0) for sku in SKUS},
    ):
        state: OrderState | None = None
        reason = None
        seen: set[uuid.UUID] = set()
        for event in events:
            if event.event_id in seen:
                continue
            if isinstance(event, ReserveStock):
                placement = apply_placed(state, event.demand(), stock)
                seen.add(event.event_id)
                if placement.decision is not None:
                    reason = placement.decision.reason
                state = placement.state
            elif isinstance(event, CancelOrder):
                state = apply_cancelled(state, event.cancelled()).state
                seen.add(event.event_id)
            else:
                shipment = apply_shipped(state)
                if shipment.kind is not ShipKind.NOT_RESERVED:
                    seen.add(event.event_id)
                state = shipment.state
        assert state is not None
        ends.append((str(state.status), None if reason is None else str(reason), dict(state.lines)))
    return ends
