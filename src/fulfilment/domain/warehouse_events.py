"""What the warehouse tells the service: its shipments, its own cancellations, its adjustments.

The warehouse pushes them as signed webhooks and answers for them when polled (docs/design.md,
"Hearing back from the warehouse"); both become the commands of this module, applied through
``Stock.apply`` like the broker's events. Each is applied once by the warehouse's own id of the
change (``shipment_id``, ``cancellation_id``), whichever webhook or poll brought it: the
command's ``event_id`` is derived from that id (:func:`warehouse_event_id`), so the inbox,
the traces and the result events' ``causation_id`` treat it as any other event's id.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID, uuid5

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import Command, OrderLine, aggregate_demand

WAREHOUSE_EVENTS_NAMESPACE = UUID("6f1d3c52-55a4-4d0e-9a51-6a0f0a8c2b7e")
"""The UUID namespace (RFC 9562, 5.5) of the ids derived from the warehouse's ids."""


def warehouse_event_id(kind: str, warehouse_id: str) -> UUID:
    """The ``event_id`` of the warehouse's change ``warehouse_id`` of ``kind``.

    ``kind`` is ``shipment``, ``cancellation`` or ``adjustment``; the same pair always gives
    the same UUID (version 5), and two kinds never share one, so a shipment re-sent under a new
    webhook id, or found again by the poll, is the same event.
    """
    return uuid5(WAREHOUSE_EVENTS_NAMESPACE, f"{kind}:{warehouse_id}")


class Source(StrEnum):
    """How a warehouse event reached the service."""

    WEBHOOK = "webhook"
    """Pushed to ``POST /webhooks/warehouse``."""
    POLL = "poll"
    """Listed by ``GET /fulfilment-orders/{id}`` when the dispatcher asked."""
    OPERATOR = "operator"
    """Recorded by an operator (``fulfilment stock adjust``); adjustments only."""


@dataclass(frozen=True, slots=True)
class RecordShipment(Command["ShipmentOutcome"]):
    """Command: a shipment the warehouse sent, of some of an order's units.

    Attributes:
        event_id: :func:`warehouse_event_id` of ``("shipment", shipment_id)``.
        shipment_id: the warehouse's id of the shipment, its idempotency key.
        webhook_id: the ``webhook-id`` that brought it; None when the poll found it.
        fulfilment_order_id: the warehouse's id of the fulfilment order.
        order_id: the order (the fulfilment order's ``reference``), by which it is matched.
        shipped_at: when it left, timezone-aware.
        carrier: the carrier's name, None when the warehouse gave none.
        tracking_numbers: one per package, possibly none.
        tracking_url: where to follow it, None when the warehouse gave none.
        lines: the units shipped; a SKU may repeat (merged by :meth:`shipped`).
        source: how it arrived.
    """

    event_id: UUID
    shipment_id: str
    webhook_id: str | None
    fulfilment_order_id: str
    order_id: UUID
    shipped_at: datetime
    carrier: str | None
    tracking_numbers: tuple[str, ...]
    tracking_url: str | None
    lines: tuple[OrderLine, ...]
    source: Source

    def shipped(self) -> dict[str, int]:
        """Units shipped per SKU, lines of the same SKU summed, keys in code-point order."""
        return aggregate_demand(self.lines)


@dataclass(frozen=True, slots=True)
class RecordWarehouseCancellation(Command["WarehouseCancellationOutcome"]):
    """Command: the warehouse cancelled what it cannot fulfil of an order.

    Attributes:
        event_id: :func:`warehouse_event_id` of ``("cancellation", cancellation_id)``.
        cancellation_id: the warehouse's id of the cancellation, its idempotency key.
        webhook_id: the ``webhook-id`` that brought it; None when the poll found it.
        fulfilment_order_id: the warehouse's id of the fulfilment order.
        order_id: the order (the fulfilment order's ``reference``).
        cancelled_at: when the warehouse cancelled, timezone-aware.
        reason: the warehouse's reason (``unfulfillable``, ...), kept as it sent it.
        lines: the units cancelled; None cancels everything the order still holds.
        source: how it arrived.
    """

    event_id: UUID
    cancellation_id: str
    webhook_id: str | None
    fulfilment_order_id: str
    order_id: UUID
    cancelled_at: datetime
    reason: str
    lines: tuple[OrderLine, ...] | None
    source: Source

    def cancelled(self) -> dict[str, int] | None:
        """Units cancelled per SKU, merged, in code-point order; None: all the order holds."""
        return None if self.lines is None else aggregate_demand(self.lines)


