"""Create stock_levels, inbox_messages, reservations and reservation_lines.

Revision ID: 0001
Revises:
Create Date: 2025-01-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stock_levels",
        sa.Column("sku", sa.Text, nullable=False),
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
    op.create_table(
        "inbox_messages",
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("event_id", sa.Uuid, nullable=False),
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
    op.create_table(
        "reservations",
        sa.Column("order_id", sa.Uuid, nullable=False),
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
    op.create_table(
        "reservation_lines",
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("order_id", "sku", name="reservation_lines_pkey"),
        sa.ForeignKeyConstraint(
            ["order_id"],
            ["reservations.order_id"],
            name="reservation_lines_order_id_fkey",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("quantity > 0", name="reservation_lines_quantity_positive"),
    )


def downgrade() -> None:
    op.drop_table("reservation_lines")
    op.drop_table("reservations")
    op.drop_table("inbox_messages")
    op.drop_table("stock_levels")
