"""The state table of a reservation (product contract, "The reservation lifecycle"), cell by cell.

Rows are the order's state when the event is applied, columns the event; each test names its
cell. The last tests check the promise the table is built for: place and cancel commute.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fulfilment.domain.lifecycle import (
    CancelKind,
    CancelOrder,
    CancelOutcome,
    OrderState,
    OrderStatus,
    ShipKind,
    ShipOutcome,
    Tombstone,
    apply_cancelled,
    apply_placed,
    apply_shipped,
    as_lines,
    released,
    shipped,
)
from fulfilment.domain.model import Decision, OrderLine, RejectionReason, StockLevel

PLENTY = {"A": StockLevel(100), "B": StockLevel(100), "C": StockLevel(100)}

RESERVED = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2})
REJECTED = OrderState(OrderStatus.REJECTED, {"A": 300})
RELEASED = OrderState(OrderStatus.RELEASED)
SHIPPED = OrderState(OrderStatus.SHIPPED, {"A": 3, "B": 2}, shipped={"A": 3, "B": 2})
WHOLE_TOMBSTONE = OrderState(OrderStatus.CANCELLED, tombstone=Tombstone(None))
LINES_TOMBSTONE = OrderState(OrderStatus.CANCELLED, tombstone=Tombstone({"A": 1}))
PLACED_STATES = [RESERVED, REJECTED, RELEASED, SHIPPED]


# OrderPlaced


def test_placed_without_a_row_is_reserved_when_the_stock_suffices():
    placement = apply_placed(None, {"A": 3, "B": 2}, PLENTY)

    assert placement.decision == Decision(None)
    assert placement.state == OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2})


@pytest.mark.parametrize(
    ("stock", "decision"),
    [
        ({"A": StockLevel(2)}, Decision(RejectionReason.UNKNOWN_SKU, ("B",))),
        (
            {"A": StockLevel(2), "B": StockLevel(5)},
            Decision(RejectionReason.INSUFFICIENT_STOCK, ("A",)),
        ),
    ],
)
def test_placed_without_a_row_is_rejected_as_decide_says(stock, decision):
    placement = apply_placed(None, {"A": 3, "B": 2}, stock)

    assert placement.decision == decision
    assert placement.state == OrderState(OrderStatus.REJECTED, {"A": 3, "B": 2})


@pytest.mark.parametrize("state", PLACED_STATES, ids=lambda state: str(state.status))
def test_placed_on_a_placed_order_is_a_duplicate_of_the_order_and_changes_nothing(state):
    placement = apply_placed(state, {"A": 1}, PLENTY)

    assert placement.decision is None
    assert placement.state is state


def test_placed_on_a_tombstone_of_the_whole_order_is_rejected_as_cancelled():
    placement = apply_placed(WHOLE_TOMBSTONE, {"A": 3}, PLENTY)

    assert placement.decision == Decision(RejectionReason.CANCELLED)
    assert placement.state == OrderState(OrderStatus.REJECTED, {}, Tombstone(None))


def test_placed_on_a_tombstone_of_some_lines_reserves_what_it_did_not_cancel():
    tombstone = Tombstone({"A": 1, "B": 2, "Z": 5})

    placement = apply_placed(
        OrderState(OrderStatus.CANCELLED, tombstone=tombstone), {"A": 3, "B": 2, "C": 1}, PLENTY
    )

    assert placement.decision == Decision(None)
    assert placement.state == OrderState(OrderStatus.RESERVED, {"A": 2, "C": 1}, tombstone)


def test_placed_on_a_tombstone_that_cancelled_every_line_is_rejected_as_cancelled():
    tombstone = Tombstone({"A": 5, "B": 2})

    placement = apply_placed(
        OrderState(OrderStatus.CANCELLED, tombstone=tombstone), {"A": 3, "B": 2}, PLENTY
    )

    assert placement.decision == Decision(RejectionReason.CANCELLED)
    assert placement.state == OrderState(OrderStatus.REJECTED, {}, tombstone)


def test_placed_on_a_tombstone_decides_all_or_nothing_on_what_remains():
    tombstone = Tombstone({"A": 2})
    stock = {"A": StockLevel(1), "B": StockLevel(1)}

    fits = apply_placed(OrderState(OrderStatus.CANCELLED, tombstone=tombstone), {"A": 3}, stock)
    short = apply_placed(
        OrderState(OrderStatus.CANCELLED, tombstone=tombstone), {"A": 3, "B": 2}, stock
    )

    assert fits.decision == Decision(None)
    assert fits.state.lines == {"A": 1}
    assert short.decision == Decision(RejectionReason.INSUFFICIENT_STOCK, ("B",))
    assert short.state == OrderState(OrderStatus.REJECTED, {"A": 1, "B": 2}, tombstone)


def test_the_stock_of_a_sku_the_tombstone_cancelled_in_full_is_not_looked_at():
    tombstone = Tombstone({"GONE": 4})

    placement = apply_placed(
        OrderState(OrderStatus.CANCELLED, tombstone=tombstone), {"A": 1, "GONE": 4}, PLENTY
    )

    assert placement.decision == Decision(None)
    assert placement.state.lines == {"A": 1}


# OrderCancelled


@pytest.mark.parametrize("cancelled", [None, {"A": 2}], ids=["whole", "lines"])
def test_cancelled_without_a_row_leaves_a_tombstone_and_releases_nothing(cancelled):
    cancellation = apply_cancelled(None, cancelled)

    assert cancellation.kind is CancelKind.TOMBSTONED
    assert cancellation.state == OrderState(OrderStatus.CANCELLED, {}, Tombstone(cancelled))
    assert cancellation.lines == {}


def test_cancelled_whole_on_a_reserved_order_releases_everything_it_holds():
    cancellation = apply_cancelled(RESERVED, None)

    assert cancellation.kind is CancelKind.RELEASED
    assert cancellation.state == OrderState(OrderStatus.RELEASED)
    assert cancellation.lines == {"A": 3, "B": 2}


def test_cancelled_lines_on_a_reserved_order_release_them_and_it_stays_reserved():
    cancellation = apply_cancelled(RESERVED, {"A": 1})

    assert cancellation.kind is CancelKind.PARTIALLY_RELEASED
    assert cancellation.state == OrderState(OrderStatus.RESERVED, {"A": 2, "B": 2})
    assert cancellation.lines == {"A": 1}


def test_cancelling_a_whole_sku_drops_its_line():
    cancellation = apply_cancelled(RESERVED, {"B": 2})

    assert cancellation.state == OrderState(OrderStatus.RESERVED, {"A": 3})


def test_cancelling_more_of_a_sku_than_the_order_holds_cancels_what_it_holds():
    cancellation = apply_cancelled(RESERVED, {"A": 50, "Z": 1})

    assert cancellation.kind is CancelKind.PARTIALLY_RELEASED
    assert cancellation.lines == {"A": 3}
    assert cancellation.state == OrderState(OrderStatus.RESERVED, {"B": 2})


def test_cancelling_every_line_of_a_reserved_order_releases_it():
    cancellation = apply_cancelled(RESERVED, {"A": 3, "B": 7})

    assert cancellation.kind is CancelKind.RELEASED
    assert cancellation.state == OrderState(OrderStatus.RELEASED)
    assert cancellation.lines == {"A": 3, "B": 2}


def test_cancelling_only_skus_the_order_does_not_hold_changes_nothing():
    cancellation = apply_cancelled(RESERVED, {"Z": 1})

    assert cancellation.kind is CancelKind.IGNORED
    assert cancellation.state is RESERVED
    assert cancellation.lines == {}


def test_a_reserved_order_keeps_its_tombstone_when_cancelled_again():
    tombstone = Tombstone({"A": 1})

    cancellation = apply_cancelled(OrderState(OrderStatus.RESERVED, {"A": 2}, tombstone), None)

    assert cancellation.state == OrderState(OrderStatus.RELEASED, {}, tombstone)


PARTLY_SHIPPED = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2}, shipped={"A": 1})
"""Reserved: the warehouse shipped 1 of its 3 A; it holds 2 A and 2 B."""


def test_cancelled_lines_on_a_partly_shipped_order_release_only_what_it_holds():
    cancellation = apply_cancelled(PARTLY_SHIPPED, {"A": 3})

    assert cancellation.kind is CancelKind.PARTIALLY_RELEASED
    assert cancellation.lines == {"A": 2}
    assert cancellation.state == OrderState(
        OrderStatus.RESERVED, {"A": 1, "B": 2}, shipped={"A": 1}
    )
    assert cancellation.state.held == {"B": 2}


def test_cancelled_whole_on_a_partly_shipped_order_leaves_it_shipped_with_what_left():
    cancellation = apply_cancelled(PARTLY_SHIPPED, None)

    assert cancellation.kind is CancelKind.RELEASED
    assert cancellation.lines == {"A": 2, "B": 2}
    assert cancellation.state == OrderState(OrderStatus.SHIPPED, {"A": 1}, shipped={"A": 1})


def test_an_order_whose_lines_shipped_none_is_released_when_it_gives_back_the_last():
    state = OrderState(OrderStatus.RESERVED, {"A": 2}, shipped={"A": 0})

    cancellation = apply_cancelled(state, None)

    assert (cancellation.kind, cancellation.state.status) == (
        CancelKind.RELEASED,
        OrderStatus.RELEASED,
    )


def test_cancelling_a_sku_that_shipped_in_full_changes_nothing():
    state = OrderState(OrderStatus.RESERVED, {"A": 1, "B": 2}, shipped={"A": 1})

    cancellation = apply_cancelled(state, {"A": 1})

    assert (cancellation.kind, cancellation.state, cancellation.lines) == (
        CancelKind.IGNORED,
        state,
        {},
    )


def test_an_order_holds_its_lines_less_what_shipped_and_nothing_unless_reserved():
    assert PARTLY_SHIPPED.held == {"A": 2, "B": 2}
    assert RESERVED.held == {"A": 3, "B": 2}
    assert [state.held for state in (REJECTED, RELEASED, SHIPPED, LINES_TOMBSTONE)] == [{}] * 4


@pytest.mark.parametrize("state", [REJECTED, RELEASED], ids=["rejected", "released"])
@pytest.mark.parametrize("cancelled", [None, {"A": 1}], ids=["whole", "lines"])
def test_cancelled_on_a_rejected_or_released_order_changes_nothing(state, cancelled):
    cancellation = apply_cancelled(state, cancelled)

    assert (cancellation.kind, cancellation.state, cancellation.lines) == (
        CancelKind.IGNORED,
        state,
        {},
    )


@pytest.mark.parametrize("cancelled", [None, {"A": 1}], ids=["whole", "lines"])
def test_cancelled_on_a_shipped_order_is_too_late(cancelled):
    cancellation = apply_cancelled(SHIPPED, cancelled)

    assert (cancellation.kind, cancellation.state, cancellation.lines) == (
        CancelKind.CANCEL_AFTER_SHIP,
        SHIPPED,
        {},
    )


def test_cancelled_lines_on_a_tombstone_of_lines_are_added_to_it():
    state = OrderState(OrderStatus.CANCELLED, tombstone=Tombstone({"B": 1, "C": 2}))

    cancellation = apply_cancelled(state, {"A": 4, "C": 3})

    assert cancellation.kind is CancelKind.TOMBSTONED
    assert cancellation.state == OrderState(
        OrderStatus.CANCELLED, {}, Tombstone({"A": 4, "B": 1, "C": 5})
    )
    assert list(cancellation.state.tombstone.lines) == ["A", "B", "C"]
    assert cancellation.lines == {}


def test_cancelled_whole_on_a_tombstone_of_lines_makes_it_of_the_whole_order():
    cancellation = apply_cancelled(LINES_TOMBSTONE, None)

    assert cancellation.kind is CancelKind.TOMBSTONED
    assert cancellation.state == WHOLE_TOMBSTONE


@pytest.mark.parametrize("cancelled", [None, {"A": 1}], ids=["whole", "lines"])
def test_cancelled_on_a_tombstone_of_the_whole_order_changes_nothing(cancelled):
    cancellation = apply_cancelled(WHOLE_TOMBSTONE, cancelled)

    assert (cancellation.kind, cancellation.state) == (CancelKind.IGNORED, WHOLE_TOMBSTONE)


# OrderShipped


def test_shipped_without_a_row_is_not_reserved():
    shipment = apply_shipped(None)

    assert (shipment.kind, shipment.state, shipment.lines) == (ShipKind.NOT_RESERVED, None, {})


def test_shipped_on_a_reserved_order_ships_every_line_it_holds():
    state = OrderState(OrderStatus.RESERVED, {"A": 2}, Tombstone({"A": 1}))

    shipment = apply_shipped(state)

    assert shipment.kind is ShipKind.SHIPPED
    assert shipment.state == OrderState(
        OrderStatus.SHIPPED, {"A": 2}, Tombstone({"A": 1}), shipped={"A": 2}
    )
    assert shipment.lines == {"A": 2}


def test_shipped_on_a_partly_shipped_order_ships_what_the_warehouse_did_not_take():
    state = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2, "C": 1}, shipped={"A": 1, "B": 2})

    shipment = apply_shipped(state)

    assert shipment.kind is ShipKind.SHIPPED
    assert shipment.lines == {"A": 2, "C": 1}
    assert shipment.state == OrderState(
        OrderStatus.SHIPPED, {"A": 3, "B": 2, "C": 1}, shipped={"A": 3, "B": 2, "C": 1}
    )


@pytest.mark.parametrize(
    "state",
    [REJECTED, RELEASED, WHOLE_TOMBSTONE, LINES_TOMBSTONE],
    ids=["rejected", "released", "cancelled-whole", "cancelled-lines"],
)
def test_shipped_on_an_order_that_holds_nothing_is_not_reserved(state):
    shipment = apply_shipped(state)

    assert (shipment.kind, shipment.state, shipment.lines) == (ShipKind.NOT_RESERVED, state, {})


def test_shipped_on_a_shipped_order_changes_nothing():
    shipment = apply_shipped(SHIPPED)

    assert (shipment.kind, shipment.state, shipment.lines) == (ShipKind.IGNORED, SHIPPED, {})


# Commands, outcomes and stock


def test_a_cancel_sums_its_lines_per_sku_in_code_point_order():
    command = CancelOrder(
        uuid4(),
        uuid4(),
        datetime(2010, 12, 1, 9, 41, tzinfo=UTC),
        (OrderLine("b", 1), OrderLine("B", 2), OrderLine("b", 3)),
    )

    assert command.cancelled() == {"B": 2, "b": 4}
    assert list(command.cancelled() or {}) == ["B", "b"]


def test_a_cancel_without_lines_cancels_the_whole_order():
    command = CancelOrder(uuid4(), uuid4(), datetime(2010, 12, 1, 9, 41, tzinfo=UTC))

    assert command.cancelled() is None


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        (CancelOutcome(CancelKind.RELEASED, uuid4(), uuid4()), "released"),
        (CancelOutcome(CancelKind.PARTIALLY_RELEASED, uuid4(), uuid4()), "partially_released"),
        (CancelOutcome(CancelKind.TOMBSTONED, uuid4(), uuid4()), "tombstoned"),
        (CancelOutcome(CancelKind.IGNORED, uuid4(), uuid4()), "ignored"),
        (CancelOutcome(CancelKind.CANCEL_AFTER_SHIP, uuid4(), uuid4()), "cancel_after_ship"),
        (CancelOutcome(CancelKind.DUPLICATE, uuid4(), uuid4()), "duplicate:event"),
        (ShipOutcome(ShipKind.SHIPPED, uuid4(), uuid4()), "shipped"),
        (ShipOutcome(ShipKind.IGNORED, uuid4(), uuid4()), "ignored"),
        (ShipOutcome(ShipKind.NOT_RESERVED, uuid4(), uuid4()), "not_reserved"),
        (ShipOutcome(ShipKind.DUPLICATE, uuid4(), uuid4()), "duplicate:event"),
    ],
)
def test_every_outcome_has_a_short_fixed_label(outcome, label):
    assert outcome.label == label


def test_outcome_lines_are_one_per_sku_in_code_point_order():
    assert as_lines({"b": 1, "B": 2, "A": 3}) == (
        OrderLine("A", 3),
        OrderLine("B", 2),
        OrderLine("b", 1),
    )


def test_a_release_gives_back_reserved_units_and_a_shipment_takes_them_out():
    assert released(StockLevel(10, 6), 4) == StockLevel(10, 2)
    assert shipped(StockLevel(10, 6), 4) == StockLevel(6, 2)


def test_cancelled_is_a_rejection_reason_that_decide_never_gives():
    assert RejectionReason("cancelled") is RejectionReason.CANCELLED


# Place and cancel commute


def _apply_in_turn(events, stock):
    """Apply ``("place", demand)`` and ``("cancel", units or None)`` events to one order."""
    state = None
    levels = dict(stock)
    for kind, payload in events:
        if kind == "place":
            placement = apply_placed(state, payload, levels)
            if placement.decision is not None and placement.decision.reason is None:
                for sku, units in placement.state.lines.items():
                    level = levels[sku]
                    levels[sku] = StockLevel(level.on_hand, level.reserved + units)
            state = placement.state
        else:
            cancellation = apply_cancelled(state, payload)
            for sku, units in cancellation.lines.items():
                levels[sku] = released(levels[sku], units)
            state = cancellation.state
    return state, levels


units = st.dictionaries(st.sampled_from("ABC"), st.integers(1, 5), min_size=1).map(
    lambda d: dict(sorted(d.items()))
)


@given(
    demand=units,
    cancels=st.lists(st.one_of(st.none(), units), max_size=3),
    position=st.integers(0, 3),
)
def test_with_enough_stock_an_order_holds_the_same_lines_wherever_its_place_arrives(
    demand, cancels, position
):
    in_order = [("place", demand), *(("cancel", c) for c in cancels)]
    events = list(in_order[1:])
    events.insert(min(position, len(events)), in_order[0])

    expected, expected_levels = _apply_in_turn(in_order, PLENTY)
    state, levels = _apply_in_turn(events, PLENTY)

    held = state.lines if state.status is OrderStatus.RESERVED else {}
    expected_held = expected.lines if expected.status is OrderStatus.RESERVED else {}
    assert held == expected_held
    assert levels == expected_levels
    # A whole cancel ends released (after) or rejected as cancelled (before): both hold nothing.
    assert (state.status is OrderStatus.RESERVED) == (expected.status is OrderStatus.RESERVED)


def test_every_arrival_order_of_a_place_and_two_partial_cancels_leaves_the_same_lines():
    events = [("place", {"A": 5, "B": 1}), ("cancel", {"A": 2}), ("cancel", {"A": 2, "C": 9})]

    results = {
        tuple(sorted(_apply_in_turn(order, PLENTY)[0].lines.items()))
        for order in itertools.permutations(events)
    }

    assert results == {(("A", 1), ("B", 1))}
