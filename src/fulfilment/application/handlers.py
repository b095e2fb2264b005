"""Use cases, as plain functions: the message first, dependencies by keyword."""

from __future__ import annotations

from fulfilment.application.ports import Warehouse
from fulfilment.domain.model import ReservationOutcome, ReserveStock


async def reserve_stock(command: ReserveStock, *, warehouse: Warehouse) -> ReservationOutcome:
    """Reserve stock for one placed order; see :meth:`Warehouse.reserve` for the guarantees.

    Insufficient stock and unknown SKUs come back as ``rejected`` outcomes, a redelivered event
    as a ``duplicate``; only infrastructure failures raise (:class:`TransientError`).
    """
    return await warehouse.reserve(command)
