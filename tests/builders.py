"""Test data: the commands the warehouse tests reserve, and the worker's parse of a body."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.domain.model import OrderLine, ReserveStock
from fulfilment.worker.delivery import check_body, parse_event

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


def parse_order_placed(body: bytes, content_type: str | None) -> OrderPlacedV1:
    """What the worker does with a delivery before any write: the delivery policy's checks of
    every body, then ``on_order_placed``'s parse (both raise ``MalformedEventError``)."""
    check_body(body, content_type)
    return parse_event(OrderPlacedV1, body)
