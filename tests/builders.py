"""Test data: the commands the warehouse tests reserve."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from fulfilment.domain.model import OrderLine, ReserveStock

PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
"""When the test orders were placed: the first day of the Online Retail data."""


def order(
    *lines: tuple[str, int], event_id: UUID | None = None, order_id: UUID | None = None
) -> ReserveStock:
    """A ``ReserveStock`` of ``(sku, quantity)`` lines; new ids unless given."""
    return ReserveStock(
        event_id=event_id or uuid4(),
        order_id=order_id or uuid4(),
        placed_at=PLACED_AT,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
    )
