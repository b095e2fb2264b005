"""The warehouse's shipments and cancellations on PostgreSQL, through ``PostgresStock.apply``.

``record_shipments()`` and ``record_warehouse_cancellations()`` (migration 0015) against the
rule of product.md, "Hearing back from the warehouse": what each does to the order, the stock,
the kept rows (shipments, cancellations, their lines, discrepancies, the webhook inbox) and the
result events, applied once per webhook id and once per shipment or cancellation id; and the
upstream ``OrderShipped`` and the shop's ``OrderCancelled`` on an order shipped in part.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.stock import PostgresStock, apply_statement
from fulfilment.contracts.result_events import (
    STOCK_RELEASED_ROUTING_KEY,
    STOCK_SHIPPED_ROUTING_KEY,
    StockReleasedV1,
    StockShippedV1,
    parse_result_event,
)
from fulfilment.domain.lifecycle import CancelKind, OrderStatus, ShipKind
from fulfilment.domain.model import OrderLine, StockLevel
from fulfilment.domain.warehouse_events import (
    DuplicateBy,
    RecordShipment,
    RecordWarehouseCancellation,
    ShipmentKind,
    Source,
    WarehouseCancellationKind,
    warehouse_event_id,
)
from fulfilment.entrypoints.startup import database_options
from fulfilment.routes.warehouse import WEBHOOK_ROUTES
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import cancellation, order, shipment

pytestmark = pytest.mark.postgres

SHIPPED_AT = datetime(2026, 12, 6, 9, 58, tzinfo=UTC)
CANCELLED_AT = datetime(2026, 12, 6, 10, 5, tzinfo=UTC)


def shipped(
    order_id: UUID,
    *lines: tuple[str, int],
    shipment_id: str | None = None,
    webhook_id: str | None = "",
    tracking_numbers: tuple[str, ...] = ("JD014600003828392019",),
) -> RecordShipment:
    """A shipment of ``order_id``'s ``(sku, quantity)`` lines, by webhook (a new webhook id
    unless given; None: found by the poll)."""
    shipment_id = shipment_id or f"SHP-{uuid4()}"
    if webhook_id == "":
        webhook_id = f"msg_{uuid4().hex}"
    return RecordShipment(
        event_id=warehouse_event_id("shipment", shipment_id),
        shipment_id=shipment_id,
        webhook_id=webhook_id,
        fulfilment_order_id=f"FO-{order_id}",
        order_id=order_id,
        shipped_at=SHIPPED_AT,
        carrier="DHL",
        tracking_numbers=tracking_numbers,
        tracking_url="https://track.example/JD014600003828392019",
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
        source=Source.WEBHOOK if webhook_id is not None else Source.POLL,
    )


def cancelled_by_warehouse(
    order_id: UUID,
    *lines: tuple[str, int],
    cancellation_id: str | None = None,
    webhook_id: str | None = "",
) -> RecordWarehouseCancellation:
    """A cancellation by the warehouse of ``order_id``'s lines (whole without any)."""
    cancellation_id = cancellation_id or f"CXL-{uuid4()}"
    if webhook_id == "":
        webhook_id = f"msg_{uuid4().hex}"
    return RecordWarehouseCancellation(
        event_id=warehouse_event_id("cancellation", cancellation_id),
        cancellation_id=cancellation_id,
        webhook_id=webhook_id,
        fulfilment_order_id=f"FO-{order_id}",
        order_id=order_id,
        cancelled_at=CANCELLED_AT,
        reason="unfulfillable",
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines) if lines else None,
        source=Source.WEBHOOK if webhook_id is not None else Source.POLL,
    )


async def _rows(engine: AsyncEngine, query: str, **parameters: Any) -> list[Any]:
    async with engine.connect() as connection:
        return list((await connection.execute(sa.text(query), parameters)).all())


async def _order(engine: AsyncEngine, order_id: UUID) -> tuple[str, dict[str, tuple[int, int]]]:
    """The order's status and its lines, ``{sku: (quantity, shipped)}``."""
    [(status,)] = await _rows(
        engine, "SELECT status FROM reservations WHERE order_id = :o", o=order_id
    )
    lines = await _rows(
        engine,
        "SELECT sku, quantity, shipped FROM reservation_lines WHERE order_id = :o",
        o=order_id,
    )
    return status, {sku: (quantity, units) for sku, quantity, units in lines}


