"""What the service recorded of the warehouse's news, read back per order, and the stock per SKU.

The demo checks these rows against what its warehouse simulator says it made (``fulfilment.demo
.warehouse_news``): each shipment and cancellation of the warehouse is one row of
``warehouse_shipments`` / ``warehouse_cancellations`` (migration 0014) with its lines, the
order's lines say what it shipped (``reservation_lines.shipped``), and the stock levels what is
left. Read-only; each function is one query on its own connection.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Integer, bindparam, column, func, select, true
from sqlalchemy.dialects import postgresql

from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.tables.stock import (
    outbox,
    reservation_lines,
    reservations,
    stock_levels,
)
from fulfilment.adapters.postgres.tables.warehouse import (
    warehouse_cancellation_lines,
    warehouse_cancellations,
    warehouse_shipment_lines,
    warehouse_shipments,
)
from fulfilment.domain.lifecycle import OrderStatus


@dataclass(frozen=True, slots=True)
class RecordedShipment:
    """One ``warehouse_shipments`` row with its lines.

    Attributes:
        shipment_id: the warehouse's id of the shipment.
        order_id: the order it named (its ``reference``).
        source: ``webhook`` or ``poll``: what brought it first.
        outcome: ``shipped``, ``already_shipped`` or ``discrepancy``.
        tracking_numbers: as the warehouse sent them.
        lines: per SKU, ``(quantity sent, units taken from the order)``.
    """

    shipment_id: str
    order_id: UUID
    source: str
    outcome: str
    tracking_numbers: tuple[str, ...]
    lines: dict[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class RecordedCancellation:
    """One ``warehouse_cancellations`` row with its lines.

    Attributes:
        cancellation_id: the warehouse's id of the cancellation.
        order_id: the order it named.
        source: ``webhook`` or ``poll``.
        outcome: ``released``, ``ignored`` or ``discrepancy``.
        whole: it named no lines (everything the order still held).
        lines: per SKU, ``(quantity named, units released)``; for a whole cancellation, what it
            released.
    """

    cancellation_id: str
    order_id: UUID
    source: str
    outcome: str
    whole: bool
    lines: dict[str, tuple[int, int]]


async def recorded_shipments(
    stock: PostgresStock, order_ids: Collection[UUID]
) -> list[RecordedShipment]:
    """The warehouse's shipments recorded for any of ``order_ids``, by ``shipment_id``."""
    if not order_ids:
        return []
    query = (
        select(
            warehouse_shipments.c.shipment_id,
            warehouse_shipments.c.order_id,
            warehouse_shipments.c.source,
            warehouse_shipments.c.outcome,
            warehouse_shipments.c.tracking_numbers,
            warehouse_shipment_lines.c.sku,
            warehouse_shipment_lines.c.quantity,
            warehouse_shipment_lines.c.taken,
        )
        .select_from(
            warehouse_shipments.outerjoin(
                warehouse_shipment_lines,
                warehouse_shipment_lines.c.shipment_id == warehouse_shipments.c.shipment_id,
            )
        )
        .where(warehouse_shipments.c.order_id.in_(bindparam("ids", expanding=True)))
        .order_by(warehouse_shipments.c.shipment_id)
    )
    async with stock.engine.connect() as connection:
        rows = (await connection.execute(query, {"ids": list(order_ids)})).all()
    found: dict[str, RecordedShipment] = {}
    for row in rows:
        shipment = found.setdefault(
            row.shipment_id,
            RecordedShipment(
                row.shipment_id,
                row.order_id,
                row.source,
                row.outcome,
                tuple(row.tracking_numbers),
                {},
            ),
        )
        if row.sku is not None:
            shipment.lines[row.sku] = (row.quantity, row.taken)
    return list(found.values())


async def recorded_cancellations(
    stock: PostgresStock, order_ids: Collection[UUID]
) -> list[RecordedCancellation]:
    """The warehouse's cancellations recorded for any of ``order_ids``, by their id."""
    if not order_ids:
        return []
    query = (
        select(
            warehouse_cancellations.c.cancellation_id,
            warehouse_cancellations.c.order_id,
            warehouse_cancellations.c.source,
            warehouse_cancellations.c.outcome,
            warehouse_cancellations.c.whole,
            warehouse_cancellation_lines.c.sku,
            warehouse_cancellation_lines.c.quantity,
            warehouse_cancellation_lines.c.released,
        )
        .select_from(
            warehouse_cancellations.outerjoin(
                warehouse_cancellation_lines,
                warehouse_cancellation_lines.c.cancellation_id
                == warehouse_cancellations.c.cancellation_id,
            )
        )
        .where(warehouse_cancellations.c.order_id.in_(bindparam("ids", expanding=True)))
        .order_by(warehouse_cancellations.c.cancellation_id)
    )
    async with stock.engine.connect() as connection:
        rows = (await connection.execute(query, {"ids": list(order_ids)})).all()
    found: dict[str, RecordedCancellation] = {}
    for row in rows:
        cancellation = found.setdefault(
            row.cancellation_id,
            RecordedCancellation(
                row.cancellation_id, row.order_id, row.source, row.outcome, row.whole, {}
            ),
        )
        if row.sku is not None:
            cancellation.lines[row.sku] = (row.quantity, row.released)
    return list(found.values())


