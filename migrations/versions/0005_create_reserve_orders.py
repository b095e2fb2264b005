"""Create reserve_orders(): many reservations in one transaction and one round trip; drop the
foreign key of reservation_lines.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

The worker commits the orders that are waiting at the same moment together (group commit):
one call, one transaction, about ten statements however many orders it carries (three more
when some are duplicates of an order or rejected), where ``reserve_order()`` ran about as
many per order. The outcome of each order is the one ``reserve_order()`` would give if the
orders were sent one after the other in the order of the arrays (their arrival order), so
``fulfilment.domain.model.decide`` stays the rule. The function and its comment are
``migrations/sql/reserve_orders/v1.sql``, whose header lists its steps and its lock order.

The foreign key from ``reservation_lines.order_id`` to ``reservations`` goes. Its check is a
query and a row lock (a WAL record) per line inserted, and each connection plans that query
once: on a new database, while ``reservations`` is small, the plan is a sequential scan that
stays until autovacuum analyzes the table, and it took four fifths of PostgreSQL's CPU in the
benchmark's drains (docs/performance.md). The functions are the only writers of both tables
and write an order's reservation and its lines in one transaction, and the stock invariants
(``fulfilment report``, ``fulfilment_stock_invariant_violations``) check that every reserved
unit has its lines.

``reserve_order()`` stays, unused by this release, so that workers of the previous release
keep running during a rolling update; revision 0006 drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "reserve_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[])"

FOREIGN_KEY = "reservation_lines_order_id_fkey"


def upgrade() -> None:
    load_sql("reserve_orders/v1.sql")
    # Dropping the key locks both tables; behind a long transaction the wait would stall
    # every running worker's reservations, so give up after 5 s and let the job retry.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_constraint(FOREIGN_KEY, "reservation_lines", type_="foreignkey")


def downgrade() -> None:
    op.create_foreign_key(
        FOREIGN_KEY,
        "reservation_lines",
        "reservations",
        ["order_id"],
        ["order_id"],
        ondelete="CASCADE",
    )
    op.execute(f"DROP FUNCTION {SIGNATURE}")
