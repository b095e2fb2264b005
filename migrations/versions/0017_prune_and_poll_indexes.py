"""Two indexes: the webhook inbox by age, and the reserved orders.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

- ``webhook_inbox_received_at_idx`` on ``webhook_inbox (received_at)``: ``fulfilment prune``
  deletes the webhook ids received before the retention (7 days), a batch at a time
  (``received_at < now() - ... LIMIT n``, ``adapters.postgres.webhook_inbox``, whose bound is
  ``now()`` from this release on: a ``clock_timestamp()`` bound cannot use an index). Without
  it the last batch of every run, the one that finds fewer rows than its size, read the whole
  table.
- ``reservations_reserved_idx`` on ``reservations (order_id) WHERE status = 'reserved'``: the
  dispatcher's poll (``polls_due.sql``) and its gauge of orders without news
  (``without_news.sql``) start from the reserved orders, the few that still hold units, and
  join their fulfilment orders by ``order_id``. Without it each look read every order ever
  placed; the index holds only the reserved ones. The poll's query gathers the due fulfilment
  orders before it sorts them (``polls_due.sql``): with its ``LIMIT`` in the same query the
  planner walked ``warehouse_requests_without_news_idx`` in order through the fulfilment
  orders of every order shipped long ago, index or not.

Measured with ``EXPLAIN ANALYZE`` on 1,000,000 orders (5,000 reserved, 950,000 fulfilment
orders) and 1,000,000 webhook ids over 8 days: the poll's look 8.2 s before, 2.9 s with the
index alone, 0.05 s with the index and the new query; the gauge 0.24 s before, 0.05 s after;
the prune's last batch 0.36 s (a scan of every row) before, 0.2 ms after. Building the two
indexes took 0.2 s and 0.5 s, the upgrade 1.1 s.

Rolling update: two new indexes, nothing else; the previous release's processes run unchanged
on them. Each ``CREATE INDEX`` runs in the migration's one transaction, like every index before
it (0012 rebuilt one on a busy table the same way), and takes a SHARE lock on its table for the
build: reads go on, writes to ``reservations`` and ``webhook_inbox`` wait for it (about half a
second per million rows, above). As in 0011 the migration gives up after 5 s of waiting for its
locks, and the job retries. Not ``CONCURRENTLY``: that cannot run in a transaction, and an
autocommit block would commit the revisions before it and release the migration's advisory
lock in the middle of the upgrade; a concurrent build that fails leaves an invalid index
behind.

The downgrade drops both indexes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_index("webhook_inbox_received_at_idx", "webhook_inbox", ["received_at"])
    op.create_index(
        "reservations_reserved_idx",
        "reservations",
        ["order_id"],
        postgresql_where=sa.text("status = 'reserved'"),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_index("reservations_reserved_idx", table_name="reservations")
    op.drop_index("webhook_inbox_received_at_idx", table_name="webhook_inbox")
