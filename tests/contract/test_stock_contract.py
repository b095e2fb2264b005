"""One suite, two stock stores: the in-memory fake and PostgreSQL must keep the same promises."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import pytest
import sqlalchemy as sa

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.domain.handoff import RequestStatus
from fulfilment.domain.lifecycle import CancelKind, OrderStatus, ShipKind
from fulfilment.domain.model import (
    DuplicateOf,
    OrderLine,
    OutcomeKind,
    RejectionReason,
    StockLevel,
)
from tests.support.builders import cancellation, in_trace, order, shipment
from tests.support.fakes import (
    SHOP_RELEASE,
    UPSTREAM_SHIPMENT,
    FakeStock,
    RecordedEvent,
    result_body,
)
from tests.support.warehouse_rows import requests_of


async def test_reserving_an_order_takes_its_units_from_what_is_available(stock):
    await stock.put_stock({"85123A": 10, "71053": 6})

    outcome = await stock.apply(order(("85123A", 6), ("71053", 6)))

    assert outcome.kind is OutcomeKind.RESERVED
    assert outcome.label == "reserved"
    assert (outcome.reason, outcome.duplicate_of, outcome.skus) == (None, None, ())
    assert await stock.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(on_hand=10, reserved=6),
        "71053": StockLevel(on_hand=6, reserved=6),
    }


async def test_the_outcome_names_the_order_and_the_event(stock):
    await stock.put_stock({"A": 1})
    command = order(("A", 1))

    outcome = await stock.apply(command)

    assert (outcome.order_id, outcome.event_id) == (command.order_id, command.event_id)


async def test_exactly_the_available_units_can_be_reserved(stock):
    await stock.put_stock({"A": 5})
    await stock.apply(order(("A", 2)))

    outcome = await stock.apply(order(("A", 3)))

    assert outcome.kind is OutcomeKind.RESERVED
    assert await stock.levels_of(["A"]) == {"A": StockLevel(5, 5)}


async def test_an_order_is_rejected_whole_when_one_sku_is_short(stock):
    await stock.put_stock({"A": 10, "B": 1, "C": 10})

    outcome = await stock.apply(order(("A", 1), ("B", 2), ("C", 1)))

    assert outcome.kind is OutcomeKind.REJECTED
    assert outcome.reason is RejectionReason.INSUFFICIENT_STOCK
    assert outcome.skus == ("B",)
    assert outcome.label == "rejected:insufficient_stock"
    assert await stock.levels_of(["A", "B", "C"]) == {
        "A": StockLevel(10),
        "B": StockLevel(1),
        "C": StockLevel(10),
    }


async def test_an_order_with_an_unknown_sku_is_rejected_naming_it(stock):
    await stock.put_stock({"A": 10})

    outcome = await stock.apply(order(("A", 1), ("NOPE", 1)))

    assert (outcome.kind, outcome.reason, outcome.skus) == (
        OutcomeKind.REJECTED,
        RejectionReason.UNKNOWN_SKU,
        ("NOPE",),
    )
    assert await stock.levels_of(["A", "NOPE"]) == {"A": StockLevel(10)}


async def test_an_unknown_sku_wins_over_a_short_one(stock):
    await stock.put_stock({"A": 1})

    outcome = await stock.apply(order(("A", 5), ("Z", 1)))

    assert (outcome.reason, outcome.skus) == (RejectionReason.UNKNOWN_SKU, ("Z",))


async def test_offending_skus_are_named_in_code_point_order(stock):
    await stock.put_stock({"b": 1, "a": 1, "B": 1, "BANK CHARGES": 1})

    outcome = await stock.apply(order(("b", 2), ("a", 2), ("BANK CHARGES", 2), ("B", 2)))

    assert outcome.skus == ("B", "BANK CHARGES", "a", "b")


async def test_the_same_event_twice_is_a_duplicate_and_changes_nothing(stock):
    await stock.put_stock({"A": 10})
    command = order(("A", 4))
    await stock.apply(command)

    again = await stock.apply(command)

    assert (again.kind, again.duplicate_of) == (OutcomeKind.DUPLICATE, DuplicateOf.EVENT)
    assert again.label == "duplicate:event"
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 4)}


async def test_a_rejected_event_delivered_again_is_a_duplicate_too(stock):
    await stock.put_stock({"A": 1})
    command = order(("A", 4))
    await stock.apply(command)
    await stock.put_stock({"A": 10})

    again = await stock.apply(command)

    assert (again.kind, again.duplicate_of) == (OutcomeKind.DUPLICATE, DuplicateOf.EVENT)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 0)}


async def test_the_same_order_under_a_new_event_is_a_duplicate_of_the_order(stock):
    await stock.put_stock({"A": 10})
    first = order(("A", 4))
    await stock.apply(first)

    again = await stock.apply(order(("A", 4), order_id=first.order_id))

    assert (again.kind, again.duplicate_of) == (OutcomeKind.DUPLICATE, DuplicateOf.ORDER)
    assert again.label == "duplicate:order"
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 4)}


async def test_a_rejected_order_under_a_new_event_is_a_duplicate_of_the_order(stock):
    await stock.put_stock({"A": 1})
    first = order(("A", 4))
    await stock.apply(first)
    await stock.put_stock({"A": 10})

    again = await stock.apply(order(("A", 4), order_id=first.order_id))

    assert (again.kind, again.duplicate_of) == (OutcomeKind.DUPLICATE, DuplicateOf.ORDER)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 0)}


async def test_a_duplicate_of_an_order_delivered_again_is_a_duplicate_of_its_event(stock):
    await stock.put_stock({"A": 10})
    first = order(("A", 4))
    await stock.apply(first)
    second = order(("A", 4), order_id=first.order_id)
    await stock.apply(second)

    again = await stock.apply(second)

    assert again.duplicate_of is DuplicateOf.EVENT


async def test_repeated_sku_lines_are_one_demand(stock):
    await stock.put_stock({"A": 6, "B": 5})

    fits = await stock.apply(order(("A", 3), ("A", 3)))
    too_much = await stock.apply(order(("B", 3), ("B", 3)))

    assert fits.kind is OutcomeKind.RESERVED
    assert (too_much.reason, too_much.skus) == (RejectionReason.INSUFFICIENT_STOCK, ("B",))
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(6, 6), "B": StockLevel(5, 0)}


async def test_skus_that_differ_only_in_case_are_different_skus(stock):
    await stock.put_stock({"15056bl": 2, "15056BL": 50})

    lower = await stock.apply(order(("15056bl", 3)))
    upper = await stock.apply(order(("15056BL", 3)))

    assert (lower.reason, lower.skus) == (RejectionReason.INSUFFICIENT_STOCK, ("15056bl",))
    assert upper.kind is OutcomeKind.RESERVED
    assert await stock.levels_of(["15056bl", "15056BL", "15056Bl"]) == {
        "15056bl": StockLevel(2, 0),
        "15056BL": StockLevel(50, 3),
    }


async def test_skus_keep_their_inner_spaces_and_punctuation(stock):
    await stock.put_stock({"BANK CHARGES": 1, "gift_0001_40": 1})

    outcome = await stock.apply(order(("BANK CHARGES", 1), ("gift_0001_40", 1)))

    assert outcome.kind is OutcomeKind.RESERVED
    assert await stock.levels_of(["BANK CHARGES", "BANKCHARGES"]) == {
        "BANK CHARGES": StockLevel(1, 1)
    }


async def test_put_stock_creates_skus_and_keeps_what_is_reserved(stock):
    await stock.put_stock({"A": 5})
    await stock.apply(order(("A", 2)))

    await stock.put_stock({"A": 8, "B": 3})

    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(8, 2), "B": StockLevel(3, 0)}


async def test_put_stock_down_to_exactly_what_is_reserved_is_allowed(stock):
    await stock.put_stock({"A": 5})
    await stock.apply(order(("A", 2)))

    await stock.put_stock({"A": 2})

    assert await stock.levels_of(["A"]) == {"A": StockLevel(2, 2)}


async def test_put_stock_below_reserved_raises_and_changes_nothing(stock):
    await stock.put_stock({"A": 5, "B": 5})
    await stock.apply(order(("A", 4), ("B", 1)))

    with pytest.raises(StockBelowReservedError) as raised:
        await stock.put_stock({"B": 100, "A": 3, "C": 7})

    assert raised.value.skus == ("A",)
    assert isinstance(raised.value, ValueError)
    assert await stock.levels_of(["A", "B", "C"]) == {"A": StockLevel(5, 4), "B": StockLevel(5, 1)}


async def test_negative_stock_is_refused(stock):
    with pytest.raises(ValueError, match="on_hand"):
        await stock.put_stock({"A": -1})

    assert await stock.levels_of(["A"]) == {}


async def test_stock_leaves_out_unknown_skus(stock):
    await stock.put_stock({"A": 1})

    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(1)}
    assert await stock.levels_of([]) == {}


async def test_an_order_of_675_lines_is_reserved_in_one_piece(stock):
    skus = [f"SKU{i:04d}" for i in range(600)]
    await stock.put_stock(dict.fromkeys(skus, 10))
    # 675 lines, 75 of them repeating a SKU, like the real data set's largest order.
    lines = [(sku, 2) for sku in skus] + [(sku, 1) for sku in skus[:75]]

    outcome = await stock.apply(order(*lines))

    assert outcome.kind is OutcomeKind.RESERVED
    levels = await stock.levels_of(skus)
    assert levels[skus[0]] == StockLevel(10, 3)
    assert levels[skus[-1]] == StockLevel(10, 2)
    assert sum(level.reserved for level in levels.values()) == 2 * 600 + 75


async def test_redeliveries_are_counted_per_event_and_survive_between_calls(stock):
    event_a, event_b = uuid.uuid4(), uuid.uuid4()
    assert await stock.count_redelivery(event_a) == 1
    assert await stock.count_redelivery(event_a) == 2
    assert await stock.count_redelivery(event_b) == 1
    assert await stock.count_redelivery(event_a) == 3


# The lifecycle: every cell of the state table (fulfilment.domain.lifecycle), on both.


async def reserved_order(stock, *lines, on_hand=None):
    await stock.put_stock(on_hand or {"A": 10, "B": 10, "C": 10})
    command = order(*lines)
    assert (await stock.apply(command)).kind is OutcomeKind.RESERVED
    return command


async def test_cancelling_a_reserved_order_whole_gives_its_stock_back(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2), ("A", 1))
    command = cancellation(placed.order_id)

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.label) == (
        CancelKind.RELEASED,
        OrderStatus.RELEASED,
        "released",
    )
    assert (outcome.order_id, outcome.event_id) == (placed.order_id, command.event_id)
    assert outcome.lines == (OrderLine("A", 4), OrderLine("B", 2))
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10), "B": StockLevel(10)}


async def test_cancelling_some_lines_gives_back_those_units_and_the_order_stays_reserved(
    stock,
):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))

    outcome = await stock.apply(cancellation(placed.order_id, ("A", 1), ("A", 1)))

    assert (outcome.kind, outcome.status, outcome.lines) == (
        CancelKind.PARTIALLY_RELEASED,
        OrderStatus.RESERVED,
        (OrderLine("A", 2),),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10, 1), "B": StockLevel(10, 2)}


async def test_partial_cancels_shrink_the_order_until_it_is_released(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(cancellation(placed.order_id, ("B", 2)))

    second = await stock.apply(cancellation(placed.order_id, ("A", 1)))
    last = await stock.apply(cancellation(placed.order_id))

    assert (second.kind, second.lines) == (CancelKind.PARTIALLY_RELEASED, (OrderLine("A", 1),))
    assert (last.kind, last.status, last.lines) == (
        CancelKind.RELEASED,
        OrderStatus.RELEASED,
        (OrderLine("A", 2),),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10), "B": StockLevel(10)}


async def test_cancelling_more_than_the_order_holds_cancels_what_it_holds(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))

    outcome = await stock.apply(cancellation(placed.order_id, ("A", 50), ("B", 2)))

    assert (outcome.kind, outcome.lines) == (
        CancelKind.RELEASED,
        (OrderLine("A", 3), OrderLine("B", 2)),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10), "B": StockLevel(10)}


async def test_cancelling_a_sku_the_order_does_not_hold_changes_nothing(stock):
    placed = await reserved_order(stock, ("A", 3))

    outcome = await stock.apply(cancellation(placed.order_id, ("B", 1), ("a", 1)))

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        CancelKind.IGNORED,
        OrderStatus.RESERVED,
        (),
        "ignored",
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10, 3), "B": StockLevel(10)}


async def test_cancelling_a_rejected_or_released_order_changes_nothing(stock):
    await stock.put_stock({"A": 2})
    rejected = order(("A", 5))
    released = order(("A", 2))
    await stock.apply(rejected)
    await stock.apply(released)
    await stock.apply(cancellation(released.order_id))

    on_rejected = await stock.apply(cancellation(rejected.order_id))
    on_released = await stock.apply(cancellation(released.order_id, ("A", 1)))

    assert (on_rejected.kind, on_rejected.status) == (CancelKind.IGNORED, OrderStatus.REJECTED)
    assert (on_released.kind, on_released.status) == (CancelKind.IGNORED, OrderStatus.RELEASED)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2)}


async def test_a_cancel_after_the_shipment_is_too_late_and_changes_nothing(stock):
    placed = await reserved_order(stock, ("A", 3))
    await stock.apply(shipment(placed.order_id))

    outcome = await stock.apply(cancellation(placed.order_id))

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        CancelKind.CANCEL_AFTER_SHIP,
        OrderStatus.SHIPPED,
        (),
        "cancel_after_ship",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(7, 0)}


async def test_the_same_cancel_twice_is_a_duplicate_and_changes_nothing(stock):
    placed = await reserved_order(stock, ("A", 3))
    command = cancellation(placed.order_id, ("A", 1))
    await stock.apply(command)

    again = await stock.apply(command)

    assert (again.kind, again.status, again.lines, again.label) == (
        CancelKind.DUPLICATE,
        None,
        (),
        "duplicate:event",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 2)}


async def test_a_cancel_of_no_lines_is_refused(stock):
    placed = await reserved_order(stock, ("A", 3))
    empty = cancellation(placed.order_id)
    empty = type(empty)(empty.event_id, empty.order_id, empty.cancelled_at, ())

    with pytest.raises(ValueError, match="no lines"):
        await stock.apply(empty)

    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 3)}


@pytest.mark.parametrize("lines", [(), (("A", 2),)], ids=["whole", "lines"])
async def test_a_cancel_before_its_order_leaves_a_tombstone_and_no_stock_change(stock, lines):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))

    outcome = await stock.apply(cancellation(placed.order_id, *lines))

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        CancelKind.TOMBSTONED,
        OrderStatus.CANCELLED,
        (),
        "tombstoned",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10)}


async def test_an_order_placed_after_its_whole_cancel_is_rejected_as_cancelled(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    await stock.apply(cancellation(placed.order_id))

    outcome = await stock.apply(placed)

    assert (outcome.kind, outcome.reason, outcome.skus, outcome.label) == (
        OutcomeKind.REJECTED,
        RejectionReason.CANCELLED,
        (),
        "rejected:cancelled",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10)}


async def test_an_order_placed_after_partial_cancels_reserves_what_they_left(stock):
    await stock.put_stock({"A": 10, "B": 10, "C": 10})
    placed = order(("A", 3), ("B", 2), ("C", 1))
    await stock.apply(cancellation(placed.order_id, ("A", 1), ("Z", 4)))
    await stock.apply(cancellation(placed.order_id, ("A", 1), ("B", 5)))

    outcome = await stock.apply(placed)

    assert outcome.kind is OutcomeKind.RESERVED
    assert await stock.levels_of(["A", "B", "C"]) == {
        "A": StockLevel(10, 1),
        "B": StockLevel(10),
        "C": StockLevel(10, 1),
    }
    released = await stock.apply(cancellation(placed.order_id))
    assert released.lines == (OrderLine("A", 1), OrderLine("C", 1))


async def test_an_order_whose_every_line_was_cancelled_first_is_rejected_as_cancelled(
    stock,
):
    await stock.put_stock({"A": 10, "B": 10})
    placed = order(("A", 3), ("B", 2))
    await stock.apply(cancellation(placed.order_id, ("A", 3), ("B", 9)))

    outcome = await stock.apply(placed)

    assert (outcome.kind, outcome.reason, outcome.skus) == (
        OutcomeKind.REJECTED,
        RejectionReason.CANCELLED,
        (),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10), "B": StockLevel(10)}


async def test_what_a_tombstone_leaves_is_reserved_all_or_nothing(stock):
    await stock.put_stock({"A": 1, "B": 1})
    placed = order(("A", 3), ("B", 2))
    await stock.apply(cancellation(placed.order_id, ("A", 2)))

    outcome = await stock.apply(placed)

    assert (outcome.kind, outcome.reason, outcome.skus) == (
        OutcomeKind.REJECTED,
        RejectionReason.INSUFFICIENT_STOCK,
        ("B",),
    )
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(1), "B": StockLevel(1)}


async def test_a_tombstone_of_lines_becomes_one_of_the_whole_order(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    await stock.apply(cancellation(placed.order_id, ("A", 1)))

    whole = await stock.apply(cancellation(placed.order_id))
    after = await stock.apply(cancellation(placed.order_id, ("A", 1)))
    outcome = await stock.apply(placed)

    assert (whole.kind, whole.status) == (CancelKind.TOMBSTONED, OrderStatus.CANCELLED)
    assert (after.kind, after.status) == (CancelKind.IGNORED, OrderStatus.CANCELLED)
    assert outcome.reason is RejectionReason.CANCELLED


async def test_a_placed_tombstone_is_a_duplicate_of_the_order_the_second_time(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    await stock.apply(cancellation(placed.order_id, ("A", 1)))
    await stock.apply(placed)

    again = await stock.apply(order(("A", 3), order_id=placed.order_id))

    assert again.duplicate_of is DuplicateOf.ORDER
    assert await stock.levels_of(["A"]) == {"A": StockLevel(10, 2)}


async def test_shipping_a_reserved_order_takes_its_lines_out_of_the_warehouse(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    command = shipment(placed.order_id)

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.label) == (
        ShipKind.SHIPPED,
        OrderStatus.SHIPPED,
        "shipped",
    )
    assert (outcome.order_id, outcome.event_id) == (placed.order_id, command.event_id)
    assert outcome.lines == (OrderLine("A", 3), OrderLine("B", 2))
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(7), "B": StockLevel(8)}


async def test_a_partly_cancelled_order_ships_what_it_still_holds(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    await stock.apply(cancellation(placed.order_id, ("B", 2), ("A", 1)))

    outcome = await stock.apply(shipment(placed.order_id))

    assert outcome.lines == (OrderLine("A", 2),)
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(8), "B": StockLevel(10)}


async def test_a_second_shipment_changes_nothing_and_the_same_one_is_a_duplicate(stock):
    placed = await reserved_order(stock, ("A", 3))
    first = shipment(placed.order_id)
    await stock.apply(first)

    second = await stock.apply(shipment(placed.order_id))
    again = await stock.apply(first)

    assert (second.kind, second.status, second.lines, second.label) == (
        ShipKind.IGNORED,
        OrderStatus.SHIPPED,
        (),
        "ignored",
    )
    assert (again.kind, again.status, again.label) == (
        ShipKind.DUPLICATE,
        None,
        "duplicate:event",
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(7)}


async def test_a_shipment_before_its_order_is_not_reserved_and_ships_when_replayed(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3))
    early = shipment(placed.order_id)

    outcome = await stock.apply(early)
    await stock.apply(placed)
    replayed = await stock.apply(early)

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        ShipKind.NOT_RESERVED,
        None,
        (),
        "not_reserved",
    )
    assert replayed.kind is ShipKind.SHIPPED
    assert await stock.levels_of(["A"]) == {"A": StockLevel(7)}


async def test_shipping_an_order_that_holds_nothing_is_not_reserved(stock):
    await stock.put_stock({"A": 2})
    rejected, released, tombstoned = order(("A", 5)), order(("A", 2)), order(("A", 1))
    await stock.apply(rejected)
    await stock.apply(released)
    await stock.apply(cancellation(released.order_id))
    await stock.apply(cancellation(tombstoned.order_id))

    outcomes = [
        await stock.apply(shipment(placed.order_id)) for placed in (rejected, released, tombstoned)
    ]

    assert [(outcome.kind, outcome.status) for outcome in outcomes] == [
        (ShipKind.NOT_RESERVED, OrderStatus.REJECTED),
        (ShipKind.NOT_RESERVED, OrderStatus.RELEASED),
        (ShipKind.NOT_RESERVED, OrderStatus.CANCELLED),
    ]
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2)}


async def test_an_order_placed_again_after_its_release_or_shipment_is_a_duplicate(stock):
    released = await reserved_order(stock, ("A", 3))
    shipped = order(("B", 2))
    await stock.apply(shipped)
    await stock.apply(cancellation(released.order_id))
    await stock.apply(shipment(shipped.order_id))

    again = [
        await stock.apply(order(("A", 1), order_id=released.order_id)),
        await stock.apply(order(("B", 1), order_id=shipped.order_id)),
    ]

    assert [outcome.duplicate_of for outcome in again] == [DuplicateOf.ORDER] * 2
    assert await stock.levels_of(["A", "B"]) == {"A": StockLevel(10), "B": StockLevel(8)}


async def test_stock_can_be_lowered_to_what_remains_reserved_after_a_shipment(stock):
    placed = await reserved_order(stock, ("A", 3))
    await stock.apply(order(("A", 2)))
    await stock.apply(shipment(placed.order_id))

    await stock.put_stock({"A": 2})

    assert await stock.levels_of(["A"]) == {"A": StockLevel(2, 2)}


# Result events (product contract, "Result events"): one per status change and per partial
# release, in the transaction of the change; none for a tombstone, a duplicate or a no-op.

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
"""A W3C trace context, as an input delivery's ``traceparent`` header carries it."""

