"""The reservation lifecycle: released, shipped and cancelled orders, tombstones, and the
functions place_orders(), cancel_orders() and ship_orders().

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

``OrderCancelled`` gives stock back and ``OrderShipped`` takes it out (product contract, "The
reservation lifecycle"; the state table is ``fulfilment.domain.lifecycle``):

- ``reservations.status`` gains ``released``, ``shipped`` and ``cancelled``; ``reason`` gains
  ``cancelled``, and is set exactly for ``rejected`` orders.
- A cancel that comes before its order leaves a tombstone: a ``cancelled`` row with no
  ``event_id`` and no ``placed_at`` yet (both become nullable, and are NULL exactly for it),
  whose new column ``tombstone`` says what was cancelled, ``order`` or ``lines``, the lines
  summed per SKU in the new table ``tombstone_lines``. ``cancelled_at`` and ``shipped_at``
  record the events' times.
- ``reservation_lines`` of a reserved order shrink with partial cancels (rows updated, or
  deleted at 0) and are deleted when it is released; a shipped order keeps them, as the units
  that left.
- ``inbox_messages.outcome`` gains the outcomes of cancels and shipments.
- ``place_orders()``, ``cancel_orders()`` and ``ship_orders()`` (v1 each) apply a batch of
  events of their kind in one transaction. ``place_orders()`` is ``reserve_orders()`` v1 that
  also places a tombstone, reserving what it left. Their files in ``migrations/sql/`` give the
  rule and the lock order they share.

Every change is a loosening (new values, nullable columns, new columns and a table), so rows
written before it keep every constraint, and workers of the previous release keep running
during a rolling update. They call ``reserve_orders()`` v1, which this revision leaves as it
is: the lifecycle's version of it has a new name, ``place_orders()``, because replacing v1
would hand those workers the new rejection reason ``cancelled``, which they cannot read (a
whole batch of committed orders would fail as unreadable). v1 inserts a reservation with
``ON CONFLICT (order_id) DO NOTHING``, so an ``OrderPlaced`` a previous-release worker takes
for a tombstoned order is answered ``duplicate:order`` and reserves nothing, the behaviour
before the lifecycle; for an order released or shipped it answers ``duplicate:order`` too,
which is right. A revision of the next release drops ``reserve_orders()``, as 0006 dropped
``reserve_order()``. Only this release consumes the cancel
queue, so such a tombstone needs a cancel that came first and an ``OrderPlaced`` taken by an
old worker, both within the update; the order then stays ``cancelled`` holding nothing, where
this release would have reserved what a cancel of some lines left (the ``OrderPlaced`` is in
the inbox, so a replay cannot change it). The previous release neither consumes the new
queues nor writes the new values, and its ``report`` counts the new statuses as rejections.

The CHECK constraints that change are dropped and added again under their names: adding one
scans its table (``inbox_messages``, ``reservations``) under the lock of the migration, about a
second per few million rows, during which writers wait. As in 0005, the migration gives up
after 5 s of waiting for its locks, and the job retries.

The downgrade refuses to run while any row uses what it removes (a lifecycle status, reason or
inbox outcome): it would lose them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLACE_ORDERS = "place_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[])"
CANCEL_ORDERS = (
    "cancel_orders(text, uuid[], uuid[], timestamptz[], boolean[], integer[], text[], integer[])"
)
SHIP_ORDERS = "ship_orders(text, uuid[], uuid[], timestamptz[])"

NEW_CHECKS = {
    ("inbox_messages", "inbox_messages_outcome_valid"): (
        "outcome IN ('reserved', 'rejected', 'duplicate_order', 'released',"
        " 'partially_released', 'tombstoned', 'cancel_ignored', 'cancel_after_ship',"
        " 'shipped', 'ship_ignored')"
    ),
    ("reservations", "reservations_status_valid"): (
        "status IN ('reserved', 'rejected', 'released', 'shipped', 'cancelled')"
    ),
    ("reservations", "reservations_reason_valid"): (
        "reason IN ('insufficient_stock', 'unknown_sku', 'cancelled')"
    ),
    ("reservations", "reservations_reason_iff_rejected"): (
        "(reason IS NOT NULL) = (status = 'rejected')"
    ),
}

OLD_CHECKS = {
    ("inbox_messages", "inbox_messages_outcome_valid"): (
        "outcome IN ('reserved', 'rejected', 'duplicate_order')"
    ),
    ("reservations", "reservations_status_valid"): "status IN ('reserved', 'rejected')",
    ("reservations", "reservations_reason_valid"): (
        "reason IN ('insufficient_stock', 'unknown_sku')"
    ),
    ("reservations", "reservations_reason_iff_rejected"): (
        "(reason IS NULL) = (status = 'reserved')"
    ),
}


def _replace_checks(checks: dict[tuple[str, str], str]) -> None:
    for (table, name), condition in checks.items():
        op.drop_constraint(name, table, type_="check")
        op.create_check_constraint(name, table, condition)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    _replace_checks(NEW_CHECKS)
    op.alter_column("reservations", "event_id", nullable=True)
    op.alter_column("reservations", "placed_at", nullable=True)
    op.add_column("reservations", sa.Column("tombstone", sa.Text, nullable=True))
    op.add_column(
        "reservations", sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "reservations", sa.Column("shipped_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_check_constraint(
        "reservations_placed_unless_cancelled",
        "reservations",
        "(event_id IS NULL) = (status = 'cancelled')"
        " AND (placed_at IS NULL) = (status = 'cancelled')",
    )
    op.create_check_constraint(
        "reservations_tombstone_valid", "reservations", "tombstone IN ('order', 'lines')"
    )
    op.create_check_constraint(
        "reservations_cancelled_has_tombstone",
        "reservations",
        "status <> 'cancelled' OR tombstone IS NOT NULL",
    )
    op.create_check_constraint(
        "reservations_shipped_at_iff_shipped",
        "reservations",
        "(shipped_at IS NOT NULL) = (status = 'shipped')",
    )
    op.create_table(
        "tombstone_lines",
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("quantity", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("order_id", "sku", name="tombstone_lines_pkey"),
        sa.CheckConstraint("quantity > 0", name="tombstone_lines_quantity_positive"),
    )
    load_sql("place_orders/v1.sql")
    load_sql("cancel_orders/v1.sql")
    load_sql("ship_orders/v1.sql")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Fails (and so rolls the downgrade back) while any row needs the lifecycle's schema.
    op.execute(
        """
        DO $check$
        BEGIN
            IF EXISTS (SELECT 1 FROM reservations WHERE status NOT IN ('reserved', 'rejected')
                                                     OR reason = 'cancelled'
                                                     OR tombstone IS NOT NULL)
               OR EXISTS (SELECT 1 FROM inbox_messages
                           WHERE outcome NOT IN ('reserved', 'rejected', 'duplicate_order'))
            THEN
                RAISE EXCEPTION 'orders or events of the reservation lifecycle are stored'
                    USING HINT = 'The downgrade would lose them; remove them first.';
            END IF;
        END
        $check$
        """
    )
    op.execute(f"DROP FUNCTION {SHIP_ORDERS}")
    op.execute(f"DROP FUNCTION {CANCEL_ORDERS}")
    op.execute(f"DROP FUNCTION {PLACE_ORDERS}")
    op.drop_table("tombstone_lines")
    for name in (
        "reservations_shipped_at_iff_shipped",
        "reservations_cancelled_has_tombstone",
        "reservations_tombstone_valid",
        "reservations_placed_unless_cancelled",
    ):
        op.drop_constraint(name, "reservations", type_="check")
    op.drop_column("reservations", "shipped_at")
    op.drop_column("reservations", "cancelled_at")
    op.drop_column("reservations", "tombstone")
    op.alter_column("reservations", "placed_at", nullable=False)
    op.alter_column("reservations", "event_id", nullable=False)
    _replace_checks(OLD_CHECKS)
