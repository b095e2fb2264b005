"""The warehouse's inventory on the wire: a page of ``GET {base}/inventory?after=<sku>&limit=<n>``.

``{"as_of": "<RFC 3339>", "items": [{"sku": "85123A", "on_hand": 41}], "next": "<sku>" | null}``
(product.md, "Hearing back from the warehouse"): the SKUs after ``after`` in the warehouse's
order, at most ``limit`` of them; ``next`` is the ``after`` of the next page, null on the last.
Read as strictly as the warehouse's webhooks (``contracts.warehouse_events``): SKUs as the
service stores them, on hand an integer >= 0, unknown fields ignored.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from fulfilment.contracts.order_placed import Sku


class InventoryItemV1(BaseModel):
    """One SKU's units on the warehouse's shelf."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    sku: Sku
    on_hand: Annotated[int, Field(ge=0)]


class InventoryPageV1(BaseModel):
    """One page of the warehouse's inventory."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="Inventory page")

    as_of: AwareDatetime
    """When the warehouse read its counts (RFC 3339)."""
    items: list[InventoryItemV1]
    next: Sku | None
    """The last SKU of this page when more follow (the next page's ``after``); null: the last."""