_OUTBOX = sa.text(
    "SELECT event_id, order_id, sku, routing_key, body, traceparent, published_at"
    " FROM outbox ORDER BY id"
)


async def result_events(stock):
    """The result events ``warehouse`` wrote, in the order it wrote them.

    From PostgreSQL, each row is also checked for what no two stock stores share: its
    ``event_id`` is a UUID, the same as the body's and unique; its ``order_id`` column is the
    body's, or for an event about a SKU its ``sku`` column; ``occurred_at`` carries an offset;
    and nothing is published yet.
    """
    if isinstance(stock, FakeStock):
        return list(stock.result_events)
    async with stock.engine.connect() as connection:
        rows = (await connection.execute(_OUTBOX)).all()
    events = []
    for event_id, order_id, sku, routing_key, stored, traceparent, published_at in rows:
        body = dict(stored)
        assert body.pop("event_id") == str(event_id)
        if order_id is None:
            assert body["sku"] == sku
            assert "order_id" not in body
        else:
            assert (body["order_id"], sku) == (str(order_id), None)
        assert datetime.fromisoformat(body.pop("occurred_at")).utcoffset() is not None
        assert published_at is None
        events.append(RecordedEvent(routing_key, body, traceparent))
    assert len({row.event_id for row in rows}) == len(rows)
    return events


