"""The warehouse's shipments and cancellations by the order's state, cell by cell
(``fulfilment.domain.warehouse_lifecycle``, its table), and the promise the table is built for:
shipments and cancellations of disjoint units commute."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fulfilment.domain.lifecycle import OrderState, OrderStatus, Tombstone, apply_shipped
from fulfilment.domain.warehouse_events import (
    Discrepancy,
    DiscrepancyKind,
    ShipmentKind,
    WarehouseCancellationKind,
)
from fulfilment.domain.warehouse_lifecycle import apply_shipment, apply_warehouse_cancellation

RESERVED = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2})
PARTLY_SHIPPED = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2}, shipped={"A": 1})
SHIPPED = OrderState(OrderStatus.SHIPPED, {"A": 3, "B": 2}, shipped={"A": 3, "B": 2})
REJECTED = OrderState(OrderStatus.REJECTED, {"A": 300})
RELEASED = OrderState(OrderStatus.RELEASED)
TOMBSTONE = OrderState(OrderStatus.CANCELLED, tombstone=Tombstone(None))


# Shipments


def test_a_shipment_of_part_of_a_reserved_order_takes_it_and_the_order_stays_reserved():
    shipment = apply_shipment(RESERVED, {"A": 1})

    assert shipment.kind is ShipmentKind.SHIPPED
    assert (shipment.taken, shipment.unmatched, shipment.discrepancies) == ({"A": 1}, {}, ())
    assert shipment.state == PARTLY_SHIPPED
    assert shipment.state.held == {"A": 2, "B": 2}


def test_the_shipment_that_takes_the_last_held_units_ships_the_order():
    shipment = apply_shipment(PARTLY_SHIPPED, {"A": 2, "B": 2})

    assert (shipment.kind, shipment.taken) == (ShipmentKind.SHIPPED, {"A": 2, "B": 2})
    assert shipment.state == SHIPPED


def test_a_shipment_of_more_than_held_takes_what_is_held_and_keeps_the_excess():
    shipment = apply_shipment(PARTLY_SHIPPED, {"A": 5, "B": 1})

    assert shipment.kind is ShipmentKind.SHIPPED
    assert (shipment.taken, shipment.unmatched) == ({"A": 2, "B": 1}, {"A": 3})
    assert shipment.discrepancies == (
        Discrepancy(DiscrepancyKind.MORE_THAN_HELD, "A", 3, OrderStatus.RESERVED),
    )
    assert shipment.state is not None
    assert shipment.state.held == {"B": 1}


def test_a_shipment_of_a_sku_the_order_has_no_line_of_is_sku_not_held():
    shipment = apply_shipment(RESERVED, {"A": 1, "Z": 4})

    assert (shipment.kind, shipment.taken, shipment.unmatched) == (
        ShipmentKind.SHIPPED,
        {"A": 1},
        {"Z": 4},
    )
    assert shipment.discrepancies == (
        Discrepancy(DiscrepancyKind.SKU_NOT_HELD, "Z", 4, OrderStatus.RESERVED),
    )


def test_a_shipment_that_takes_nothing_is_a_discrepancy_and_changes_nothing():
    state = OrderState(OrderStatus.RESERVED, {"A": 1, "B": 2}, shipped={"A": 1})

    shipment = apply_shipment(state, {"A": 1, "Z": 1})

    assert (shipment.kind, shipment.state, shipment.taken) == (
        ShipmentKind.DISCREPANCY,
        state,
        {},
    )
    assert shipment.unmatched == {"A": 1, "Z": 1}
    assert [d.kind for d in shipment.discrepancies] == [
        DiscrepancyKind.MORE_THAN_HELD,
        DiscrepancyKind.SKU_NOT_HELD,
    ]


def test_a_shipment_of_a_shipped_order_is_already_shipped_and_keeps_nothing():
    shipment = apply_shipment(SHIPPED, {"A": 9, "Z": 1})

    assert (shipment.kind, shipment.state, shipment.taken) == (
        ShipmentKind.ALREADY_SHIPPED,
        SHIPPED,
        {},
    )
    assert (shipment.unmatched, shipment.discrepancies) == ({}, ())


def test_a_shipment_without_an_order_is_a_discrepancy_per_line():
    shipment = apply_shipment(None, {"A": 1, "B": 2})

    assert (shipment.kind, shipment.state, shipment.taken) == (
        ShipmentKind.DISCREPANCY,
        None,
        {},
    )
    assert shipment.unmatched == {"A": 1, "B": 2}
    assert shipment.discrepancies == (
        Discrepancy(DiscrepancyKind.UNKNOWN_ORDER, "A", 1, None),
        Discrepancy(DiscrepancyKind.UNKNOWN_ORDER, "B", 2, None),
    )


@pytest.mark.parametrize("state", [REJECTED, RELEASED, TOMBSTONE], ids=str)
def test_a_shipment_of_an_order_that_is_not_reserved_is_a_discrepancy(state):
    shipment = apply_shipment(state, {"A": 1})

    assert (shipment.kind, shipment.state, shipment.taken, shipment.unmatched) == (
        ShipmentKind.DISCREPANCY,
        state,
        {},
        {"A": 1},
    )
    assert shipment.discrepancies == (
        Discrepancy(DiscrepancyKind.ORDER_NOT_RESERVED, "A", 1, state.status),
    )


def test_a_shipment_names_at_least_one_line():
    with pytest.raises(ValueError, match="at least one line"):
        apply_shipment(RESERVED, {})


# Cancellations by the warehouse


def test_a_cancellation_of_lines_releases_what_the_order_holds_of_them():
    cancellation = apply_warehouse_cancellation(PARTLY_SHIPPED, {"A": 5, "Z": 1})

    assert (cancellation.kind, cancellation.released) == (
        WarehouseCancellationKind.RELEASED,
        {"A": 2},
    )
    assert cancellation.state == OrderState(
        OrderStatus.RESERVED, {"A": 1, "B": 2}, shipped={"A": 1}
    )
    assert cancellation.discrepancies == ()


def test_a_cancellation_without_lines_releases_all_the_order_holds():
    cancellation = apply_warehouse_cancellation(RESERVED, None)

    assert (cancellation.kind, cancellation.released) == (
        WarehouseCancellationKind.RELEASED,
        {"A": 3, "B": 2},
    )
    assert cancellation.state == OrderState(OrderStatus.RELEASED)


def test_a_cancellation_of_the_rest_of_a_partly_shipped_order_leaves_it_shipped():
    cancellation = apply_warehouse_cancellation(PARTLY_SHIPPED, None)

    assert (cancellation.kind, cancellation.released) == (
        WarehouseCancellationKind.RELEASED,
        {"A": 2, "B": 2},
    )
    assert cancellation.state == OrderState(OrderStatus.SHIPPED, {"A": 1}, shipped={"A": 1})


@pytest.mark.parametrize(
    ("state", "cancelled"),
    [(RESERVED, {"Z": 1}), (SHIPPED, None), (SHIPPED, {"A": 1}), (RELEASED, None)],
    ids=["reserved-other-sku", "shipped-whole", "shipped-lines", "released"],
)
def test_a_cancellation_of_nothing_the_order_holds_is_ignored(state, cancelled):
    cancellation = apply_warehouse_cancellation(state, cancelled)

    assert (cancellation.kind, cancellation.state, cancellation.released) == (
        WarehouseCancellationKind.IGNORED,
        state,
        {},
    )
    assert cancellation.discrepancies == ()


@pytest.mark.parametrize("state", [REJECTED, TOMBSTONE], ids=str)
def test_a_cancellation_of_an_order_that_never_held_stock_is_a_discrepancy(state):
    cancellation = apply_warehouse_cancellation(state, {"A": 1})

    assert (cancellation.kind, cancellation.state, cancellation.released) == (
        WarehouseCancellationKind.DISCREPANCY,
        state,
        {},
    )
    assert cancellation.discrepancies == (
        Discrepancy(DiscrepancyKind.ORDER_NOT_RESERVED, "A", 1, state.status),
    )


def test_a_whole_cancellation_without_an_order_is_one_discrepancy_without_a_sku():
    cancellation = apply_warehouse_cancellation(None, None)

    assert (cancellation.kind, cancellation.state) == (WarehouseCancellationKind.DISCREPANCY, None)
    assert cancellation.discrepancies == (
        Discrepancy(DiscrepancyKind.UNKNOWN_ORDER, None, None, None),
    )


# What commutes


@st.composite
def disjoint_parts(draw):
    """An order's lines, and shipments and cancellations (as ("ship"|"cancel", units))
    that together name at most what it holds of each SKU, in any order."""
    lines = draw(st.dictionaries(st.sampled_from("ABC"), st.integers(1, 6), min_size=1))
    parts = []
    for sku, units in lines.items():
        left = units
        while left and draw(st.booleans()):
            part = draw(st.integers(1, left))
            left -= part
            parts.append((draw(st.sampled_from(["ship", "cancel"])), {sku: part}))
    return dict(sorted(lines.items())), draw(st.permutations(parts))


def _apply(state, parts):
    for kind, units in parts:
        result = (
            apply_shipment(state, units)
            if kind == "ship"
            else apply_warehouse_cancellation(state, units)
        )
        assert result.discrepancies == ()
        state = result.state
    return state


@given(disjoint_parts(), st.randoms())
def test_shipments_and_cancellations_of_disjoint_units_end_the_same_in_any_order(drawn, random):
    lines, parts = drawn
    shuffled = list(parts)
    random.shuffle(shuffled)

    one = _apply(OrderState(OrderStatus.RESERVED, lines), parts)
    other = _apply(OrderState(OrderStatus.RESERVED, lines), shuffled)

    assert one == other


@given(disjoint_parts())
def test_the_upstream_shipment_after_them_ships_all_that_was_not_cancelled(drawn):
    lines, parts = drawn
    cancelled: Counter[str] = Counter()
    for kind, units in parts:
        if kind == "cancel":
            cancelled.update(units)
    state = _apply(OrderState(OrderStatus.RESERVED, lines), parts)

    after = apply_shipped(state).state

    assert after is not None
    left = {sku: units - cancelled[sku] for sku, units in lines.items()}
    left = {sku: units for sku, units in left.items() if units > 0}
    assert (after.status, after.held, dict(after.shipped), dict(after.lines)) == (
        OrderStatus.SHIPPED if left else OrderStatus.RELEASED,
        {},
        left,
        left,
    )
