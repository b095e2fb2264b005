"""Test data: the commands the warehouse tests apply, and the worker's parse of a body."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.domain.lifecycle import CancelOrder, ShipOrder
from fulfilment.domain.model import OrderLine, ReserveStock
from fulfilment.worker.delivery import check_body, parse_event

PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
"""When the test orders were placed: the first day of the Online Retail data."""

CANCELLED_AT = datetime(2010, 12, 1, 9, 41, tzinfo=UTC)
"""When the test orders were cancelled."""

SHIPPED_AT = datetime(2010, 12, 2, 7, 5, tzinfo=UTC)
"""When the test orders were shipped."""


def order(
    *lines: tuple[str, int],
    event_id: UUID | None = None,
    order_id: UUID | None = None,
    traceparent: str | None = None,
) -> ReserveStock:
    """A ``ReserveStock`` of ``(sku, quantity)`` lines; new ids unless given."""
    return ReserveStock(
        event_id=event_id or uuid4(),
        order_id=order_id or uuid4(),
        placed_at=PLACED_AT,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
        traceparent=traceparent,
    )


def cancellation(
    order_id: UUID,
    *lines: tuple[str, int],
    event_id: UUID | None = None,
    traceparent: str | None = None,
) -> CancelOrder:
    """A ``CancelOrder`` of ``order_id``: of its ``(sku, quantity)`` lines, or whole without."""
    return CancelOrder(
        event_id=event_id or uuid4(),
        order_id=order_id,
        cancelled_at=CANCELLED_AT,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines) if lines else None,
        traceparent=traceparent,
    )


def shipment(
    order_id: UUID, *, event_id: UUID | None = None, traceparent: str | None = None
) -> ShipOrder:
    """A ``ShipOrder`` of ``order_id``; a new event id unless given."""
    return ShipOrder(
        event_id=event_id or uuid4(),
        order_id=order_id,
        shipped_at=SHIPPED_AT,
        traceparent=traceparent,
    )


def parse_order_placed(body: bytes, content_type: str | None) -> OrderPlacedV1:
    """What the worker does with a delivery before any write: the delivery policy's checks of
    every body, then ``on_order_placed``'s parse (both raise ``MalformedEventError``)."""
    check_body(body, content_type)
    return parse_event(OrderPlacedV1, body)