def lines(*pairs):
    return tuple(OrderLine(sku, quantity) for sku, quantity in pairs)


async def test_a_reservation_writes_stock_reserved_with_its_lines_merged_and_sorted(stock):
    await stock.put_stock({"b": 10, "B": 10, "A": 10})
    command = order(("b", 1), ("A", 2), ("B", 3), ("b", 4))

    with in_trace(TRACEPARENT):
        await stock.apply(command)

    assert await result_events(stock) == [
        RecordedEvent(
            "stock.reserved",
            result_body(command, lines=lines(("A", 2), ("B", 3), ("b", 5))),
            TRACEPARENT,
        )
    ]


@pytest.mark.parametrize(
    ("on_hand", "reason", "skus"),
    [
        ({"A": 1, "B": 1, "C": 9}, "insufficient_stock", ["A", "B"]),
        ({"A": 9}, "unknown_sku", ["B", "C"]),
    ],
    ids=["insufficient_stock", "unknown_sku"],
)
async def test_a_rejection_writes_stock_rejected_with_its_reason_and_skus(
    stock, on_hand, reason, skus
):
    await stock.put_stock(on_hand)
    command = order(("C", 2), ("B", 2), ("A", 2))

    await stock.apply(command)

    assert await result_events(stock) == [
        RecordedEvent("stock.rejected", result_body(command, reason=reason, skus=skus))
    ]


