"""The fault suite's crash plan, and the warehouse and relay hooks that carry it out.

A worker or relay of the fault suite (``crashing.py``, beside this module, started instead of
``fulfilment worker``/``fulfilment relay`` when a scenario gives a plan) kills itself with
SIGKILL (no cleanup, no ack, no rollback: a crash, an OOM kill or a node loss look the same to
the broker and the database) at one of these points of a delivery of any event (an order
placed, cancelled or shipped):

``before_transaction``
    the event is validated (and a redelivery counted), nothing is written yet.
``in_transaction``
    the event's writes are done (inbox row, reservation, stock) but not committed. Each
    transition is one statement, so a client can only die inside it or after it; the armed
    path runs that statement in an explicit transaction and pauses before ``COMMIT``, and the
    database's ``client_connection_check_interval`` aborts the orphaned transaction.
``after_commit``
    the transaction is committed, the delivery is not acknowledged yet.

and, in the relay, at one of these points of a batch of outbox rows:

``before_publish``
    the batch is read, nothing of it is published yet.
``after_publish``
    the batch is published and confirmed by the broker, its rows are not marked yet (so
    they are published again, with the same ``event_id``, by the next relay).

The plan (:data:`CRASH_PLAN_VARIABLE`) is a comma-separated list of ``point:probability`` (each
delivery draws once per point), plus ``poison_sku:<SKU>`` to crash on every delivery of an
order, or a cancel of lines, holding that SKU:
``FULFILMENT_TEST_CRASH_PLAN="before_transaction:0.01,after_commit:0.01,poison_sku:POISON"``.

The production roots know nothing of it: the worker's root takes a wrapper of its warehouse
(``run_worker(wrap_warehouse=...)``) and the relay's a hooks object (``run_relay(hooks=...)``),
so neither the handler, the delivery policy nor the warehouse knows of crash injection.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import structlog

from fulfilment.adapters.postgres.warehouse import apply_statement
from fulfilment.application.ports import OutcomeT, Warehouse
from fulfilment.domain.lifecycle import CancelOrder
from fulfilment.domain.model import Command, ReserveStock
from fulfilment.relay.service import RelayHooks

if TYPE_CHECKING:
    from uuid import UUID

    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine

    from fulfilment.adapters.postgres.outbox import OutboxRow
    from fulfilment.domain.model import StockLevel

CRASH_PLAN_VARIABLE = "FULFILMENT_TEST_CRASH_PLAN"
"""The environment variable a crashing worker or relay reads its plan from (not a setting:
``FULFILMENT_TEST_*`` variables are the suite's own)."""


logger = structlog.get_logger("fulfilment.faults")


class CrashPoint(StrEnum):
    """Where in a delivery an injected crash happens."""

    BEFORE_TRANSACTION = "before_transaction"
    IN_TRANSACTION = "in_transaction"
    AFTER_COMMIT = "after_commit"
    BEFORE_PUBLISH = "before_publish"
    AFTER_PUBLISH = "after_publish"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Crash probabilities per point (0 to 1) and the SKUs that always crash."""

    probabilities: Mapping[CrashPoint, float] = field(default_factory=dict)
    poison_skus: frozenset[str] = frozenset()

    @property
    def armed(self) -> bool:
        """True when any crash can happen."""
        return bool(self.poison_skus) or any(p > 0 for p in self.probabilities.values())

    def crashes_at(self, point: CrashPoint, command: Command[Any] | None = None) -> bool:
        """Whether this delivery of ``command`` (None: the relay's batch) crashes at ``point``.

        Draws at random, except for a poison SKU, which always crashes.
        """
        lines = command.lines or () if isinstance(command, ReserveStock | CancelOrder) else ()
        if point is CrashPoint.BEFORE_TRANSACTION and any(
            line.sku in self.poison_skus for line in lines
        ):
            return True
        probability = self.probabilities.get(point, 0.0)
        return probability > 0 and random.random() < probability


def parse_fault_plan(text: str) -> FaultPlan:
    """Parse a plan (:data:`CRASH_PLAN_VARIABLE`); an empty string means no faults.

    Raises:
        ValueError: an unknown point, a probability outside 0..1, or a malformed item.
    """
    probabilities: dict[CrashPoint, float] = {}
    poison: set[str] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition(":")
        if name == "poison_sku" and value:
            poison.add(value)
            continue
        try:
            point = CrashPoint(name)
            probability = float(value)
        except ValueError:
            points = ", ".join(p.value for p in CrashPoint)
            msg = f"{item!r}: expected <point>:<probability> (point: {points}) or poison_sku:<SKU>"
            raise ValueError(msg) from None
        if not 0 <= probability <= 1:
            msg = f"{item!r}: probability must be between 0 and 1"
            raise ValueError(msg)
        probabilities[point] = probability
    return FaultPlan(probabilities, frozenset(poison))


def crash(point: CrashPoint, event_id: object) -> None:
    """Kill this process with SIGKILL, after one log line saying where and at which event."""
    logger.warning("fault.crash", point=str(point), event_id=str(event_id))
    os.kill(os.getpid(), signal.SIGKILL)


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
        """Wrap ``inner``; nothing is checked or opened here."""
        self._inner = inner
        self._plan = plan
        self._engine = engine
        self._consumer = consumer

    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:
        """``inner.apply(command)``, unless a crash point of the plan kills the process."""
        if self._plan.crashes_at(CrashPoint.BEFORE_TRANSACTION, command):
            crash(CrashPoint.BEFORE_TRANSACTION, command.event_id)
        if self._plan.crashes_at(CrashPoint.IN_TRANSACTION, command):
            await self._crash_in_transaction(command, *apply_statement(self._consumer, [command]))
        outcome = await self._inner.apply(command)
        if self._plan.crashes_at(CrashPoint.AFTER_COMMIT, command):
            crash(CrashPoint.AFTER_COMMIT, command.event_id)
        return outcome

    async def _crash_in_transaction(
        self, command: Command[Any], statement: sa.TextClause, arguments: dict[str, Any]
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


class CrashingRelayHooks(RelayHooks):
    """The relay's hooks, killing the process at the relay's crash points of ``plan``."""

    def __init__(self, plan: FaultPlan) -> None:
        """Crash as ``plan`` says (its ``before_publish`` and ``after_publish`` points)."""
        self._plan = plan

    def before_publish(self, batch: Sequence[OutboxRow]) -> None:
        """Crash before anything of ``batch`` is published, if the plan draws it."""
        if self._plan.crashes_at(CrashPoint.BEFORE_PUBLISH):
            crash(CrashPoint.BEFORE_PUBLISH, batch[0].event_id)

    def after_publish(self, batch: Sequence[OutboxRow]) -> None:
        """Crash once ``batch`` is confirmed and before its rows are marked, if drawn."""
        if self._plan.crashes_at(CrashPoint.AFTER_PUBLISH):
            crash(CrashPoint.AFTER_PUBLISH, batch[0].event_id)
