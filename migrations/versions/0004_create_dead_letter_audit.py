"""Create dead_letter_audit: every dead letter an operator replayed or purged.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

``fulfilment dlq replay`` and ``fulfilment dlq purge`` write one row per message, committed
before the message leaves the dead-letter queue. The row keeps the body and headers, so a purged
message can still be read (and published again by hand) afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dead_letter_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
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
        sa.CheckConstraint(
            "action IN ('replayed', 'purged')", name="dead_letter_audit_action_valid"
        ),
    )
    op.create_index("dead_letter_audit_event_id_idx", "dead_letter_audit", ["event_id"])
    op.create_index("dead_letter_audit_run_id_idx", "dead_letter_audit", ["run_id"])


def downgrade() -> None:
    op.drop_table("dead_letter_audit")