async def test_duplicates_of_an_event_or_an_order_write_no_result_event(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 1))
    await stock.apply(placed)
    cancel = cancellation(placed.order_id, ("A", 1))
    await stock.apply(cancel)
    before = await result_events(stock)

    await stock.apply(placed)
    await stock.apply(order(("A", 1), order_id=placed.order_id))
    await stock.apply(cancel)

    assert [event.routing_key for event in before] == ["stock.reserved", "stock.released"]
    assert await result_events(stock) == before


async def test_a_partial_cancel_and_the_last_one_write_stock_released_with_the_status(stock):
    placed = await reserved_order(stock, ("A", 3), ("B", 2))
    partial = cancellation(placed.order_id, ("B", 5), ("Z", 1))
    whole = cancellation(placed.order_id)

    with in_trace(TRACEPARENT):
        await stock.apply(partial)
    await stock.apply(whole)

    assert (await result_events(stock))[1:] == [
        RecordedEvent(
            "stock.released",
            result_body(partial, lines=lines(("B", 2)), order_status="reserved", **SHOP_RELEASE),
            TRACEPARENT,
        ),
        RecordedEvent(
            "stock.released",
            result_body(whole, lines=lines(("A", 3)), order_status="released", **SHOP_RELEASE),
        ),
    ]


