"""Drop reserve_orders(), unused since place_orders() (0007) took its place.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

0007 kept ``reserve_orders()`` so that workers of the release before it, which called it,
kept running during a rolling update; it promised that a revision of the next release drops
it, as 0006 dropped ``reserve_order()``. No worker since calls it: release 0.1.0 calls
``place_orders()``. A deployment still running workers of a release older than 0007 must
update through a release at 0012 first: those workers fail every reservation once the
function is gone.

The downgrade loads it again from ``migrations/sql/reserve_orders/v1.sql``; the runtime role
keeps no privilege on it (``RUNTIME_PRIVILEGES``).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "reserve_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[])"


def upgrade() -> None:
    # As in 0006: calls take no lock on the function, only DDL on it in another open
    # transaction would; give up after 5 s then and let the job retry, rather than wait unseen
    # while holding the migration's advisory lock.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {SIGNATURE}")


def downgrade() -> None:
    load_sql("reserve_orders/v1.sql")
