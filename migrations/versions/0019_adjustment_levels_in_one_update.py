"""An adjustment's level written in one statement per call: ``record_adjustments()`` v2.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

``record_adjustments()`` v1 updated each new adjustment's ``warehouse_adjustments`` row
(applied, the level after it) inside its loop, one ``UPDATE`` by ``adjustment_id`` per
adjustment. PL/pgSQL keeps a statement's plan for the session: planned while the table was
small, or while its statistics said so, that ``UPDATE`` is a sequential scan, and every
adjustment read the whole table. A burst of 20,000 adjustments in calls of 16 read 199 million
rows, and the time per adjustment grew from 0.7 ms to 4 ms as the table filled (issue 37: an
adjustment cost PostgreSQL 2.28 times a shipment's CPU on the intake's path). Version 2
(``migrations/sql/record_adjustments/v2.sql``) writes those values in one ``UPDATE`` after the
loop; its outcomes, locks, rows and events are version 1's.

Rolling update: ``CREATE OR REPLACE`` with the same signature and results; an intake or
operator of the previous release calls it unchanged.

The downgrade loads version 1 again.
"""

from __future__ import annotations

from collections.abc import Sequence

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    load_sql("record_adjustments/v2.sql")


def downgrade() -> None:
    load_sql("record_adjustments/v1.sql")
