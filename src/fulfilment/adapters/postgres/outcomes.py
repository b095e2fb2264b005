"""Outcome counts and the stock invariants, read from one snapshot of the database."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fulfilment.adapters.postgres.tables.handoff import warehouse_requests
from fulfilment.adapters.postgres.tables.stock import (
    inbox_messages,
    inbox_pruned,
    outbox,
    reservation_lines,
    reservations,
    stock_levels,
)
from fulfilment.adapters.postgres.tables.warehouse import (
    warehouse_adjustments,
    warehouse_cancellations,
    warehouse_shipments,
)
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import RejectionReason

MISMATCH_EXAMPLES = 10
"""How many disagreeing SKUs :class:`InvariantChecks` names (the count covers them all)."""


@dataclass(frozen=True, slots=True)
class InvariantChecks:
    """What must always hold (docs/guarantees.md), with counts of what does not.

    Attributes:
        stock_out_of_bounds: SKUs with ``reserved < 0`` or ``on_hand < 0`` (the CHECK
            constraint of ``stock_levels`` makes those 0 unless it was dropped), or with
            ``reserved > on_hand`` although no loss of the SKU was ever reported: a short SKU
            whose shortfall no ``warehouse_adjustments`` row of a negative delta explains
            (the service itself never reserves beyond ``on_hand``). A SKU short after a
            reported loss is not a violation: :class:`Shortage` counts it.
        reserved_mismatches: SKUs whose ``reserved`` differs from the units the reserved
            orders hold, their ``reservation_lines`` less what shipped of them (``quantity -
            shipped``; either side missing counts as 0): an order shipped in part by the
            warehouse holds the rest.
        reserved_mismatch_examples: up to :data:`MISMATCH_EXAMPLES` of those SKUs, in
            code-point order.
        inbox_unaccounted: the events that placed an order, and those that ended one, minus
            the orders they did that to; 0 when every such event left exactly one trace. An
            order is placed by one event (an inbox ``reserved`` or ``rejected`` row; every
            order but a tombstone is placed). It is ended, left holding nothing as
            ``released`` or ``shipped``, by at most one event (later ones find nothing to
            release or ship): an inbox ``released`` row (the shop's cancel gave back its last
            units, leaving it ``shipped`` when the warehouse had shipped some) or ``shipped``
            row (the upstream ``OrderShipped``); a warehouse request marked
            ``released_order``; a shipment of the warehouse recorded ``shipped`` that left it
            ``shipped``; a cancellation of the warehouse recorded ``released`` that left it
            ``released`` or ``shipped``. So a difference is an event lost half-way or applied
            twice. With the hand-off, a cancel of an order the warehouse may hold releases it
            later, when the warehouse accepts the cancellation or its fulfilment order fails
            (``fulfilment.domain.handoff``); then the request, not the inbox row
            (``cancel_requested``), records the release. The mark is recorded when the
            release happens, not derived afterwards: ``fulfilment prune`` deletes the inbox
            rows that would tell which released orders had an inbox ``released`` row, and a
            request's status (``accepted``, ``withdrawn``) does not say whether its
            application ended the order, released part of it, or nothing. Assumes one
            consumer name per database, as deployed.
        orphan_lines: ``reservation_lines`` rows whose order has no reservation (the check
            of the foreign key that migration 0005 dropped).
        shipped_mismatches: SKUs whose ``shipped`` (the units ``ship_orders()`` and
            ``record_shipments()`` took out of ``on_hand``) differs from the units shipped of
            every order's ``reservation_lines`` (``shipped``; either side missing counts as
            0): ``on_hand`` went down by other than exactly the shipped units. During a
            rolling update from a release before migration 0009, the SKUs its workers ship
            differ until they are gone.
        shipped_mismatch_examples: up to :data:`MISMATCH_EXAMPLES` of those SKUs, in
            code-point order.
    """

    stock_out_of_bounds: int
    reserved_mismatches: int
    reserved_mismatch_examples: tuple[str, ...]
    inbox_unaccounted: int
    orphan_lines: int
    shipped_mismatches: int
    shipped_mismatch_examples: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every invariant holds."""
        return (
            self.stock_out_of_bounds == 0
            and self.reserved_mismatches == 0
            and self.inbox_unaccounted == 0
            and self.orphan_lines == 0
            and self.shipped_mismatches == 0
        )


