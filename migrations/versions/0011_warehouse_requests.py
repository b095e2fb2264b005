"""The hand-off to the warehouse system: warehouse_requests, its audit, and v3 of two functions.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

- ``warehouse_requests``: one row per request to the warehouse system (a fulfilment order per
  reservation, a cancellation per cancel of an order the warehouse may hold), recorded in the
  transaction of the change that caused it and sent by the dispatcher (product contract,
  "The warehouse system"). ``id`` gives the per-order order; ``idempotency_key`` is minted
  with the row; ``body`` is frozen at the first attempt. A partial index serves the
  dispatcher's claim (open rows by ``next_attempt_at``), another the per-order rule and the
  cancels' look-up (``order_id, id``); a partial unique index keeps one fulfilment order per
  order. ``released_order`` marks the cancellation whose application left its order
  ``released`` (none else did: the order's release left no inbox ``released`` row), so the
  invariant check counts every release; it is recorded, not derived, because ``fulfilment
  prune`` deletes the inbox rows that would tell per order which event released it.
- ``warehouse_request_audit``: who re-sent which request (``fulfilment`` operator commands).
  ``dead_letter_audit`` does not fit: it records messages (headers, body, failure class).
- ``inbox_messages.outcome`` gains ``cancel_requested`` (a cancel that waits for the
  warehouse's answer) and ``outbox.routing_key`` gains ``stock.cancel_refused``.
- ``place_orders()`` and ``cancel_orders()`` v3 take a last parameter ``p_handoff boolean
  DEFAULT false``: true records the requests (``migrations/sql/*/v3.sql`` say what, as a diff
  against v2); false is v2's behaviour exactly. A new parameter is a new signature, so the
  revision drops v2 and creates v3 in its transaction, as 0009 did.

Rolling update: workers of the previous release pass v2's arguments and call v3 with
``p_handoff`` false, which is v2; they never write ``cancel_requested``. Creating two empty
tables and replacing two CHECK constraints (validated by a scan of ``inbox_messages`` and
``outbox`` under a short ``lock_timeout``) is the whole cost.

The downgrade drops v3 and loads v2 again, restores the two CHECK constraints (refused while
an inbox row says ``cancel_requested`` or an outbox row ``stock.cancel_refused``: the older
release cannot read them), and drops the two tables with every request in them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLACE_ORDERS_V2 = (
    "place_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[], text[])"
)
CANCEL_ORDERS_V2 = (
    "cancel_orders(text, uuid[], uuid[], timestamptz[], boolean[], integer[], text[], integer[],"
    " text[])"
)
# v3 takes v2's arguments and p_handoff boolean.
PLACE_ORDERS_V3 = PLACE_ORDERS_V2.replace("text[])", "text[], boolean)")
CANCEL_ORDERS_V3 = CANCEL_ORDERS_V2.replace(" text[])", " text[], boolean)")

INBOX_OUTCOMES_V10 = (
    "reserved",
    "rejected",
    "duplicate_order",
    "released",
    "partially_released",
    "tombstoned",
    "cancel_ignored",
    "cancel_after_ship",
    "shipped",
    "ship_ignored",
)
INBOX_OUTCOMES_V11 = (*INBOX_OUTCOMES_V10[:8], "cancel_requested", *INBOX_OUTCOMES_V10[8:])
ROUTING_KEYS_V10 = ("stock.reserved", "stock.rejected", "stock.released", "stock.shipped")
ROUTING_KEYS_V11 = (*ROUTING_KEYS_V10, "stock.cancel_refused")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def _replace_checks(outcomes: tuple[str, ...], routing_keys: tuple[str, ...]) -> None:
    op.drop_constraint("inbox_messages_outcome_valid", "inbox_messages", type_="check")
    op.create_check_constraint(
        "inbox_messages_outcome_valid", "inbox_messages", _one_of("outcome", outcomes)
    )
    op.drop_constraint("outbox_routing_key_valid", "outbox", type_="check")
    op.create_check_constraint(
        "outbox_routing_key_valid", "outbox", _one_of("routing_key", routing_keys)
    )


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table(
        "warehouse_requests",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("idempotency_key", sa.Uuid, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("order_id", sa.Uuid, nullable=False),
        sa.Column("causation_id", sa.Uuid, nullable=False),
        sa.Column("lines", postgresql.JSONB, nullable=True),
        sa.Column("body", sa.LargeBinary, nullable=True),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("first_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("warehouse_id", sa.Text, nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("last_answer", sa.Text, nullable=True),
        sa.Column("traceparent", sa.Text, nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("released_order", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("id", name="warehouse_requests_pkey"),
        sa.UniqueConstraint("idempotency_key", name="warehouse_requests_idempotency_key_key"),
        sa.CheckConstraint(
            "kind IN ('fulfilment_order', 'cancellation')", name="warehouse_requests_kind_valid"
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'sending', 'accepted', 'refused', 'failed', 'withdrawn',"
            " 'expired')",
            name="warehouse_requests_status_valid",
        ),
        sa.CheckConstraint(
            "kind = 'cancellation' OR lines IS NOT NULL",
            name="warehouse_requests_fulfilment_order_has_lines",
        ),
        sa.CheckConstraint(
            "attempts >= 0 AND (attempts = 0) = (body IS NULL)"
            " AND (attempts = 0) = (first_attempt_at IS NULL)",
            name="warehouse_requests_body_frozen_at_first_attempt",
        ),
        sa.CheckConstraint(
            "NOT released_order OR (kind = 'cancellation' AND status IN ('accepted', 'withdrawn'))",
            name="warehouse_requests_released_order_by_a_cancellation",
        ),
    )
    op.create_index(
        "warehouse_requests_due_idx",
        "warehouse_requests",
        ["next_attempt_at"],
        postgresql_where=sa.text("status IN ('pending', 'sending')"),
    )
    op.create_index("warehouse_requests_order_idx", "warehouse_requests", ["order_id", "id"])
    op.create_index(
        "warehouse_requests_one_fulfilment_order_idx",
        "warehouse_requests",
        ["order_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'fulfilment_order'"),
    )
    op.create_table(
        "warehouse_request_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("idempotency_key", sa.Uuid, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("status_before", sa.Text, nullable=False),
        sa.Column("operator", sa.Text, nullable=False),
        sa.Column("database_user", sa.Text, nullable=False, server_default=sa.text("session_user")),
        sa.Column(
            "performed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("id", name="warehouse_request_audit_pkey"),
        sa.CheckConstraint("action IN ('resent')", name="warehouse_request_audit_action_valid"),
    )
    op.create_index(
        "warehouse_request_audit_idempotency_key_idx",
        "warehouse_request_audit",
        ["idempotency_key"],
    )
    _replace_checks(INBOX_OUTCOMES_V11, ROUTING_KEYS_V11)
    op.execute(f"DROP FUNCTION {PLACE_ORDERS_V2}")
    load_sql("place_orders/v3.sql")
    op.execute(f"DROP FUNCTION {CANCEL_ORDERS_V2}")
    load_sql("cancel_orders/v3.sql")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {PLACE_ORDERS_V3}")
    load_sql("place_orders/v2.sql")
    op.execute(f"DROP FUNCTION {CANCEL_ORDERS_V3}")
    load_sql("cancel_orders/v2.sql")
    _replace_checks(INBOX_OUTCOMES_V10, ROUTING_KEYS_V10)
    op.drop_table("warehouse_request_audit")
    op.drop_table("warehouse_requests")