async def order_lines(
    stock: PostgresStock, order_ids: Collection[UUID]
) -> dict[UUID, dict[str, tuple[int, int]]]:
    """Per order of ``order_ids`` that has lines, per SKU: ``(quantity, shipped)``.

    ``quantity - shipped`` is what the line still holds (migration 0014).
    """
    if not order_ids:
        return {}
    query = select(
        reservation_lines.c.order_id,
        reservation_lines.c.sku,
        reservation_lines.c.quantity,
        reservation_lines.c.shipped,
    ).where(reservation_lines.c.order_id.in_(bindparam("ids", expanding=True)))
    lines: dict[UUID, dict[str, tuple[int, int]]] = defaultdict(dict)
    async with stock.engine.connect() as connection:
        for row in await connection.execute(query, {"ids": list(order_ids)}):
            lines[row.order_id][row.sku] = (row.quantity, row.shipped)
    return dict(lines)


@dataclass(frozen=True, slots=True)
class SkuStock:
    """One SKU's ``stock_levels`` row beside the units its reserved orders' lines hold."""

    on_hand: int
    reserved: int
    held: int
    """Units the lines of ``reserved`` orders hold of it (``quantity - shipped``)."""


async def stock_by_sku(stock: PostgresStock) -> dict[str, SkuStock]:
    """Every SKU's ``on_hand`` and ``reserved``, and the units held by lines, in one snapshot.

    One statement, so the levels and the lines are of the same instant: ``reserved`` equals
    ``held`` wherever the stock is right (product contract, "Hearing back from the
    warehouse": reserved units equal the held lines).
    """
    held = (
        select(
            reservation_lines.c.sku,
            func.sum(reservation_lines.c.quantity - reservation_lines.c.shipped).label("held"),
        )
        .select_from(
            reservation_lines.join(
                reservations, reservations.c.order_id == reservation_lines.c.order_id
            )
        )
        .where(reservations.c.status == OrderStatus.RESERVED.value)
        .group_by(reservation_lines.c.sku)
        .subquery()
    )
    query = select(
        stock_levels.c.sku,
        stock_levels.c.on_hand,
        stock_levels.c.reserved,
        func.coalesce(held.c.held, 0).label("held"),
    ).select_from(stock_levels.outerjoin(held, held.c.sku == stock_levels.c.sku))
    async with stock.engine.connect() as connection:
        return {
            row.sku: SkuStock(int(row.on_hand), int(row.reserved), int(row.held))
            for row in await connection.execute(query)
        }


async def outbox_units_after(stock: PostgresStock, after_id: int) -> dict[tuple[str, str], int]:
    """Units of the result events above ``after_id``, by ``(routing key, reason)``.

    Summed over the events' ``lines`` (``stock.reserved``, ``stock.released``,
    ``stock.shipped``; a ``stock.cancel_refused`` of a whole order has none); ``reason`` is
    the event's ``reason`` (``stock.released``: ``cancelled`` or ``warehouse_cancelled``),
    ``""`` when it has none. Read from the rows written, not from the stock levels, so that
    what the warehouse does meanwhile is told apart from what the shop's events did.
    """
    line = (
        func.jsonb_array_elements(outbox.c.body["lines"])
        .table_valued(column("value", postgresql.JSONB))
        .alias("line")
    )
    query = (
        select(
            outbox.c.routing_key,
            func.coalesce(outbox.c.body["reason"].astext, "").label("reason"),
            func.sum(line.c.value["quantity"].astext.cast(Integer)).label("units"),
        )
        .select_from(outbox.join(line, true()))
        .where(outbox.c.id > after_id, func.jsonb_typeof(outbox.c.body["lines"]) == "array")
        .group_by(outbox.c.routing_key, "reason")
    )
    async with stock.engine.connect() as connection:
        return {
            (row.routing_key, row.reason): int(row.units) for row in await connection.execute(query)
        }