async def _events(engine: AsyncEngine, order_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    """The order's result events, in publishing order, each validated by its model."""
    rows = await _rows(
        engine, "SELECT routing_key, body FROM outbox WHERE order_id = :o ORDER BY id", o=order_id
    )
    for routing_key, body in rows:
        parse_result_event(routing_key, json.dumps(body))
    return [(routing_key, body) for routing_key, body in rows]


async def _discrepancies(engine: AsyncEngine, source_id: str) -> list[tuple[Any, ...]]:
    rows = await _rows(
        engine,
        "SELECT kind, sku, quantity, order_status FROM warehouse_discrepancies"
        " WHERE source_id = :s ORDER BY id",
        s=source_id,
    )
    return [tuple(row) for row in rows]


async def _inbox(engine: AsyncEngine) -> dict[str, tuple[str, str]]:
    rows = await _rows(engine, "SELECT webhook_id, type, outcome FROM webhook_inbox")
    return {webhook_id: (type_, outcome) for webhook_id, type_, outcome in rows}


async def _reserved(stock: PostgresStock, *lines: tuple[str, int]) -> UUID:
    placed = order(*lines)
    outcome = await stock.apply(placed)
    assert outcome.reason is None
    return placed.order_id


@pytest.fixture
async def loaded(stock: PostgresStock) -> PostgresStock:
    await stock.put_stock({"85123A": 10, "71053": 10, "22423": 10})
    return stock


# --- shipments ---------------------------------------------------------------------------------


async def test_a_shipment_of_the_whole_order_ships_it_with_its_tracking(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))
    command = shipped(order_id, ("85123A", 4), ("71053", 2))

    outcome = await loaded.apply(command)

    assert outcome.kind is ShipmentKind.SHIPPED
    assert outcome.status is OrderStatus.SHIPPED
    assert outcome.lines == (OrderLine("71053", 2), OrderLine("85123A", 4))
    assert outcome.unmatched == ()
    assert await _order(engine, order_id) == ("shipped", {"85123A": (4, 4), "71053": (2, 2)})
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(6, 0),
        "71053": StockLevel(8, 0),
    }
    [(routing_key, body)] = (await _events(engine, order_id))[1:]
    assert routing_key == STOCK_SHIPPED_ROUTING_KEY
    assert body["causation_id"] == str(command.event_id)
    assert body["lines"] == [{"sku": "71053", "quantity": 2}, {"sku": "85123A", "quantity": 4}]
    assert body["shipment_id"] == command.shipment_id
    assert body["carrier"] == "DHL"
    assert body["tracking_numbers"] == ["JD014600003828392019"]
    assert body["tracking_url"] == command.tracking_url
    assert body["order_status"] == "shipped"
    [kept] = await _rows(
        engine,
        "SELECT webhook_id, source, carrier, tracking_numbers, outcome, order_status"
        " FROM warehouse_shipments WHERE shipment_id = :s",
        s=command.shipment_id,
    )
    assert tuple(kept) == (
        command.webhook_id,
        "webhook",
        "DHL",
        ["JD014600003828392019"],
        "shipped",
        "shipped",
    )
    assert await _inbox(engine) == {command.webhook_id: ("shipment.shipped", "shipped")}


async def test_a_partial_shipment_leaves_the_order_reserved_holding_the_rest(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))

    first = await loaded.apply(shipped(order_id, ("85123A", 3)))
    after_first = await _order(engine, order_id)
    last = await loaded.apply(shipped(order_id, ("85123A", 1), ("71053", 2)))

    assert (first.kind, first.status, first.lines) == (
        ShipmentKind.SHIPPED,
        OrderStatus.RESERVED,
        (OrderLine("85123A", 3),),
    )
    assert after_first == ("reserved", {"85123A": (4, 3), "71053": (2, 0)})
    assert (last.kind, last.status) == (ShipmentKind.SHIPPED, OrderStatus.SHIPPED)
    assert await _order(engine, order_id) == ("shipped", {"85123A": (4, 4), "71053": (2, 2)})
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(6, 0),
        "71053": StockLevel(8, 0),
    }
    statuses = [body["order_status"] for _, body in (await _events(engine, order_id))[1:]]
    assert statuses == ["reserved", "shipped"]


