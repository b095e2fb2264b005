"""Hearing back from the warehouse: record_shipments(), record_warehouse_cancellations(), and
the lifecycle's functions for orders shipped in part.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

- ``record_shipments()`` and ``record_warehouse_cancellations()`` (v1 each) apply a batch of
  the warehouse's shipments or cancellations in one transaction, once per webhook id
  (``webhook_inbox``) and once per ``shipment_id``/``cancellation_id``, keep them with their
  lines and discrepancies (0014's tables), and write their result events to the outbox
  (``migrations/sql/record_*/v1.sql`` give the rule and the lock order).
- ``warehouse_shipments.order_status`` and ``warehouse_cancellations.order_status``: the
  order's status after the change (NULL for an unknown order), so that an operator reads what
  a shipment did to its order, and the invariant check counts the orders a shipment or a
  cancellation of the warehouse left ``shipped`` or ``released`` (``outcomes``).
- ``ship_orders()`` v3 and ``cancel_orders()`` v4 ship and release only what an order still
  holds (``reservation_lines.quantity - shipped``): an order the warehouse shipped in part
  ships the rest, and a cancel of it releases only held units, leaving it ``shipped`` when it
  then holds nothing. Their result events gain the fields of 0015's events
  (``docs/events.md``). Their signatures are unchanged (``CREATE OR REPLACE``).

Rolling update: workers of the previous release call ``ship_orders()`` and
``cancel_orders()`` with the same arguments and get the new versions, which behave as the old
ones on every order no warehouse shipment touched, and on one that a shipment did ship and
release what it holds, whichever release's worker calls them; the relay of the previous
release publishes the events' new fields as they are (fields added only, and the routing keys
are the same). The two new columns are nullable,
added without a rewrite.

The downgrade drops the two functions and the columns, and loads ``ship_orders()`` v2 and
``cancel_orders()`` v3 again; 0014's downgrade refuses to go further while an order is
shipped in part.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RECORD_SHIPMENTS = (
    "record_shipments(text, uuid[], text[], text[], text[], text[], uuid[], timestamptz[],"
    " text[], text[], integer[], text[], integer[], text[], integer[], text[])"
)
RECORD_WAREHOUSE_CANCELLATIONS = (
    "record_warehouse_cancellations(text, uuid[], text[], text[], text[], text[], uuid[],"
    " timestamptz[], text[], boolean[], integer[], text[], integer[], text[])"
)
ORDER_STATUSES = "order_status IN ('reserved', 'rejected', 'released', 'shipped', 'cancelled')"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in ("warehouse_shipments", "warehouse_cancellations"):
        op.add_column(table, sa.Column("order_status", sa.Text, nullable=True))
        op.create_check_constraint(f"{table}_order_status_valid", table, ORDER_STATUSES)
    load_sql("record_shipments/v1.sql")
    load_sql("record_warehouse_cancellations/v1.sql")
    load_sql("ship_orders/v3.sql")
    load_sql("cancel_orders/v4.sql")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    load_sql("cancel_orders/v3.sql")
    load_sql("ship_orders/v2.sql")
    op.execute(f"DROP FUNCTION {RECORD_WAREHOUSE_CANCELLATIONS}")
    op.execute(f"DROP FUNCTION {RECORD_SHIPMENTS}")
    for table in ("warehouse_cancellations", "warehouse_shipments"):
        op.drop_constraint(f"{table}_order_status_valid", table, type_="check")
        op.drop_column(table, "order_status")
