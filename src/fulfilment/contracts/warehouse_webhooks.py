"""The webhook bodies the intake takes, whole: the envelope with its ``data`` typed.

:class:`~fulfilment.contracts.warehouse_events.WebhookEnvelope` reads any webhook's outside;
the models here read a body of a type the service takes in one strict parse (``data`` as the
type's model), which is what the intake validates and what its OpenAPI document describes.
:data:`TAKEN` lists them by ``type``; any other type is answered 204 and counted, not kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, StringConstraints

from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
    InventoryAdjustmentV1,
    ShipmentV1,
    WarehouseCancellationV1,
)


class AnyWebhook(BaseModel):
    """What the intake reads of every signed body first: its ``type``, nothing else.

    A body whose ``type`` the service does not take is answered without a look at the rest;
    a body that is no JSON object with a string ``type`` is invalid.
    """

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="warehouse webhook")

    type: Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ShipmentShippedWebhook(BaseModel):
    """The body of a ``shipment.shipped`` webhook."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", title="shipment.shipped webhook"
    )

    type: Literal["shipment.shipped"]
    timestamp: AwareDatetime
    """When the warehouse emitted the event (RFC 3339)."""
    data: ShipmentV1


class FulfilmentOrderCancelledWebhook(BaseModel):
    """The body of a ``fulfilment_order.cancelled`` webhook: the warehouse's own cancellation."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", title="fulfilment_order.cancelled webhook"
    )

    type: Literal["fulfilment_order.cancelled"]
    timestamp: AwareDatetime
    """When the warehouse emitted the event (RFC 3339)."""
    data: WarehouseCancellationV1


class InventoryAdjustedWebhook(BaseModel):
    """The body of an ``inventory.adjusted`` webhook: a change of the warehouse's stock."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", title="inventory.adjusted webhook"
    )

    type: Literal["inventory.adjusted"]
    timestamp: AwareDatetime
    """When the warehouse emitted the event (RFC 3339)."""
    data: InventoryAdjustmentV1


TakenWebhook = ShipmentShippedWebhook | FulfilmentOrderCancelledWebhook | InventoryAdjustedWebhook
"""A body of a type the service takes."""

TAKEN: Final[Mapping[str, type[TakenWebhook]]] = MappingProxyType(
    {
        SHIPMENT_SHIPPED: ShipmentShippedWebhook,
        FULFILMENT_ORDER_CANCELLED: FulfilmentOrderCancelledWebhook,
        INVENTORY_ADJUSTED: InventoryAdjustedWebhook,
    }
)
"""The model of each webhook type the service takes, by ``type``."""

OTHER_TYPE: Final = "other"
"""The ``type`` label of a webhook whose type is none of :data:`TYPE_LABELS`'s others."""

TYPE_LABELS: Final = (SHIPMENT_SHIPPED, FULFILMENT_ORDER_CANCELLED, INVENTORY_ADJUSTED, OTHER_TYPE)
"""The ``type`` label's values in ``fulfilment_webhooks_received_total``: bounded, whatever a
sender writes."""


def type_label(webhook_type: str | None) -> str:
    """``webhook_type`` as the metric's ``type`` label: itself when known, else ``other``."""
    return webhook_type if webhook_type in TYPE_LABELS else OTHER_TYPE
