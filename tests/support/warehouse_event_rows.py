"""What the warehouse's shipments and cancellations recorded, as the tests compare it, from
PostgreSQL (migration 0014's tables) or the fake.

Each reader takes a ``FakeStock``, or an asyncpg connection or pool; every value is plain
(text, ints, UUIDs, tuples) so that the two compare equal when they recorded the same. Ids
minted by the store (``warehouse_discrepancies.id``) and times are left out.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from tests.support.fakes import FakeStock

Lines = tuple[tuple[str, int, int], ...]
"""Per SKU in code-point order: ``(sku, quantity, taken or released)``."""

ShipmentRow = tuple[UUID, str, str | None, str, str, str | None, tuple[str, ...], Lines]
"""``(order_id, fulfilment_order_id, webhook_id, source, outcome, carrier, tracking numbers,
lines)`` of one shipment."""

CancellationRow = tuple[UUID, str, str | None, str, str, str, bool, Lines]
"""``(order_id, fulfilment_order_id, webhook_id, source, outcome, reason, whole, lines)``."""

DiscrepancyRow = tuple[str, str, str, UUID | None, str | None, int | None, str | None]
"""``(kind, source, source_id, order_id, sku, quantity, order_status)``."""

Database = asyncpg.Connection | asyncpg.Pool


def _lines(rows: list[Any], key: str, column: str) -> dict[str, Lines]:
    grouped: dict[str, list[tuple[str, int, int]]] = {}
    for row in rows:
        grouped.setdefault(row[key], []).append((row["sku"], row["quantity"], row[column]))
    return {change: tuple(sorted(lines)) for change, lines in grouped.items()}


OrderRow = tuple[str, dict[str, tuple[int, int]]]
"""An order's status and, per SKU, ``(quantity, shipped)`` of its lines."""


async def order_lines(store: FakeStock | Database) -> dict[UUID, OrderRow]:
    """Per order: its status and, per SKU, ``(quantity, shipped)`` of its lines."""
    if isinstance(store, FakeStock):
        return {
            order_id: (
                str(row.status),
                {sku: (units, row.shipped.get(sku, 0)) for sku, units in row.lines.items()},
            )
            for order_id, row in store.reservations.items()
        }
    orders: dict[UUID, OrderRow] = {
        row["order_id"]: (row["status"], {})
        for row in await store.fetch("SELECT order_id, status FROM reservations")
    }
    for row in await store.fetch("SELECT order_id, sku, quantity, shipped FROM reservation_lines"):
        orders[row["order_id"]][1][row["sku"]] = (row["quantity"], row["shipped"])
    return orders


async def shipments(store: FakeStock | Database) -> dict[str, ShipmentRow]:
    """The recorded shipments by ``shipment_id``."""
    if isinstance(store, FakeStock):
        return {
            shipment_id: (
                s.order_id,
                s.fulfilment_order_id,
                s.webhook_id,
                str(s.source),
                str(s.outcome),
                s.carrier,
                s.tracking_numbers,
                tuple(sorted((sku, q, taken) for sku, (q, taken) in s.lines.items())),
            )
            for shipment_id, s in store.warehouse.shipments.items()
        }
    lines = _lines(
        await store.fetch("SELECT shipment_id, sku, quantity, taken FROM warehouse_shipment_lines"),
        "shipment_id",
        "taken",
    )
    return {
        row["shipment_id"]: (
            row["order_id"],
            row["fulfilment_order_id"],
            row["webhook_id"],
            row["source"],
            row["outcome"],
            row["carrier"],
            tuple(row["tracking_numbers"]),
            lines.get(row["shipment_id"], ()),
        )
        for row in await store.fetch(
            "SELECT shipment_id, order_id, fulfilment_order_id, webhook_id, source, outcome,"
            " carrier, tracking_numbers FROM warehouse_shipments"
        )
    }


async def cancellations(store: FakeStock | Database) -> dict[str, CancellationRow]:
    """The recorded cancellations of the warehouse by ``cancellation_id``."""
    if isinstance(store, FakeStock):
        return {
            cancellation_id: (
                c.order_id,
                c.fulfilment_order_id,
                c.webhook_id,
                str(c.source),
                str(c.outcome),
                c.reason,
                c.whole,
                tuple(sorted((sku, q, given) for sku, (q, given) in c.lines.items())),
            )
            for cancellation_id, c in store.warehouse.cancellations.items()
        }
    lines = _lines(
        await store.fetch(
            "SELECT cancellation_id, sku, quantity, released FROM warehouse_cancellation_lines"
        ),
        "cancellation_id",
        "released",
    )
    return {
        row["cancellation_id"]: (
            row["order_id"],
            row["fulfilment_order_id"],
            row["webhook_id"],
            row["source"],
            row["outcome"],
            row["reason"],
            row["whole"],
            lines.get(row["cancellation_id"], ()),
        )
        for row in await store.fetch(
            "SELECT cancellation_id, order_id, fulfilment_order_id, webhook_id, source, outcome,"
            " reason, whole FROM warehouse_cancellations"
        )
    }


async def discrepancies(store: FakeStock | Database) -> list[DiscrepancyRow]:
    """The kept discrepancies, sorted (the order they were written in is not compared)."""
    if isinstance(store, FakeStock):
        rows = [
            (
                str(d.discrepancy.kind),
                d.source,
                d.source_id,
                d.order_id,
                d.discrepancy.sku,
                d.discrepancy.quantity,
                None if d.discrepancy.order_status is None else str(d.discrepancy.order_status),
            )
            for d in store.warehouse.discrepancies
        ]
    else:
        rows = [
            tuple(row)
            for row in await store.fetch(
                "SELECT kind, source, source_id, order_id, sku, quantity, order_status"
                " FROM warehouse_discrepancies"
            )
        ]
    return sorted(rows, key=repr)


async def webhook_inbox(store: FakeStock | Database) -> dict[str, tuple[str, str]]:
    """The recorded webhook ids: ``(type, outcome)`` by webhook id."""
    if isinstance(store, FakeStock):
        return {webhook_id: row for (_, webhook_id), row in store.warehouse.webhook_inbox.items()}
    return {
        row["webhook_id"]: (row["type"], row["outcome"])
        for row in await store.fetch("SELECT webhook_id, type, outcome FROM webhook_inbox")
    }


AdjustmentRow = tuple[str, int, int, str, str | None, str, int, int, str | None, str | None]
"""``(sku, delta, applied, reason, webhook_id, source, on_hand_after, reserved_after,
operator, comment)`` of one adjustment."""


async def adjustments(store: FakeStock | Database) -> dict[str, AdjustmentRow]:
    """The recorded adjustments by ``adjustment_id``."""
    if isinstance(store, FakeStock):
        return {
            adjustment_id: (
                a.sku,
                a.delta,
                a.applied,
                str(a.reason),
                a.webhook_id,
                str(a.source),
                a.on_hand_after,
                a.reserved_after,
                None if a.operator is None else a.operator.operator,
                None if a.operator is None else a.operator.comment,
            )
            for adjustment_id, a in store.warehouse.adjustments.items()
        }
    return {
        row["adjustment_id"]: tuple(row)[1:]  # type: ignore[misc]
        for row in await store.fetch(
            "SELECT adjustment_id, sku, delta, applied, reason, webhook_id, source,"
            " on_hand_after, reserved_after, operator, comment FROM warehouse_adjustments"
        )
    }
