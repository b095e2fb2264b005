"""``OrderPlaced`` version 1, as published by checkout to exchange ``orders`` (``order.placed``).

Validation is strict JSON (no string-to-number coercion) over the raw body; unknown fields are
ignored because producers add fields before consumers know them (product contract, "Input
event"). Bounds: the largest order of the Online Retail data has 675 lines and its largest
quantity is 80,995 units (2,880 in its December 2010 files), well inside :data:`MAX_LINES`
and :data:`MAX_QUANTITY`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from fulfilment.domain.model import OrderLine, ReserveStock

MAX_LINES = 1_000
"""Lines per order; the real data's largest order has 675."""

MAX_QUANTITY = 1_000_000
"""Units per line; the largest line of the Online Retail data set (2010-2011) has 80,995."""

MAX_SKU_LENGTH = 64
"""Characters per stock code; real codes run from ``D`` to ``gift_0001_40`` and ``BANK CHARGES``."""

Sku = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_SKU_LENGTH, pattern=r"^\S(?:.*\S)?$"),
]
"""A stock code: case-sensitive, inner spaces allowed, no leading or trailing white space."""


class OrderLineV1(BaseModel):
    """One order line on the wire."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    sku: Sku
    quantity: Annotated[int, Field(ge=1, le=MAX_QUANTITY)]


class OrderPlacedV1(BaseModel):
    """The ``OrderPlaced`` event, version 1 (see ``docs`` in the README for an example)."""

    # The title names the event in a refusal's reason ("invalid OrderPlaced v1: ...").
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="OrderPlaced v1")

    version: Literal[1]
    event_id: UUID
    order_id: UUID
    placed_at: AwareDatetime
    lines: Annotated[list[OrderLineV1], Field(min_length=1, max_length=MAX_LINES)]

    def to_command(self) -> ReserveStock:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return ReserveStock(
            event_id=self.event_id,
            order_id=self.order_id,
            placed_at=self.placed_at,
            lines=tuple(OrderLine(line.sku, line.quantity) for line in self.lines),
        )


def order_placed_body(
    *,
    event_id: UUID,
    order_id: UUID,
    placed_at: datetime,
    lines: list[tuple[str, int]],
) -> bytes:
    """Serialise an ``OrderPlaced`` v1 body (UTF-8 JSON), as producers send it.

    Raises:
        pydantic.ValidationError: the event would break the contract (e.g. a naive ``placed_at``).
    """
    event = OrderPlacedV1(
        version=1,
        event_id=event_id,
        order_id=order_id,
        placed_at=placed_at,
        lines=[OrderLineV1(sku=sku, quantity=quantity) for sku, quantity in lines],
    )
    return event.model_dump_json().encode()
