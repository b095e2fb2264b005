"""The service's side of the drift report, read in one snapshot.

On hand per SKU, and the units the warehouse may have shipped that the service has not heard
of yet. Read in one ``REPEATABLE READ`` transaction, so that the levels and the orders agree
with each other: a shipment the service recorded is in both (``on_hand`` fell and the order
holds less) or in neither.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.tables.handoff import warehouse_requests
from fulfilment.adapters.postgres.tables.stock import reservation_lines, reservations, stock_levels
from fulfilment.domain.handoff import RequestKind, RequestStatus

AT_THE_WAREHOUSE = (RequestStatus.ACCEPTED, RequestStatus.SENDING)
"""The statuses of a fulfilment-order request whose order the warehouse may be shipping: taken
(``accepted``), or sent with no final answer yet (``sending``: the warehouse may have created
it, and a shipment may come before the answer is recorded)."""


@dataclass(frozen=True, slots=True)
class HeldAtTheWarehouse:
    """Units of one SKU an order holds while the warehouse has its fulfilment order.

    Attributes:
        order_id: the order (``reservations.order_id``).
        warehouse_id: the warehouse's id of its fulfilment order; None while ``sending``.
        status: the fulfilment-order request's status (``accepted`` or ``sending``).
        units: ``quantity - shipped`` of its line of the SKU (> 0).
    """

    order_id: UUID
    warehouse_id: str | None
    status: str
    units: int


@dataclass(frozen=True, slots=True)
class ServiceStock:
    """The service's stock in one snapshot.

    Attributes:
        on_hand: ``stock_levels.on_hand`` by SKU, every SKU.
        held: by SKU, the reserved orders holding units of it whose fulfilment order the
            warehouse has (:data:`AT_THE_WAREHOUSE`), by order id.
    """

    on_hand: dict[str, int]
    held: dict[str, list[HeldAtTheWarehouse]]


async def service_stock(engine: AsyncEngine) -> ServiceStock:
    """``stock_levels.on_hand`` and the units held at the warehouse, in one snapshot.

    Raises:
        sqlalchemy.exc.DBAPIError: the database failed (not retried: this is a report).
        OSError: the database cannot be reached.
    """
    held_units = reservation_lines.c.quantity - reservation_lines.c.shipped
    held_query = (
        sa.select(
            reservation_lines.c.sku,
            reservation_lines.c.order_id,
            warehouse_requests.c.warehouse_id,
            warehouse_requests.c.status,
            held_units.label("units"),
        )
        .join(reservations, reservations.c.order_id == reservation_lines.c.order_id)
        .join(warehouse_requests, warehouse_requests.c.order_id == reservation_lines.c.order_id)
        .where(
            reservations.c.status == "reserved",
            held_units > 0,
            warehouse_requests.c.kind == RequestKind.FULFILMENT_ORDER.value,
            warehouse_requests.c.status.in_([status.value for status in AT_THE_WAREHOUSE]),
        )
        .order_by(reservation_lines.c.sku, reservation_lines.c.order_id)
    )
    snapshot = engine.execution_options(isolation_level="REPEATABLE READ")
    async with snapshot.connect() as connection, connection.begin():
        levels = await connection.execute(sa.select(stock_levels.c.sku, stock_levels.c.on_hand))
        on_hand = {row.sku: int(row.on_hand) for row in levels}
        held: dict[str, list[HeldAtTheWarehouse]] = defaultdict(list)
        for row in await connection.execute(held_query):
            held[row.sku].append(
                HeldAtTheWarehouse(row.order_id, row.warehouse_id, row.status, int(row.units))
            )
    return ServiceStock(on_hand=on_hand, held=dict(held))
