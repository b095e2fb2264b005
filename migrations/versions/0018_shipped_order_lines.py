"""A shipped order's lines shipped whole, whichever release's call shipped it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

0014 sets ``reservation_lines.shipped = quantity`` on the lines of the orders shipped before
it commits, and this release's ``ship_orders()`` (v3 on) sets it when it ships one. A worker
of the previous release whose ``ship_orders()`` call began before the upgrade commits (it
waited for a lock the upgrade held, or for a row another call held) runs version 2's body to
its end after the commit, as PostgreSQL runs every call with the body it began with: the
order is shipped, ``stock_levels.shipped`` went up by its lines, and its lines keep
``shipped = 0`` (seen under load by ``make test-upgrade``: the invariant check's shipped
mismatch, on the SKUs of one order shipped 0.3 s into the upgrade).

- ``shipped_order_lines()`` (v1, ``migrations/sql/shipped_order_lines``) and its trigger
  ``reservations_shipped_lines`` (AFTER UPDATE OF status ON reservations, FOR EACH ROW, when
  the status became ``shipped``) set ``shipped = quantity`` on the order's lines that shipped
  less. For this release's writers it finds no row: they set the status once no line holds
  a unit.

Rolling update: a trigger, committed with the upgrade, applies to every statement that runs
after it, that call's ``UPDATE reservations`` included. ``CREATE TRIGGER`` takes ``SHARE ROW
EXCLUSIVE`` on ``reservations``, which a worker writing an order holds while it waits for
the stock rows: 0014, first of an upgrade from the previous release, takes ``reservations``
before ``stock_levels`` for it, in the services' order.

The downgrade drops the trigger and the function.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    load_sql("shipped_order_lines/v1.sql")
    op.execute(
        "CREATE TRIGGER reservations_shipped_lines AFTER UPDATE OF status ON reservations"
        " FOR EACH ROW"
        " WHEN (NEW.status = 'shipped' AND OLD.status IS DISTINCT FROM 'shipped')"
        " EXECUTE FUNCTION shipped_order_lines()"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER reservations_shipped_lines ON reservations")
    op.execute("DROP FUNCTION shipped_order_lines()")
