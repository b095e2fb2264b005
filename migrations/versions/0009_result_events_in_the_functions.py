"""Result events: place_orders(), cancel_orders() and ship_orders() v2 write the outbox.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Every change of a reservation's status, and every partial cancel that releases stock, writes
its result event to ``outbox`` (0008) in the transaction of the change (product contract,
"Result events"): ``stock.reserved`` and ``stock.rejected`` by ``place_orders()``,
``stock.released`` by ``cancel_orders()``, ``stock.shipped`` by ``ship_orders()``. A
tombstone, a duplicate and an event that changes nothing write none. Each function writes its
rows with one ``INSERT ... SELECT`` per kind for the whole batch, in arrival order, mints the
``event_id`` with ``gen_random_uuid()``, takes ``occurred_at`` from the transaction's time,
and calls ``pg_notify('fulfilment_outbox', '')`` when it wrote any, so that the relay wakes up.
``ship_orders()`` also raises ``stock_levels.shipped`` by the units it takes out of
``on_hand``. The files of v2 in ``migrations/sql/`` say what changed, as a diff against v1.

Each function gains a last parameter, ``p_traceparents text[]``: the W3C trace context of
each input event, copied to ``outbox.traceparent``. A new parameter is a new signature, which
``CREATE OR REPLACE`` would add beside the old one instead of replacing it, so the revision
drops each v1 and creates v2 in its transaction: callers see one or the other, never neither.

Rolling update: the new parameter defaults to NULL and the result columns are unchanged, so
a worker of the previous release, which passes the old number of arguments, calls v2 and
reads its answers as before; its transitions write their result events too (without trace
context) and raise ``shipped``, so nothing is left out of the outbox during the update.
PostgreSQL plans the workers' prepared statements again once the function they named is
dropped, and resolves them to v2 (``tests/integration/test_postgres_schema.py`` runs such a
statement across the upgrade). ``reserve_orders()`` v1, called only by workers of the release
before 0007, is left as it is and writes no result events.

The downgrade drops v2 and loads v1 again: result events are no longer written, and
``shipped`` no longer rises (the report's shipped-units invariant then names the SKUs shipped
since). The rows already in ``outbox`` stay for the relay.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLACE_ORDERS_V1 = "place_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[])"
CANCEL_ORDERS_V1 = (
    "cancel_orders(text, uuid[], uuid[], timestamptz[], boolean[], integer[], text[], integer[])"
)
SHIP_ORDERS_V1 = "ship_orders(text, uuid[], uuid[], timestamptz[])"

# v2 takes v1's arguments and p_traceparents text[].
PLACE_ORDERS_V2 = PLACE_ORDERS_V1.replace(")", ", text[])")
CANCEL_ORDERS_V2 = CANCEL_ORDERS_V1.replace(")", ", text[])")
SHIP_ORDERS_V2 = SHIP_ORDERS_V1.replace(")", ", text[])")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {PLACE_ORDERS_V1}")
    load_sql("place_orders/v2.sql")
    op.execute(f"DROP FUNCTION {CANCEL_ORDERS_V1}")
    load_sql("cancel_orders/v2.sql")
    op.execute(f"DROP FUNCTION {SHIP_ORDERS_V1}")
    load_sql("ship_orders/v2.sql")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {PLACE_ORDERS_V2}")
    load_sql("place_orders/v1.sql")
    op.execute(f"DROP FUNCTION {CANCEL_ORDERS_V2}")
    load_sql("cancel_orders/v1.sql")
    op.execute(f"DROP FUNCTION {SHIP_ORDERS_V2}")
    load_sql("ship_orders/v1.sql")
