"""Test data: the warehouse's shipments, cancellations and adjustments as commands."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import count
from uuid import UUID

from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import (
    AdjustmentReason,
    OperatorIdentity,
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
    warehouse_event_id,
)

WAREHOUSE_SHIPPED_AT = datetime(2010, 12, 2, 6, 40, tzinfo=UTC)
"""When the warehouse's test shipments left."""

WAREHOUSE_CANCELLED_AT = datetime(2010, 12, 2, 6, 10, tzinfo=UTC)
"""When the warehouse cancelled what it could not ship."""

WAREHOUSE_ADJUSTED_AT = datetime(2010, 12, 2, 5, 50, tzinfo=UTC)
"""When the warehouse's test adjustments happened."""

_ids = count(1)


def _next(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def _webhook_id(given: str | None, source: Source) -> str | None:
    if source is Source.POLL:
        return None
    return given or _next("msg")


def warehouse_shipment(
    order_id: UUID,
    *lines: tuple[str, int],
    shipment_id: str | None = None,
    webhook_id: str | None = None,
    source: Source = Source.WEBHOOK,
    carrier: str | None = "DHL",
    tracking_numbers: tuple[str, ...] = ("JD014600003828392019",),
    tracking_url: str | None = "https://tracking.example/JD014600003828392019",
) -> RecordShipment:
    """A ``RecordShipment`` of ``(sku, quantity)`` lines of ``order_id``.

    New ids unless given; a command of the poll (``source``) has no webhook id.
    """
    shipment_id = shipment_id or _next("SHP")
    return RecordShipment(
        event_id=warehouse_event_id("shipment", shipment_id),
        shipment_id=shipment_id,
        webhook_id=_webhook_id(webhook_id, source),
        fulfilment_order_id=f"FO-{order_id.hex[:8]}",
        order_id=order_id,
        shipped_at=WAREHOUSE_SHIPPED_AT,
        carrier=carrier,
        tracking_numbers=tracking_numbers,
        tracking_url=tracking_url,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
        source=source,
    )


def warehouse_cancellation(
    order_id: UUID,
    *lines: tuple[str, int],
    cancellation_id: str | None = None,
    webhook_id: str | None = None,
    source: Source = Source.WEBHOOK,
    reason: str = "unfulfillable",
) -> RecordWarehouseCancellation:
    """A ``RecordWarehouseCancellation`` of ``order_id``: of its lines, or all it holds without.

    New ids unless given; a command of the poll (``source``) has no webhook id.
    """
    cancellation_id = cancellation_id or _next("CXL")
    return RecordWarehouseCancellation(
        event_id=warehouse_event_id("cancellation", cancellation_id),
        cancellation_id=cancellation_id,
        webhook_id=_webhook_id(webhook_id, source),
        fulfilment_order_id=f"FO-{order_id.hex[:8]}",
        order_id=order_id,
        cancelled_at=WAREHOUSE_CANCELLED_AT,
        reason=reason,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines) if lines else None,
        source=source,
    )


def warehouse_adjustment(
    sku: str,
    delta: int,
    reason: AdjustmentReason | None = None,
    *,
    adjustment_id: str | None = None,
    webhook_id: str | None = None,
    operator: OperatorIdentity | None = None,
) -> RecordAdjustment:
    """A ``RecordAdjustment`` of ``delta`` units of ``sku`` (reason ``received`` for a gain,
    ``damaged`` for a loss, unless given); by an operator when ``operator`` is given (then no
    webhook id). New ids unless given."""
    adjustment_id = adjustment_id or _next("ADJ")
    if reason is None:
        reason = AdjustmentReason.RECEIVED if delta > 0 else AdjustmentReason.DAMAGED
    return RecordAdjustment(
        event_id=warehouse_event_id("adjustment", adjustment_id),
        adjustment_id=adjustment_id,
        webhook_id=None if operator is not None else (webhook_id or _next("msg")),
        sku=sku,
        delta=delta,
        reason=reason,
        occurred_at=WAREHOUSE_ADJUSTED_AT,
        source=Source.WEBHOOK if operator is None else Source.OPERATOR,
        operator=operator,
    )