async def test_a_shipment_of_more_than_held_takes_what_is_held_and_keeps_the_rest(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    command = shipped(order_id, ("85123A", 6), ("22423", 1))

    outcome = await loaded.apply(command)

    assert outcome.kind is ShipmentKind.SHIPPED
    assert outcome.lines == (OrderLine("85123A", 4),)
    assert outcome.unmatched == (OrderLine("22423", 1), OrderLine("85123A", 2))
    assert outcome.status is OrderStatus.SHIPPED
    assert await _discrepancies(engine, command.shipment_id) == [
        ("sku_not_held", "22423", 1, "reserved"),
        ("more_than_held", "85123A", 2, "reserved"),
    ]
    assert await loaded.levels_of(["85123A", "22423"]) == {
        "85123A": StockLevel(6, 0),
        "22423": StockLevel(10, 0),
    }
    lines = await _rows(
        engine,
        "SELECT sku, quantity, taken FROM warehouse_shipment_lines WHERE shipment_id = :s"
        " ORDER BY sku",
        s=command.shipment_id,
    )
    assert [tuple(line) for line in lines] == [("22423", 1, 0), ("85123A", 6, 4)]


async def test_a_shipment_of_an_unknown_order_changes_nothing_and_is_kept(loaded, engine):
    order_id = uuid4()
    command = shipped(order_id, ("85123A", 2))

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (ShipmentKind.DISCREPANCY, None)
    assert outcome.unmatched == (OrderLine("85123A", 2),)
    assert await _discrepancies(engine, command.shipment_id) == [
        ("unknown_order", "85123A", 2, None)
    ]
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(10, 0)}
    assert await _events(engine, order_id) == []


@pytest.mark.parametrize("status", ["rejected", "released"])
async def test_a_shipment_of_an_order_not_reserved_is_a_discrepancy(loaded, engine, status):
    if status == "rejected":
        placed = order(("85123A", 99))
        await loaded.apply(placed)
        order_id = placed.order_id
    else:
        order_id = await _reserved(loaded, ("85123A", 2))
        await loaded.apply(cancellation(order_id))
    command = shipped(order_id, ("85123A", 2))

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (ShipmentKind.DISCREPANCY, OrderStatus(status))
    assert await _discrepancies(engine, command.shipment_id) == [
        ("order_not_reserved", "85123A", 2, status)
    ]
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(10, 0)}


async def test_a_shipment_of_an_order_the_upstream_event_shipped_is_already_shipped(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 2))
    assert (await loaded.apply(shipment(order_id))).kind is ShipKind.SHIPPED
    command = shipped(order_id, ("85123A", 2))

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (ShipmentKind.ALREADY_SHIPPED, OrderStatus.SHIPPED)
    assert await _discrepancies(engine, command.shipment_id) == []
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(8, 0)}
    assert await _inbox(engine) == {command.webhook_id: ("shipment.shipped", "already_shipped")}


async def test_the_upstream_shipment_ships_only_what_the_warehouse_left(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))
    await loaded.apply(shipped(order_id, ("85123A", 3)))

    outcome = await loaded.apply(shipment(order_id))

    assert outcome.kind is ShipKind.SHIPPED
    assert outcome.lines == (OrderLine("71053", 2), OrderLine("85123A", 1))
    assert await _order(engine, order_id) == ("shipped", {"85123A": (4, 4), "71053": (2, 2)})
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(6, 0),
        "71053": StockLevel(8, 0),
    }
    _, body = (await _events(engine, order_id))[-1]
    assert body["lines"] == [{"sku": "71053", "quantity": 2}, {"sku": "85123A", "quantity": 1}]
    assert (body["shipment_id"], body["tracking_numbers"], body["order_status"]) == (
        None,
        [],
        "shipped",
    )


async def test_the_same_webhook_again_is_a_duplicate_and_changes_nothing(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    command = shipped(order_id, ("85123A", 2))
    await loaded.apply(command)

    again = await loaded.apply(command)

    assert (again.kind, again.duplicate_by, again.label) == (
        ShipmentKind.DUPLICATE,
        DuplicateBy.WEBHOOK,
        "duplicate:webhook",
    )
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(8, 2)}
    assert len(await _events(engine, order_id)) == 2
    assert await _inbox(engine) == {command.webhook_id: ("shipment.shipped", "shipped")}


async def test_the_same_shipment_under_a_new_webhook_id_is_a_duplicate_recorded(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    first = shipped(order_id, ("85123A", 2))
    await loaded.apply(first)
    resent = shipped(order_id, ("85123A", 2), shipment_id=first.shipment_id)

    again = await loaded.apply(resent)

    assert (again.kind, again.duplicate_by) == (ShipmentKind.DUPLICATE, DuplicateBy.CHANGE)
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(8, 2)}
    assert await _inbox(engine) == {
        first.webhook_id: ("shipment.shipped", "shipped"),
        resent.webhook_id: ("shipment.shipped", "duplicate"),
    }