async def test_cancels_that_change_nothing_write_no_result_event(stock):
    await stock.put_stock({"A": 2})
    held = order(("A", 1))
    rejected = order(("A", 5))
    shipped = order(("A", 1))
    for command in (held, rejected, shipped):
        await stock.apply(command)
    await stock.apply(shipment(shipped.order_id))
    before = await result_events(stock)

    await stock.apply(cancellation(held.order_id, ("B", 1)))
    await stock.apply(cancellation(rejected.order_id))
    await stock.apply(cancellation(shipped.order_id))

    assert [event.routing_key for event in before] == [
        "stock.reserved",
        "stock.rejected",
        "stock.reserved",
        "stock.shipped",
    ]
    assert await result_events(stock) == before


async def test_a_tombstone_writes_nothing_and_its_order_what_remains_of_it(stock):
    await stock.put_stock({"A": 10, "B": 10})
    partly = order(("A", 3), ("B", 2))
    wholly = order(("B", 1), ("A", 1))
    await stock.apply(cancellation(partly.order_id, ("A", 1)))
    await stock.apply(cancellation(partly.order_id, ("B", 2)))
    await stock.apply(cancellation(wholly.order_id))
    assert await result_events(stock) == []

    await stock.apply(partly)
    await stock.apply(wholly)

    assert await result_events(stock) == [
        RecordedEvent("stock.reserved", result_body(partly, lines=lines(("A", 2)))),
        RecordedEvent("stock.rejected", result_body(wholly, reason="cancelled", skus=["A", "B"])),
    ]


