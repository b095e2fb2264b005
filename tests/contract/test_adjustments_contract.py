"""Adjustments of the warehouse's stock and the shortage rule, on both stock stores (product
contract, "Hearing back from the warehouse"; ``fulfilment.domain.adjustments``).

An adjustment changes ``on_hand`` by its delta once per ``adjustment_id``, never below 0 (the
rest of a loss is a discrepancy), creates an unknown SKU by a positive delta, and writes
``stock.adjusted``. A loss may leave ``reserved > on_hand``: the SKU is short, no order
reserves it, and every change of its shortfall, by whichever writer, writes ``stock.shortage``.
"""

from __future__ import annotations

import asyncio

import pytest

from fulfilment.domain.lifecycle import CancelKind, OrderStatus, ShipKind
from fulfilment.domain.model import OutcomeKind, RejectionReason, StockLevel
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentReason,
    DuplicateBy,
    OperatorIdentity,
    ShipmentKind,
    WarehouseCancellationKind,
)
from tests.contract.test_stock_contract import TRACEPARENT, reserved_order, result_events
from tests.contract.test_warehouse_events_contract import read
from tests.support.builders import cancellation, in_trace, order, shipment
from tests.support.fakes import RecordedEvent
from tests.support.warehouse_commands import (
    warehouse_adjustment,
    warehouse_cancellation,
    warehouse_shipment,
)
from tests.support.warehouse_event_rows import adjustments, discrepancies, webhook_inbox


def adjusted_event(command, *, applied, on_hand, reserved, traceparent=None):
    """The ``stock.adjusted`` that ``command`` writes, less ``event_id`` and ``occurred_at``."""
    return RecordedEvent(
        "stock.adjusted",
        {
            "version": 1,
            "causation_id": str(command.event_id),
            "adjustment_id": command.adjustment_id,
            "sku": command.sku,
            "delta": command.delta,
            "applied": applied,
            "reason": str(command.reason),
            "source": str(command.source),
            "on_hand": on_hand,
            "reserved": reserved,
            "available": max(0, on_hand - reserved),
        },
        traceparent,
    )


def shortage_event(sku, *, on_hand, reserved):
    """The ``stock.shortage`` of ``sku`` at that level (no trace context: a trigger's)."""
    return RecordedEvent(
        "stock.shortage",
        {
            "version": 1,
            "sku": sku,
            "on_hand": on_hand,
            "reserved": reserved,
            "short": max(0, reserved - on_hand),
        },
        None,
    )


async def events_after(stock, count):
    """The result events written after the first ``count``."""
    return (await result_events(stock))[count:]


# Adjustments


async def test_a_receipt_raises_on_hand_once_and_writes_stock_adjusted(stock):
    await stock.put_stock({"A": 10})
    command = warehouse_adjustment("A", 5, AdjustmentReason.RECEIVED)

    with in_trace(TRACEPARENT):
        outcome = await stock.apply(command)

    assert (outcome.kind, outcome.label, outcome.sku, outcome.event_id) == (
        AdjustmentKind.ADJUSTED,
        "adjusted",
        "A",
        command.event_id,
    )
    assert (outcome.on_hand, outcome.reserved, outcome.applied, outcome.discrepancy) == (
        15,
        0,
        5,
        0,
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(15)}
    assert await result_events(stock) == [
        adjusted_event(command, applied=5, on_hand=15, reserved=0, traceparent=TRACEPARENT)
    ]
    assert await read(stock, adjustments) == {
        command.adjustment_id: (
            "A",
            5,
            5,
            "received",
            command.webhook_id,
            "webhook",
            15,
            0,
            None,
            None,
        )
    }
    assert await read(stock, webhook_inbox) == {
        command.webhook_id: ("inventory.adjusted", "adjusted")
    }


async def test_a_repeated_webhook_or_adjustment_id_changes_nothing(stock):
    await stock.put_stock({"A": 10})
    command = warehouse_adjustment("A", -2)
    await stock.apply(command)
    again = warehouse_adjustment("A", -2, adjustment_id=command.adjustment_id)

    by_webhook = await stock.apply(command)
    by_change = await stock.apply(again)

    assert (by_webhook.kind, by_webhook.duplicate_by, by_webhook.label) == (
        AdjustmentKind.DUPLICATE,
        DuplicateBy.WEBHOOK,
        "duplicate:webhook",
    )
    assert (by_change.kind, by_change.duplicate_by) == (
        AdjustmentKind.DUPLICATE,
        DuplicateBy.CHANGE,
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(8)}
    assert len(await result_events(stock)) == 1
    assert await read(stock, webhook_inbox) == {
        command.webhook_id: ("inventory.adjusted", "adjusted"),
        again.webhook_id: ("inventory.adjusted", "duplicate"),
    }