async def test_a_polled_shipment_records_no_webhook_and_a_later_webhook_of_it_is_a_duplicate(
    loaded, engine
):
    order_id = await _reserved(loaded, ("85123A", 4))
    polled = shipped(order_id, ("85123A", 4), webhook_id=None)

    outcome = await loaded.apply(polled)
    late = await loaded.apply(shipped(order_id, ("85123A", 4), shipment_id=polled.shipment_id))

    assert (outcome.kind, outcome.status) == (ShipmentKind.SHIPPED, OrderStatus.SHIPPED)
    assert (late.kind, late.duplicate_by) == (ShipmentKind.DUPLICATE, DuplicateBy.CHANGE)
    [(webhook_id, source)] = await _rows(
        engine,
        "SELECT webhook_id, source FROM warehouse_shipments WHERE shipment_id = :s",
        s=polled.shipment_id,
    )
    assert (webhook_id, source) == (None, "poll")
    assert [outcome for _, outcome in (await _inbox(engine)).values()] == ["duplicate"]


async def test_one_call_with_a_shipment_twice_and_its_resend_applies_it_once(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    command = shipped(order_id, ("85123A", 2))
    resent = shipped(order_id, ("85123A", 2), shipment_id=command.shipment_id)
    statement, arguments = apply_statement("fulfilment", [command, command, resent])

    async with engine.begin() as connection:
        rows = (await connection.execute(statement, arguments)).all()

    assert [(row.outcome, row.duplicate_by) for row in rows] == [
        ("shipped", None),
        ("duplicate", "webhook"),
        ("duplicate", "change"),
    ]
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(8, 2)}
    assert await _inbox(engine) == {
        command.webhook_id: ("shipment.shipped", "shipped"),
        resent.webhook_id: ("shipment.shipped", "duplicate"),
    }


async def test_the_webhook_routes_apply_the_data_of_a_webhook(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    data = json.dumps(
        {
            "shipment_id": "SHP-81723",
            "fulfilment_order_id": "FO-1",
            "reference": str(order_id),
            "shipped_at": "2026-12-06T09:58:00Z",
            "carrier": "DHL",
            "tracking_numbers": ["JD014600003828392019"],
            "lines": [{"sku": "85123A", "quantity": 4}],
        }
    ).encode()
    cancelled = json.dumps(
        {
            "cancellation_id": "CXL-1120",
            "fulfilment_order_id": "FO-1",
            "reference": str(order_id),
            "cancelled_at": "2026-12-06T10:00:00Z",
            "reason": "unfulfillable",
        }
    ).encode()

    handled = await WEBHOOK_ROUTES["shipment.shipped"].handler(
        data, stock=loaded, webhook_id="msg_1", source=Source.WEBHOOK
    )
    found = await WEBHOOK_ROUTES["shipment.shipped"].handler(
        data, stock=loaded, webhook_id=None, source=Source.POLL
    )
    late = await WEBHOOK_ROUTES["fulfilment_order.cancelled"].handler(
        cancelled, stock=loaded, webhook_id="msg_2", source=Source.WEBHOOK
    )

    assert (handled.outcome, handled.labels) == ("shipped", ("shipped", ""))
    assert handled.event_id == warehouse_event_id("shipment", "SHP-81723")
    assert handled.order_id == order_id
    assert (found.outcome, found.labels) == ("duplicate:change", ("duplicate", "change"))
    assert (late.outcome, late.log_fields["status"]) == ("ignored", OrderStatus.SHIPPED)
    assert await _inbox(engine) == {
        "msg_1": ("shipment.shipped", "shipped"),
        "msg_2": ("fulfilment_order.cancelled", "ignored"),
    }


# --- the warehouse's cancellations ---------------------------------------------------------------


async def test_a_cancellation_of_lines_releases_what_the_order_holds_of_them(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))
    command = cancelled_by_warehouse(order_id, ("85123A", 3), ("22423", 1))

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (
        WarehouseCancellationKind.RELEASED,
        OrderStatus.RESERVED,
    )
    assert outcome.lines == (OrderLine("85123A", 3),)
    assert await _order(engine, order_id) == ("reserved", {"85123A": (1, 0), "71053": (2, 0)})
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(10, 1)}
    routing_key, body = (await _events(engine, order_id))[-1]
    assert routing_key == STOCK_RELEASED_ROUTING_KEY
    assert (body["reason"], body["warehouse_reason"], body["order_status"]) == (
        "warehouse_cancelled",
        "unfulfillable",
        "reserved",
    )
    assert body["causation_id"] == str(command.event_id)
    lines = await _rows(
        engine,
        "SELECT sku, quantity, released FROM warehouse_cancellation_lines"
        " WHERE cancellation_id = :c ORDER BY sku",
        c=command.cancellation_id,
    )
    assert [tuple(line) for line in lines] == [("22423", 1, 0), ("85123A", 3, 3)]
    assert await _discrepancies(engine, command.cancellation_id) == []