async def test_an_order_whose_lines_were_all_cancelled_first_is_rejected_naming_them(stock):
    await stock.put_stock({"A": 10})
    placed = order(("A", 3), ("B", 1), ("A", 1))
    await stock.apply(cancellation(placed.order_id, ("A", 4), ("B", 1)))

    await stock.apply(placed)

    assert await result_events(stock) == [
        RecordedEvent("stock.rejected", result_body(placed, reason="cancelled", skus=["A", "B"]))
    ]


async def test_a_shipment_writes_stock_shipped_with_what_left_and_nothing_after(stock):
    placed = await reserved_order(stock, ("B", 2), ("A", 3))
    await stock.apply(cancellation(placed.order_id, ("A", 1)))
    first = shipment(placed.order_id)

    with in_trace(TRACEPARENT):
        await stock.apply(first)
    await stock.apply(shipment(placed.order_id))
    await stock.apply(first)
    await stock.apply(shipment(uuid.uuid4()))

    assert (await result_events(stock))[2:] == [
        RecordedEvent(
            "stock.shipped",
            result_body(
                first,
                lines=lines(("A", 2), ("B", 2)),
                **UPSTREAM_SHIPMENT,
                order_status="shipped",
            ),
            TRACEPARENT,
        )
    ]


async def test_every_event_of_a_batch_gets_its_own_row_and_trace_context(stock):
    await stock.put_stock({"A": 100})
    traces = [f"00-{i:032x}-{i:016x}-01" for i in range(1, 11)]
    commands = [order(("A", 1)) for _ in traces]

    async def reserve(command, trace):
        with in_trace(trace):
            await stock.apply(command)

    await asyncio.gather(*map(reserve, commands, traces))

    events = await result_events(stock)
    assert sorted((event.order_id, event.traceparent) for event in events) == sorted(
        (str(command.order_id), trace) for command, trace in zip(commands, traces, strict=True)
    )


