"""The operators' reads of what the warehouse told the service, and the replay's record.

``fulfilment warehouse invalid-webhooks|invalid-webhook|replay-webhook|discrepancies`` and
``fulfilment report`` read through these functions:

- ``invalid_webhooks`` (migration 0014): a signed webhook that was no valid event of its type,
  kept once per webhook id by the intake with its headers (the signature left out), raw body
  and reason. :func:`record_replay` marks one replayed and writes its audit row
  (``invalid_webhook_audit``) in one transaction, as ``dlq replay`` writes
  ``dead_letter_audit``;
- ``warehouse_discrepancies``: what a shipment or a cancellation of the warehouse named that
  its order did not hold;
- :func:`warehouse_counts`: the shipments, cancellations, discrepancies and kept webhooks
  counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fulfilment.adapters.postgres.dead_letter_audit import Operator
from fulfilment.adapters.postgres.tables.stock import reservations
from fulfilment.adapters.postgres.tables.warehouse import (
    invalid_webhook_audit,
    invalid_webhooks,
    warehouse_cancellations,
    warehouse_discrepancies,
    warehouse_shipments,
)
from fulfilment.domain.lifecycle import OrderStatus


@dataclass(frozen=True, slots=True)
class KeptWebhook:
    """One kept webhook (a row of ``invalid_webhooks``; the intake writes it).

    Attributes:
        webhook_id: the sender's ``webhook-id``, the row's key.
        type: the body's ``type`` when it could be read, else None.
        received_at: when the intake first kept it (a retry of it changes nothing).
        headers: the request's headers, ``webhook-signature`` left out.
        body: the raw body, as received.
        reason: why the intake refused it (422).
        replayed_at: when an operator replayed it; None while it is waiting.
        replay_outcome: how the replay ended (the command's outcome label); None before.
    """

    webhook_id: str
    type: str | None
    received_at: datetime
    headers: Mapping[str, Any]
    body: bytes
    reason: str
    replayed_at: datetime | None
    replay_outcome: str | None


@dataclass(frozen=True, slots=True)
class Discrepancy:
    """One row of ``warehouse_discrepancies`` (docs/design.md, "Hearing back from the warehouse").

    Attributes:
        id: the row's number, in the order they were found.
        kind: ``unknown_order``, ``order_not_reserved``, ``more_than_held``, ``sku_not_held``
            or ``more_than_on_hand`` (a loss larger than on hand).
        source: ``shipment``, ``cancellation`` or ``adjustment``; ``source_id`` its warehouse
            id.
        order_id: the order it named; None for an adjustment's.
        sku, quantity: the SKU and the units not held (the excess for ``more_than_held``);
            None for a discrepancy of the whole order.
        order_status: the order's status when it was found, None for an unknown order.
        detected_at: when it was found.
    """

    id: int
    kind: str
    source: str
    source_id: str
    order_id: UUID | None
    sku: str | None
    quantity: int | None
    order_status: str | None
    detected_at: datetime


async def find_invalid_webhooks(
    engine: AsyncEngine, *, limit: int, replayed: bool
) -> tuple[list[KeptWebhook], int]:
    """At most ``limit`` kept webhooks, oldest first, and how many match in all.

    ``replayed`` False: those still waiting (``replayed_at`` null); True: every kept one.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the query.
        OSError: the database cannot be reached.
    """
    waiting = sa.true() if replayed else invalid_webhooks.c.replayed_at.is_(None)
    query = (
        sa.select(invalid_webhooks)
        .where(waiting)
        .order_by(invalid_webhooks.c.received_at, invalid_webhooks.c.webhook_id)
        .limit(limit)
    )
    total = sa.select(sa.func.count()).select_from(invalid_webhooks).where(waiting)
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).mappings().all()
        count = (await connection.execute(total)).scalar_one()
    return [_invalid_webhook(row) for row in rows], int(count)


async def get_invalid_webhook(engine: AsyncEngine, webhook_id: str) -> KeptWebhook | None:
    """The kept webhook of ``webhook_id``, or None.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the query.
        OSError: the database cannot be reached.
    """
    query = sa.select(invalid_webhooks).where(invalid_webhooks.c.webhook_id == webhook_id)
    async with engine.connect() as connection:
        row = (await connection.execute(query)).mappings().one_or_none()
    return None if row is None else _invalid_webhook(row)


async def record_replay(
    engine: AsyncEngine,
    webhook_id: str,
    *,
    outcome: str,
    operator: Operator,
    comment: str | None,
) -> datetime | None:
    """Mark ``webhook_id`` replayed with ``outcome`` and write its audit row, in one transaction.

    Called after ``Stock.apply`` committed the webhook's command: a crash between the two
    leaves the row waiting, and replaying it again applies nothing twice (the webhook's id is
    in ``webhook_inbox``: the outcome is then ``duplicate``). The audit row's ``operator`` is
    the stated name, else the OS user (:class:`Operator`); the database adds its session
    role as ``database_user``.

    Returns:
        When it was marked replayed; None when it is not waiting any more (replayed by another
        operator meanwhile, or gone): then no audit row is written.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the statements.
        OSError: the database cannot be reached.
    """
    mark = (
        invalid_webhooks.update()
        .where(
            invalid_webhooks.c.webhook_id == webhook_id,
            invalid_webhooks.c.replayed_at.is_(None),
        )
        .values(replayed_at=sa.func.now(), replay_outcome=outcome)
        .returning(invalid_webhooks.c.replayed_at)
    )
    async with engine.begin() as connection:
        replayed_at: datetime | None = (await connection.execute(mark)).scalar_one_or_none()
        if replayed_at is None:
            return None
        await connection.execute(
            invalid_webhook_audit.insert().values(
                webhook_id=webhook_id,
                action="replayed",
                outcome=outcome,
                operator=operator.name,
                comment=comment,
                os_user=operator.os_user,
                host=operator.host,
            )
        )
    return replayed_at


async def find_discrepancies(
    engine: AsyncEngine, *, limit: int, kinds: tuple[str, ...] = ()
) -> tuple[list[Discrepancy], int]:
    """At most ``limit`` discrepancies of ``kinds``, newest first, and how many match in all.

    ``kinds`` empty: every kind.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the query.
        OSError: the database cannot be reached.
    """
    chosen = warehouse_discrepancies.c.kind.in_(kinds) if kinds else sa.true()
    query = (
        sa.select(warehouse_discrepancies)
        .where(chosen)
        .order_by(warehouse_discrepancies.c.id.desc())
        .limit(limit)
    )
    total = sa.select(sa.func.count()).select_from(warehouse_discrepancies).where(chosen)
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).mappings().all()
        count = (await connection.execute(total)).scalar_one()
    return [Discrepancy(**dict(row)) for row in rows], int(count)


@dataclass(frozen=True, slots=True)
class WarehouseCounts:
    """What the warehouse told the service, counted (``fulfilment report``).

    Attributes:
        shipments_by_source: shipments recorded, by ``webhook`` or ``poll``.
        shipments_by_outcome: the same by outcome (``shipped``, ``already_shipped``,
            ``discrepancy``).
        orders_shipped_in_part: orders a warehouse shipment took units from that still hold
            some (``reserved``).
        orders_shipped_in_whole: orders a warehouse shipment took units from that hold none
            (``shipped``).
        cancellations_by_source, cancellations_by_outcome: the warehouse's cancellations
            recorded, by source and by outcome (``released``, ``ignored``, ``discrepancy``).
        discrepancies_by_kind: discrepancies kept, by kind.
        invalid_webhooks_kept: kept webhooks waiting for an operator.
        invalid_webhooks_replayed: kept webhooks an operator replayed.
    """

    shipments_by_source: dict[str, int] = field(default_factory=dict)
    shipments_by_outcome: dict[str, int] = field(default_factory=dict)
    orders_shipped_in_part: int = 0
    orders_shipped_in_whole: int = 0
    cancellations_by_source: dict[str, int] = field(default_factory=dict)
    cancellations_by_outcome: dict[str, int] = field(default_factory=dict)
    discrepancies_by_kind: dict[str, int] = field(default_factory=dict)
    invalid_webhooks_kept: int = 0
    invalid_webhooks_replayed: int = 0

    @property
    def any_recorded(self) -> bool:
        """Whether the warehouse told the service anything yet (or something waits on it)."""
        return bool(
            self.shipments_by_source
            or self.cancellations_by_source
            or self.discrepancies_by_kind
            or self.invalid_webhooks_kept
            or self.invalid_webhooks_replayed
        )


async def warehouse_counts(engine: AsyncEngine) -> WarehouseCounts:
    """:class:`WarehouseCounts`, read in one repeatable-read snapshot.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed a query.
        OSError: the database cannot be reached.
    """
    shipped_orders = (
        sa.select(reservations.c.status, sa.func.count(sa.distinct(reservations.c.order_id)))
        .select_from(
            warehouse_shipments.join(
                reservations, reservations.c.order_id == warehouse_shipments.c.order_id
            )
        )
        .where(warehouse_shipments.c.outcome == "shipped")
        .group_by(reservations.c.status)
    )
    kept = sa.select(
        sa.func.count().filter(invalid_webhooks.c.replayed_at.is_(None)),
        sa.func.count().filter(invalid_webhooks.c.replayed_at.is_not(None)),
    )
    async with engine.connect() as plain:
        connection = await plain.execution_options(isolation_level="REPEATABLE READ")
        async with connection.begin():
            shipments_by_source = await _grouped(connection, warehouse_shipments, "source")
            shipments_by_outcome = await _grouped(connection, warehouse_shipments, "outcome")
            by_status = {
                str(status): int(count)
                for status, count in await connection.execute(shipped_orders)
            }
            cancellations_by_source = await _grouped(connection, warehouse_cancellations, "source")
            cancellations_by_outcome = await _grouped(
                connection, warehouse_cancellations, "outcome"
            )
            discrepancies = await _grouped(connection, warehouse_discrepancies, "kind")
            waiting, replayed = (await connection.execute(kept)).one()
    return WarehouseCounts(
        shipments_by_source=shipments_by_source,
        shipments_by_outcome=shipments_by_outcome,
        orders_shipped_in_part=by_status.get(str(OrderStatus.RESERVED), 0),
        orders_shipped_in_whole=by_status.get(str(OrderStatus.SHIPPED), 0),
        cancellations_by_source=cancellations_by_source,
        cancellations_by_outcome=cancellations_by_outcome,
        discrepancies_by_kind=discrepancies,
        invalid_webhooks_kept=int(waiting),
        invalid_webhooks_replayed=int(replayed),
    )


async def _grouped(connection: AsyncConnection, table: sa.Table, column: str) -> dict[str, int]:
    """Rows of ``table`` counted by ``column``, keys in code-point order."""
    query = sa.select(table.c[column], sa.func.count()).group_by(table.c[column])
    rows = await connection.execute(query)
    return dict(sorted((str(value), int(count)) for value, count in rows))


def _invalid_webhook(row: sa.RowMapping) -> KeptWebhook:
    return KeptWebhook(
        webhook_id=row["webhook_id"],
        type=row["type"],
        received_at=row["received_at"],
        headers=row["headers"],
        body=bytes(row["body"]),
        reason=row["reason"],
        replayed_at=row["replayed_at"],
        replay_outcome=row["replay_outcome"],
    )
