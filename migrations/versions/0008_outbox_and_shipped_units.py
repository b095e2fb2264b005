"""The outbox of result events, and the units shipped per SKU.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``outbox``: one row per result event (product contract, "Result events"), written by the
functions in the transaction of the status change it reports and published afterwards by the
relay (``fulfilment relay``). ``id`` is the order in which rows were written; two changes of
one order are serialized by the row lock on its reservation, so for one ``order_id`` it is
also the order in which their transactions committed, the order the relay publishes them in.
``event_id`` is minted with the row and never changes; ``body`` is the message exactly as
published (JSON); ``traceparent`` the W3C trace context that came with the input event, if
any. ``published_at`` is set once the broker has confirmed the message; published rows are
deleted after the retention (``fulfilment relay`` prunes them).

``stock_levels.shipped``: the units of each SKU that left the warehouse with a shipment,
raised by ``ship_orders()`` as it lowers ``on_hand``, so that ``on_hand`` going down by
exactly the shipped lines is an invariant the report can check (shipped = the lines of the
``shipped`` orders). It starts at the lines of the orders already shipped.

Both are additions: workers of the previous release keep running during a rolling update
(their functions write no outbox rows and do not raise ``shipped``; the invariant holds again
once the last of them is gone, and the report says which SKUs differ meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROUTING_KEYS = (
    "routing_key IN ('stock.reserved', 'stock.rejected', 'stock.released', 'stock.shipped')"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("event_id", sa.Uuid, nullable=False),
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("routing_key", sa.Text, nullable=False),
        sa.Column("body", postgresql.JSONB, nullable=False),
        sa.Column("traceparent", sa.Text, nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="outbox_pkey"),
        sa.UniqueConstraint("event_id", name="outbox_event_id_key"),
        sa.CheckConstraint(ROUTING_KEYS, name="outbox_routing_key_valid"),
    )
    # The relay's queue: the unpublished rows in the order they were written.
    op.create_index(
        "outbox_unpublished_idx",
        "outbox",
        ["id"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    # The retention's scan: published rows, oldest first.
    op.create_index(
        "outbox_published_at_idx",
        "outbox",
        ["published_at"],
        postgresql_where=sa.text("published_at IS NOT NULL"),
    )
    op.add_column(
        "stock_levels",
        sa.Column("shipped", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    op.create_check_constraint("stock_levels_shipped_not_negative", "stock_levels", "shipped >= 0")
    op.execute(
        """
        UPDATE stock_levels AS s
           SET shipped = l.units
          FROM (SELECT l.sku, sum(l.quantity) AS units
                  FROM reservation_lines AS l
                  JOIN reservations AS r USING (order_id)
                 WHERE r.status = 'shipped'
                 GROUP BY l.sku) AS l
         WHERE s.sku = l.sku
        """
    )


def downgrade() -> None:
    op.drop_constraint("stock_levels_shipped_not_negative", "stock_levels", type_="check")
    op.drop_column("stock_levels", "shipped")
    op.drop_index("outbox_published_at_idx", table_name="outbox")
    op.drop_index("outbox_unpublished_idx", table_name="outbox")
    op.drop_table("outbox")