# The hand-off to the warehouse system (product contract, "The warehouse system"): the requests
# are recorded in the transaction of the change, and a cancel of an order the warehouse may
# hold waits for its answer (fulfilment.domain.handoff).


async def move_on(stock, order_id, status):
    """Stand in for the dispatcher: the order's pending fulfilment order is now ``status``."""
    if isinstance(stock, FakeStock):
        stock.fulfilment_order(order_id).status = status
        return
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "UPDATE warehouse_requests SET status = :status, attempts = 1, body = '{}',"
                " first_attempt_at = now(), last_attempt_at = now()"
                " WHERE order_id = :order_id AND kind = 'fulfilment_order'"
            ),
            {"status": str(status), "order_id": order_id},
        )


async def inbox_outcome(stock, event_id):
    if isinstance(stock, FakeStock):
        return stock.inbox[(stock.consumer, event_id)]
    async with stock.engine.connect() as connection:
        return await connection.scalar(
            sa.text("SELECT outcome FROM inbox_messages WHERE event_id = :event_id"),
            {"event_id": event_id},
        )


async def test_without_the_handoff_nothing_is_recorded_for_the_warehouse_system(stock):
    placed = await reserved_order(stock, ("A", 3))
    await stock.apply(cancellation(placed.order_id, ("A", 1)))

    assert await requests_of(stock) == []


async def test_a_reservation_records_its_fulfilment_order_pending_with_its_lines(
    handoff_stock,
):
    await handoff_stock.put_stock({"b": 10, "B": 10, "A": 10})
    command = order(("b", 1), ("A", 2), ("B", 3), ("b", 4))

    with in_trace(TRACEPARENT):
        await handoff_stock.apply(command)

    # The request continues the order's trace from the span that wrote its result event.
    assert [event.traceparent for event in await result_events(handoff_stock)] == [TRACEPARENT]
    assert await requests_of(handoff_stock) == [
        (
            "fulfilment_order",
            command.order_id,
            command.event_id,
            (("A", 2), ("B", 3), ("b", 5)),
            "pending",
            TRACEPARENT,
        )
    ]


