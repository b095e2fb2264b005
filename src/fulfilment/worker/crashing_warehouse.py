"""``CrashingWarehouse``: the fault suite's crash points, around the warehouse port.

``main`` wraps the PostgreSQL warehouse in it only when ``FULFILMENT_FAULT_INJECTION`` arms a
plan (``worker.fault_injection``), so neither the handler, the delivery policy nor the
warehouse knows of crash injection, and production runs none of it. A module apart from the
plan because the settings validate the plan: they need not load the PostgreSQL adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from fulfilment.adapters.postgres.warehouse import (
    cancel_orders_statement,
    reserve_orders_statement,
    ship_orders_statement,
)
from fulfilment.application.ports import Warehouse
from fulfilment.worker.fault_injection import CrashPoint, FaultPlan, crash

if TYPE_CHECKING:
    from typing import Any
    from uuid import UUID

    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine

    from fulfilment.domain.lifecycle import CancelOrder, CancelOutcome, ShipOrder, ShipOutcome
    from fulfilment.domain.model import ReservationOutcome, ReserveStock, StockLevel
    from fulfilment.worker.fault_injection import Command


class CrashingWarehouse(Warehouse):
    """``inner``, killing the process at the crash points of ``plan`` around each transition.

    Args:
        inner: the warehouse every call goes to.
        plan: where and how often to crash (an armed plan).
        engine: the engine of ``inner``'s database, for the ``in_transaction`` point: that
            point runs the event's function (``place_orders()``, ``cancel_orders()`` or
            ``ship_orders()``, its outbox rows included) in a transaction of its own and dies
            before ``COMMIT``, which ``inner`` (one autocommit statement) never leaves open.
        consumer: the inbox namespace ``inner`` writes under (``FULFILMENT_CONSUMER_NAME``).

    The delivery policy counts a redelivery before it calls the handler, so a message that
    crashes every worker at ``before_transaction`` is still dead-lettered as ``poison``.
    """

    def __init__(
        self, inner: Warehouse, plan: FaultPlan, *, engine: AsyncEngine, consumer: str
    ) -> None:
        self._inner = inner
        self._plan = plan
        self._engine = engine
        self._consumer = consumer

    async def reserve(self, command: ReserveStock) -> ReservationOutcome:
        """``inner.reserve(command)``, unless a crash point of the plan kills the process."""
        if self._plan.crashes_at(CrashPoint.BEFORE_TRANSACTION, command):
            crash(CrashPoint.BEFORE_TRANSACTION, command.event_id)
        if self._plan.crashes_at(CrashPoint.IN_TRANSACTION, command):
            await self._crash_in_transaction(
                command, *reserve_orders_statement(self._consumer, [command])
            )
        outcome = await self._inner.reserve(command)
        if self._plan.crashes_at(CrashPoint.AFTER_COMMIT, command):
            crash(CrashPoint.AFTER_COMMIT, command.event_id)
        return outcome

    async def cancel(self, command: CancelOrder) -> CancelOutcome:
        """``inner.cancel(command)``, unless a crash point of the plan kills the process."""
        if self._plan.crashes_at(CrashPoint.BEFORE_TRANSACTION, command):
            crash(CrashPoint.BEFORE_TRANSACTION, command.event_id)
        if self._plan.crashes_at(CrashPoint.IN_TRANSACTION, command):
            await self._crash_in_transaction(
                command, *cancel_orders_statement(self._consumer, [command])
            )
        outcome = await self._inner.cancel(command)
        if self._plan.crashes_at(CrashPoint.AFTER_COMMIT, command):
            crash(CrashPoint.AFTER_COMMIT, command.event_id)
        return outcome

    async def ship(self, command: ShipOrder) -> ShipOutcome:
        """``inner.ship(command)``, unless a crash point of the plan kills the process."""
        if self._plan.crashes_at(CrashPoint.BEFORE_TRANSACTION, command):
            crash(CrashPoint.BEFORE_TRANSACTION, command.event_id)
        if self._plan.crashes_at(CrashPoint.IN_TRANSACTION, command):
            await self._crash_in_transaction(
                command, *ship_orders_statement(self._consumer, [command])
            )
        outcome = await self._inner.ship(command)
        if self._plan.crashes_at(CrashPoint.AFTER_COMMIT, command):
            crash(CrashPoint.AFTER_COMMIT, command.event_id)
        return outcome

    async def _crash_in_transaction(
        self, command: Command, statement: sa.TextClause, arguments: dict[str, Any]
    ) -> None:
        # Every write of the event is done (its inbox row, the transition, the outbox rows)
        # and the process dies before COMMIT, so PostgreSQL must roll it all back.
        async with self._engine.connect() as connection, connection.begin():
            await connection.execute(statement, arguments)
            crash(CrashPoint.IN_TRANSACTION, command.event_id)

    async def count_redelivery(self, event_id: UUID) -> int:
        """``inner.count_redelivery(event_id)``."""
        return await self._inner.count_redelivery(event_id)

    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        """``inner.put_stock(on_hand)``."""
        await self._inner.put_stock(on_hand)

    async def stock(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        """``inner.stock(skus)``."""
        return await self._inner.stock(skus)