async def test_a_positive_delta_of_an_unknown_sku_creates_it_and_a_loss_of_one_does_not(stock):
    gain = warehouse_adjustment("NEW", 4, AdjustmentReason.FOUND)
    loss = warehouse_adjustment("NEVER", -3, AdjustmentReason.LOST)

    gained = await stock.apply(gain)
    lost = await stock.apply(loss)

    assert (gained.on_hand, gained.applied, gained.discrepancy) == (4, 4, 0)
    assert (lost.kind, lost.on_hand, lost.applied, lost.discrepancy) == (
        AdjustmentKind.ADJUSTED,
        0,
        0,
        3,
    )
    assert await stock.levels_of(["NEW", "NEVER"]) == {"NEW": StockLevel(4)}
    assert await read(stock, discrepancies) == [
        ("more_than_on_hand", "adjustment", loss.adjustment_id, None, "NEVER", 3, None)
    ]


async def test_a_loss_larger_than_on_hand_stops_at_zero_and_keeps_the_rest(stock):
    await stock.put_stock({"A": 2})
    command = warehouse_adjustment("A", -5, AdjustmentReason.COUNTED)

    outcome = await stock.apply(command)

    assert (outcome.on_hand, outcome.applied, outcome.discrepancy, outcome.short) == (0, -2, 3, 0)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(0)}
    assert await read(stock, discrepancies) == [
        ("more_than_on_hand", "adjustment", command.adjustment_id, None, "A", 3, None)
    ]
    assert await result_events(stock) == [
        adjusted_event(command, applied=-2, on_hand=0, reserved=0)
    ]


async def test_an_operators_adjustment_keeps_who_recorded_it_and_no_webhook(stock):
    await stock.put_stock({"A": 10})
    who = OperatorIdentity("jane", "recount of aisle 4", "jane", "ops-1")
    command = warehouse_adjustment("A", -1, AdjustmentReason.COUNTED, operator=who)

    outcome = await stock.apply(command)

    assert (outcome.kind, outcome.on_hand) == (AdjustmentKind.ADJUSTED, 9)
    assert await read(stock, adjustments) == {
        command.adjustment_id: (
            "A",
            -1,
            -1,
            "counted",
            None,
            "operator",
            9,
            0,
            "jane",
            "recount of aisle 4",
        )
    }
    assert await read(stock, webhook_inbox) == {}


async def test_adjustments_applied_at_once_each_apply_once_in_turn(stock):
    await stock.put_stock({"A": 10})
    commands = [warehouse_adjustment("A", delta) for delta in (3, -4, -20, 6, 2)]

    outcomes = await asyncio.gather(*(stock.apply(command) for command in commands))
    repeated = await asyncio.gather(*(stock.apply(command) for command in commands))

    assert 10 + sum(outcome.applied for outcome in outcomes) == 8
    assert sum(outcome.discrepancy for outcome in outcomes) == 11
    assert {outcome.kind for outcome in repeated} == {AdjustmentKind.DUPLICATE}
    assert await stock.levels_of(["A"]) == {"A": StockLevel(8)}
    assert len(await read(stock, adjustments)) == len(commands)


# The shortage rule


async def test_a_loss_below_reserved_makes_the_sku_short_and_no_order_reserves_it(stock):
    await reserved_order(stock, ("A", 6), ("B", 1))
    before = len(await result_events(stock))
    loss = warehouse_adjustment("A", -7, AdjustmentReason.DAMAGED)

    outcome = await stock.apply(loss)
    refused = await stock.apply(order(("A", 1)))
    other = await stock.apply(order(("B", 1)))

    assert (outcome.on_hand, outcome.reserved, outcome.short) == (3, 6, 3)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(3, 6)}
    assert (refused.kind, refused.reason, refused.skus) == (
        OutcomeKind.REJECTED,
        RejectionReason.INSUFFICIENT_STOCK,
        ("A",),
    )
    assert other.kind is OutcomeKind.RESERVED
    assert (await events_after(stock, before))[:2] == [
        shortage_event("A", on_hand=3, reserved=6),
        adjusted_event(loss, applied=-7, on_hand=3, reserved=6),
    ]
    assert (await read(stock, adjustments))[loss.adjustment_id][6:8] == (3, 6)
    assert await stock.levels_of(["B"]) == {"B": StockLevel(10, 2)}


