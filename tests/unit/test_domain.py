from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from fulfilment.domain.model import (
    Decision,
    DuplicateOf,
    OrderLine,
    OutcomeKind,
    PlaceOrder,
    RejectionReason,
    ReservationOutcome,
    StockLevel,
    aggregate_demand,
    decide,
)


def test_aggregate_demand_sums_lines_of_the_same_sku():
    lines = [OrderLine("85123A", 6), OrderLine("71053", 2), OrderLine("85123A", 4)]

    assert aggregate_demand(lines) == {"71053": 2, "85123A": 10}


def test_aggregate_demand_orders_skus_by_code_point():
    lines = [OrderLine(sku, 1) for sku in ["b", "BANK CHARGES", "a", "B", "15056bl", "Ä"]]

    assert list(aggregate_demand(lines)) == ["15056bl", "B", "BANK CHARGES", "a", "b", "Ä"]


def test_aggregate_demand_keeps_skus_that_differ_only_in_case_apart():
    lines = [OrderLine("15056bl", 1), OrderLine("15056BL", 2)]

    assert aggregate_demand(lines) == {"15056BL": 2, "15056bl": 1}


def test_a_command_demands_its_aggregated_lines():
    command = PlaceOrder(
        event_id=uuid4(),
        order_id=uuid4(),
        placed_at=datetime(2010, 12, 1, 8, 26, tzinfo=UTC),
        lines=(OrderLine("B", 1), OrderLine("A", 2), OrderLine("B", 3)),
    )

    assert command.demand() == {"A": 2, "B": 4}


def test_available_is_on_hand_minus_reserved():
    assert StockLevel(on_hand=10, reserved=3).available == 7


def test_an_order_within_stock_can_be_reserved():
    assert decide({"A": 2}, {"A": StockLevel(5)}) == Decision(None)


def test_exactly_the_available_units_are_enough():
    assert decide({"A": 3}, {"A": StockLevel(on_hand=5, reserved=2)}) == Decision(None)


def test_one_unit_more_than_available_is_insufficient():
    decision = decide({"A": 4}, {"A": StockLevel(on_hand=5, reserved=2)})

    assert decision == Decision(RejectionReason.INSUFFICIENT_STOCK, ("A",))


def test_repeated_sku_lines_are_judged_as_one_demand():
    demand = aggregate_demand([OrderLine("A", 3), OrderLine("A", 3)])

    assert decide(demand, {"A": StockLevel(6)}) == Decision(None)
    assert decide(demand, {"A": StockLevel(5)}).reason is RejectionReason.INSUFFICIENT_STOCK


def test_an_unknown_sku_wins_over_insufficient_stock():
    decision = decide({"A": 100, "Z": 1}, {"A": StockLevel(1)})

    assert decision == Decision(RejectionReason.UNKNOWN_SKU, ("Z",))


def test_every_offending_sku_is_named_in_code_point_order():
    demand = aggregate_demand([OrderLine(sku, 9) for sku in ["b", "a", "B", "c"]])
    stock = {sku: StockLevel(1) for sku in ["a", "b", "B", "c"]}

    assert decide(demand, stock) == Decision(
        RejectionReason.INSUFFICIENT_STOCK, ("B", "a", "b", "c")
    )


def test_skus_are_case_sensitive_when_deciding():
    decision = decide({"15056bl": 1}, {"15056BL": StockLevel(10)})

    assert decision == Decision(RejectionReason.UNKNOWN_SKU, ("15056bl",))


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        (ReservationOutcome(OutcomeKind.RESERVED, uuid4(), uuid4()), "reserved"),
        (
            ReservationOutcome(
                OutcomeKind.REJECTED, uuid4(), uuid4(), reason=RejectionReason.UNKNOWN_SKU
            ),
            "rejected:unknown_sku",
        ),
        (
            ReservationOutcome(
                OutcomeKind.REJECTED,
                uuid4(),
                uuid4(),
                reason=RejectionReason.INSUFFICIENT_STOCK,
            ),
            "rejected:insufficient_stock",
        ),
        (
            ReservationOutcome(
                OutcomeKind.DUPLICATE, uuid4(), uuid4(), duplicate_of=DuplicateOf.EVENT
            ),
            "duplicate:event",
        ),
        (
            ReservationOutcome(
                OutcomeKind.DUPLICATE, uuid4(), uuid4(), duplicate_of=DuplicateOf.ORDER
            ),
            "duplicate:order",
        ),
    ],
)
def test_each_outcome_has_a_short_fixed_label(outcome, label):
    assert outcome.label == label
