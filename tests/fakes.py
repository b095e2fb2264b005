"""Hand-written fakes of the application's ports, for tests of the layers above them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.application.ports import Warehouse
from fulfilment.domain.lifecycle import (
    CancelKind,
    CancelOrder,
    CancelOutcome,
    OrderState,
    OrderStatus,
    ShipKind,
    ShipOrder,
    ShipOutcome,
    Tombstone,
    apply_cancelled,
    apply_placed,
    apply_shipped,
    as_lines,
    released,
    shipped,
)
from fulfilment.domain.model import (
    DuplicateOf,
    OutcomeKind,
    RejectionReason,
    ReservationOutcome,
    ReserveStock,
    StockLevel,
    aggregate_demand,
)
from fulfilment.observability.tracing import current_traceparent

CANCEL_INBOX_OUTCOMES = {
    CancelKind.RELEASED: "released",
    CancelKind.PARTIALLY_RELEASED: "partially_released",
    CancelKind.TOMBSTONED: "tombstoned",
    CancelKind.IGNORED: "cancel_ignored",
    CancelKind.CANCEL_AFTER_SHIP: "cancel_after_ship",
}
"""The ``inbox_messages.outcome`` of each recorded cancel, as ``cancel_orders()`` writes it."""

SHIP_INBOX_OUTCOMES = {ShipKind.SHIPPED: "shipped", ShipKind.IGNORED: "ship_ignored"}
"""The ``inbox_messages.outcome`` of each recorded shipment, as ``ship_orders()`` writes it
(``not_reserved`` is not recorded)."""


@dataclass(frozen=True)
class RecordedEvent:
    """A result event as the outbox holds it, less what is minted with the row.

    ``body`` is the message without ``event_id`` and ``occurred_at`` (a new UUID and the
    transaction's time, which no two warehouses share); ``traceparent`` the trace context of
    the span current when it was written (the delivery's).
    """

    routing_key: str
    body: Mapping[str, Any]
    traceparent: str | None = None

    @property
    def order_id(self) -> str:
        """The ``order_id`` of the body."""
        return str(self.body["order_id"])


def result_body(command: ReserveStock | CancelOrder | ShipOrder, **fields: Any) -> dict[str, Any]:
    """The body of the result event ``command`` caused, less ``event_id`` and ``occurred_at``.

    ``fields`` are its kind's own (``lines`` as order lines, ``reason``, ``skus``,
    ``order_status``), as the product contract's "Result events" gives them.
    """
    body: dict[str, Any] = {
        "version": 1,
        "causation_id": str(command.event_id),
        "order_id": str(command.order_id),
    }
    for name, value in fields.items():
        body[name] = (
            [{"sku": line.sku, "quantity": line.quantity} for line in value]
            if name == "lines"
            else value
        )
    return body


@dataclass(frozen=True)
class Reservation:
    """What the fake keeps per order, like a row of ``reservations`` with its lines.

    ``event_id`` is the event that placed the order (None for a tombstone); ``lines`` are its
    ``reservation_lines``; ``tombstone`` is what cancels said before it was placed.
    """

    event_id: UUID | None
    reason: RejectionReason | None
    skus: tuple[str, ...]
    lines: dict[str, int] = field(default_factory=dict)
    status: OrderStatus = OrderStatus.RESERVED
    tombstone: Tombstone | None = None

    @property
    def state(self) -> OrderState:
        """The order's state, as the lifecycle's transition functions take it."""
        return OrderState(self.status, self.lines, self.tombstone)

    def after(self, state: OrderState) -> Reservation:
        """This row once the order is in ``state`` (placement, reason and SKUs kept)."""
        return Reservation(
            self.event_id, self.reason, self.skus, dict(state.lines), state.status, state.tombstone
        )


class InMemoryWarehouse(Warehouse):
    """The ``Warehouse`` in memory, with the rules of ``PostgresWarehouse``.

    An inbox keyed on ``(consumer, event_id)`` makes every event idempotent, an order placed by
    one event is a ``duplicate`` of ``order`` under any other, and one lock serialises the calls
    the way the database's row locks do. ``inbox`` maps each key to its outcome label
    (``reserved``, ``rejected``, ``duplicate_order``, and those of
    :data:`CANCEL_INBOX_OUTCOMES` and :data:`SHIP_INBOX_OUTCOMES`, as the database's column
    does). Every transition is the one of ``fulfilment.domain.lifecycle``. ``result_events``
    lists the result events in the order they were written, as the functions write them to the
    outbox: one per change of a reservation's status and per partial release, none for a
    tombstone, a duplicate or an event that changes nothing.
    """

    def __init__(self, *, consumer: str = "fulfilment") -> None:
        self.consumer = consumer
        self.levels: dict[str, StockLevel] = {}
        self.inbox: dict[tuple[str, UUID], str] = {}
        self.reservations: dict[UUID, Reservation] = {}
        self.redeliveries: dict[tuple[str, UUID], int] = {}
        self.result_events: list[RecordedEvent] = []
        self._lock = asyncio.Lock()

    async def count_redelivery(self, event_id: UUID) -> int:
        key = (self.consumer, event_id)
        self.redeliveries[key] = self.redeliveries.get(key, 0) + 1
        return self.redeliveries[key]

    async def reserve(self, command: ReserveStock) -> ReservationOutcome:
        demand = aggregate_demand(command.lines)
        if not demand:
            msg = f"order {command.order_id} has no lines"
            raise ValueError(msg)
        async with self._lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return self._duplicate(command, DuplicateOf.EVENT)
            existing = self.reservations.get(command.order_id)
            placement = apply_placed(
                None if existing is None else existing.state,
                demand,
                {sku: self.levels[sku] for sku in demand if sku in self.levels},
            )
            if placement.decision is None:
                self.inbox[key] = "duplicate_order"
                return self._duplicate(command, DuplicateOf.ORDER)
            reason = placement.decision.reason
            if reason is None:
                for sku, units in placement.state.lines.items():
                    level = self.levels[sku]
                    self.levels[sku] = StockLevel(level.on_hand, level.reserved + units)
            skus = tuple(sorted(placement.decision.skus))
            self.reservations[command.order_id] = Reservation(
                command.event_id,
                reason,
                skus,
                dict(placement.state.lines),
                placement.state.status,
                placement.state.tombstone,
            )
            self.inbox[key] = "reserved" if reason is None else "rejected"
            if reason is None:
                self._record("stock.reserved", command, lines=as_lines(placement.state.lines))
            else:
                # A rejection as cancelled names every SKU the order asked for.
                named = sorted(demand) if reason is RejectionReason.CANCELLED else skus
                self._record("stock.rejected", command, reason=str(reason), skus=list(named))
            return ReservationOutcome(
                kind=OutcomeKind.RESERVED if reason is None else OutcomeKind.REJECTED,
                order_id=command.order_id,
                event_id=command.event_id,
                reason=reason,
                skus=skus,
            )

    async def cancel(self, command: CancelOrder) -> CancelOutcome:
        if command.lines is not None and not command.lines:
            msg = f"the cancel of order {command.order_id} names no lines"
            raise ValueError(msg)
        async with self._lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return CancelOutcome(CancelKind.DUPLICATE, command.order_id, command.event_id)
            existing = self.reservations.get(command.order_id)
            cancellation = apply_cancelled(
                None if existing is None else existing.state, command.cancelled()
            )
            for sku, units in cancellation.lines.items():
                self.levels[sku] = released(self.levels[sku], units)
            self.reservations[command.order_id] = (
                Reservation(
                    None,
                    None,
                    (),
                    status=cancellation.state.status,
                    tombstone=cancellation.state.tombstone,
                )
                if existing is None
                else existing.after(cancellation.state)
            )
            self.inbox[key] = CANCEL_INBOX_OUTCOMES[cancellation.kind]
            if cancellation.lines:
                self._record(
                    "stock.released",
                    command,
                    lines=as_lines(cancellation.lines),
                    order_status=str(cancellation.state.status),
                )
            return CancelOutcome(
                cancellation.kind,
                command.order_id,
                command.event_id,
                as_lines(cancellation.lines),
                cancellation.state.status,
            )

    async def ship(self, command: ShipOrder) -> ShipOutcome:
        async with self._lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return ShipOutcome(ShipKind.DUPLICATE, command.order_id, command.event_id)
            existing = self.reservations.get(command.order_id)
            shipment = apply_shipped(None if existing is None else existing.state)
            status = None if shipment.state is None else shipment.state.status
            if shipment.kind is ShipKind.NOT_RESERVED:
                return ShipOutcome(shipment.kind, command.order_id, command.event_id, (), status)
            for sku, units in shipment.lines.items():
                self.levels[sku] = shipped(self.levels[sku], units)
            if existing is not None and shipment.state is not None:
                self.reservations[command.order_id] = existing.after(shipment.state)
            self.inbox[key] = SHIP_INBOX_OUTCOMES[shipment.kind]
            if shipment.lines:
                self._record("stock.shipped", command, lines=as_lines(shipment.lines))
            return ShipOutcome(
                shipment.kind,
                command.order_id,
                command.event_id,
                as_lines(shipment.lines),
                status,
            )

    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        if any(units < 0 for units in on_hand.values()):
            msg = "on_hand must be >= 0"
            raise ValueError(msg)
        async with self._lock:
            below = [
                sku
                for sku, units in on_hand.items()
                if sku in self.levels and units < self.levels[sku].reserved
            ]
            if below:
                raise StockBelowReservedError(below)
            for sku, units in on_hand.items():
                reserved = self.levels[sku].reserved if sku in self.levels else 0
                self.levels[sku] = StockLevel(units, reserved)

    async def stock(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        return {sku: self.levels[sku] for sku in skus if sku in self.levels}

    def _record(
        self, routing_key: str, command: ReserveStock | CancelOrder | ShipOrder, **fields: Any
    ) -> None:
        self.result_events.append(
            RecordedEvent(routing_key, result_body(command, **fields), current_traceparent())
        )

    @staticmethod
    def _duplicate(command: ReserveStock, of: DuplicateOf) -> ReservationOutcome:
        return ReservationOutcome(
            kind=OutcomeKind.DUPLICATE,
            order_id=command.order_id,
            event_id=command.event_id,
            duplicate_of=of,
        )
