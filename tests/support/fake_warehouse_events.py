"""The warehouse's shipments, cancellations and adjustments in the in-memory stock store.

``FakeStock`` applies ``RecordShipment``, ``RecordWarehouseCancellation`` and
``RecordAdjustment`` through :class:`WarehouseEventsInMemory`, which keeps what migrations
0014 and 0016's tables keep (``webhook_inbox``, ``warehouse_shipments`` and their lines,
``warehouse_cancellations`` and their lines, ``warehouse_adjustments``,
``warehouse_discrepancies``) and runs ``fulfilment.domain.warehouse_lifecycle`` and
``fulfilment.domain.adjustments``, as ``record_shipments()``,
``record_warehouse_cancellations()`` and ``record_adjustments()`` do.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID

from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
)
from fulfilment.domain.adjustments import apply_adjustment
from fulfilment.domain.handoff import RequestKind, RequestStatus
from fulfilment.domain.lifecycle import OrderStatus, as_lines, released, shipped
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentOutcome,
    AdjustmentReason,
    Discrepancy,
    DiscrepancyKind,
    DuplicateBy,
    OperatorIdentity,
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)
from fulfilment.domain.warehouse_lifecycle import apply_shipment, apply_warehouse_cancellation

if TYPE_CHECKING:
    from tests.support.fakes import FakeStock


@dataclass(frozen=True)
class StoredShipment:
    """A row of ``warehouse_shipments`` with its lines.

    ``lines`` maps each SKU to ``(quantity as sent, merged; units taken from the order)``;
    ``outcome`` is how its first application ended (never ``duplicate``).
    """

    shipment_id: str
    order_id: UUID
    fulfilment_order_id: str
    webhook_id: str | None
    source: Source
    shipped_at: datetime
    carrier: str | None
    tracking_numbers: tuple[str, ...]
    tracking_url: str | None
    outcome: ShipmentKind
    lines: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class StoredCancellation:
    """A row of ``warehouse_cancellations`` with its lines.

    ``lines`` maps each SKU to ``(quantity cancelled, units released)``; for a cancellation of
    the whole order (``whole``), the lines are what it released.
    """

    cancellation_id: str
    order_id: UUID
    fulfilment_order_id: str
    webhook_id: str | None
    source: Source
    cancelled_at: datetime
    reason: str
    whole: bool
    outcome: WarehouseCancellationKind
    lines: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class StoredAdjustment:
    """A row of ``warehouse_adjustments``: ``applied`` the units ``on_hand`` changed by, the
    level after it, and for an operator's who recorded it."""

    adjustment_id: str
    sku: str
    delta: int
    applied: int
    reason: AdjustmentReason
    webhook_id: str | None
    source: Source
    occurred_at: datetime
    on_hand_after: int
    reserved_after: int
    operator: OperatorIdentity | None


@dataclass(frozen=True)
class StoredDiscrepancy:
    """A row of ``warehouse_discrepancies``: ``source`` is ``shipment``, ``cancellation`` or
    ``adjustment`` and ``source_id`` its warehouse id; an adjustment's names no order."""

    discrepancy: Discrepancy
    source: str
    source_id: str
    order_id: UUID | None


