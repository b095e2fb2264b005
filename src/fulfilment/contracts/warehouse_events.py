"""The warehouse's events on the wire: its webhooks' bodies and its fulfilment orders when polled.

A webhook's body is ``{"type": ..., "timestamp": ..., "data": {...}}`` (Standard Webhooks'
payload shape); :class:`WebhookEnvelope` reads the first two, and the model of
:data:`WEBHOOK_DATA` for its ``type`` reads ``data``. ``GET /fulfilment-orders/{id}`` answers a
:class:`FulfilmentOrderV1`, whose shipments and cancellations are the same objects as the
webhooks' ``data``, so a change found by the poll becomes the same command as one pushed
(docs/design.md, "Hearing back from the warehouse").

Validation is as strict as the broker's events (``contracts.order_placed``): strict JSON,
quantities positive integers within :data:`~fulfilment.contracts.order_placed.MAX_QUANTITY`,
SKUs and instants PostgreSQL stores as sent, unknown fields ignored. The warehouse's ids are
its own strings (not UUIDs); the ``reference`` is the order's id, a UUID. ``data.version``
may be left out (version 1); any other version is refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from fulfilment.contracts.order_placed import MAX_QUANTITY, EventTime, MintedUuid, OrderLines, Sku
from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import (
    AdjustmentReason,
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
    warehouse_event_id,
)

MAX_WAREHOUSE_ID_LENGTH = 255
"""Characters of a warehouse's id (``shipment_id``, ``cancellation_id``, a fulfilment order's)."""

MAX_TRACKING_NUMBERS = 100
"""Tracking numbers of one shipment (one per package)."""

WarehouseId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_WAREHOUSE_ID_LENGTH, pattern=r"^[^\x00]+$"),
]
"""An id the warehouse minted: 1 to 255 characters, no NUL (PostgreSQL ``text`` cannot hold it)."""

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^[^\x00]+$")]
"""A carrier, a tracking number or URL, a reason: 1 to 2,048 characters, no NUL."""

SHIPMENT_SHIPPED = "shipment.shipped"
FULFILMENT_ORDER_CANCELLED = "fulfilment_order.cancelled"
INVENTORY_ADJUSTED = "inventory.adjusted"


class WebhookEnvelope(BaseModel):
    """The outside of every webhook body: its ``type``, ``timestamp`` and ``data`` object."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="Warehouse webhook")

    type: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    """The event's type (``shipment.shipped``, ...); one the service does not take is
    answered 204 and counted."""
    timestamp: AwareDatetime
    """When the warehouse emitted the event (RFC 3339)."""
    data: dict[str, object]
    """The event itself, read by the model of its type."""


class ShipmentV1(BaseModel):
    """A shipment: the ``data`` of ``shipment.shipped``, and an item of a polled order's list."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="Shipment v1")

    version: Literal[1] = 1
    shipment_id: WarehouseId
    fulfilment_order_id: WarehouseId
    reference: MintedUuid
    """The order's id, as the service sent it in the fulfilment order."""
    shipped_at: EventTime
    carrier: ShortText | None = None
    tracking_numbers: Annotated[list[ShortText], Field(max_length=MAX_TRACKING_NUMBERS)] = []
    tracking_url: ShortText | None = None
    lines: OrderLines

    def to_command(self, *, webhook_id: str | None, source: Source) -> RecordShipment:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return RecordShipment(
            event_id=warehouse_event_id("shipment", self.shipment_id),
            shipment_id=self.shipment_id,
            webhook_id=webhook_id,
            fulfilment_order_id=self.fulfilment_order_id,
            order_id=self.reference,
            shipped_at=self.shipped_at,
            carrier=self.carrier,
            tracking_numbers=tuple(self.tracking_numbers),
            tracking_url=self.tracking_url,
            lines=tuple(OrderLine(line.sku, line.quantity) for line in self.lines),
            source=source,
        )


class WarehouseCancellationV1(BaseModel):
    """A cancellation by the warehouse: the ``data`` of ``fulfilment_order.cancelled``.

    Without ``lines`` it cancels everything the order still holds.
    """

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", title="WarehouseCancellation v1"
    )

    version: Literal[1] = 1
    cancellation_id: WarehouseId
    fulfilment_order_id: WarehouseId
    reference: MintedUuid
    cancelled_at: EventTime
    reason: ShortText
    lines: OrderLines | None = None

    def to_command(self, *, webhook_id: str | None, source: Source) -> RecordWarehouseCancellation:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return RecordWarehouseCancellation(
            event_id=warehouse_event_id("cancellation", self.cancellation_id),
            cancellation_id=self.cancellation_id,
            webhook_id=webhook_id,
            fulfilment_order_id=self.fulfilment_order_id,
            order_id=self.reference,
            cancelled_at=self.cancelled_at,
            reason=self.reason,
            lines=None
            if self.lines is None
            else tuple(OrderLine(line.sku, line.quantity) for line in self.lines),
            source=source,
        )


def _non_zero(delta: int) -> int:
    if delta == 0:
        msg = "must not be 0"
        raise ValueError(msg)
    return delta


Delta = Annotated[int, Field(ge=-MAX_QUANTITY, le=MAX_QUANTITY), AfterValidator(_non_zero)]
"""Units an adjustment changes ``on_hand`` by: a non-zero integer within ±MAX_QUANTITY."""


class InventoryAdjustmentV1(BaseModel):
    """An adjustment of the warehouse's stock: the ``data`` of ``inventory.adjusted``.

    ``delta`` units of ``sku`` came onto (positive) or left (negative) the shelf other than
    by a shipment, for ``reason``.
    """

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", title="InventoryAdjustment v1"
    )

    version: Literal[1] = 1
    adjustment_id: WarehouseId
    sku: Sku
    delta: Delta
    reason: AdjustmentReason
    occurred_at: EventTime

    def to_command(self, *, webhook_id: str | None, source: Source) -> RecordAdjustment:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return RecordAdjustment(
            event_id=warehouse_event_id("adjustment", self.adjustment_id),
            adjustment_id=self.adjustment_id,
            webhook_id=webhook_id,
            sku=self.sku,
            delta=self.delta,
            reason=self.reason,
            occurred_at=self.occurred_at,
            source=source,
        )


FulfilmentOrderStatus = Literal[
    "received", "processing", "partially_shipped", "shipped", "cancelled", "partially_cancelled"
]


class FulfilmentOrderV1(BaseModel):
    """``GET /fulfilment-orders/{id}``'s answer: the order as the warehouse knows it."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="FulfilmentOrder v1")

    id: WarehouseId
    reference: MintedUuid
    status: FulfilmentOrderStatus
    shipments: list[ShipmentV1] = []
    cancellations: list[WarehouseCancellationV1] = []
