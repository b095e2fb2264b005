"""Generated histories of orders that the warehouse ships and cancels, and their arrival orders,
for the property tests of the lifecycle with the warehouse's events.

An order's history is its ``OrderPlaced``, the shop's ``OrderCancelled`` events, the
warehouse's shipments and cancellations, and at most one upstream ``OrderShipped``. The
*consistent* histories are those a warehouse can send: per SKU, the shipments, the
warehouse's cancellations of lines and the shop's cancels of lines together name at most what
the order placed (disjoint units), and a cancellation without lines takes what is left. Their
*equivalent* arrival orders (docs/design.md, "Orders of arrival") are those in which

1. the warehouse's events of an order come after its ``OrderPlaced`` (the warehouse knows
   only orders the service reserved and handed it), and so does its ``OrderShipped``;
2. every cancellation without lines (the shop's or the warehouse's) comes after every
   shipment of the warehouse of its order; and
3. the ``OrderShipped`` comes after every cancellation of its order;

and any copy of an event (a redelivery, the same webhook again, the same shipment or
cancellation under a new webhook id or found by the poll) comes anywhere after its first
arrival.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from fulfilment.domain.lifecycle import CancelOrder, ShipKind, ShipOrder, ShipOutcome
from fulfilment.domain.model import OrderLine, PlaceOrder, StockLevel
from fulfilment.domain.warehouse_events import (
    RecordShipment,
    RecordWarehouseCancellation,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    warehouse_event_id,
)
from tests.support.builders import CANCELLED_AT, PLACED_AT, SHIPPED_AT
from tests.support.warehouse_commands import WAREHOUSE_CANCELLED_AT, WAREHOUSE_SHIPPED_AT
from tests.support.warehouse_event_rows import OrderRow

SKUS = ("A", "B", "a")
"""The SKUs of the generated orders: ``A`` and ``a`` differ only in case."""

WarehouseEvent = RecordShipment | RecordWarehouseCancellation
Event = PlaceOrder | CancelOrder | ShipOrder | WarehouseEvent


def shipment_of(order_id: uuid.UUID, lines: Sequence[tuple[str, int]]) -> RecordShipment:
    """A new shipment of ``lines`` of ``order_id``, brought by a new webhook."""
    shipment_id = f"SHP-{uuid.uuid4().hex[:12]}"
    return RecordShipment(
        event_id=warehouse_event_id("shipment", shipment_id),
        shipment_id=shipment_id,
        webhook_id=f"msg_{uuid.uuid4().hex}",
        fulfilment_order_id=f"FO-{order_id.hex[:8]}",
        order_id=order_id,
        shipped_at=WAREHOUSE_SHIPPED_AT,
        carrier="DHL",
        tracking_numbers=(f"JD{uuid.uuid4().int % 10**18:018d}",),
        tracking_url=None,
        lines=tuple(OrderLine(sku, units) for sku, units in lines),
        source=Source.WEBHOOK,
    )


def warehouse_cancellation_of(
    order_id: uuid.UUID, lines: Sequence[tuple[str, int]] | None
) -> RecordWarehouseCancellation:
    """A new cancellation by the warehouse of ``lines`` of ``order_id`` (None: all it holds)."""
    cancellation_id = f"CXL-{uuid.uuid4().hex[:12]}"
    return RecordWarehouseCancellation(
        event_id=warehouse_event_id("cancellation", cancellation_id),
        cancellation_id=cancellation_id,
        webhook_id=f"msg_{uuid.uuid4().hex}",
        fulfilment_order_id=f"FO-{order_id.hex[:8]}",
        order_id=order_id,
        cancelled_at=WAREHOUSE_CANCELLED_AT,
        reason="unfulfillable",
        lines=None if lines is None else tuple(OrderLine(sku, units) for sku, units in lines),
        source=Source.WEBHOOK,
    )


def _cancel(order_id: uuid.UUID, lines: Sequence[tuple[str, int]] | None) -> CancelOrder:
    return CancelOrder(
        uuid.uuid4(),
        order_id,
        CANCELLED_AT,
        None if lines is None else tuple(OrderLine(sku, units) for sku, units in lines),
    )


def _grouped(draw: st.DrawFn, parts: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """``parts`` (sku, units) as the lines of events: each event one part or a few."""
    events: list[list[tuple[str, int]]] = []
    for part in draw(st.permutations(parts)):
        if events and draw(st.booleans()):
            events[-1].append(part)
        else:
            events.append([part])
    return events


@st.composite
def consistent_histories(draw: st.DrawFn) -> list[list[Event]]:
    """The events of one to three orders, each in its in-order sequence: placed, the shop's
    cancels of lines, the warehouse's shipments, its cancellations of lines, the
    cancellations without lines (the warehouse's, then the shop's), the ``OrderShipped``."""
    histories: list[list[Event]] = []
    for _ in range(draw(st.integers(1, 3))):
        order_id = uuid.uuid4()
        placed = dict(
            draw(
                st.lists(
                    st.tuples(st.sampled_from(SKUS), st.integers(1, 5)), min_size=1, max_size=3
                )
            )
        )
        parts: dict[str, list[tuple[str, int]]] = {"X": [], "S": [], "C": []}
        for sku, units in placed.items():
            left = units
            while left and draw(st.integers(0, 3)):
                part = draw(st.integers(1, left))
                left -= part
                parts[draw(st.sampled_from(["X", "S", "C"]))].append((sku, part))
        history: list[Event] = [
            PlaceOrder(
                uuid.uuid4(),
                order_id,
                PLACED_AT,
                tuple(OrderLine(sku, units) for sku, units in placed.items()),
            )
        ]
        history += [_cancel(order_id, lines) for lines in _grouped(draw, parts["X"])]
        history += [shipment_of(order_id, lines) for lines in _grouped(draw, parts["S"])]
        history += [
            warehouse_cancellation_of(order_id, lines) for lines in _grouped(draw, parts["C"])
        ]
        if draw(st.integers(0, 3)) == 0:
            history.append(warehouse_cancellation_of(order_id, None))
        if draw(st.integers(0, 4)) == 0:
            history.append(_cancel(order_id, None))
        if draw(st.booleans()):
            history.append(ShipOrder(uuid.uuid4(), order_id, SHIPPED_AT))
        histories.append(history)
    return histories


def _whole(event: Event) -> bool:
    return isinstance(event, CancelOrder | RecordWarehouseCancellation) and event.lines is None


def _must_follow(event: Event, earlier: Event) -> bool:
    """Whether ``event`` must arrive after ``earlier`` (same order) in an equivalent order."""
    warehouse_or_ship = isinstance(event, RecordShipment | RecordWarehouseCancellation | ShipOrder)
    if warehouse_or_ship and isinstance(earlier, PlaceOrder):
        return True
    if _whole(event) and isinstance(earlier, RecordShipment):
        return True
    return isinstance(event, ShipOrder) and isinstance(
        earlier, CancelOrder | RecordWarehouseCancellation
    )


@st.composite
def equivalent_arrival(draw: st.DrawFn, histories: list[list[Event]]) -> list[Event]:
    """Every event of ``histories`` in an arrival order equivalent to the in-order one (the
    module's rules), drawn as a random linear extension of them, with copies."""
    waiting = [list(history) for history in histories]
    arrived: list[Event] = []
    while any(waiting):
        ready = [
            event
            for history in waiting
            for event in history
            if not any(_must_follow(event, other) for other in history if other is not event)
        ]
        chosen = draw(st.sampled_from(ready))
        for history in waiting:
            if chosen in history:
                history.remove(chosen)
        arrived.append(chosen)
    return draw(with_copies(arrived))


@st.composite
def any_arrival(draw: st.DrawFn, histories: list[list[Event]]) -> list[Event]:
    """Every event of ``histories`` in any order, with copies."""
    events = draw(st.permutations([event for history in histories for event in history]))
    return draw(with_copies(list(events)))


def copy_of(draw: st.DrawFn, event: Event) -> Event:
    """Another arrival of ``event``: the same delivery again, or for the warehouse's events
    also the same change under a new webhook id or found by the poll."""
    if not isinstance(event, RecordShipment | RecordWarehouseCancellation):
        return event
    how = draw(st.sampled_from(["same webhook", "new webhook", "poll"]))
    if how == "same webhook":
        return event
    if how == "new webhook":
        return dataclasses.replace(
            event, webhook_id=f"msg_{uuid.uuid4().hex}", source=Source.WEBHOOK
        )
    return dataclasses.replace(event, webhook_id=None, source=Source.POLL)


@st.composite
def with_copies(draw: st.DrawFn, events: list[Event]) -> list[Event]:
    """``events`` with up to four copies, each after the event it copies (often right behind
    it, in the same batch, as a retry racing the first delivery)."""
    arrived = list(events)
    for _ in range(draw(st.integers(0, 4))):
        index = draw(st.integers(0, len(arrived) - 1))
        later = st.integers(index + 1, len(arrived))
        at = draw(st.one_of(st.just(index + 1), later))
        arrived.insert(at, copy_of(draw, arrived[index]))
    return arrived


@st.composite
def mixed_histories(draw: st.DrawFn, *, skus: Sequence[str] = SKUS) -> list[list[Event]]:
    """The events of one to three orders, anything a confused or late warehouse may send:
    shipments and cancellations of more than the order holds, of SKUs it does not hold, of
    orders that are never placed; the shop's cancels (whole or lines) and an ``OrderShipped``."""
    line = st.tuples(st.sampled_from([*skus, "Z"]), st.integers(1, 4))
    some_lines = st.lists(line, min_size=1, max_size=3)
    histories: list[list[Event]] = []
    for _ in range(draw(st.integers(1, 3))):
        order_id = uuid.uuid4()
        history: list[Event] = []
        named = some_lines
        if draw(st.integers(0, 5)):
            placed = draw(
                st.lists(
                    st.tuples(st.sampled_from(skus), st.integers(1, 4)), min_size=1, max_size=3
                )
            )
            history.append(
                PlaceOrder(
                    uuid.uuid4(),
                    order_id,
                    PLACED_AT,
                    tuple(OrderLine(sku, units) for sku, units in placed),
                )
            )
            # Mostly what the order holds, as a warehouse that is right sends.
            own = st.tuples(st.sampled_from([sku for sku, _ in placed]), st.integers(1, 3))
            named = st.one_of(st.lists(own, min_size=1, max_size=2), some_lines)
        history += [shipment_of(order_id, draw(named)) for _ in range(draw(st.integers(0, 3)))]
        for _ in range(draw(st.integers(0, 2))):
            whole = draw(st.integers(0, 2)) == 0
            history.append(warehouse_cancellation_of(order_id, None if whole else draw(named)))
        for _ in range(draw(st.integers(0, 2))):
            whole = draw(st.integers(0, 3)) == 0
            history.append(_cancel(order_id, None if whole else draw(some_lines)))
        if draw(st.integers(0, 2)) == 0:
            history.append(ShipOrder(uuid.uuid4(), order_id, SHIPPED_AT))
        histories.append(history)
    return histories


def taken_units(outcomes: Sequence[object]) -> Counter[str]:
    """Units per SKU that left the warehouse by ``outcomes`` (upstream and warehouse ships)."""
    taken: Counter[str] = Counter()
    for outcome in outcomes:
        shipped = (isinstance(outcome, ShipOutcome) and outcome.kind is ShipKind.SHIPPED) or (
            isinstance(outcome, ShipmentOutcome) and outcome.kind is ShipmentKind.SHIPPED
        )
        if shipped:
            assert isinstance(outcome, ShipOutcome | ShipmentOutcome)
            taken.update({line.sku: line.quantity for line in outcome.lines})
    return taken


def assert_stock_exact(
    loaded: Mapping[str, int],
    levels: Mapping[str, StockLevel],
    orders: Mapping[uuid.UUID, OrderRow],
    taken: Counter[str],
) -> None:
    """The stock invariants of product.md ("Promises"): ``on_hand`` = loaded − the units
    shipments took, ``reserved`` = the units the orders hold (their lines less what shipped),
    ``0 <= reserved <= on_hand``; and every order's rows agree with its status."""
    held: Counter[str] = Counter()
    shipped: Counter[str] = Counter()
    for status, lines in orders.values():
        for sku, (quantity, out) in lines.items():
            assert 0 <= out <= quantity, (status, lines)
            shipped[sku] += out
            if status == "reserved":
                held[sku] += quantity - out
        if status == "reserved":
            assert any(quantity > out for quantity, out in lines.values()), lines
        elif status == "shipped":
            assert all(quantity == out for quantity, out in lines.values()), lines
            assert lines
        elif status in {"released", "cancelled"}:
            assert lines == {}, (status, lines)
        else:
            assert all(out == 0 for _, out in lines.values()), (status, lines)
    assert set(levels) == set(loaded)
    for sku, level in levels.items():
        assert level.on_hand == loaded[sku] - taken[sku], sku
        assert level.reserved == held[sku], sku
        assert 0 <= level.reserved <= level.on_hand, sku
    assert +shipped == +taken


def settled(orders: Mapping[uuid.UUID, OrderRow]) -> dict[uuid.UUID, OrderRow]:
    """Per order its status and lines, an order that holds nothing and shipped nothing as
    ``("nothing", {})``: ``released`` after its reservation, or ``rejected`` (reason
    ``cancelled``) when the shop's cancel of it all came before it."""
    return {
        order_id: ("nothing", {}) if status in {"released", "rejected"} else (status, lines)
        for order_id, (status, lines) in orders.items()
    }
