"""Use cases, as plain functions: the message first, dependencies by keyword."""

from __future__ import annotations

from fulfilment.application.ports import Warehouse
from fulfilment.domain.lifecycle import CancelOrder, CancelOutcome, ShipOrder, ShipOutcome
from fulfilment.domain.model import ReservationOutcome, ReserveStock


async def reserve_stock(command: ReserveStock, *, warehouse: Warehouse) -> ReservationOutcome:
    """Reserve stock for one placed order; see :meth:`Warehouse.reserve` for the guarantees.

    Insufficient stock and unknown SKUs come back as ``rejected`` outcomes, a redelivered event
    as a ``duplicate``; only infrastructure failures raise (:class:`TransientError`).
    """
    return await warehouse.reserve(command)


async def cancel_order(command: CancelOrder, *, warehouse: Warehouse) -> CancelOutcome:
    """Cancel one order, whole or some lines; see :meth:`Warehouse.cancel` for the guarantees.

    Every state of the order has an outcome (a cancel before its order is a tombstone, one
    after the shipment is ``cancel_after_ship``); only infrastructure failures raise
    (:class:`TransientError`).
    """
    return await warehouse.cancel(command)


async def ship_order(command: ShipOrder, *, warehouse: Warehouse) -> ShipOutcome:
    """Ship one order; see :meth:`Warehouse.ship` for the guarantees.

    An order that is not reserved comes back as ``not_reserved`` (the caller dead-letters the
    event, reason ``order_not_reserved``, for an operator to replay); only infrastructure
    failures raise (:class:`TransientError`).
    """
    return await warehouse.ship(command)