async def test_a_whole_cancellation_releases_the_order_and_keeps_what_it_released(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))
    command = cancelled_by_warehouse(order_id)

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (
        WarehouseCancellationKind.RELEASED,
        OrderStatus.RELEASED,
    )
    assert await _order(engine, order_id) == ("released", {})
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(10, 0),
        "71053": StockLevel(10, 0),
    }
    lines = await _rows(
        engine,
        "SELECT sku, quantity, released FROM warehouse_cancellation_lines"
        " WHERE cancellation_id = :c ORDER BY sku",
        c=command.cancellation_id,
    )
    assert [tuple(line) for line in lines] == [("71053", 2, 2), ("85123A", 4, 4)]
    [(whole, kept_status)] = await _rows(
        engine,
        "SELECT whole, order_status FROM warehouse_cancellations WHERE cancellation_id = :c",
        c=command.cancellation_id,
    )
    assert (whole, kept_status) == (True, "released")


async def test_a_whole_cancellation_after_a_partial_shipment_leaves_the_order_shipped(
    loaded, engine
):
    order_id = await _reserved(loaded, ("85123A", 4), ("71053", 2))
    await loaded.apply(shipped(order_id, ("85123A", 3)))

    outcome = await loaded.apply(cancelled_by_warehouse(order_id))

    assert (outcome.kind, outcome.status) == (
        WarehouseCancellationKind.RELEASED,
        OrderStatus.SHIPPED,
    )
    assert outcome.lines == (OrderLine("71053", 2), OrderLine("85123A", 1))
    assert await _order(engine, order_id) == ("shipped", {"85123A": (3, 3)})
    [(shipped_at,)] = await _rows(
        engine, "SELECT shipped_at FROM reservations WHERE order_id = :o", o=order_id
    )
    assert shipped_at == SHIPPED_AT
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(7, 0),
        "71053": StockLevel(10, 0),
    }
    _, body = (await _events(engine, order_id))[-1]
    assert body["order_status"] == "shipped"
    report = await outcome_report(engine)
    assert report.invariants.ok, report.invariants


async def test_a_cancellation_of_an_unknown_order_is_a_discrepancy(loaded, engine):
    command = cancelled_by_warehouse(uuid4())

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (WarehouseCancellationKind.DISCREPANCY, None)
    assert await _discrepancies(engine, command.cancellation_id) == [
        ("unknown_order", None, None, None)
    ]


async def test_a_cancellation_of_a_shipped_order_is_ignored(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 2))
    await loaded.apply(shipped(order_id, ("85123A", 2)))
    command = cancelled_by_warehouse(order_id, ("85123A", 2))

    outcome = await loaded.apply(command)

    assert (outcome.kind, outcome.status) == (
        WarehouseCancellationKind.IGNORED,
        OrderStatus.SHIPPED,
    )
    assert await _discrepancies(engine, command.cancellation_id) == []


async def test_a_cancellation_twice_by_webhook_and_by_id_is_applied_once(loaded):
    order_id = await _reserved(loaded, ("85123A", 4))
    command = cancelled_by_warehouse(order_id, ("85123A", 1))
    await loaded.apply(command)

    by_webhook = await loaded.apply(command)
    by_change = await loaded.apply(
        cancelled_by_warehouse(order_id, ("85123A", 1), cancellation_id=command.cancellation_id)
    )

    assert [by_webhook.label, by_change.label] == ["duplicate:webhook", "duplicate:change"]
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(10, 3)}


