"""What the warehouse system sent, as applied (migrations 0014 to 0016).

The inbox of its webhooks, its shipments, cancellations and adjustments of stock, the
discrepancies they named, and the invalid webhooks kept for an operator with the actions
taken on them.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from fulfilment.adapters.postgres.tables.base import metadata, one_of
from fulfilment.adapters.postgres.tables.stock import ORDER_STATUSES
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
    sa.CheckConstraint(one_of("type", WEBHOOK_TYPES), name="webhook_inbox_type_valid"),
    sa.CheckConstraint(one_of("outcome", WEBHOOK_OUTCOMES), name="webhook_inbox_outcome_valid"),
    sa.Index("webhook_inbox_received_at_idx", "received_at"),
)
"""One row per webhook id applied, per consumer (migration 0014): the inbox of the warehouse's
webhooks, whose ids are the sender's strings (``inbox_messages`` keys UUIDs). A webhook whose
id is here is a duplicate (the sender's retry) and changes nothing. A change found by the
dispatcher's poll has no webhook id and no row. ``fulfilment prune`` deletes the rows past the
retention by ``received_at`` (``webhook_inbox_received_at_idx``, migration 0017)."""

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
    sa.CheckConstraint(one_of("source", SOURCES), name="warehouse_shipments_source_valid"),
    sa.CheckConstraint(
        "(webhook_id IS NULL) = (source = 'poll')",
        name="warehouse_shipments_webhook_id_unless_polled",
    ),
    sa.CheckConstraint(
        one_of("outcome", SHIPMENT_OUTCOMES), name="warehouse_shipments_outcome_valid"
    ),
    sa.CheckConstraint(
        one_of("order_status", ORDER_STATUSES), name="warehouse_shipments_order_status_valid"
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
    sa.CheckConstraint(one_of("source", SOURCES), name="warehouse_cancellations_source_valid"),
    sa.CheckConstraint(
        "(webhook_id IS NULL) = (source = 'poll')",
        name="warehouse_cancellations_webhook_id_unless_polled",
    ),
    sa.CheckConstraint(
        one_of("outcome", CANCELLATION_OUTCOMES), name="warehouse_cancellations_outcome_valid"
    ),
    sa.CheckConstraint(
        one_of("order_status", ORDER_STATUSES), name="warehouse_cancellations_order_status_valid"
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
        one_of("kind", DISCREPANCY_KINDS), name="warehouse_discrepancies_kind_valid"
    ),
    sa.CheckConstraint(
        one_of("source", DISCREPANCY_SOURCES), name="warehouse_discrepancies_source_valid"
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
        one_of("reason", ADJUSTMENT_REASONS), name="warehouse_adjustments_reason_valid"
    ),
    sa.CheckConstraint(
        one_of("source", ADJUSTMENT_SOURCES), name="warehouse_adjustments_source_valid"
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
