"""The database schema as SQLAlchemy Core tables, mirroring the alembic migrations.

The migrations under ``migrations/versions`` are the source of truth; this module repeats
them so that queries can be written against typed columns. ``tests/integration`` checks that
a migrated database and :data:`metadata` do not differ (alembic's ``compare_metadata``).

Table and column names are part of the product's external contract ("Database" in the
product description); constraint names are spelled out so that they are the same on every
database and can be named in error handling and in later migrations.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

metadata = sa.MetaData()
"""Every table of the service."""

INTEGER_MAX = 2_147_483_647
"""Largest value of an ``integer`` column (``on_hand``, ``reserved``, ``quantity``)."""

stock_levels = sa.Table(
    "stock_levels",
    metadata,
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("on_hand", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column(
        "updated_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("sku", name="stock_levels_pkey"),
    sa.CheckConstraint(
        "0 <= reserved AND reserved <= on_hand", name="stock_levels_reserved_within_on_hand"
    ),
)
"""Units per SKU: ``on_hand`` in the warehouse, ``reserved`` of them promised to orders."""

inbox_messages = sa.Table(
    "inbox_messages",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("event_id", sa.Uuid, primary_key=True),
    sa.Column("order_id", sa.Uuid, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column(
        "processed_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("consumer", "event_id", name="inbox_messages_pkey"),
    sa.CheckConstraint(
        "outcome IN ('reserved', 'rejected', 'duplicate_order')",
        name="inbox_messages_outcome_valid",
    ),
)
"""One row per processed event and consumer: the idempotency record of ``reserve``."""

reservations = sa.Table(
    "reservations",
    metadata,
    sa.Column("order_id", sa.Uuid, primary_key=True),
    sa.Column("event_id", sa.Uuid, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column(
        "skus",
        postgresql.ARRAY(sa.Text),
        nullable=False,
        server_default=sa.text("'{}'::text[]"),
    ),
    sa.Column("placed_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column(
        "created_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("order_id", name="reservations_pkey"),
    sa.UniqueConstraint("event_id", name="reservations_event_id_key"),
    sa.CheckConstraint("status IN ('reserved', 'rejected')", name="reservations_status_valid"),
    sa.CheckConstraint(
        "reason IN ('insufficient_stock', 'unknown_sku')", name="reservations_reason_valid"
    ),
    sa.CheckConstraint(
        "(reason IS NULL) = (status = 'reserved')", name="reservations_reason_iff_rejected"
    ),
)
"""One row per order: reserved, or rejected with a reason and the offending ``skus``."""

reservation_lines = sa.Table(
    "reservation_lines",
    metadata,
    sa.Column("order_id", sa.Uuid, primary_key=True),
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("order_id", "sku", name="reservation_lines_pkey"),
    sa.CheckConstraint("quantity > 0", name="reservation_lines_quantity_positive"),
)
"""The demand of each order per SKU (lines of the same SKU summed), reserved or rejected.

No foreign key to ``reservations`` (dropped by migration 0005, which says why): the
reservation functions write an order's reservation and its lines in one transaction."""

delivery_attempts = sa.Table(
    "delivery_attempts",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("message_key", sa.Text, primary_key=True),
    sa.Column("redeliveries", sa.Integer, nullable=False),
    sa.Column(
        "first_redelivered_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.Column(
        "last_redelivered_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("consumer", "message_key", name="delivery_attempts_pkey"),
    sa.CheckConstraint("redeliveries > 0", name="delivery_attempts_redeliveries_positive"),
)
"""Redeliveries the service counted per message (migration 0003), for its own delivery limit."""

dead_letter_audit = sa.Table(
    "dead_letter_audit",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("run_id", sa.Uuid, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("event_id", sa.Text, nullable=True),
    sa.Column("message_id", sa.Text, nullable=True),
    sa.Column("failure_class", sa.Text, nullable=False),
    sa.Column("exception_type", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("dead_lettered_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("headers", postgresql.JSONB, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("operator", sa.Text, nullable=False),
    sa.Column("comment", sa.Text, nullable=True),
    sa.Column(
        "performed_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("id", name="dead_letter_audit_pkey"),
    sa.CheckConstraint("action IN ('replayed', 'purged')", name="dead_letter_audit_action_valid"),
    sa.Index("dead_letter_audit_event_id_idx", "event_id"),
    sa.Index("dead_letter_audit_run_id_idx", "run_id"),
)
"""One row per dead letter replayed or purged by ``fulfilment dlq`` (migration 0004), written
before the message leaves the DLQ; ``run_id`` is the ``x-fulfilment-replay-id`` of a replay,
and ``event_id`` is text because a malformed body may hold anything there."""
