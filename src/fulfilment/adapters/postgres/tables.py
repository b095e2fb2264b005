"""The database schema as SQLAlchemy Core tables, mirroring the alembic migrations.

The migrations under ``migrations/versions`` are the source of truth; this module repeats
them so that queries can be written against typed columns. ``tests/integration`` checks that
a migrated database and :data:`metadata` do not differ (alembic's ``compare_metadata``).

Table and column names are part of the product's external contract ("Database" in the
product description); constraint names are spelled out so that they are the same on every
database and can be named in error handling and in later migrations.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
)
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentReason,
    ShipmentKind,
    Source,
    WarehouseCancellationKind,
)
from fulfilment.routes.table import ROUTES

metadata = sa.MetaData()
"""Every table of the service."""

INTEGER_MAX = 2_147_483_647
"""Largest value of an ``integer`` column (``on_hand``, ``reserved``, ``quantity``)."""

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


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


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
    sa.CheckConstraint(_one_of("outcome", INBOX_OUTCOMES), name="inbox_messages_outcome_valid"),
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
    sa.CheckConstraint(_one_of("status", ORDER_STATUSES), name="reservations_status_valid"),
    sa.CheckConstraint(_one_of("reason", REJECTION_REASONS), name="reservations_reason_valid"),
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
)
"""One row per order (migration 0007 for the lifecycle).

