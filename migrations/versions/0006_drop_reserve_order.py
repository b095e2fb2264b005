"""Drop reserve_order(), unused since reserve_orders() (0005) took its place.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

0005 kept ``reserve_order()`` so that workers of the release before it, which called it, kept
running during a rolling update. No worker since calls it. A deployment still running workers
of a release older than 0005 must update through a release at 0005 first: those workers fail
every reservation once the function is gone.

The downgrade loads it again from ``migrations/sql/reserve_order/v1.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "reserve_order(text, uuid, uuid, timestamptz, text[], integer[])"


def upgrade() -> None:
    # Calls of the function take no lock on it, so running workers do not hold this up; only
    # DDL on it in another open transaction would. As in 0005, give up after 5 s then and let
    # the job retry, rather than wait unseen while holding the migration's advisory lock.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {SIGNATURE}")


def downgrade() -> None:
    load_sql("reserve_order/v1.sql")