@dataclass(frozen=True, slots=True)
class Shortage:
    """The short SKUs: ``reserved > on_hand`` after a reported loss (the shortage rule).

    Not a violation: the warehouse lost units that orders hold; the SKU takes no new
    reservation until its cancellations, shipments or a receipt settle it.

    Attributes:
        skus: SKUs short now.
        units: units they are short by, summed (``reserved - on_hand`` of each).
        examples: up to :data:`MISMATCH_EXAMPLES` of them, in code-point order.
    """

    skus: int
    units: int
    examples: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OutcomeReport:
    """What happened to the events that reached the database: orders per state, and more.

    Attributes:
        reserved: orders that hold stock (``reserved``).
        rejected: orders rejected, per reason (``insufficient_stock``, ``unknown_sku``,
            ``cancelled``; every key always present).
        released: orders cancelled until they held nothing, none of it shipped.
        shipped: orders shipped: they hold nothing, and their lines (what was not cancelled
            of them) left the warehouse, in one shipment or several.
        cancelled: tombstones: orders cancelled before their ``OrderPlaced`` came.
        duplicate_orders: events for an order that an earlier event had already placed.
        inbox_total: events processed, of every kind (rows of ``inbox_messages``, and those
            ``fulfilment prune`` deleted, counted in ``inbox_pruned``).
        processed: those events per recorded outcome (``reserved``, ``rejected``,
            ``duplicate_order``, ``released``, ``partially_released``, ``tombstoned``,
            ``cancel_ignored``, ``cancel_after_ship``, ``cancel_requested``, ``shipped``,
            ``ship_ignored``: the values of ``inbox_messages.outcome`` that occur).
        outbox: rows of the outbox of result events, ``unpublished`` (waiting for the relay)
            and ``published`` (confirmed by the broker, kept until the relay's retention).
        invariants: the stock and inbox checks.
        shortage: the short SKUs, counted apart from the invariants.
    """

    reserved: int
    rejected: dict[str, int]
    released: int
    shipped: int
    cancelled: int
    duplicate_orders: int
    inbox_total: int
    processed: dict[str, int]
    outbox: dict[str, int]
    invariants: InvariantChecks
    shortage: Shortage

    @property
    def ok(self) -> bool:
        """True when every invariant holds."""
        return self.invariants.ok


@dataclass(frozen=True, slots=True)
class AdjustmentTotals:
    """The adjustments recorded (``warehouse_adjustments`` rows) of one source and reason.

    Attributes:
        source: ``webhook`` (the warehouse's) or ``operator`` (``fulfilment stock adjust``).
        reason: the adjustment's reason.
        adjustments: rows.
        units_in: units they put on hand (their positive ``applied``, summed).
        units_out: units they took off it (their negative ``applied``, as a positive sum).
    """

    source: str
    reason: str
    adjustments: int
    units_in: int
    units_out: int


async def adjustment_totals(connection: AsyncConnection) -> list[AdjustmentTotals]:
    """Every adjustment ever recorded, by source and reason (those with none are left out).

    Rows are never deleted, so each figure only grows: the worker exports them as counters.
    One scan of ``warehouse_adjustments``, in ``connection``'s transaction.

    Raises:
        sqlalchemy.exc.DBAPIError: the database failed.
        OSError: the database cannot be reached.
    """
    applied = warehouse_adjustments.c.applied
    rows = await connection.execute(
        sa.select(
            warehouse_adjustments.c.source,
            warehouse_adjustments.c.reason,
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(applied).filter(applied > 0), 0),
            sa.func.coalesce(-sa.func.sum(applied).filter(applied < 0), 0),
        ).group_by(warehouse_adjustments.c.source, warehouse_adjustments.c.reason)
    )
    return [
        AdjustmentTotals(str(source), str(reason), int(count), int(units_in), int(units_out))
        for source, reason, count, units_in, units_out in rows
    ]


