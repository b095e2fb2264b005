"""``OrderShipped`` version 1, published to exchange ``orders`` (``order.shipped``).

It ships everything the order still holds (no partial shipment). Validation is as strict as
``OrderPlacedV1``'s and uses its types (``contracts.order_placed``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from fulfilment.contracts.order_placed import EventTime, MintedUuid
from fulfilment.domain.lifecycle import ShipOrder


class OrderShippedV1(BaseModel):
    """The ``OrderShipped`` event, version 1 (docs/design.md, "The reservation lifecycle")."""

    # The title names the event in a refusal's reason ("invalid OrderShipped v1: ...").
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="OrderShipped v1")

    version: Literal[1]
    event_id: MintedUuid
    order_id: MintedUuid
    shipped_at: EventTime

    def to_command(self) -> ShipOrder:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return ShipOrder(
            event_id=self.event_id,
            order_id=self.order_id,
            shipped_at=self.shipped_at,
        )


def order_shipped_body(*, event_id: UUID, order_id: UUID, shipped_at: datetime) -> bytes:
    """Serialise an ``OrderShipped`` v1 body (UTF-8 JSON), as producers send it.

    Raises:
        pydantic.ValidationError: the event would break the contract (e.g. a naive time).
    """
    event = OrderShippedV1(version=1, event_id=event_id, order_id=order_id, shipped_at=shipped_at)
    return event.model_dump_json().encode()
