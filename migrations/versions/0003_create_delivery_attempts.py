"""Create delivery_attempts: redeliveries counted by the service, across broker versions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

A message that crashes the worker every time must end in the dead-letter queue after a bounded
number of deliveries. RabbitMQ's quorum-queue delivery limit does that on 3.10 to 4.2, but 4.3
stopped counting returns of unacknowledged messages (channel closed by a crash) towards it, so
the service counts redeliveries itself. Only redelivered messages write here, so the cost on
the normal path is nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "delivery_attempts",
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("message_key", sa.Text, nullable=False),
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


def downgrade() -> None:
    op.drop_table("delivery_attempts")