async def outcome_report(bind: AsyncEngine | AsyncConnection) -> OutcomeReport:
    """Count outcomes and check the invariants, all from one snapshot.

    One snapshot matters while workers are running: counting the inbox and the reservations in
    separate snapshots would report a mismatch that is only the work done in between.

    Args:
        bind: an engine, whose connection then reads in a REPEATABLE READ transaction; or a
            connection, used as it is (its transaction, if any, decides what is seen).

    Raises:
        sqlalchemy.exc.DBAPIError: the database failed (not retried: this is a report).
        OSError: the database cannot be reached.
    """
    if isinstance(bind, AsyncConnection):
        return await _report(bind)
    snapshot = bind.execution_options(isolation_level="REPEATABLE READ")
    async with snapshot.connect() as connection, connection.begin():
        return await _report(connection)


async def _report(connection: AsyncConnection) -> OutcomeReport:
    by_status = await connection.execute(
        sa.select(reservations.c.status, reservations.c.reason, sa.func.count()).group_by(
            reservations.c.status, reservations.c.reason
        )
    )
    orders = dict.fromkeys(OrderStatus, 0)
    rejected = {str(reason): 0 for reason in RejectionReason}
    for status, reason, count in by_status:
        orders[OrderStatus(status)] += count
        if status == OrderStatus.REJECTED:
            rejected[reason] = rejected.get(reason, 0) + count

    outcomes = await connection.execute(
        sa.select(inbox_messages.c.outcome, sa.func.count()).group_by(inbox_messages.c.outcome)
    )
    by_outcome: dict[str, int] = dict(sorted(outcomes.all()))
    # Rows ``fulfilment prune`` deleted still count as processed (migration 0010).
    pruned = await connection.execute(
        sa.select(inbox_pruned.c.outcome, sa.func.sum(inbox_pruned.c.rows)).group_by(
            inbox_pruned.c.outcome
        )
    )
    for outcome, rows in pruned:
        by_outcome[outcome] = by_outcome.get(outcome, 0) + int(rows)
    by_outcome = dict(sorted(by_outcome.items()))
    inbox_total = sum(by_outcome.values())
    duplicate_orders = by_outcome.get("duplicate_order", 0)
    # Every order but a tombstone was placed by one event, recorded reserved or rejected.
    # Every released or shipped order was ended by one event: recorded so in the inbox, or
    # on the cancellation request whose application ended it when the warehouse had to be
    # asked first, or on the warehouse's shipment or cancellation that left it holding
    # nothing. An inbox released row may have left its order shipped (some of it had
    # shipped), so releases and shipments are counted together.
    ended_by_requests = await connection.scalar(
        sa.select(sa.func.count()).where(warehouse_requests.c.released_order)
    )
    ended_by_shipments = await connection.scalar(
        sa.select(sa.func.count()).where(
            warehouse_shipments.c.outcome == "shipped",
            warehouse_shipments.c.order_status == str(OrderStatus.SHIPPED),
        )
    )
    ended_by_cancellations = await connection.scalar(
        sa.select(sa.func.count()).where(
            warehouse_cancellations.c.outcome == "released",
            warehouse_cancellations.c.order_status.in_(
                [str(OrderStatus.RELEASED), str(OrderStatus.SHIPPED)]
            ),
        )
    )
    placed_orders = sum(orders.values()) - orders[OrderStatus.CANCELLED]
    unaccounted = (
        by_outcome.get("reserved", 0) + by_outcome.get("rejected", 0) - placed_orders
    ) + (
        by_outcome.get("released", 0)
        + by_outcome.get("shipped", 0)
        + (ended_by_requests or 0)
        + (ended_by_shipments or 0)
        + (ended_by_cancellations or 0)
        - orders[OrderStatus.RELEASED]
        - orders[OrderStatus.SHIPPED]
    )

    # A SKU may be short only after a loss was reported of it (the shortage rule).
    loss_reported = sa.exists().where(
        warehouse_adjustments.c.sku == stock_levels.c.sku, warehouse_adjustments.c.applied < 0
    )
    short = stock_levels.c.reserved > stock_levels.c.on_hand
    out_of_bounds = await connection.scalar(
        sa.select(sa.func.count()).where(
            sa.or_(
                stock_levels.c.reserved < 0,
                stock_levels.c.on_hand < 0,
                sa.and_(short, ~loss_reported),
            )
        )
    )
    short_sku = stock_levels.c.sku.collate("C").label("sku")
    short_rows = (
        await connection.execute(
            sa.select(
                short_sku,
                sa.func.count().over().label("skus"),
                sa.func.sum(stock_levels.c.reserved - stock_levels.c.on_hand).over().label("units"),
            )
            .where(short, loss_reported)
            .order_by(short_sku)
            .limit(MISMATCH_EXAMPLES)
        )
    ).all()

    orphan_lines = await connection.scalar(
        sa.select(sa.func.count())
        .select_from(reservation_lines)
        .where(
            ~sa.exists().where(reservations.c.order_id == reservation_lines.c.order_id),
        )
    )

    held = reservation_lines.c.quantity - reservation_lines.c.shipped
    mismatches = await _lines_mismatching(
        connection,
        held,
        stock_levels.c.reserved,
        reservations.c.status == str(OrderStatus.RESERVED),
    )
    shipped_mismatches = await _lines_mismatching(
        connection, reservation_lines.c.shipped, stock_levels.c.shipped, sa.true()
    )
    published = await connection.execute(
        sa.select(outbox.c.published_at.is_not(None), sa.func.count()).group_by(
            outbox.c.published_at.is_not(None)
        )
    )
    outbox_rows = {"unpublished": 0, "published": 0}
    for is_published, count in published:
        outbox_rows["published" if is_published else "unpublished"] = count

    return OutcomeReport(
        reserved=orders[OrderStatus.RESERVED],
        rejected=rejected,
        released=orders[OrderStatus.RELEASED],
        shipped=orders[OrderStatus.SHIPPED],
        cancelled=orders[OrderStatus.CANCELLED],
        duplicate_orders=duplicate_orders,
        inbox_total=inbox_total,
        processed=by_outcome,
        outbox=outbox_rows,
        invariants=InvariantChecks(
            stock_out_of_bounds=out_of_bounds or 0,
            reserved_mismatches=mismatches[0].total if mismatches else 0,
            reserved_mismatch_examples=tuple(row.sku for row in mismatches),
            inbox_unaccounted=unaccounted,
            orphan_lines=orphan_lines or 0,
            shipped_mismatches=shipped_mismatches[0].total if shipped_mismatches else 0,
            shipped_mismatch_examples=tuple(row.sku for row in shipped_mismatches),
        ),
        shortage=Shortage(
            skus=short_rows[0].skus if short_rows else 0,
            units=int(short_rows[0].units) if short_rows else 0,
            examples=tuple(row.sku for row in short_rows),
        ),
    )


