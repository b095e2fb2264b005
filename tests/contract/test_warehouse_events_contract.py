"""The warehouse's shipments and cancellations, on both stock stores (product contract,
"Hearing back from the warehouse"; the table of ``fulfilment.domain.warehouse_lifecycle``).

Each is applied once per webhook id and once per shipment or cancellation id, whatever
brought it; it takes from the order, or gives back, only what the order holds; what it names
and cannot match is kept as a discrepancy; the upstream events take only what is left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from fulfilment.domain.handoff import RequestStatus
from fulfilment.domain.lifecycle import CancelKind, OrderStatus, ShipKind
from fulfilment.domain.model import OrderLine, StockLevel
from fulfilment.domain.warehouse_events import (
    DuplicateBy,
    ShipmentKind,
    Source,
    WarehouseCancellationKind,
)
from tests.contract.test_stock_contract import TRACEPARENT, move_on, reserved_order, result_events
from tests.support.builders import cancellation, in_trace, order, shipment
from tests.support.fakes import FakeStock, RecordedEvent, result_body
from tests.support.warehouse_commands import warehouse_cancellation, warehouse_shipment
from tests.support.warehouse_event_rows import (
    Database,
    cancellations,
    discrepancies,
    order_lines,
    shipments,
    webhook_inbox,
)


@asynccontextmanager
async def recorded(stock) -> AsyncIterator[FakeStock | Database]:
    """What the rows readers of ``tests.support.warehouse_event_rows`` read ``stock`` through."""
    if isinstance(stock, FakeStock):
        yield stock
        return
    async with stock.engine.connect() as connection:
        raw = await connection.get_raw_connection()
        yield raw.driver_connection


async def read(stock, reader):
    async with recorded(stock) as store:
        return await reader(store)


def lines(*pairs):
    return tuple(OrderLine(sku, quantity) for sku, quantity in pairs)


# Shipments


async def test_a_partial_shipment_takes_its_units_and_the_order_stays_reserved(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    command = warehouse_shipment(placed.order_id, ("A", 1), ("A", 1))

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.label) == (
        ShipmentKind.SHIPPED,
        OrderStatus.RESERVED,
        "shipped",
    )
    assert (outcome.order_id, outcome.event_id) == (placed.order_id, command.event_id)
    assert (outcome.lines, outcome.unmatched, outcome.duplicate_by) == (lines(("A", 2)), (), None)
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(8, 1), "B": StockLevel(10, 2)}
    assert (await read(stock, order_lines))[placed.order_id] == (
        "reserved",
        {"A": (3, 2), "B": (2, 0)},
    )


async def test_the_shipment_that_takes_the_last_held_units_ships_the_order(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 2)))

    outcome = await stock.apply(warehouse_shipment(placed.order_id, ("B", 2), ("A", 1)))

    assert (outcome.kind, outcome.status, outcome.lines) == (
        ShipmentKind.SHIPPED,
        OrderStatus.SHIPPED,
        lines(("A", 1), ("B", 2)),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(7), "B": StockLevel(8)}
    assert (await read(stock, order_lines))[placed.order_id] == (
        "shipped",
        {"A": (3, 3), "B": (2, 2)},
    )


async def test_a_shipment_of_more_than_held_takes_what_is_held_and_keeps_the_rest(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 2)))
    command = warehouse_shipment(placed.order_id, ("A", 4), ("Z", 1))

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.lines, outcome.unmatched) == (
        ShipmentKind.SHIPPED,
        OrderStatus.RESERVED,
        lines(("A", 1)),
        lines(("A", 3), ("Z", 1)),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(7, 0), "B": StockLevel(10, 2)}
    assert await read(stock, discrepancies) == [
        ("more_than_held", "shipment", command.shipment_id, placed.order_id, "A", 3, "reserved"),
        ("sku_not_held", "shipment", command.shipment_id, placed.order_id, "Z", 1, "reserved"),
    ]


async def test_a_shipment_that_takes_nothing_is_a_discrepancy_and_changes_no_stock(stock):
    placed = await reserved_order(stock, ("A", 3))
    command = warehouse_shipment(placed.order_id, ("B", 2))

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.lines, outcome.unmatched, outcome.label) == (
        ShipmentKind.DISCREPANCY,
        OrderStatus.RESERVED,
        (),
        lines(("B", 2)),
        "discrepancy",
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10, 3), "B": StockLevel(10)}
    assert await read(stock, discrepancies) == [
        ("sku_not_held", "shipment", command.shipment_id, placed.order_id, "B", 2, "reserved")
    ]


async def test_a_shipment_of_an_unknown_order_is_kept_once_as_a_discrepancy(stock):
    await stock.put_stock({"A": 10})
    command = warehouse_shipment(order(("A", 1)).order_id, ("A", 1))

    outcome = await stock.apply(command)
    again = await stock.apply(
        warehouse_shipment(command.order_id, ("A", 1), shipment_id=command.shipment_id)
    )

    assert (outcome.kind, outcome.status, outcome.unmatched) == (
        ShipmentKind.DISCREPANCY,
        None,
        lines(("A", 1)),
    )
    assert (again.kind, again.duplicate_by) == (ShipmentKind.DUPLICATE, DuplicateBy.CHANGE)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10)}
    assert await read(stock, discrepancies) == [
        ("unknown_order", "shipment", command.shipment_id, command.order_id, "A", 1, None)
    ]


async def test_a_shipment_of_an_order_that_holds_nothing_is_a_discrepancy(stock):
    await stock.put_stock({"A": 2})
    rejected, released, tombstoned = order(("A", 5)), order(("A", 2)), order(("A", 1))
    await stock.apply(rejected)
    await stock.apply(released)
    await stock.apply(cancellation(released.order_id))
    await stock.apply(cancellation(tombstoned.order_id))
    commands = [
        warehouse_shipment(placed.order_id, ("A", 1)) for placed in (rejected, released, tombstoned)
    ]

    outcomes = [await stock.apply(command) for command in commands]

    assert [(outcome.kind, outcome.status) for outcome in outcomes] == [
        (ShipmentKind.DISCREPANCY, OrderStatus.REJECTED),
        (ShipmentKind.DISCREPANCY, OrderStatus.RELEASED),
        (ShipmentKind.DISCREPANCY, OrderStatus.CANCELLED),
    ]
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2)}
    assert await read(stock, discrepancies) == sorted(
        [
            ("order_not_reserved", "shipment", c.shipment_id, c.order_id, "A", 1, status)
            for c, status in zip(commands, ["rejected", "released", "cancelled"], strict=True)
        ],
        key=repr,
    )


async def test_a_shipment_after_the_upstream_shipment_is_already_shipped(stock):
    placed = await reserved_order(stock, ("A", 3))
    await stock.apply(shipment(placed.order_id))

    outcome = await stock.apply(warehouse_shipment(placed.order_id, ("A", 3)))

    assert (outcome.kind, outcome.status, outcome.lines, outcome.unmatched, outcome.label) == (
        ShipmentKind.ALREADY_SHIPPED,
        OrderStatus.SHIPPED,
        (),
        (),
        "already_shipped",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(7)}
    assert await read(stock, discrepancies) == []


async def test_the_upstream_shipment_after_a_partial_one_ships_what_remains(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 1), ("B", 2)))
    command = shipment(placed.order_id)

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.lines) == (
        ShipKind.SHIPPED,
        OrderStatus.SHIPPED,
        lines(("A", 2)),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(7), "B": StockLevel(8)}
    assert (await read(stock, order_lines))[placed.order_id] == (
        "shipped",
        {"A": (3, 3), "B": (2, 2)},
    )


async def test_a_shipment_is_recorded_with_its_carrier_tracking_and_lines(stock):
    placed = await reserved_order(stock, ("A", 3))
    command = warehouse_shipment(
        placed.order_id, ("A", 2), ("A", 3), tracking_numbers=("1Z999", "1Z998")
    )

    await stock.apply(command)

    assert await read(stock, shipments) == {
        command.shipment_id: (
            placed.order_id,
            command.fulfilment_order_id,
            command.webhook_id,
            "webhook",
            "shipped",
            "DHL",
            ("1Z999", "1Z998"),
            (("A", 5, 3),),
        )
    }
    assert await read(stock, webhook_inbox) == {command.webhook_id: ("shipment.shipped", "shipped")}


# Duplicates: by webhook id first, then by the shipment's or cancellation's own id


async def test_a_shipment_is_applied_once_by_webhook_id_and_once_by_shipment_id(stock):
    placed = await reserved_order(stock, ("A", 3))
    first = warehouse_shipment(placed.order_id, ("A", 1))
    resent = warehouse_shipment(placed.order_id, ("A", 1), shipment_id=first.shipment_id)
    polled = warehouse_shipment(
        placed.order_id, ("A", 1), shipment_id=first.shipment_id, source=Source.POLL
    )

    outcomes = [await stock.apply(command) for command in (first, first, resent, polled, resent)]

    assert [(outcome.kind, outcome.duplicate_by) for outcome in outcomes] == [
        (ShipmentKind.SHIPPED, None),
        (ShipmentKind.DUPLICATE, DuplicateBy.WEBHOOK),
        (ShipmentKind.DUPLICATE, DuplicateBy.CHANGE),
        (ShipmentKind.DUPLICATE, DuplicateBy.CHANGE),
        (ShipmentKind.DUPLICATE, DuplicateBy.WEBHOOK),
    ]
    assert [outcome.label for outcome in outcomes[1:3]] == ["duplicate:webhook", "duplicate:change"]
    assert outcomes[1].status is None
    assert await stock.levels_of(["A"]) == {"A": StockLevel(9, 2)}
    assert await read(stock, webhook_inbox) == {
        first.webhook_id: ("shipment.shipped", "shipped"),
        resent.webhook_id: ("shipment.shipped", "duplicate"),
    }
    assert len(await read(stock, shipments)) == 1


async def test_a_shipment_found_by_the_poll_records_no_webhook_and_its_webhook_is_a_duplicate(
    stock,
):
    placed = await reserved_order(stock, ("A", 3))
    polled = warehouse_shipment(placed.order_id, ("A", 1), source=Source.POLL)
    pushed = warehouse_shipment(placed.order_id, ("A", 1), shipment_id=polled.shipment_id)

    first = await stock.apply(polled)
    late = await stock.apply(pushed)

    assert (first.kind, late.kind, late.duplicate_by) == (
        ShipmentKind.SHIPPED,
        ShipmentKind.DUPLICATE,
        DuplicateBy.CHANGE,
    )
    assert (await read(stock, shipments))[polled.shipment_id][2:4] == (None, "poll")
    assert await read(stock, webhook_inbox) == {
        pushed.webhook_id: ("shipment.shipped", "duplicate")
    }


async def test_a_cancellation_is_applied_once_by_webhook_id_and_once_by_cancellation_id(stock):
    placed = await reserved_order(stock, ("A", 3))
    first = warehouse_cancellation(placed.order_id, ("A", 1))
    resent = warehouse_cancellation(
        placed.order_id, ("A", 1), cancellation_id=first.cancellation_id
    )
    polled = warehouse_cancellation(
        placed.order_id, ("A", 1), cancellation_id=first.cancellation_id, source=Source.POLL
    )

    outcomes = [await stock.apply(command) for command in (first, first, resent, polled)]

    assert [(outcome.kind, outcome.duplicate_by) for outcome in outcomes] == [
        (WarehouseCancellationKind.RELEASED, None),
        (WarehouseCancellationKind.DUPLICATE, DuplicateBy.WEBHOOK),
        (WarehouseCancellationKind.DUPLICATE, DuplicateBy.CHANGE),
        (WarehouseCancellationKind.DUPLICATE, DuplicateBy.CHANGE),
    ]
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 2)}
    assert await read(stock, webhook_inbox) == {
        first.webhook_id: ("fulfilment_order.cancelled", "released"),
        resent.webhook_id: ("fulfilment_order.cancelled", "duplicate"),
    }


async def test_a_webhook_id_seen_for_a_shipment_makes_a_cancellation_under_it_a_duplicate(
    stock,
):
    placed = await reserved_order(stock, ("A", 3))
    shipped = warehouse_shipment(placed.order_id, ("A", 1))
    await stock.apply(shipped)

    outcome = await stock.apply(
        warehouse_cancellation(placed.order_id, webhook_id=shipped.webhook_id)
    )

    assert (outcome.kind, outcome.duplicate_by) == (
        WarehouseCancellationKind.DUPLICATE,
        DuplicateBy.WEBHOOK,
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(9, 2)}


# Cancellations by the warehouse


async def test_a_cancellation_of_lines_releases_what_the_order_holds_of_them(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 1)))
    command = warehouse_cancellation(placed.order_id, ("A", 5), ("Z", 1))

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        WarehouseCancellationKind.RELEASED,
        OrderStatus.RESERVED,
        lines(("A", 2)),
        "released",
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(9), "B": StockLevel(10, 2)}
    assert (await read(stock, order_lines))[placed.order_id] == (
        "reserved",
        {"A": (1, 1), "B": (2, 0)},
    )
    assert (await read(stock, cancellations))[command.cancellation_id][4:] == (
        "released",
        "unfulfillable",
        False,
        (("A", 5, 2), ("Z", 1, 0)),
    )
    assert await read(stock, discrepancies) == []


@pytest.mark.parametrize(
    ("shipped_first", "status"),
    [((), OrderStatus.RELEASED), ((("A", 1),), OrderStatus.SHIPPED)],
    ids=["nothing-shipped", "some-shipped"],
)
async def test_a_cancellation_without_lines_releases_all_the_order_holds(
    stock, shipped_first, status
):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    if shipped_first:
        await stock.apply(warehouse_shipment(placed.order_id, *shipped_first))
    command = warehouse_cancellation(placed.order_id)

    outcome = await stock.apply(command)

    held_a = 3 - sum(units for _, units in shipped_first)
    assert (outcome.kind, outcome.status, outcome.lines) == (
        WarehouseCancellationKind.RELEASED,
        status,
        lines(("A", held_a), ("B", 2)),
    )
    assert await stock.levels_of(["A", "B"]) == {
        "A": StockLevel(10 - (3 - held_a)),
        "B": StockLevel(10),
    }
    assert (await read(stock, cancellations))[command.cancellation_id][4:] == (
        "released",
        "unfulfillable",
        True,
        (("A", held_a, held_a), ("B", 2, 2)),
    )


@pytest.mark.parametrize("before", ["shipped", "released", "holds-none-of-it"])
async def test_a_cancellation_of_nothing_the_order_holds_is_ignored(stock, before):
    placed = await reserved_order(stock, ("A", 3))
    if before == "shipped":
        await stock.apply(shipment(placed.order_id))
    elif before == "released":
        await stock.apply(cancellation(placed.order_id))
    levels = await stock.levels_of(["A"])
    command = warehouse_cancellation(
        placed.order_id, *([("Z", 1)] if before == "holds-none-of-it" else [])
    )

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.lines, outcome.label) == (
        WarehouseCancellationKind.IGNORED,
        (),
        "ignored",
    )
    assert await stock.levels_of(["A"]) == levels
    assert await read(stock, discrepancies) == []


async def test_a_cancellation_of_an_order_that_never_held_stock_is_a_discrepancy(stock):
    await stock.put_stock({"A": 2})
    rejected, tombstoned, unknown = order(("A", 5)), order(("A", 1)), order(("A", 1))
    await stock.apply(rejected)
    await stock.apply(cancellation(tombstoned.order_id))
    commands = [
        warehouse_cancellation(rejected.order_id, ("A", 5)),
        warehouse_cancellation(tombstoned.order_id),
        warehouse_cancellation(unknown.order_id, ("A", 1)),
    ]

    outcomes = [await stock.apply(command) for command in commands]

    assert [(outcome.kind, outcome.status) for outcome in outcomes] == [
        (WarehouseCancellationKind.DISCREPANCY, OrderStatus.REJECTED),
        (WarehouseCancellationKind.DISCREPANCY, OrderStatus.CANCELLED),
        (WarehouseCancellationKind.DISCREPANCY, None),
    ]
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2)}
    rejected_c, tombstoned_c, unknown_c = commands
    assert await read(stock, discrepancies) == sorted(
        [
            (
                "order_not_reserved",
                "cancellation",
                rejected_c.cancellation_id,
                rejected.order_id,
                "A",
                5,
                "rejected",
            ),
            (
                "order_not_reserved",
                "cancellation",
                tombstoned_c.cancellation_id,
                tombstoned.order_id,
                None,
                None,
                "cancelled",
            ),
            (
                "unknown_order",
                "cancellation",
                unknown_c.cancellation_id,
                unknown.order_id,
                "A",
                1,
                None,
            ),
        ],
        key=repr,
    )


# The shop's cancel, on a partly shipped order


async def test_the_shops_cancel_releases_only_what_the_order_still_holds(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 2)))

    partial = await stock.apply(cancellation(placed.order_id, ("A", 3)))
    whole = await stock.apply(cancellation(placed.order_id))

    assert (partial.kind, partial.status, partial.lines) == (
        CancelKind.PARTIALLY_RELEASED,
        OrderStatus.RESERVED,
        lines(("A", 1)),
    )
    assert (whole.kind, whole.status, whole.lines) == (
        CancelKind.RELEASED,
        OrderStatus.SHIPPED,
        lines(("B", 2)),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(8), "B": StockLevel(10)}
    assert (await read(stock, order_lines))[placed.order_id] == ("shipped", {"A": (2, 2)})


# Result events


async def test_a_shipment_writes_stock_shipped_with_its_tracking_and_the_order_status(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    partial = warehouse_shipment(placed.order_id, ("B", 2), ("Z", 1), tracking_url=None)
    last = warehouse_shipment(
        placed.order_id, ("A", 3), carrier=None, tracking_numbers=(), tracking_url=None
    )

    with in_trace(TRACEPARENT):
        await stock.apply(partial)
    await stock.apply(last)
    await stock.apply(last)
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 1)))

    assert (await result_events(stock))[1:] == [
        RecordedEvent(
            "stock.shipped",
            result_body(
                partial,
                lines=lines(("B", 2)),
                shipment_id=partial.shipment_id,
                carrier="DHL",
                tracking_numbers=["JD014600003828392019"],
                tracking_url=None,
                order_status="reserved",
            ),
            TRACEPARENT,
        ),
        RecordedEvent(
            "stock.shipped",
            result_body(
                last,
                lines=lines(("A", 3)),
                shipment_id=last.shipment_id,
                carrier=None,
                tracking_numbers=[],
                tracking_url=None,
                order_status="shipped",
            ),
        ),
    ]


async def test_a_cancellation_writes_stock_released_with_the_warehouses_reason(stock):
    placed = await reserved_order(stock, ("A", 3))
    command = warehouse_cancellation(placed.order_id, ("A", 1), reason="damaged")

    with in_trace(TRACEPARENT):
        await stock.apply(command)
    await stock.apply(command)
    await stock.apply(warehouse_cancellation(placed.order_id, ("Z", 1)))

    assert (await result_events(stock))[1:] == [
        RecordedEvent(
            "stock.released",
            result_body(
                command,
                lines=lines(("A", 1)),
                order_status="reserved",
                reason="warehouse_cancelled",
                warehouse_reason="damaged",
            ),
            TRACEPARENT,
        )
    ]


async def test_discrepancies_and_already_shipped_write_no_result_event(stock):
    placed = await reserved_order(stock, ("A", 3))
    await stock.apply(shipment(placed.order_id))
    before = await result_events(stock)

    await stock.apply(warehouse_shipment(placed.order_id, ("A", 1)))
    await stock.apply(warehouse_shipment(order(("A", 1)).order_id, ("A", 1)))
    await stock.apply(warehouse_cancellation(order(("A", 1)).order_id))

    assert await result_events(stock) == before


# With the hand-off: news of the fulfilment order, and the shop's cancel waiting on it


async def news_at(stock, order_id):
    if isinstance(stock, FakeStock):
        request = stock.fulfilment_order(order_id)
        return None if request is None else request.news_at
    async with recorded(stock) as connection:
        return await connection.fetchval(
            "SELECT news_at FROM warehouse_requests"
            " WHERE order_id = $1 AND kind = 'fulfilment_order'",
            order_id,
        )


async def test_every_recorded_shipment_and_cancellation_is_news_of_its_fulfilment_order(
    handoff_stock,
):
    shipped, cancelled, quiet = (
        await reserved_order(handoff_stock, ("A", 3), on_hand={"A": 10}),
        order(("A", 2)),
        order(("A", 1)),
    )
    for placed in (cancelled, quiet):
        await handoff_stock.apply(placed)
    for placed in (shipped, cancelled, quiet):
        await move_on(handoff_stock, placed.order_id, RequestStatus.ACCEPTED)

    await handoff_stock.apply(warehouse_shipment(shipped.order_id, ("A", 1)))
    await handoff_stock.apply(warehouse_cancellation(cancelled.order_id, ("Z", 1)))

    assert await news_at(handoff_stock, shipped.order_id) is not None
    assert await news_at(handoff_stock, cancelled.order_id) is not None
    assert await news_at(handoff_stock, quiet.order_id) is None


async def test_a_shipment_takes_units_while_the_shops_cancel_waits_at_the_warehouse(
    handoff_stock,
):
    placed = await reserved_order(handoff_stock, ("A", 3), ("B", 2))
    await move_on(handoff_stock, placed.order_id, RequestStatus.ACCEPTED)
    waiting = await handoff_stock.apply(cancellation(placed.order_id))

    outcome = await handoff_stock.apply(warehouse_shipment(placed.order_id, ("A", 3)))

    assert waiting.kind is CancelKind.CANCEL_REQUESTED
    assert (outcome.kind, outcome.status, outcome.lines) == (
        ShipmentKind.SHIPPED,
        OrderStatus.RESERVED,
        lines(("A", 3)),
    )
    assert await handoff_stock.levels_of(["A", "B"]) == {
        "A": StockLevel(7),
        "B": StockLevel(10, 2),
    }


@pytest.mark.parametrize("request_status", [RequestStatus.PENDING, RequestStatus.SENDING])
async def test_a_shipment_before_the_warehouses_answer_is_recorded_applies_by_reference(
    handoff_stock, request_status
):
    # The warehouse accepted the fulfilment order, but its answer was lost: the dispatcher
    # still sees it pending or sending when the shipment comes.
    placed = await reserved_order(handoff_stock, ("A", 3))
    if request_status is RequestStatus.SENDING:
        await move_on(handoff_stock, placed.order_id, request_status)

    outcome = await handoff_stock.apply(warehouse_shipment(placed.order_id, ("A", 3)))

    assert (outcome.kind, outcome.status) == (ShipmentKind.SHIPPED, OrderStatus.SHIPPED)
    assert await handoff_stock.levels_of(["A"]) == {"A": StockLevel(7)}
    assert await news_at(handoff_stock, placed.order_id) is not None