class ShipmentKind(StrEnum):
    """How the processing of one warehouse shipment ended."""

    SHIPPED = "shipped"
    """It took units from the order (``on_hand`` and ``reserved`` went down by them); any it
    could not take are a discrepancy too."""
    ALREADY_SHIPPED = "already_shipped"
    """The order is ``shipped`` already (the upstream ``OrderShipped`` may have come first);
    nothing changed."""
    DISCREPANCY = "discrepancy"
    """It took nothing: the order is unknown or not reserved, or holds none of the shipped
    SKUs. What it named is kept as a discrepancy."""
    DUPLICATE = "duplicate"
    """This shipment (or this webhook) was applied before; nothing changed."""


class WarehouseCancellationKind(StrEnum):
    """How the processing of one cancellation by the warehouse ended."""

    RELEASED = "released"
    """It gave reserved units back (``reserved`` went down by them)."""
    IGNORED = "ignored"
    """The order is known but holds none of the cancelled units (shipped, released, or
    cancelled already); nothing changed."""
    DISCREPANCY = "discrepancy"
    """No order of that reference, or one that never held stock (rejected, a tombstone): kept
    as a discrepancy; nothing changed."""
    DUPLICATE = "duplicate"
    """This cancellation (or this webhook) was applied before; nothing changed."""


class DuplicateBy(StrEnum):
    """What a duplicate warehouse event repeated."""

    WEBHOOK = "webhook"
    """Its ``webhook-id`` was recorded before (the sender's retry)."""
    CHANGE = "change"
    """Its ``shipment_id`` or ``cancellation_id`` was applied before, under another webhook
    id or from the poll."""


class DiscrepancyKind(StrEnum):
    """Why the warehouse's event could not be applied in full: ``warehouse_discrepancies.kind``."""

    UNKNOWN_ORDER = "unknown_order"
    """No order of that reference (no ``reservations`` row)."""
    ORDER_NOT_RESERVED = "order_not_reserved"
    """The order holds no stock and never shipped: rejected, released, or a tombstone
    (a cancellation of a released order is ``ignored`` instead: it held stock once)."""
    MORE_THAN_HELD = "more_than_held"
    """A shipment named more of a SKU than the order holds of it; ``quantity`` is the excess."""
    SKU_NOT_HELD = "sku_not_held"
    """A shipment named a SKU the order has no line of (never held, or released it all)."""
    MORE_THAN_ON_HAND = "more_than_on_hand"
    """An adjustment took more units than on hand (``fulfilment.domain.adjustments``);
    ``quantity`` is the units it could not take, and it names no order."""


@dataclass(frozen=True, slots=True)
class Discrepancy:
    """What the warehouse said that the service's stock cannot match: one kept row.

    ``sku`` and ``quantity`` are None for a cancellation without lines (of the whole order);
    ``order_status`` is the order's status when the event came, None without a row.
    """

    kind: DiscrepancyKind
    sku: str | None
    quantity: int | None
    order_status: OrderStatus | None


@dataclass(frozen=True, slots=True)
class ShipmentOutcome:
    """Result of ``Stock.apply`` of a :class:`RecordShipment`.

    Attributes:
        kind: how it ended.
        order_id: the order it named.
        event_id: the command's event id.
        lines: the units taken from the order, one per SKU in code-point order.
        discrepancies: the ``warehouse_discrepancies`` rows it kept, one per SKU it named and
            could not take in full, in code-point order; empty for ``already_shipped`` and
            ``duplicate``. The metric ``fulfilment_warehouse_discrepancies_total`` counts
            them by kind.
        status: the order's status after it; None when the order is unknown, and for a
            ``duplicate`` (not looked at).
        duplicate_by: what a ``duplicate`` repeated; None otherwise.
    """

    kind: ShipmentKind
    order_id: UUID
    event_id: UUID
    lines: tuple[OrderLine, ...] = ()
    discrepancies: tuple[Discrepancy, ...] = ()
    status: OrderStatus | None = None
    duplicate_by: DuplicateBy | None = None

    @property
    def unmatched(self) -> tuple[OrderLine, ...]:
        """The units it named that the order did not hold, one per SKU in code-point order.

        The SKU and units of each of :attr:`discrepancies` (a shipment's always has both).
        """
        return tuple(
            OrderLine(found.sku, found.quantity)
            for found in self.discrepancies
            if found.sku is not None and found.quantity is not None
        )

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics: the kind, or ``duplicate:<by>``."""
        if self.duplicate_by is not None:
            return f"{self.kind}:{self.duplicate_by}"
        return str(self.kind)


@dataclass(frozen=True, slots=True)
class WarehouseCancellationOutcome:
    """Result of ``Stock.apply`` of a :class:`RecordWarehouseCancellation`.

    Attributes:
        kind: how it ended.
        order_id: the order it named.
        event_id: the command's event id.
        lines: the units released, one per SKU in code-point order.
        discrepancies: the ``warehouse_discrepancies`` rows it kept (an unknown order, or one
            that never held stock): one per SKU it named in code-point order, or one without
            SKU for a cancellation of the whole order; empty otherwise.
        status: the order's status after it (``reserved`` while it holds units, ``released``
            when it holds none and shipped none, ``shipped`` when it holds none and shipped
            some); None when the order is unknown, and for a ``duplicate``.
        duplicate_by: what a ``duplicate`` repeated; None otherwise.
    """

    kind: WarehouseCancellationKind
    order_id: UUID
    event_id: UUID
    lines: tuple[OrderLine, ...] = ()
    discrepancies: tuple[Discrepancy, ...] = ()
    status: OrderStatus | None = None
    duplicate_by: DuplicateBy | None = None

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics: the kind, or ``duplicate:<by>``."""
        if self.duplicate_by is not None:
            return f"{self.kind}:{self.duplicate_by}"
        return str(self.kind)