async def test_each_change_of_a_shortfall_writes_stock_shortage_until_a_receipt_settles_it(
    stock,
):
    await reserved_order(stock, ("A", 6))
    await stock.apply(warehouse_adjustment("A", -7))
    before = len(await result_events(stock))

    await stock.apply(warehouse_adjustment("A", -1))
    await stock.apply(warehouse_adjustment("A", 1))
    await stock.apply(warehouse_adjustment("A", 5))
    await stock.apply(warehouse_adjustment("A", 1))

    shortages = [
        event
        for event in await events_after(stock, before)
        if event.routing_key == "stock.shortage"
    ]
    assert shortages == [
        shortage_event("A", on_hand=2, reserved=6),
        shortage_event("A", on_hand=3, reserved=6),
        shortage_event("A", on_hand=8, reserved=6),
    ]


async def test_the_warehouses_cancellation_of_the_short_lines_settles_the_shortage(stock):
    placed = await reserved_order(stock, ("A", 6))
    await stock.apply(warehouse_adjustment("A", -8))
    before = len(await result_events(stock))

    outcome = await stock.apply(warehouse_cancellation(placed.order_id, ("A", 4)))

    assert (outcome.kind, outcome.status) == (
        WarehouseCancellationKind.RELEASED,
        OrderStatus.RESERVED,
    )
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2, 2)}
    assert [event.routing_key for event in await events_after(stock, before)] == [
        "stock.shortage",
        "stock.released",
    ]
    assert (await events_after(stock, before))[0] == shortage_event("A", on_hand=2, reserved=2)


async def test_the_shops_cancel_of_an_order_holding_a_short_sku_shrinks_the_shortfall(stock):
    placed = await reserved_order(stock, ("A", 6))
    await stock.apply(warehouse_adjustment("A", -8))
    before = len(await result_events(stock))

    outcome = await stock.apply(cancellation(placed.order_id, ("A", 1)))

    assert outcome.kind is CancelKind.PARTIALLY_RELEASED
    assert await stock.levels_of(["A"]) == {"A": StockLevel(2, 5)}
    assert (await events_after(stock, before))[0] == shortage_event("A", on_hand=2, reserved=5)


async def test_a_shipment_from_a_short_sku_takes_on_hand_to_zero_never_below(stock):
    placed = await reserved_order(stock, ("A", 6), ("B", 1))
    await stock.apply(warehouse_adjustment("A", -8))
    before = len(await result_events(stock))

    outcome = await stock.apply(warehouse_shipment(placed.order_id, ("A", 4)))

    assert (outcome.kind, outcome.status) == (ShipmentKind.SHIPPED, OrderStatus.RESERVED)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(0, 2)}
    assert (await events_after(stock, before))[0] == shortage_event("A", on_hand=0, reserved=2)


async def test_the_upstream_shipment_of_an_order_holding_a_short_sku_settles_it(stock):
    placed = await reserved_order(stock, ("A", 6))
    await stock.apply(warehouse_adjustment("A", -8))
    before = len(await result_events(stock))

    outcome = await stock.apply(shipment(placed.order_id))

    assert (outcome.kind, outcome.status) == (ShipKind.SHIPPED, OrderStatus.SHIPPED)
    assert await stock.levels_of(["A"]) == {"A": StockLevel(0, 0)}
    assert (await events_after(stock, before))[0] == shortage_event("A", on_hand=0, reserved=0)


async def test_a_change_that_leaves_the_shortfall_as_it_was_writes_no_shortage(stock):
    placed = await reserved_order(stock, ("A", 6), ("B", 1))
    before = len(await result_events(stock))

    await stock.apply(warehouse_adjustment("A", -4))
    await stock.apply(warehouse_shipment(placed.order_id, ("A", 2)))

    assert [event.routing_key for event in await events_after(stock, before)] == [
        "stock.adjusted",
        "stock.shipped",
    ]


async def test_an_adjustment_of_nothing_is_refused(stock):
    with pytest.raises(ValueError, match="delta"):
        await stock.apply(warehouse_adjustment("A", 0))
