"""The stock store's tables.

The stock levels, the orders and their lines, the inbox, the outbox, and the records of the
worker (redeliveries) and of the operators (dead letters replayed or purged, inbox rows
pruned).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from fulfilment.adapters.postgres.tables.base import metadata, one_of
from fulfilment.routes.table import ROUTES

stock_levels = sa.Table(
    "stock_levels",
    metadata,
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("on_hand", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column(
        "updated_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.Column("shipped", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("sku", name="stock_levels_pkey"),
    sa.CheckConstraint("shipped >= 0", name="stock_levels_shipped_not_negative"),
    sa.CheckConstraint("0 <= reserved AND 0 <= on_hand", name="stock_levels_within_bounds"),
)
"""Units per SKU: ``on_hand`` in the warehouse, ``reserved`` of them promised to orders, and
``shipped``, the units that left with shipments (migration 0008). ``reserved <= on_hand``
wherever no loss was reported: a loss (``record_adjustments()``, migration 0016) may leave
``reserved > on_hand``, a short SKU, announced by ``stock.shortage`` (the trigger
``stock_levels_shortage``)."""

INBOX_OUTCOMES = tuple(outcome for route in ROUTES for outcome in route.function.inbox_outcomes)
"""Every ``inbox_messages.outcome``, each route's (``BatchFunction.inbox_outcomes``), in the
routes' order: an ``OrderPlaced`` was ``reserved``, ``rejected`` or a
``duplicate_order``; an ``OrderCancelled`` ``released`` or ``partially_released`` stock, left
a tombstone (``tombstoned``), changed nothing (``cancel_ignored``), came after the shipment
(``cancel_after_ship``) or waits for the warehouse system's answer (``cancel_requested``,
migration 0011); an ``OrderShipped`` ``shipped`` the order or changed nothing
(``ship_ignored``). A shipment of an order that is not reserved is not recorded (migration
0007)."""

ORDER_STATUSES = ("reserved", "rejected", "released", "shipped", "cancelled")
"""Every ``reservations.status`` (``fulfilment.domain.lifecycle.OrderStatus``)."""

REJECTION_REASONS = ("insufficient_stock", "unknown_sku", "cancelled")
"""Every ``reservations.reason`` (``fulfilment.domain.model.RejectionReason``)."""


inbox_messages = sa.Table(
    "inbox_messages",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("event_id", sa.Uuid, primary_key=True),
    sa.Column("order_id", sa.Uuid, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column(
        "processed_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("consumer", "event_id", name="inbox_messages_pkey"),
    sa.CheckConstraint(one_of("outcome", INBOX_OUTCOMES), name="inbox_messages_outcome_valid"),
)
"""One row per processed event and consumer, of every kind: the idempotency record of
``Stock.apply``."""

reservations = sa.Table(
    "reservations",
    metadata,
    sa.Column("order_id", sa.Uuid, primary_key=True),
    sa.Column("event_id", sa.Uuid, nullable=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column(
        "skus",
        postgresql.ARRAY(sa.Text),
        nullable=False,
        server_default=sa.text("'{}'::text[]"),
    ),
    sa.Column("placed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column(
        "created_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.Column("tombstone", sa.Text, nullable=True),
    sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("shipped_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("order_id", name="reservations_pkey"),
    sa.UniqueConstraint("event_id", name="reservations_event_id_key"),
    sa.CheckConstraint(one_of("status", ORDER_STATUSES), name="reservations_status_valid"),
    sa.CheckConstraint(one_of("reason", REJECTION_REASONS), name="reservations_reason_valid"),
    sa.CheckConstraint(
        "(reason IS NOT NULL) = (status = 'rejected')", name="reservations_reason_iff_rejected"
    ),
    sa.CheckConstraint(
        "(event_id IS NULL) = (status = 'cancelled')"
        " AND (placed_at IS NULL) = (status = 'cancelled')",
        name="reservations_placed_unless_cancelled",
    ),
    sa.CheckConstraint("tombstone IN ('order', 'lines')", name="reservations_tombstone_valid"),
    sa.CheckConstraint(
        "status <> 'cancelled' OR tombstone IS NOT NULL",
        name="reservations_cancelled_has_tombstone",
    ),
    sa.CheckConstraint(
        "(shipped_at IS NOT NULL) = (status = 'shipped')",
        name="reservations_shipped_at_iff_shipped",
    ),
    sa.Index(
        "reservations_reserved_idx",
        "order_id",
        postgresql_where=sa.text("status = 'reserved'"),
    ),
)
"""One row per order (migration 0007 for the lifecycle).

``status``: ``reserved``; ``rejected`` with a ``reason`` and the offending ``skus``;
``released`` (cancelled until nothing remained); ``shipped`` (at ``shipped_at``); or
``cancelled``, a tombstone: cancels came before the ``OrderPlaced``, which has not come yet
(``event_id`` and ``placed_at`` are NULL until it does). ``tombstone`` says what those early
cancels cancelled, ``order`` or ``lines`` (summed in ``tombstone_lines``), and stays once the
order is placed; ``cancelled_at`` is the time of the last cancel that changed the order.
``reservations_reserved_idx`` (migration 0017) holds the ``reserved`` orders, the few that
still hold units, from which the dispatcher's poll starts."""