``status``: ``reserved``; ``rejected`` with a ``reason`` and the offending ``skus``;
``released`` (cancelled until nothing remained); ``shipped`` (at ``shipped_at``); or
``cancelled``, a tombstone: cancels came before the ``OrderPlaced``, which has not come yet
(``event_id`` and ``placed_at`` are NULL until it does). ``tombstone`` says what those early
cancels cancelled, ``order`` or ``lines`` (summed in ``tombstone_lines``), and stays once the
order is placed; ``cancelled_at`` is the time of the last cancel that changed the order."""

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
        _one_of("routing_key", OUTBOX_ROUTING_KEYS),
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
    sa.CheckConstraint(_one_of("kind", REQUEST_KINDS), name="warehouse_requests_kind_valid"),
    sa.CheckConstraint(_one_of("status", REQUEST_STATUSES), name="warehouse_requests_status_valid"),
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
        _one_of("action", REQUEST_AUDIT_ACTIONS), name="warehouse_request_audit_action_valid"
    ),
    sa.Index("warehouse_request_audit_idempotency_key_idx", "idempotency_key"),
)
"""One row per operator action on a warehouse request (migration 0011): a ``resent`` request
(failed or expired, sent again with the same key and body), the status it had, who did it
(``operator``, and the session's role as the database sees it). ``dead_letter_audit`` does
not fit: its rows are messages (headers, body, failure class), these are rows of a table."""

WEBHOOK_TYPES = (SHIPMENT_SHIPPED, FULFILMENT_ORDER_CANCELLED, INVENTORY_ADJUSTED)
"""Every ``webhook_inbox.type``: the webhooks the service applies."""

WEBHOOK_OUTCOMES = tuple(
    dict.fromkeys(
        [
            *map(str, ShipmentKind),
            *map(str, WarehouseCancellationKind),
            *map(str, AdjustmentKind),
        ]
    )
)
"""Every ``webhook_inbox.outcome``: how the shipment, cancellation or adjustment it brought
ended (``ShipmentKind``, ``WarehouseCancellationKind``, ``AdjustmentKind``); ``duplicate`` for
a change applied before under another webhook id."""

webhook_inbox = sa.Table(
    "webhook_inbox",
    metadata,
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("webhook_id", sa.Text, primary_key=True),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column(
        "received_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("consumer", "webhook_id", name="webhook_inbox_pkey"),
    sa.CheckConstraint(_one_of("type", WEBHOOK_TYPES), name="webhook_inbox_type_valid"),
    sa.CheckConstraint(_one_of("outcome", WEBHOOK_OUTCOMES), name="webhook_inbox_outcome_valid"),
)
"""One row per webhook id applied, per consumer (migration 0014): the inbox of the warehouse's
webhooks, whose ids are the sender's strings (``inbox_messages`` keys UUIDs). A webhook whose
id is here is a duplicate (the sender's retry) and changes nothing. A change found by the
dispatcher's poll has no webhook id and no row."""

SOURCES = (str(Source.WEBHOOK), str(Source.POLL))
"""Every ``source`` of a shipment or cancellation: how it reached the service."""

SHIPMENT_OUTCOMES = tuple(str(kind) for kind in ShipmentKind if kind is not ShipmentKind.DUPLICATE)
"""Every ``warehouse_shipments.outcome``: a duplicate is not recorded again."""

warehouse_shipments = sa.Table(
    "warehouse_shipments",
    metadata,
    sa.Column("shipment_id", sa.Text, primary_key=True),
    sa.Column("order_id", sa.Uuid, nullable=False),
    sa.Column("fulfilment_order_id", sa.Text, nullable=False),
    sa.Column("webhook_id", sa.Text, nullable=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("shipped_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("carrier", sa.Text, nullable=True),
    sa.Column("tracking_numbers", postgresql.ARRAY(sa.Text), nullable=False),
    sa.Column("tracking_url", sa.Text, nullable=True),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("order_status", sa.Text, nullable=True),
    sa.Column(
        "recorded_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("shipment_id", name="warehouse_shipments_pkey"),
    sa.CheckConstraint(_one_of("source", SOURCES), name="warehouse_shipments_source_valid"),
    sa.CheckConstraint(
        "(webhook_id IS NULL) = (source = 'poll')",
        name="warehouse_shipments_webhook_id_unless_polled",
    ),
    sa.CheckConstraint(
        _one_of("outcome", SHIPMENT_OUTCOMES), name="warehouse_shipments_outcome_valid"
    ),
    sa.CheckConstraint(
        _one_of("order_status", ORDER_STATUSES), name="warehouse_shipments_order_status_valid"
    ),
    sa.Index("warehouse_shipments_order_idx", "order_id"),
)
"""One row per shipment of the warehouse applied (migration 0014), keyed by its
``shipment_id`` whichever webhook (``webhook_id``) or poll (``source``) brought it first: who
carries it, its tracking numbers (one per package, possibly none), how it ended
(``outcome``) and the order's status after it (``order_status``, migration 0015; NULL for an
unknown order). Its lines are in ``warehouse_shipment_lines``."""

warehouse_shipment_lines = sa.Table(
    "warehouse_shipment_lines",
    metadata,
    sa.Column("shipment_id", sa.Text, primary_key=True),
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("taken", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("shipment_id", "sku", name="warehouse_shipment_lines_pkey"),
    sa.CheckConstraint(
        "0 < quantity AND 0 <= taken AND taken <= quantity",
        name="warehouse_shipment_lines_taken_within_quantity",
    ),
)
"""The lines of each shipment in ``warehouse_shipments``: ``quantity`` as the warehouse sent
it (lines of the same SKU summed), ``taken`` the units taken from the order (what it held of
the SKU, never more; the rest is a discrepancy). No foreign key, like ``reservation_lines``."""

CANCELLATION_OUTCOMES = tuple(
    str(kind)
    for kind in WarehouseCancellationKind
    if kind is not WarehouseCancellationKind.DUPLICATE
)
"""Every ``warehouse_cancellations.outcome``: a duplicate is not recorded again."""

warehouse_cancellations = sa.Table(
    "warehouse_cancellations",
    metadata,
    sa.Column("cancellation_id", sa.Text, primary_key=True),
    sa.Column("order_id", sa.Uuid, nullable=False),
    sa.Column("fulfilment_order_id", sa.Text, nullable=False),
    sa.Column("webhook_id", sa.Text, nullable=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("whole", sa.Boolean, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("order_status", sa.Text, nullable=True),
    sa.Column(
        "recorded_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("cancellation_id", name="warehouse_cancellations_pkey"),
    sa.CheckConstraint(_one_of("source", SOURCES), name="warehouse_cancellations_source_valid"),
    sa.CheckConstraint(
        "(webhook_id IS NULL) = (source = 'poll')",
        name="warehouse_cancellations_webhook_id_unless_polled",
    ),
    sa.CheckConstraint(
        _one_of("outcome", CANCELLATION_OUTCOMES), name="warehouse_cancellations_outcome_valid"
    ),
    sa.CheckConstraint(
        _one_of("order_status", ORDER_STATUSES), name="warehouse_cancellations_order_status_valid"
    ),
    sa.Index("warehouse_cancellations_order_idx", "order_id"),
)
"""One row per cancellation by the warehouse applied (migration 0014), keyed by its
``cancellation_id`` as shipments are by theirs: the warehouse's ``reason`` as it sent it,
``whole`` when it named no lines (everything the order still held), how it ended, and the
order's status after it (``order_status``, migration 0015). Its lines are in
``warehouse_cancellation_lines``."""

warehouse_cancellation_lines = sa.Table(
    "warehouse_cancellation_lines",
    metadata,
    sa.Column("cancellation_id", sa.Text, primary_key=True),
    sa.Column("sku", sa.Text, primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("released", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("cancellation_id", "sku", name="warehouse_cancellation_lines_pkey"),
    sa.CheckConstraint(
        "0 < quantity AND 0 <= released AND released <= quantity",
        name="warehouse_cancellation_lines_released_within_quantity",
    ),
)
"""The lines of each cancellation in ``warehouse_cancellations``: ``quantity`` as sent (summed
per SKU), ``released`` the units it gave back (what the order still held, never more). A
cancellation of the whole order keeps as its lines what it released (``quantity =
released``). No foreign key, like ``reservation_lines``."""

DISCREPANCY_KINDS = (
    "unknown_order",
    "order_not_reserved",
    "more_than_held",
    "sku_not_held",
    "more_than_on_hand",
)
"""Every ``warehouse_discrepancies.kind``: no order of that reference; an order that is not
``reserved`` (rejected, released, a tombstone); more units than the order held of the SKU
(``quantity`` the excess); a SKU the order never held; a loss of more units than on hand
(``quantity`` the units not taken; migration 0016)."""

DISCREPANCY_SOURCES = ("shipment", "cancellation", "adjustment")
"""Every ``warehouse_discrepancies.source``: what named the units."""

warehouse_discrepancies = sa.Table(
    "warehouse_discrepancies",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("source_id", sa.Text, nullable=False),
    sa.Column("order_id", sa.Uuid, nullable=True),
    sa.Column("sku", sa.Text, nullable=True),
    sa.Column("quantity", sa.Integer, nullable=True),
    sa.Column("order_status", sa.Text, nullable=True),
    sa.Column(
        "detected_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("id", name="warehouse_discrepancies_pkey"),
    sa.CheckConstraint(
        _one_of("kind", DISCREPANCY_KINDS), name="warehouse_discrepancies_kind_valid"
    ),
    sa.CheckConstraint(
        _one_of("source", DISCREPANCY_SOURCES), name="warehouse_discrepancies_source_valid"
    ),
    sa.CheckConstraint(
        "quantity IS NULL OR quantity > 0", name="warehouse_discrepancies_quantity_positive"
    ),
    sa.CheckConstraint(
        "(order_id IS NULL) = (source = 'adjustment')",
        name="warehouse_discrepancies_order_unless_adjustment",
    ),
    sa.Index("warehouse_discrepancies_source_idx", "source", "source_id"),
)
"""What a shipment or a cancellation of the warehouse named that the order did not hold
(migration 0014), one row per kind and SKU (``sku`` and ``quantity`` NULL for a whole order:
``unknown_order``, ``order_not_reserved``), recorded in the transaction that applied it;
``source_id`` is its ``shipment_id`` or ``cancellation_id``, ``order_status`` the order's
status then (NULL when unknown). A shipment of an order already ``shipped`` is not one (its
outcome ``already_shipped`` says so). A loss beyond ``on_hand`` (source ``adjustment``,
migration 0016) names its ``adjustment_id`` and SKU, and no order."""

invalid_webhooks = sa.Table(
    "invalid_webhooks",
    metadata,
    sa.Column("webhook_id", sa.Text, primary_key=True),
    sa.Column("type", sa.Text, nullable=True),
    sa.Column(
        "received_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.Column("headers", postgresql.JSONB, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("replay_outcome", sa.Text, nullable=True),
    sa.PrimaryKeyConstraint("webhook_id", name="invalid_webhooks_pkey"),
    sa.CheckConstraint(
        "(replayed_at IS NULL) = (replay_outcome IS NULL)",
        name="invalid_webhooks_replay_outcome_iff_replayed",
    ),
)
"""A signed webhook that is not a valid event of its type (answered 422), kept once per
webhook id (migration 0014; a retry of it changes nothing): its ``type`` when the envelope
could be read, the request's headers without ``webhook-signature``, the raw body and the
reason; ``replayed_at`` and ``replay_outcome`` once an operator replayed it."""

invalid_webhook_audit = sa.Table(
    "invalid_webhook_audit",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("webhook_id", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
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
    sa.PrimaryKeyConstraint("id", name="invalid_webhook_audit_pkey"),
    sa.CheckConstraint("action IN ('replayed')", name="invalid_webhook_audit_action_valid"),
    sa.Index("invalid_webhook_audit_webhook_id_idx", "webhook_id"),
)
"""One row per operator action on a kept invalid webhook (migration 0014): a ``replayed`` one,
how it ended, who did it (``operator``, the machine's user and host, and the session's role as
the database sees it), like ``dead_letter_audit``."""

ADJUSTMENT_REASONS = tuple(map(str, AdjustmentReason))
"""Every ``warehouse_adjustments.reason``."""

ADJUSTMENT_SOURCES = (str(Source.WEBHOOK), str(Source.OPERATOR))
"""Every ``warehouse_adjustments.source``: a webhook of the warehouse, or an operator."""

warehouse_adjustments = sa.Table(
    "warehouse_adjustments",
    metadata,
    sa.Column("adjustment_id", sa.Text, primary_key=True),
    sa.Column("sku", sa.Text, nullable=False),
    sa.Column("delta", sa.Integer, nullable=False),
    sa.Column("applied", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("webhook_id", sa.Text, nullable=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("on_hand_after", sa.Integer, nullable=False),
    sa.Column("reserved_after", sa.Integer, nullable=False),
    sa.Column("operator", sa.Text, nullable=True),
    sa.Column("comment", sa.Text, nullable=True),
    sa.Column("os_user", sa.Text, nullable=True),
    sa.Column("host", sa.Text, nullable=True),
    sa.Column("database_user", sa.Text, nullable=False, server_default=sa.text("session_user")),
    sa.Column(
        "recorded_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("now()"),
    ),
    sa.PrimaryKeyConstraint("adjustment_id", name="warehouse_adjustments_pkey"),
    sa.CheckConstraint("delta <> 0", name="warehouse_adjustments_delta_not_zero"),
    sa.CheckConstraint(
        "(delta > 0 AND applied = delta) OR (delta < 0 AND delta <= applied AND applied <= 0)",
        name="warehouse_adjustments_applied_within_delta",
    ),
    sa.CheckConstraint(
        _one_of("reason", ADJUSTMENT_REASONS), name="warehouse_adjustments_reason_valid"
    ),
    sa.CheckConstraint(
        _one_of("source", ADJUSTMENT_SOURCES), name="warehouse_adjustments_source_valid"
    ),
    sa.CheckConstraint(
        "(webhook_id IS NULL) = (source = 'operator')"
        " AND (operator IS NULL) = (source <> 'operator')",
        name="warehouse_adjustments_webhook_or_operator",
    ),
    sa.CheckConstraint(
        "0 <= on_hand_after AND 0 <= reserved_after",
        name="warehouse_adjustments_levels_not_negative",
    ),
    sa.Index("warehouse_adjustments_sku_idx", "sku"),
)
"""One row per adjustment of ``on_hand`` applied (migration 0016), by its ``adjustment_id``
whatever webhook brought it: ``delta`` as sent, ``applied`` the units ``on_hand`` changed by
(a loss stops it at 0; the rest is a ``more_than_on_hand`` discrepancy), the SKU's level
after it, and for an operator's (``fulfilment stock adjust``) who recorded it and why, as
``dead_letter_audit`` records a replay (``database_user`` the session's role)."""
