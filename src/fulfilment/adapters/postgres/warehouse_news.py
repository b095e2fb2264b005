"""What the service recorded of the warehouse's news, read back per order, and the stock per SKU.

The demo checks these rows against what its warehouse simulator says it made (``fulfilment.demo
.warehouse_news``, ``fulfilment.demo.warehouse_stock``): each shipment and cancellation of the
warehouse is one row of ``warehouse_shipments`` / ``warehouse_cancellations`` (migration 0014)
with its lines, each adjustment one of ``warehouse_adjustments`` (migration 0016), the order's
lines say what it shipped (``reservation_lines.shipped``), and the stock levels what is left.
Read-only; each function is one query on its own connection.
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
    warehouse_adjustments,
    warehouse_cancellation_lines,
    warehouse_cancellations,
    warehouse_shipment_lines,
    warehouse_shipments,
)
from fulfilment.contracts.result_events import (
    STOCK_ADJUSTED_ROUTING_KEY,
    STOCK_REJECTED_ROUTING_KEY,
    STOCK_SHORTAGE_ROUTING_KEY,
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


@dataclass(frozen=True, slots=True)
class RecordedAdjustment:
    """One ``warehouse_adjustments`` row: an adjustment the service applied.

    Attributes:
        adjustment_id: the warehouse's id of it.
        sku: its SKU.
        delta: units as sent (positive onto the shelf).
        applied: units ``on_hand`` changed by (``delta``, or less of a loss beyond on hand).
        reason: ``received``, ``damaged`` ...
        on_hand: ``on_hand`` after it.
        reserved: ``reserved`` after it.
    """

    adjustment_id: str
    sku: str
    delta: int
    applied: int
    reason: str
    on_hand: int
    reserved: int


async def recorded_adjustments(
    stock: PostgresStock, adjustment_ids: Collection[str]
) -> dict[str, RecordedAdjustment]:
    """The adjustments of ``adjustment_ids`` the service applied, by id (absent: not yet)."""
    if not adjustment_ids:
        return {}
    query = select(
        warehouse_adjustments.c.adjustment_id,
        warehouse_adjustments.c.sku,
        warehouse_adjustments.c.delta,
        warehouse_adjustments.c.applied,
        warehouse_adjustments.c.reason,
        warehouse_adjustments.c.on_hand_after,
        warehouse_adjustments.c.reserved_after,
    ).where(warehouse_adjustments.c.adjustment_id.in_(bindparam("ids", expanding=True)))
    async with stock.engine.connect() as connection:
        return {
            row.adjustment_id: RecordedAdjustment(
                row.adjustment_id,
                row.sku,
                int(row.delta),
                int(row.applied),
                row.reason,
                int(row.on_hand_after),
                int(row.reserved_after),
            )
            for row in await connection.execute(query, {"ids": list(adjustment_ids)})
        }


async def skus_with_losses(stock: PostgresStock) -> set[str]:
    """The SKUs of which an adjustment ever took units off ``on_hand`` (a reported loss)."""
    query = (
        select(warehouse_adjustments.c.sku).where(warehouse_adjustments.c.applied < 0).distinct()
    )
    async with stock.engine.connect() as connection:
        return set((await connection.scalars(query)).all())


async def adjusted_units_after(stock: PostgresStock, after_id: int) -> dict[str, int]:
    """Units ``on_hand`` changed by per SKU, by the ``stock.adjusted`` rows above ``after_id``."""
    applied = func.sum(outbox.c.body["applied"].astext.cast(Integer))
    query = (
        select(outbox.c.sku, applied.label("applied"))
        .where(outbox.c.id > after_id, outbox.c.routing_key == STOCK_ADJUSTED_ROUTING_KEY)
        .group_by(outbox.c.sku)
    )
    async with stock.engine.connect() as connection:
        return {row.sku: int(row.applied) for row in await connection.execute(query)}


async def shortfalls_after(stock: PostgresStock, after_id: int, sku: str) -> list[int]:
    """The ``short`` of each ``stock.shortage`` row of ``sku`` above ``after_id``, in order."""
    query = (
        select(outbox.c.body["short"].astext.cast(Integer))
        .where(
            outbox.c.id > after_id,
            outbox.c.routing_key == STOCK_SHORTAGE_ROUTING_KEY,
            outbox.c.sku == sku,
        )
        .order_by(outbox.c.id)
    )
    async with stock.engine.connect() as connection:
        return [int(short) for short in (await connection.scalars(query)).all()]


async def rejection_of(stock: PostgresStock, order_id: UUID) -> tuple[str, list[str]] | None:
    """The ``reason`` and ``skus`` of the order's ``stock.rejected``; None: it has none."""
    query = select(outbox.c.body["reason"].astext, outbox.c.body["skus"]).where(
        outbox.c.order_id == order_id, outbox.c.routing_key == STOCK_REJECTED_ROUTING_KEY
    )
    async with stock.engine.connect() as connection:
        row = (await connection.execute(query)).first()
    return None if row is None else (str(row[0]), [str(sku) for sku in row[1]])
