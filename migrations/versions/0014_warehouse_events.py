"""Hearing back from the warehouse: the tables of its shipments, cancellations and webhooks.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

The warehouse's shipments and its own cancellations, pushed as signed webhooks or found by the
dispatcher's poll (product contract, "Hearing back from the warehouse"), are applied by the
functions of 0015; this revision creates what they write.

- ``reservation_lines.shipped``: the units of the line that left with shipments. ``quantity``
  stays the units held plus the units shipped (cancels still shrink it by what they release),
  so the units an order holds are ``quantity - shipped``: an order is ``reserved`` while it
  holds some, and ``shipped`` when it holds none and shipped some. The lines of the orders
  already ``shipped`` are set to ``shipped = quantity``, what "the lines of a shipped order
  are the units that left" meant before.
- ``webhook_inbox``: one row per webhook id applied, per consumer, with the webhook's type and
  the outcome; a webhook whose id is there is answered as a duplicate and changes nothing.
- ``warehouse_shipments`` and ``warehouse_shipment_lines``: one row per shipment applied (its
  ``shipment_id`` is the key whatever webhook or poll brought it), with the carrier, tracking
  numbers and the lines as sent (merged per SKU) beside the units taken from the order.
- ``warehouse_cancellations`` and ``warehouse_cancellation_lines``: the same for the
  warehouse's own cancellations; a cancellation of the whole order (no lines) keeps as its
  lines what it released.
- ``warehouse_discrepancies``: what a shipment or cancellation named that the order did not
  hold (an unknown order, one not reserved, more than held, a SKU never held).
- ``invalid_webhooks`` and ``invalid_webhook_audit``: a signed webhook that is not a valid
  event of its type, kept once per webhook id for an operator to read and replay, and who
  replayed it (as ``dead_letter_audit`` records the dead letters' replays).
- ``warehouse_requests.news_at`` (the last shipment or cancellation recorded for the order of
  a fulfilment order) and ``polled_at`` (the dispatcher's last poll of it), and a partial index
  of the accepted fulfilment orders by ``greatest(news_at, polled_at, answered_at)``, the last
  time the service heard of the order, which the poll reads in order (``greatest`` skips
  NULLs, and a poll that found nothing new still moves the order back in the line).

No foreign keys between the new tables, as for ``reservation_lines`` (0005 says why): the
functions write a shipment and its lines in one transaction.

Rolling update: every change is an addition (tables, nullable columns, a column with a
constant default, which PostgreSQL 11 and later add without rewriting the table). Workers of
the previous release keep running: their ``ship_orders()`` is replaced by 0015's, which sets
``shipped``; until then (0014 alone) an order they ship keeps ``shipped = 0`` on its lines. The
CHECK constraint of ``shipped`` and the setting of the shipped orders' lines scan
``reservation_lines`` under the migration's lock (about a second per few million rows, during
which writers of it wait); as in 0011 the migration gives up after 5 s of waiting for its
locks, and the job retries.

The downgrade refuses to run while a line holds units and shipped some (a partial shipment:
the previous release would count its shipped units as held), then drops the columns, the index
and the tables with every shipment, cancellation, discrepancy and kept webhook in them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WEBHOOK_TYPES = ("shipment.shipped", "fulfilment_order.cancelled")
WEBHOOK_OUTCOMES = ("shipped", "already_shipped", "discrepancy", "released", "ignored", "duplicate")
SHIPMENT_OUTCOMES = ("shipped", "already_shipped", "discrepancy")
CANCELLATION_OUTCOMES = ("released", "ignored", "discrepancy")
SOURCES = ("webhook", "poll")
DISCREPANCY_KINDS = ("unknown_order", "order_not_reserved", "more_than_held", "sku_not_held")
DISCREPANCY_SOURCES = ("shipment", "cancellation")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # The services lock stock rows before the rows of the tables altered here, and an upgrade
    # to head is one transaction whose 0016 alters stock_levels: taking stock_levels first,
    # as they do, keeps a worker holding stock rows from waiting on a table this upgrade holds
    # while the upgrade waits on it (a deadlock seen under load). The same upgrade's 0018
    # creates a trigger on reservations, which they lock before stock_levels: reservations
    # first, in EXCLUSIVE mode, which waits for every transaction holding one of its rows, so
    # that none is left holding one while it waits for the stock rows this upgrade holds.
    op.execute("LOCK TABLE reservations IN EXCLUSIVE MODE")
    op.execute("LOCK TABLE stock_levels IN ACCESS EXCLUSIVE MODE")
    op.add_column(
        "reservation_lines",
        sa.Column("shipped", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE reservation_lines AS l SET shipped = l.quantity FROM reservations AS r"
        " WHERE r.order_id = l.order_id AND r.status = 'shipped'"
    )
    op.create_check_constraint(
        "reservation_lines_shipped_within_quantity",
        "reservation_lines",
        "0 <= shipped AND shipped <= quantity",
    )

    op.create_table(
        "webhook_inbox",
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("webhook_id", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("consumer", "webhook_id", name="webhook_inbox_pkey"),
        sa.CheckConstraint(_one_of("type", WEBHOOK_TYPES), name="webhook_inbox_type_valid"),
        sa.CheckConstraint(
            _one_of("outcome", WEBHOOK_OUTCOMES), name="webhook_inbox_outcome_valid"
        ),
    )

    op.create_table(
        "warehouse_shipments",
        sa.Column("shipment_id", sa.Text, nullable=False),
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("fulfilment_order_id", sa.Text, nullable=False),
        sa.Column("webhook_id", sa.Text, nullable=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("shipped_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("carrier", sa.Text, nullable=True),
        sa.Column("tracking_numbers", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("tracking_url", sa.Text, nullable=True),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("shipment_id", name="warehouse_shipments_pkey"),
        sa.CheckConstraint(_one_of("source", SOURCES), name="warehouse_shipments_source_valid"),
        sa.CheckConstraint(
            "(webhook_id IS NULL) = (source = 'poll')",
            name="warehouse_shipments_webhook_id_unless_polled",
        ),
        sa.CheckConstraint(
            _one_of("outcome", SHIPMENT_OUTCOMES), name="warehouse_shipments_outcome_valid"
        ),
    )
    op.create_index("warehouse_shipments_order_idx", "warehouse_shipments", ["order_id"])
    op.create_table(
        "warehouse_shipment_lines",
        sa.Column("shipment_id", sa.Text, nullable=False),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.Column("taken", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("shipment_id", "sku", name="warehouse_shipment_lines_pkey"),
        sa.CheckConstraint(
            "0 < quantity AND 0 <= taken AND taken <= quantity",
            name="warehouse_shipment_lines_taken_within_quantity",
        ),
    )

    op.create_table(
        "warehouse_cancellations",
        sa.Column("cancellation_id", sa.Text, nullable=False),
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("fulfilment_order_id", sa.Text, nullable=False),
        sa.Column("webhook_id", sa.Text, nullable=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("whole", sa.Boolean, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("cancellation_id", name="warehouse_cancellations_pkey"),
        sa.CheckConstraint(_one_of("source", SOURCES), name="warehouse_cancellations_source_valid"),
        sa.CheckConstraint(
            "(webhook_id IS NULL) = (source = 'poll')",
            name="warehouse_cancellations_webhook_id_unless_polled",
        ),
        sa.CheckConstraint(
            _one_of("outcome", CANCELLATION_OUTCOMES),
            name="warehouse_cancellations_outcome_valid",
        ),
    )
    op.create_index("warehouse_cancellations_order_idx", "warehouse_cancellations", ["order_id"])
    op.create_table(
        "warehouse_cancellation_lines",
        sa.Column("cancellation_id", sa.Text, nullable=False),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.Column("released", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("cancellation_id", "sku", name="warehouse_cancellation_lines_pkey"),
        sa.CheckConstraint(
            "0 < quantity AND 0 <= released AND released <= quantity",
            name="warehouse_cancellation_lines_released_within_quantity",
        ),
    )

    op.create_table(
        "warehouse_discrepancies",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("source_id", sa.Text, nullable=False),
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("sku", sa.Text, nullable=True),
        sa.Column("quantity", sa.Integer, nullable=True),
        sa.Column("order_status", sa.Text, nullable=True),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("id", name="warehouse_discrepancies_pkey"),
        sa.CheckConstraint(
            _one_of("kind", DISCREPANCY_KINDS), name="warehouse_discrepancies_kind_valid"
        ),
        sa.CheckConstraint(
            _one_of("source", DISCREPANCY_SOURCES), name="warehouse_discrepancies_source_valid"
        ),
        sa.CheckConstraint(
            "quantity IS NULL OR quantity > 0", name="warehouse_discrepancies_quantity_positive"
        ),
    )
    op.create_index(
        "warehouse_discrepancies_source_idx", "warehouse_discrepancies", ["source", "source_id"]
    )

    op.create_table(
        "invalid_webhooks",
        sa.Column("webhook_id", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("headers", postgresql.JSONB, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replay_outcome", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("webhook_id", name="invalid_webhooks_pkey"),
        sa.CheckConstraint(
            "(replayed_at IS NULL) = (replay_outcome IS NULL)",
            name="invalid_webhooks_replay_outcome_iff_replayed",
        ),
    )
    op.create_table(
        "invalid_webhook_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("webhook_id", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("operator", sa.Text, nullable=False),
        sa.Column("comment", sa.Text, nullable=True),
        sa.Column("os_user", sa.Text, nullable=True),
        sa.Column("host", sa.Text, nullable=True),
        sa.Column("database_user", sa.Text, nullable=False, server_default=sa.text("session_user")),
        sa.Column(
            "performed_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()
        ),
        sa.PrimaryKeyConstraint("id", name="invalid_webhook_audit_pkey"),
        sa.CheckConstraint("action IN ('replayed')", name="invalid_webhook_audit_action_valid"),
    )
    op.create_index("invalid_webhook_audit_webhook_id_idx", "invalid_webhook_audit", ["webhook_id"])

    op.add_column(
        "warehouse_requests", sa.Column("news_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "warehouse_requests", sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "warehouse_requests_without_news_idx",
        "warehouse_requests",
        [sa.text("greatest(news_at, polled_at, answered_at)"), "id"],
        postgresql_where=sa.text("kind = 'fulfilment_order' AND status = 'accepted'"),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Fails (and so rolls the downgrade back) while an order is shipped in part: the previous
    # release would read its shipped units as held.
    op.execute(
        """
        DO $check$
        BEGIN
            IF EXISTS (SELECT 1 FROM reservation_lines AS l
                         JOIN reservations AS r USING (order_id)
                        WHERE l.shipped > 0 AND r.status <> 'shipped')
            THEN
                RAISE EXCEPTION 'orders shipped in part are stored'
                    USING HINT = 'The downgrade would count their shipped units as held.';
            END IF;
        END
        $check$
        """
    )
    op.drop_index("warehouse_requests_without_news_idx", table_name="warehouse_requests")
    op.drop_column("warehouse_requests", "polled_at")
    op.drop_column("warehouse_requests", "news_at")
    op.drop_table("invalid_webhook_audit")
    op.drop_table("invalid_webhooks")
    op.drop_table("warehouse_discrepancies")
    op.drop_table("warehouse_cancellation_lines")
    op.drop_table("warehouse_cancellations")
    op.drop_table("warehouse_shipment_lines")
    op.drop_table("warehouse_shipments")
    op.drop_table("webhook_inbox")
    op.drop_constraint(
        "reservation_lines_shipped_within_quantity", "reservation_lines", type_="check"
    )
    op.drop_column("reservation_lines", "shipped")
