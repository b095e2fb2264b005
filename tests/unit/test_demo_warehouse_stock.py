"""The demo's staging of the warehouse's receipt and damage: where the day is cut, what fits."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from fulfilment.adapters.postgres.warehouse_news import SkuStock
from fulfilment.dataset.online_retail import RetailOrder
from fulfilment.dataset.retail_lifecycle import RetailCancellation
from fulfilment.demo.warehouse_stock import (
    SHORT_UNITS,
    plan_staging,
    split_at_middle_order,
)


def order(invoice_no: str, *lines: tuple[str, int]) -> RetailOrder:
    return RetailOrder(
        invoice_no=invoice_no,
        event_id=uuid4(),
        order_id=uuid4(),
        placed_at=datetime(2010, 12, 2, 12, tzinfo=UTC),
        lines=lines,
        source="test",
        day="2010-12-02",
        customer="1",
    )


def cancellation() -> RetailCancellation:
    return RetailCancellation(
        invoice_no="C1",
        cancels="0",
        event_id=uuid4(),
        order_id=uuid4(),
        cancelled_at=datetime(2010, 12, 2, 12, tzinfo=UTC),
        lines=(("A", 1),),
        source="test",
        day="2010-12-02",
    )


def test_the_run_holding_the_middle_order_is_cut_before_it() -> None:
    orders = [order(str(n), ("A", 1)) for n in range(5)]
    cancel = cancellation()
    runs = [tuple(orders[:1]), (cancel,), tuple(orders[1:])]

    split, cut = split_at_middle_order(runs)

    assert split == [(orders[0],), (cancel,), (orders[1],), tuple(orders[2:])]
    assert cut == 3


def test_a_middle_order_that_begins_its_run_cuts_between_runs() -> None:
    orders = [order(str(n), ("A", 1)) for n in range(4)]
    cancel = cancellation()
    runs = [tuple(orders[:2]), (cancel,), tuple(orders[2:])]

    assert split_at_middle_order(runs) == (runs, 2)


def test_a_day_without_orders_is_not_cut() -> None:
    runs = [(cancellation(),)]

    assert split_at_middle_order(runs) == (runs, None)


def test_the_damage_takes_the_held_sku_an_afternoon_order_could_have_had_with_least_free() -> None:
    levels = {
        "A": SkuStock(on_hand=10, reserved=4, held=4),  # 6 free
        "B": SkuStock(on_hand=5, reserved=3, held=3),  # 2 free
        "C": SkuStock(on_hand=9, reserved=8, held=8),  # 1 free, but its order wants 2
        "D": SkuStock(on_hand=50, reserved=20, held=20),
    }
    morning = {"A": 4, "B": 3, "C": 8, "D": 20}
    first_b = order("2", ("B", 1), ("A", 1))
    afternoon = [order("1", ("C", 2)), first_b, order("3", ("B", 2))]

    plan = plan_staging(levels, morning, afternoon)

    assert plan is not None
    assert (plan.damaged_sku, plan.damaged_units) == ("B", 2 + SHORT_UNITS)
    assert (plan.damaged_on_hand, plan.held, plan.available) == (5, 3, 2)
    assert (plan.refused, plan.refused_units) == (first_b, 1)
    # The receipt: the SKU the morning's orders hold most of.
    assert (plan.received_sku, plan.received_on_hand) == ("D", 50)


def test_a_sku_held_by_orders_before_the_day_or_an_order_that_could_not_be_reserved_is_no_fit() -> (
    None
):
    levels = {
        "A": SkuStock(on_hand=10, reserved=6, held=6),  # 2 of its held units are not the day's
        "B": SkuStock(on_hand=5, reserved=3, held=3),
        "X": SkuStock(on_hand=0, reserved=0, held=0),
    }
    morning = {"A": 4, "B": 3}
    # B's first afternoon order also asks for X, of which nothing is available.
    afternoon = [order("1", ("A", 1)), order("2", ("B", 1), ("X", 1))]

    assert plan_staging(levels, morning, afternoon) is None


def test_nothing_held_in_the_morning_stages_nothing() -> None:
    levels = {"A": SkuStock(on_hand=10, reserved=0, held=0)}

    assert plan_staging(levels, {}, [order("1", ("A", 1))]) is None