class AdjustmentReason(StrEnum):
    """Why ``on_hand`` of a SKU changed (product contract, "Hearing back from the warehouse").

    The warehouse sends one of these; an operator's adjustment (``fulfilment stock adjust``)
    names one too, and says the rest in its comment.
    """

    RECEIVED = "received"
    RETURNED = "returned"
    FOUND = "found"
    COUNTED = "counted"
    DAMAGED = "damaged"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class OperatorIdentity:
    """Who recorded an operator's adjustment, as ``fulfilment dlq replay`` records a replay.

    ``operator`` is the name given (``--operator``, else the OS user), ``comment`` the why,
    ``os_user`` and ``host`` where the command ran (None when unknown).
    """

    operator: str
    comment: str | None
    os_user: str | None
    host: str | None


@dataclass(frozen=True, slots=True)
class RecordAdjustment(Command["AdjustmentOutcome"]):
    """Command: ``on_hand`` of ``sku`` changed by ``delta`` in the warehouse.

    Attributes:
        event_id: :func:`warehouse_event_id` of ``("adjustment", adjustment_id)``.
        adjustment_id: the warehouse's id of the adjustment (an operator's: ``op-<uuid>``),
            its idempotency key.
        webhook_id: the ``webhook-id`` that brought it; None for an operator's.
        sku: the SKU; one unknown to the service is created by a positive delta.
        delta: units, non-zero; negative for units that left the shelf other than by shipment.
        reason: why.
        occurred_at: when it happened in the warehouse, timezone-aware.
        source: ``webhook`` or ``operator``.
        operator: who recorded it, for ``operator`` adjustments only.
    """

    event_id: UUID
    adjustment_id: str
    webhook_id: str | None
    sku: str
    delta: int
    reason: AdjustmentReason
    occurred_at: datetime
    source: Source
    operator: OperatorIdentity | None = None


class AdjustmentKind(StrEnum):
    """How the processing of one adjustment ended."""

    ADJUSTED = "adjusted"
    """``on_hand`` changed by the applied units (all of ``delta``, or down to 0 with the rest
    a ``more_than_on_hand`` discrepancy); ``stock.adjusted`` says so."""
    DUPLICATE = "duplicate"
    """This adjustment (or this webhook) was applied before; nothing changed."""


@dataclass(frozen=True, slots=True)
class AdjustmentOutcome:
    """Result of ``Stock.apply`` of a :class:`RecordAdjustment`.

    Attributes:
        kind: how it ended.
        sku: the SKU it named.
        event_id: the command's event id.
        on_hand: the SKU's ``on_hand`` after it (0 for a duplicate: not looked at).
        reserved: the SKU's ``reserved`` after it (0 for a duplicate).
        applied: the units ``on_hand`` changed by: ``delta``, or ``-on_hand`` when a loss
            was larger than the shelf.
        discrepancy: the units of a loss beyond ``on_hand`` (``applied - delta``), >= 0.
        duplicate_by: what a ``duplicate`` repeated; None otherwise.
        reason: the command's reason (what the metrics count adjustments by).
        discrepancies: the ``warehouse_discrepancies`` row it kept: one ``more_than_on_hand``
            of the SKU and :attr:`discrepancy` units, or none.
    """

    kind: AdjustmentKind
    sku: str
    event_id: UUID
    on_hand: int = 0
    reserved: int = 0
    applied: int = 0
    discrepancy: int = 0
    duplicate_by: DuplicateBy | None = None
    reason: AdjustmentReason | None = None
    discrepancies: tuple[Discrepancy, ...] = ()

    @property
    def short(self) -> int:
        """Units the SKU is short by after it: ``reserved - on_hand`` when positive, else 0."""
        return max(0, self.reserved - self.on_hand)

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics: the kind, or ``duplicate:<by>``."""
        if self.duplicate_by is not None:
            return f"{self.kind}:{self.duplicate_by}"
        return str(self.kind)
