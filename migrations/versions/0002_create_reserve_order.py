"""Create reserve_order(): one reservation, inbox record included, in one round trip.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-06

The function and its comment are ``migrations/sql/reserve_order/v1.sql``, whose header says
how it works. Later changes to a function go in a new version of its file, loaded by a new
revision (``migrations/sql/README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "reserve_order(text, uuid, uuid, timestamptz, text[], integer[])"


def upgrade() -> None:
    load_sql("reserve_order/v1.sql")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