async def _lines_mismatching(
    connection: AsyncConnection,
    line_units: sa.ColumnElement[int],
    units: sa.Column[int],
    orders: sa.ColumnElement[bool],
) -> Sequence[sa.Row[str, int]]:
    """The SKUs whose ``units`` of ``stock_levels`` differ from their lines' ``line_units``.

    The lines are those of the orders that match ``orders``, summed per SKU.

    Up to :data:`MISMATCH_EXAMPLES` rows ``(sku, total)`` in code-point order, ``total``
    counting them all.
    """
    lines = (
        sa.select(
            reservation_lines.c.sku,
            sa.func.sum(line_units).label("units"),
        )
        .join(reservations, reservations.c.order_id == reservation_lines.c.order_id)
        .where(orders)
        .group_by(reservation_lines.c.sku)
        .cte("lines")
    )
    sku = sa.func.coalesce(stock_levels.c.sku, lines.c.sku).collate("C").label("sku")
    result = await connection.execute(
        sa.select(sku, sa.func.count().over().label("total"))
        .select_from(stock_levels.join(lines, lines.c.sku == stock_levels.c.sku, full=True))
        .where(sa.func.coalesce(units, 0) != sa.func.coalesce(lines.c.units, 0))
        .order_by(sku)
        .limit(MISMATCH_EXAMPLES)
    )
    return result.all()
