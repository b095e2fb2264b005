"""The fulfilment orders the warehouse holds, what it did with them, and how it describes them.

``GET {base}/fulfilment-orders/{id}`` answers :meth:`Order.document`: the service's
``FulfilmentOrderV1`` (``fulfilment.contracts.warehouse_events``), whose shipments and
cancellations are the same objects as the webhooks' ``data``. Every shipment and every
cancellation of the warehouse's own is listed there, whether or not a webhook ever told the
service about it: the service's poll finds what the webhooks missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = (
    "received",
    "processing",
    "partially_shipped",
    "shipped",
    "cancelled",
    "partially_cancelled",
)
"""A fulfilment order's statuses, as the warehouse API lists them."""


@dataclass
class Order:
    """A fulfilment order the warehouse holds.

    ``remaining`` is what is left to ship after the shop's cancellations, the warehouse's own
    and its shipments; ``shipments`` and ``cancellations`` are the webhooks' ``data`` objects
    of what the warehouse did (its own cancellations only, not the shop's).
    """

    id: str
    reference: str
    lines: list[dict[str, Any]]
    idempotency_key: str
    created_at: float
    """``time.monotonic()`` at its creation."""
    traceparent: str | None
    """The W3C trace context the request carried, if any."""
    remaining: dict[str, int] = field(default_factory=dict)
    shipments: list[dict[str, Any]] = field(default_factory=list)
    cancellations: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False
    """The warehouse began working on it (cancelled what it could not find, or shipped): a
    cancellation by the shop is refused ``too_late`` from then on."""

    def status(self, *, picked: bool) -> str:
        """One of :data:`STATUSES`: what is left, what shipped, what was cancelled.

        Nothing left: ``shipped`` when any unit shipped, else ``cancelled``. Something left:
        ``partially_shipped`` when any unit shipped, ``partially_cancelled`` when any was
        cancelled (by the shop or the warehouse), ``processing`` once ``picked`` or started,
        else ``received``.
        """
        shipped = sum(line["quantity"] for s in self.shipments for line in s["lines"])
        ordered = sum(line["quantity"] for line in self.lines)
        left = sum(self.remaining.values())
        if not left:
            return "shipped" if shipped else "cancelled"
        if shipped:
            return "partially_shipped"
        if ordered - shipped - left > 0:
            return "partially_cancelled"
        return "processing" if picked or self.started else "received"

    def document(self, *, picked: bool) -> dict[str, Any]:
        """The answer of ``GET {base}/fulfilment-orders/{id}`` (a ``FulfilmentOrderV1``)."""
        return {
            "id": self.id,
            "reference": self.reference,
            "status": self.status(picked=picked),
            "shipments": self.shipments,
            "cancellations": self.cancellations,
        }


@dataclass
class Cancellation:
    """A cancellation by the shop the warehouse answered, accepted or refused."""

    order_id: str
    lines: list[dict[str, Any]] | None
    idempotency_key: str
    status: str
    """``cancelled``, ``partially_cancelled`` or ``too_late``."""