@dataclass
class WarehouseEventsInMemory:
    """The warehouse's events applied to ``stock``'s rows, under its lock.

    ``webhook_inbox`` maps ``(consumer, webhook_id)`` to ``(webhook type, outcome)``, the
    outcome a kind's value (``duplicate`` included: a repeat under a new webhook id is
    recorded too). A poll's command (no webhook id) records no inbox row.
    """

    stock: FakeStock
    webhook_inbox: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    shipments: dict[str, StoredShipment] = field(default_factory=dict)
    cancellations: dict[str, StoredCancellation] = field(default_factory=dict)
    adjustments: dict[str, StoredAdjustment] = field(default_factory=dict)
    discrepancies: list[StoredDiscrepancy] = field(default_factory=list)

    def _duplicate_by(
        self, webhook_id: str | None, change_id: str, seen: Container[str]
    ) -> DuplicateBy | None:
        """What makes this event a duplicate: its webhook id first, then its change's id."""
        if webhook_id is not None and (self.stock.consumer, webhook_id) in self.webhook_inbox:
            return DuplicateBy.WEBHOOK
        if change_id in seen:
            return DuplicateBy.CHANGE
        return None

    def _inbox(self, webhook_id: str | None, type_: str, outcome: str) -> None:
        if webhook_id is not None:
            self.webhook_inbox[(self.stock.consumer, webhook_id)] = (type_, outcome)

    def _news(self, order_id: UUID) -> None:
        """The order's fulfilment order had news now (``warehouse_requests.news_at``)."""
        request = self.stock.fulfilment_order(order_id)
        if request is not None:
            request.news_at = datetime.now(UTC)

    def nothing_left_to_cancel(self, order_id: UUID) -> None:
        """The order holds nothing now: a cancellation request of the shop's for it that was
        never sent is ``withdrawn`` (product contract, "Hearing back from the warehouse")."""
        for request in self.stock.requests:
            if (
                request.order_id == order_id
                and request.kind is RequestKind.CANCELLATION
                and request.status is RequestStatus.PENDING
            ):
                request.status = RequestStatus.WITHDRAWN
                request.answered_at = datetime.now(UTC)

    def _keep(
        self, found: tuple[Discrepancy, ...], source: str, source_id: str, order_id: UUID | None
    ) -> None:
        self.discrepancies += [StoredDiscrepancy(d, source, source_id, order_id) for d in found]

    async def record_shipment(self, command: RecordShipment) -> ShipmentOutcome:
        """Apply a shipment once per webhook id and once per ``shipment_id``."""
        units = command.shipped()
        async with self.stock.lock:
            by = self._duplicate_by(command.webhook_id, command.shipment_id, self.shipments)
            if by is not None:
                if by is DuplicateBy.CHANGE:
                    self._inbox(command.webhook_id, SHIPMENT_SHIPPED, ShipmentKind.DUPLICATE)
                return ShipmentOutcome(
                    ShipmentKind.DUPLICATE, command.order_id, command.event_id, duplicate_by=by
                )
            existing = self.stock.reservations.get(command.order_id)
            result = apply_shipment(None if existing is None else existing.state, units)
            for sku, taken in result.taken.items():
                self.stock.levels[sku] = shipped(self.stock.levels[sku], taken)
            if existing is not None and result.state is not None:
                self.stock.reservations[command.order_id] = existing.after(result.state)
                if result.taken and not result.state.held:
                    self.nothing_left_to_cancel(command.order_id)
            self.shipments[command.shipment_id] = StoredShipment(
                command.shipment_id,
                command.order_id,
                command.fulfilment_order_id,
                command.webhook_id,
                command.source,
                command.shipped_at,
                command.carrier,
                command.tracking_numbers,
                command.tracking_url,
                result.kind,
                {sku: (quantity, result.taken.get(sku, 0)) for sku, quantity in units.items()},
            )
            self._keep(result.discrepancies, "shipment", command.shipment_id, command.order_id)
            self._inbox(command.webhook_id, SHIPMENT_SHIPPED, result.kind)
            self._news(command.order_id)
            status = None if result.state is None else result.state.status
            if result.taken:
                self.stock.record_result(
                    "stock.shipped",
                    command,
                    lines=as_lines(result.taken),
                    shipment_id=command.shipment_id,
                    carrier=command.carrier,
                    tracking_numbers=list(command.tracking_numbers),
                    tracking_url=command.tracking_url,
                    order_status=str(status),
                )
            return ShipmentOutcome(
                result.kind,
                command.order_id,
                command.event_id,
                as_lines(result.taken),
                result.discrepancies,
                status,
            )

    async def record_cancellation(
        self, command: RecordWarehouseCancellation
    ) -> WarehouseCancellationOutcome:
        """Apply a cancellation once per webhook id and once per ``cancellation_id``."""
        asked = command.cancelled()
        async with self.stock.lock:
            by = self._duplicate_by(command.webhook_id, command.cancellation_id, self.cancellations)
            if by is not None:
                if by is DuplicateBy.CHANGE:
                    self._inbox(
                        command.webhook_id,
                        FULFILMENT_ORDER_CANCELLED,
                        WarehouseCancellationKind.DUPLICATE,
                    )
                return WarehouseCancellationOutcome(
                    WarehouseCancellationKind.DUPLICATE,
                    command.order_id,
                    command.event_id,
                    duplicate_by=by,
                )
            existing = self.stock.reservations.get(command.order_id)
            result = apply_warehouse_cancellation(
                None if existing is None else existing.state, asked
            )
            for sku, units in result.released.items():
                self.stock.levels[sku] = released(self.stock.levels[sku], units)
            if existing is not None and result.state is not None:
                self.stock.reservations[command.order_id] = existing.after(result.state)
                if result.released and not result.state.held:
                    self.nothing_left_to_cancel(command.order_id)
            lines = (
                {sku: (units, units) for sku, units in result.released.items()}
                if asked is None
                else {sku: (units, result.released.get(sku, 0)) for sku, units in asked.items()}
            )
            self.cancellations[command.cancellation_id] = StoredCancellation(
                command.cancellation_id,
                command.order_id,
                command.fulfilment_order_id,
                command.webhook_id,
                command.source,
                command.cancelled_at,
                command.reason,
                asked is None,
                result.kind,
                lines,
            )
            self._keep(
                result.discrepancies, "cancellation", command.cancellation_id, command.order_id
            )
            self._inbox(command.webhook_id, FULFILMENT_ORDER_CANCELLED, result.kind)
            self._news(command.order_id)
            status: OrderStatus | None = None if result.state is None else result.state.status
            if result.released:
                self.stock.record_result(
                    "stock.released",
                    command,
                    lines=as_lines(result.released),
                    order_status=str(status),
                    reason="warehouse_cancelled",
                    warehouse_reason=command.reason,
                )
            return WarehouseCancellationOutcome(
                result.kind,
                command.order_id,
                command.event_id,
                as_lines(result.released),
                result.discrepancies,
                status,
            )

    async def record_adjustment(self, command: RecordAdjustment) -> AdjustmentOutcome:
        """Apply an adjustment of ``on_hand`` once per webhook id and once per adjustment id."""
        async with self.stock.lock:
            by = self._duplicate_by(command.webhook_id, command.adjustment_id, self.adjustments)
            if by is not None:
                if by is DuplicateBy.CHANGE:
                    self._inbox(command.webhook_id, INVENTORY_ADJUSTED, AdjustmentKind.DUPLICATE)
                return AdjustmentOutcome(
                    AdjustmentKind.DUPLICATE,
                    command.sku,
                    command.event_id,
                    duplicate_by=by,
                    reason=command.reason,
                )
            adjusted = apply_adjustment(self.stock.levels.get(command.sku), command.delta)
            if adjusted.level is not None:
                self.stock.levels[command.sku] = adjusted.level
            on_hand, reserved = (
                (0, 0)
                if adjusted.level is None
                else (adjusted.level.on_hand, adjusted.level.reserved)
            )
            self.adjustments[command.adjustment_id] = StoredAdjustment(
                command.adjustment_id,
                command.sku,
                command.delta,
                adjusted.applied,
                command.reason,
                command.webhook_id,
                command.source,
                command.occurred_at,
                on_hand,
                reserved,
                command.operator,
            )
            found = (
                (
                    Discrepancy(
                        DiscrepancyKind.MORE_THAN_ON_HAND, command.sku, adjusted.discrepancy, None
                    ),
                )
                if adjusted.discrepancy
                else ()
            )
            self._keep(found, "adjustment", command.adjustment_id, None)
            self._inbox(command.webhook_id, INVENTORY_ADJUSTED, AdjustmentKind.ADJUSTED)
            self.stock.record_sku_result(
                "stock.adjusted",
                causation_id=str(command.event_id),
                adjustment_id=command.adjustment_id,
                sku=command.sku,
                delta=command.delta,
                applied=adjusted.applied,
                reason=str(command.reason),
                source=str(command.source),
                on_hand=on_hand,
                reserved=reserved,
                available=max(0, on_hand - reserved),
            )
            return AdjustmentOutcome(
                AdjustmentKind.ADJUSTED,
                command.sku,
                command.event_id,
                on_hand,
                reserved,
                adjusted.applied,
                adjusted.discrepancy,
                reason=command.reason,
                discrepancies=found,
            )
