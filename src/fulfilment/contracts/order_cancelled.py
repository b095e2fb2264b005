"""``OrderCancelled`` version 1, published to exchange ``orders`` (``order.cancelled``).

Without ``lines`` it cancels the whole order; with them, those quantities (summed per SKU, as
for ``OrderPlaced``). Validation is as strict as ``OrderPlacedV1``'s and uses its types: the
same ids, SKUs, quantities, line counts and instants are accepted, each one PostgreSQL stores
as it was sent (``contracts.order_placed``). ``"lines": null`` and ``"lines": []`` are refused:
a producer that means the whole order leaves the field out, so a bug that loses a partial
cancel's lines cannot cancel a whole order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

from fulfilment.contracts.order_placed import EventTime, MintedUuid, OrderLines, OrderLineV1
from fulfilment.domain.lifecycle import CancelOrder
from fulfilment.domain.model import OrderLine


class OrderCancelledV1(BaseModel):
    """The ``OrderCancelled`` event, version 1 (docs/design.md, "The reservation lifecycle")."""

    # The title names the event in a refusal's reason ("invalid OrderCancelled v1: ...").
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="OrderCancelled v1")

    version: Literal[1]
    event_id: MintedUuid
    order_id: MintedUuid
    cancelled_at: EventTime
    lines: OrderLines | None = None

    @field_validator("lines", mode="before")
    @classmethod
    def _lines_or_absent(cls, value: Any) -> Any:  # noqa: ANN401 - any JSON value, checked next
        # Runs only for a value that was sent: an absent field keeps its default.
        if value is None:
            refusal = PydanticCustomError(
                "lines_null", "must be a list of lines, or left out to cancel the whole order"
            )
            raise refusal
        return value

    def to_command(self) -> CancelOrder:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return CancelOrder(
            event_id=self.event_id,
            order_id=self.order_id,
            cancelled_at=self.cancelled_at,
            lines=None
            if self.lines is None
            else tuple(OrderLine(line.sku, line.quantity) for line in self.lines),
        )


def order_cancelled_body(
    *,
    event_id: UUID,
    order_id: UUID,
    cancelled_at: datetime,
    lines: list[tuple[str, int]] | None = None,
) -> bytes:
    """Serialise an ``OrderCancelled`` v1 body (UTF-8 JSON), as producers send it.

    ``lines`` None cancels the whole order, and the body has no ``lines`` field.

    Raises:
        pydantic.ValidationError: the event would break the contract (e.g. no lines in a list).
    """
    event = (
        OrderCancelledV1(version=1, event_id=event_id, order_id=order_id, cancelled_at=cancelled_at)
        if lines is None
        else OrderCancelledV1(
            version=1,
            event_id=event_id,
            order_id=order_id,
            cancelled_at=cancelled_at,
            lines=[OrderLineV1(sku=sku, quantity=quantity) for sku, quantity in lines],
        )
    )
    return event.model_dump_json(exclude_none=True).encode()
