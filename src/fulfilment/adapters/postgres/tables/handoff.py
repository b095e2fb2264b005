"""The hand-off's tables.

The requests to the warehouse system, and the operators' actions on them.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from fulfilment.adapters.postgres.tables.base import metadata, one_of

REQUEST_KINDS = ("fulfilment_order", "cancellation")
"""Every ``warehouse_requests.kind`` (``fulfilment.domain.handoff.RequestKind``)."""

REQUEST_STATUSES = ("pending", "sending", "accepted", "refused", "failed", "withdrawn", "expired")
"""Every ``warehouse_requests.status`` (``fulfilment.domain.handoff.RequestStatus``)."""

warehouse_requests = sa.Table(
    "warehouse_requests",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
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
    sa.Column("news_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("id", name="warehouse_requests_pkey"),
    sa.UniqueConstraint("idempotency_key", name="warehouse_requests_idempotency_key_key"),
    sa.CheckConstraint(one_of("kind", REQUEST_KINDS), name="warehouse_requests_kind_valid"),
    sa.CheckConstraint(one_of("status", REQUEST_STATUSES), name="warehouse_requests_status_valid"),
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
    sa.Index(
        "warehouse_requests_due_idx",
        "next_attempt_at",
        "id",
        postgresql_where=sa.text("status IN ('pending', 'sending')"),
    ),
    sa.Index("warehouse_requests_order_idx", "order_id", "id"),
    sa.Index(
        "warehouse_requests_one_fulfilment_order_idx",
        "order_id",
        unique=True,
        postgresql_where=sa.text("kind = 'fulfilment_order'"),
    ),
    sa.Index(
        "warehouse_requests_without_news_idx",
        sa.text("greatest(news_at, polled_at, answered_at)"),
        "id",
        postgresql_where=sa.text("kind = 'fulfilment_order' AND status = 'accepted'"),
    ),
)
"""One row per request to the warehouse system (migration 0011), recorded by
``place_orders()``/``cancel_orders()`` v3 in the transaction of the change that caused it, and
claimed, sent and answered by the dispatcher (``PostgresWarehouseRequests``). ``id`` is the
per-order sending order; ``idempotency_key`` is minted with the row and never changes;
``lines`` are ``[{"sku", "quantity"}]`` merged per SKU and sorted by SKU (NULL: a
cancellation of the whole order); ``body`` is the exact bytes sent, frozen at the first
attempt (so NULL exactly while ``attempts`` is 0). At most one fulfilment order per order.
``released_order`` is true on the cancellation whose application (accepted, or applied
locally once its fulfilment order failed) left its order holding nothing (``released``, or
``shipped`` when the warehouse had shipped some of it): the invariant check (``outcomes``)
counts it as the event that ended the order. ``news_at`` (migration 0014)
is the last time a shipment or cancellation of the warehouse was recorded for the order of a
fulfilment order, ``polled_at`` the dispatcher's last ``GET`` of it; the poll reads the
accepted fulfilment orders by ``greatest(news_at, polled_at, answered_at)``, the last time it
heard of the order (``greatest`` skips NULLs; a poll that found nothing new moves it on), the
expression of ``warehouse_requests_without_news_idx``."""

REQUEST_AUDIT_ACTIONS = ("resent",)
"""Every ``warehouse_request_audit.action``."""

warehouse_request_audit = sa.Table(
    "warehouse_request_audit",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
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
    sa.CheckConstraint(
        one_of("action", REQUEST_AUDIT_ACTIONS), name="warehouse_request_audit_action_valid"
    ),
    sa.Index("warehouse_request_audit_idempotency_key_idx", "idempotency_key"),
)
"""One row per operator action on a warehouse request (migration 0011): a ``resent`` request
(failed or expired, sent again with the same key and body), the status it had, who did it
(``operator``, and the session's role as the database sees it). ``dead_letter_audit`` does
not fit: its rows are messages (headers, body, failure class), these are rows of a table."""
