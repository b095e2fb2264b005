"""Hand-written fakes of the application's ports, for tests of the layers above them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from uuid import UUID

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.application.ports import Warehouse
from fulfilment.domain.model import (
    DuplicateOf,
    OutcomeKind,
    RejectionReason,
    ReservationOutcome,
    ReserveStock,
    StockLevel,
    aggregate_demand,
    decide,
)


@dataclass(frozen=True)
class Reservation:
    """What the fake keeps per order, like a row of ``reservations`` with its lines."""

    event_id: UUID
    reason: RejectionReason | None
    skus: tuple[str, ...]
    lines: dict[str, int] = field(default_factory=dict)


class InMemoryWarehouse(Warehouse):
    """The ``Warehouse`` in memory, with the rules of ``PostgresWarehouse``.

    An inbox keyed on ``(consumer, event_id)`` makes ``reserve`` idempotent, an order placed by
    one event is a ``duplicate`` of ``order`` under any other, and one lock serialises the calls
    the way the database's row locks do. ``inbox`` maps each key to its outcome label
    (``reserved``, ``rejected`` or ``duplicate_order``, as the database's column does).
    """

    def __init__(self, *, consumer: str = "fulfilment") -> None:
        self.consumer = consumer
        self.levels: dict[str, StockLevel] = {}
        self.inbox: dict[tuple[str, UUID], str] = {}
        self.reservations: dict[UUID, Reservation] = {}
        self.redeliveries: dict[tuple[str, UUID], int] = {}
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
            if command.order_id in self.reservations:
                self.inbox[key] = "duplicate_order"
                return self._duplicate(command, DuplicateOf.ORDER)
            decision = decide(
                demand, {sku: self.levels[sku] for sku in demand if sku in self.levels}
            )
            if decision.reason is None:
                for sku, units in demand.items():
                    level = self.levels[sku]
                    self.levels[sku] = StockLevel(level.on_hand, level.reserved + units)
            skus = tuple(sorted(decision.skus))
            self.reservations[command.order_id] = Reservation(
                command.event_id, decision.reason, skus, dict(demand)
            )
            self.inbox[key] = "reserved" if decision.reason is None else "rejected"
            return ReservationOutcome(
                kind=OutcomeKind.RESERVED if decision.reason is None else OutcomeKind.REJECTED,
                order_id=command.order_id,
                event_id=command.event_id,
                reason=decision.reason,
                skus=skus,
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

    @staticmethod
    def _duplicate(command: ReserveStock, of: DuplicateOf) -> ReservationOutcome:
        return ReservationOutcome(
            kind=OutcomeKind.DUPLICATE,
            order_id=command.order_id,
            event_id=command.event_id,
            duplicate_of=of,
        )