async def test_the_shops_cancel_after_a_partial_shipment_releases_only_what_is_held(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    await loaded.apply(shipped(order_id, ("85123A", 3)))

    outcome = await loaded.apply(cancellation(order_id))

    assert (outcome.kind, outcome.status) == (CancelKind.RELEASED, OrderStatus.SHIPPED)
    assert outcome.lines == (OrderLine("85123A", 1),)
    assert await _order(engine, order_id) == ("shipped", {"85123A": (3, 3)})
    assert await loaded.levels_of(["85123A"]) == {"85123A": StockLevel(7, 0)}
    _, body = (await _events(engine, order_id))[-1]
    assert (body["reason"], body["warehouse_reason"], body["order_status"]) == (
        "cancelled",
        None,
        "shipped",
    )


# --- with the hand-off: the fulfilment order's news, the shop's unsent cancellation -------------


@pytest.fixture
async def handoff(engine: AsyncEngine) -> PostgresStock:
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    await stock.put_stock({"85123A": 10})
    return stock


async def _accept_fulfilment_order(engine: AsyncEngine, order_id: UUID) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            sa.text(
                "UPDATE warehouse_requests SET status = 'accepted', answered_at = now()"
                " WHERE order_id = :o AND kind = 'fulfilment_order'"
            ),
            {"o": order_id},
        )


async def _requests(engine: AsyncEngine, order_id: UUID) -> list[tuple[Any, ...]]:
    rows = await _rows(
        engine,
        "SELECT kind, status, news_at IS NOT NULL FROM warehouse_requests"
        " WHERE order_id = :o ORDER BY id",
        o=order_id,
    )
    return [tuple(row) for row in rows]


async def test_a_shipment_sets_news_at_on_its_fulfilment_order(handoff, engine):
    order_id = await _reserved(handoff, ("85123A", 4))
    await _accept_fulfilment_order(engine, order_id)

    await handoff.apply(shipped(order_id, ("85123A", 1)))

    assert await _requests(engine, order_id) == [("fulfilment_order", "accepted", True)]


async def test_an_unsent_cancellation_of_the_shop_is_withdrawn_once_nothing_is_left_to_cancel(
    handoff, engine
):
    order_id = await _reserved(handoff, ("85123A", 4))
    await _accept_fulfilment_order(engine, order_id)
    assert (await handoff.apply(cancellation(order_id))).kind is CancelKind.CANCEL_REQUESTED

    await handoff.apply(shipped(order_id, ("85123A", 4)))

    assert await _requests(engine, order_id) == [
        ("fulfilment_order", "accepted", True),
        ("cancellation", "withdrawn", False),
    ]


# --- concurrency ---------------------------------------------------------------------------------


@pytest.fixture
async def second_stock(clean_database: str) -> Any:
    """Another ``PostgresStock`` on its own engine: another replica of the intake."""
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=5.0)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("same_webhook", [True, False], ids=["same-webhook", "new-webhook"])
async def test_the_same_shipment_on_two_replicas_at_once_is_applied_once(
    loaded, second_stock, engine, same_webhook
):
    order_ids = [await _reserved(loaded, ("85123A", 1), ("71053", 1)) for _ in range(5)]
    for order_id in order_ids:
        first = shipped(order_id, ("85123A", 1), ("71053", 1))
        other = (
            first
            if same_webhook
            else shipped(order_id, ("85123A", 1), ("71053", 1), shipment_id=first.shipment_id)
        )

        outcomes = await asyncio.gather(loaded.apply(first), second_stock.apply(other))

        expected_by = DuplicateBy.WEBHOOK if same_webhook else DuplicateBy.CHANGE
        assert sorted(o.label for o in outcomes) == ["duplicate:" + expected_by, "shipped"]
    assert await loaded.levels_of(["85123A", "71053"]) == {
        "85123A": StockLevel(5, 0),
        "71053": StockLevel(5, 0),
    }
    [(events,)] = await _rows(
        engine, "SELECT count(*) FROM outbox WHERE routing_key = 'stock.shipped'"
    )
    assert events == len(order_ids)


async def test_result_event_models_read_the_new_fields(loaded, engine):
    order_id = await _reserved(loaded, ("85123A", 4))
    await loaded.apply(shipped(order_id, ("85123A", 4), tracking_numbers=("A1", "B2")))
    await loaded.apply(cancelled_by_warehouse(order_id))
    placed = await _reserved(loaded, ("71053", 2))
    await loaded.apply(cancelled_by_warehouse(placed, ("71053", 1)))

    rows = await _rows(engine, "SELECT routing_key, body FROM outbox ORDER BY id")
    events = [parse_result_event(key, json.dumps(body)) for key, body in rows]

    [shipped_event] = [e for e in events if isinstance(e, StockShippedV1)]
    assert shipped_event.tracking_numbers == ["A1", "B2"]
    assert shipped_event.order_status == "shipped"
    [released] = [e for e in events if isinstance(e, StockReleasedV1)]
    assert (released.reason, released.warehouse_reason) == ("warehouse_cancelled", "unfulfillable")