reservation_lines = sa.Table(
    "reservation_lines",
    metadata,
    sa.Column("order_id", sa.Uuid, primary_key=True),
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("shipped", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("order_id", "sku", name="reservation_lines_pkey"),
    sa.CheckConstraint("quantity > 0", name="reservation_lines_quantity_positive"),
    sa.CheckConstraint(
        "0 <= shipped AND shipped <= quantity", name="reservation_lines_shipped_within_quantity"
    ),
)
"""The lines of each order per SKU (lines of the same SKU summed). ``quantity`` is the units
the line holds plus those it shipped (``shipped``, migration 0014), so it holds
``quantity - shipped``: a ``reserved`` order holds units of some line (partial cancels shrink
``quantity`` by what they release, and drop a line left with nothing held or shipped), a
``shipped`` one holds none (``shipped = quantity``, the units that left), a ``rejected`` one's
lines are what it asked for (after its tombstone); none for a ``released`` or ``cancelled``
order.

No foreign key to ``reservations`` (dropped by migration 0005, which says why): the
reservation functions write an order's reservation and its lines in one transaction."""

tombstone_lines = sa.Table(
    "tombstone_lines",
    metadata,
    sa.Column("order_id", sa.Uuid, primary_key=True),
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("quantity", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("order_id", "sku", name="tombstone_lines_pkey"),
    sa.CheckConstraint("quantity > 0", name="tombstone_lines_quantity_positive"),
)
"""Units per SKU that cancels of an order's lines cancelled before its ``OrderPlaced`` came
(the order's ``tombstone`` is ``lines``), summed (``bigint``: repeated cancels may add past
``integer``); ``place_orders()`` reserves what they leave. Written only under the order's
``reservations`` row lock; no foreign key, like ``reservation_lines``."""

delivery_attempts = sa.Table(
    "delivery_attempts",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("message_key", sa.Text, primary_key=True),
    sa.Column("redeliveries", sa.Integer, nullable=False),
    sa.Column(
        "first_redelivered_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.Column(
        "last_redelivered_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("consumer", "message_key", name="delivery_attempts_pkey"),
    sa.CheckConstraint("redeliveries > 0", name="delivery_attempts_redeliveries_positive"),
)
"""Redeliveries the service counted per message (migration 0003), for its own delivery limit."""

OUTBOX_ROUTING_KEYS = (
    "stock.reserved",
    "stock.rejected",
    "stock.released",
    "stock.shipped",
    "stock.cancel_refused",
    "stock.adjusted",
    "stock.shortage",
)
"""Every ``outbox.routing_key``: the result events (docs/design.md, "The outbox").
``stock.adjusted`` and ``stock.shortage`` are about a SKU (``outbox.sku``), the others about
an order (``outbox.order_id``), migration 0016."""

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("event_id", sa.Uuid, nullable=False),
    sa.Column("order_id", sa.Uuid, nullable=True),
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
    sa.Column("sku", sa.Text, nullable=True),
    sa.PrimaryKeyConstraint("id", name="outbox_pkey"),
    sa.UniqueConstraint("event_id", name="outbox_event_id_key"),
    sa.CheckConstraint(
        one_of("routing_key", OUTBOX_ROUTING_KEYS),
        name="outbox_routing_key_valid",
    ),
    sa.CheckConstraint("(order_id IS NULL) <> (sku IS NULL)", name="outbox_order_or_sku"),
    sa.Index("outbox_unpublished_idx", "id", postgresql_where=sa.text("published_at IS NULL")),
    sa.Index(
        "outbox_published_at_idx",
        "published_at",
        postgresql_where=sa.text("published_at IS NOT NULL"),
    ),
)
"""One row per result event (migration 0008; ``stock.cancel_refused`` since 0011), written in
the transaction of the status change it reports; ``id`` is the publishing order,
``published_at`` set once the broker confirmed. ``order_id`` is the order it reports on, or
``sku`` the SKU (``stock.adjusted``, ``stock.shortage``; migration 0016): exactly one is set,
and the relay publishes the rows of one order or one SKU in ``id`` order."""

dead_letter_audit = sa.Table(
    "dead_letter_audit",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("run_id", sa.Uuid, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("event_id", sa.Text, nullable=True),
    sa.Column("message_id", sa.Text, nullable=True),
    sa.Column("failure_class", sa.Text, nullable=False),
    sa.Column("exception_type", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("dead_lettered_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("headers", postgresql.JSONB, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("operator", sa.Text, nullable=False),
    sa.Column("comment", sa.Text, nullable=True),
    sa.Column("os_user", sa.Text, nullable=True),
    sa.Column("host", sa.Text, nullable=True),
    sa.Column("database_user", sa.Text, nullable=False, server_default=sa.text("session_user")),
    sa.Column(
        "performed_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("id", name="dead_letter_audit_pkey"),
    sa.CheckConstraint("action IN ('replayed', 'purged')", name="dead_letter_audit_action_valid"),
    sa.Index("dead_letter_audit_event_id_idx", "event_id"),
    sa.Index("dead_letter_audit_run_id_idx", "run_id"),
)
"""One row per dead letter replayed or purged by ``fulfilment dlq`` (migration 0004), written
before the message leaves the DLQ; ``run_id`` is the ``x-fulfilment-replay-id`` of a replay,
and ``event_id`` is text because a malformed body may hold anything there."""

inbox_pruned = sa.Table(
    "inbox_pruned",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("outcome", sa.Text, primary_key=True),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("consumer", "outcome", name="inbox_pruned_pkey"),
    sa.CheckConstraint("rows >= 0", name="inbox_pruned_rows_not_negative"),
)
"""How many ``inbox_messages`` rows of each outcome ``fulfilment prune`` deleted (migration
0010), added in the transaction that deletes them, so the report's outcome counts and the
invariant check (``outcomes``) still count every event ever processed."""