async def test_a_rejection_and_a_duplicate_record_no_request(handoff_stock):
    await handoff_stock.put_stock({"A": 1})
    placed = order(("A", 1))
    await handoff_stock.apply(placed)

    await handoff_stock.apply(order(("A", 5)))
    await handoff_stock.apply(placed)
    await handoff_stock.apply(order(("A", 1), order_id=placed.order_id))

    assert [row[1] for row in await requests_of(handoff_stock)] == [placed.order_id]


async def test_a_cancel_before_the_send_releases_at_once_and_shrinks_the_request(
    handoff_stock,
):
    placed = await reserved_order(handoff_stock, ("A", 3), ("B", 2))

    outcome = await handoff_stock.apply(cancellation(placed.order_id, ("A", 1), ("B", 2)))

    assert (outcome.kind, outcome.lines) == (
        CancelKind.PARTIALLY_RELEASED,
        lines(("A", 1), ("B", 2)),
    )
    assert await handoff_stock.levels_of(["A", "B"]) == {
        "A": StockLevel(10, 2),
        "B": StockLevel(10, 0),
    }
    [request] = await requests_of(handoff_stock)
    assert (request[0], request[3], request[4]) == ("fulfilment_order", (("A", 2),), "pending")


async def test_a_whole_cancel_before_the_send_withdraws_the_request(handoff_stock):
    placed = await reserved_order(handoff_stock, ("A", 3))

    outcome = await handoff_stock.apply(cancellation(placed.order_id))

    assert (outcome.kind, outcome.status) == (CancelKind.RELEASED, OrderStatus.RELEASED)
    assert [row[4] for row in await requests_of(handoff_stock)] == ["withdrawn"]
    assert await handoff_stock.levels_of(["A"]) == {"A": StockLevel(10, 0)}


@pytest.mark.parametrize("sent", [RequestStatus.SENDING, RequestStatus.ACCEPTED])
@pytest.mark.parametrize(
    ("asked", "recorded"),
    [((), None), ((("A", 5), ("Z", 1)), (("A", 3),))],
    ids=["whole", "lines"],
)
async def test_a_cancel_after_the_send_releases_nothing_and_records_a_cancellation(
    handoff_stock, sent, asked, recorded
):
    placed = await reserved_order(handoff_stock, ("A", 3), ("B", 2))
    await move_on(handoff_stock, placed.order_id, sent)
    command = cancellation(placed.order_id, *asked)
    events_before = await result_events(handoff_stock)

    with in_trace(TRACEPARENT):
        outcome = await handoff_stock.apply(command)

    assert (outcome.kind, outcome.status, outcome.lines, outcome.label) == (
        CancelKind.CANCEL_REQUESTED,
        OrderStatus.RESERVED,
        (),
        "cancel_requested",
    )
    assert await handoff_stock.levels_of(["A", "B"]) == {
        "A": StockLevel(10, 3),
        "B": StockLevel(10, 2),
    }
    assert (await requests_of(handoff_stock))[1:] == [
        ("cancellation", placed.order_id, command.event_id, recorded, "pending", TRACEPARENT)
    ]
    assert await result_events(handoff_stock) == events_before
    assert await inbox_outcome(handoff_stock, command.event_id) == "cancel_requested"
    again = await handoff_stock.apply(command)
    assert again.kind is CancelKind.DUPLICATE
    assert len(await requests_of(handoff_stock)) == 2


async def test_a_cancel_after_the_send_of_skus_the_order_does_not_hold_is_ignored(
    handoff_stock,
):
    placed = await reserved_order(handoff_stock, ("A", 3))
    await move_on(handoff_stock, placed.order_id, RequestStatus.ACCEPTED)

    outcome = await handoff_stock.apply(cancellation(placed.order_id, ("Z", 1)))

    assert outcome.kind is CancelKind.IGNORED
    assert len(await requests_of(handoff_stock)) == 1


async def test_a_cancel_of_an_order_that_failed_at_the_warehouse_releases_at_once(
    handoff_stock,
):
    placed = await reserved_order(handoff_stock, ("A", 3))
    await move_on(handoff_stock, placed.order_id, RequestStatus.FAILED)

    outcome = await handoff_stock.apply(cancellation(placed.order_id))

    assert (outcome.kind, outcome.lines) == (CancelKind.RELEASED, lines(("A", 3)))
    assert [row[4] for row in await requests_of(handoff_stock)] == ["failed"]
