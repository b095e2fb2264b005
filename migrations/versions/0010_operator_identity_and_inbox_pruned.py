"""The operator's identity in dead_letter_audit, and inbox_pruned for the inbox's retention.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30

- ``dead_letter_audit`` gains ``os_user`` and ``host`` (who ran ``fulfilment dlq replay`` or
  ``purge``, from the environment; NULL for rows written before) and ``database_user``, the
  session's role, filled in by the database itself (``DEFAULT session_user``), which the tool
  does not set; rows written before get the role that runs this migration. ``operator``
  stays: the ``--operator`` name, else the OS user.
- ``inbox_pruned`` counts, per consumer and outcome, the inbox rows ``fulfilment prune``
  deleted, in the same transaction as the delete, so that ``fulfilment report`` and the
  invariant check still count every processed event.

Adding nullable columns and a column with a non-volatile default (``session_user`` is
stable) rewrites no table since PostgreSQL 11, and the previous release writes audit rows
without the new columns, so it keeps running during the update.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column("dead_letter_audit", sa.Column("os_user", sa.Text, nullable=True))
    op.add_column("dead_letter_audit", sa.Column("host", sa.Text, nullable=True))
    op.add_column(
        "dead_letter_audit",
        sa.Column("database_user", sa.Text, nullable=False, server_default=sa.text("session_user")),
    )
    op.create_table(
        "inbox_pruned",
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("consumer", "outcome", name="inbox_pruned_pkey"),
        sa.CheckConstraint("rows >= 0", name="inbox_pruned_rows_not_negative"),
    )


def downgrade() -> None:
    op.drop_table("inbox_pruned")
    op.drop_column("dead_letter_audit", "database_user")
    op.drop_column("dead_letter_audit", "host")
    op.drop_column("dead_letter_audit", "os_user")
