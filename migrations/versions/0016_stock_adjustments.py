"""Stock that follows the warehouse: adjustments, the shortage rule, and their result events.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

The warehouse's adjustments of its stock (receipts, returns, damages, counts), pushed as
``inventory.adjusted`` webhooks, and an operator's (``fulfilment stock adjust``) change
``on_hand`` by a delta, once per ``adjustment_id`` (product contract, "Hearing back from the
warehouse").

- ``warehouse_adjustments``: one row per adjustment applied (its ``adjustment_id`` is the key
  whatever webhook brought it), with the delta as sent, the units ``applied`` (a loss stops
  ``on_hand`` at 0), the level after it, and for an operator's who recorded it and why
  (``operator``, ``comment``, ``os_user``, ``host``, ``database_user``), as
  ``dead_letter_audit`` records a replay.
- ``record_adjustments()`` (v1) applies a batch of them (``migrations/sql/record_adjustments``).
- The shortage rule: ``stock_levels``' CHECK becomes ``0 <= reserved AND 0 <= on_hand``
  (``stock_levels_within_bounds``): a reported loss may leave ``reserved > on_hand``, a short
  SKU, which ``place_orders()`` already refuses (nothing is available). The trigger
  ``stock_levels_shortage`` (``stock_shortage_event()`` v1) writes ``stock.shortage`` in the
  transaction of any writer that changed a SKU's shortfall. ``ship_orders()`` v4 and
  ``record_shipments()`` v2 take ``on_hand`` of a short SKU to 0, never below.
- ``outbox``: ``stock.adjusted`` and ``stock.shortage`` are about a SKU, not an order:
  ``order_id`` becomes nullable and the new ``sku`` column holds their SKU (exactly one of the
  two is set), which the relay publishes them in order by.
- ``webhook_inbox`` takes ``inventory.adjusted`` webhooks (outcome ``adjusted``);
  ``warehouse_discrepancies`` takes ``more_than_on_hand`` from the source ``adjustment``
  (a loss beyond ``on_hand``), with no order (``order_id`` nullable).

Rolling update: every change widens what is allowed (a CHECK relaxed or widened, a nullable
column, a new table, function and trigger) and the replaced functions keep their signatures,
so workers, intakes and dispatchers of the previous release keep running. Its relay, though,
exits on a routing key it does not know: the warehouse's ``inventory.adjusted`` webhooks are
subscribed, and ``fulfilment stock adjust`` run, only once no relay of the previous release
runs (docs/deploy.md); until then no ``stock.adjusted`` row exists, and no SKU is short, so no
``stock.shortage`` row either. The CHECK changes scan ``stock_levels`` and ``outbox`` under the
migration's lock; as in 0011 it gives up after 5 s of waiting for its locks, and the job
retries.

The downgrade refuses to run while a SKU is short or an outbox row has no order (the previous
release can neither hold the one nor publish the other), then drops the trigger, the function
and the table with every adjustment in it, and restores the CHECK constraints and the
previous versions of ``ship_orders()`` and ``record_shipments()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from fulfilment.adapters.postgres.schema import load_sql

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RECORD_ADJUSTMENTS = (
    "record_adjustments(text, uuid[], text[], text[], text[], text[], integer[], text[],"
    " timestamptz[], text[], text[], text[], text[], text[])"
)
ADJUSTMENT_REASONS = ("received", "returned", "found", "counted", "damaged", "lost")
ADJUSTMENT_SOURCES = ("webhook", "operator")

WEBHOOK_TYPES_V15 = ("shipment.shipped", "fulfilment_order.cancelled")
WEBHOOK_TYPES = (*WEBHOOK_TYPES_V15, "inventory.adjusted")
WEBHOOK_OUTCOMES_V15 = (
    "shipped",
    "already_shipped",
    "discrepancy",
    "duplicate",
    "released",
    "ignored",
)
WEBHOOK_OUTCOMES = (*WEBHOOK_OUTCOMES_V15, "adjusted")
DISCREPANCY_KINDS_V15 = ("unknown_order", "order_not_reserved", "more_than_held", "sku_not_held")
DISCREPANCY_KINDS = (*DISCREPANCY_KINDS_V15, "more_than_on_hand")
DISCREPANCY_SOURCES_V15 = ("shipment", "cancellation")
DISCREPANCY_SOURCES = (*DISCREPANCY_SOURCES_V15, "adjustment")
ROUTING_KEYS_V15 = (
    "stock.reserved",
    "stock.rejected",
    "stock.released",
    "stock.shipped",
    "stock.cancel_refused",
)
ROUTING_KEYS = (*ROUTING_KEYS_V15, "stock.adjusted", "stock.shortage")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(name, table, type_="check")
    op.create_check_constraint(name, table, condition)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_constraint("stock_levels_reserved_within_on_hand", "stock_levels", type_="check")
    op.create_check_constraint(
        "stock_levels_within_bounds", "stock_levels", "0 <= reserved AND 0 <= on_hand"
    )

    op.create_table(
        "warehouse_adjustments",
        sa.Column("adjustment_id", sa.Text, nullable=False),
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
    )
    op.create_index("warehouse_adjustments_sku_idx", "warehouse_adjustments", ["sku"])

    _replace_check("webhook_inbox", "webhook_inbox_type_valid", _one_of("type", WEBHOOK_TYPES))
    _replace_check(
        "webhook_inbox", "webhook_inbox_outcome_valid", _one_of("outcome", WEBHOOK_OUTCOMES)
    )
    op.alter_column("warehouse_discrepancies", "order_id", nullable=True)
    _replace_check(
        "warehouse_discrepancies",
        "warehouse_discrepancies_kind_valid",
        _one_of("kind", DISCREPANCY_KINDS),
    )
    _replace_check(
        "warehouse_discrepancies",
        "warehouse_discrepancies_source_valid",
        _one_of("source", DISCREPANCY_SOURCES),
    )
    op.create_check_constraint(
        "warehouse_discrepancies_order_unless_adjustment",
        "warehouse_discrepancies",
        "(order_id IS NULL) = (source = 'adjustment')",
    )

    op.alter_column("outbox", "order_id", nullable=True)
    op.add_column("outbox", sa.Column("sku", sa.Text, nullable=True))
    op.create_check_constraint(
        "outbox_order_or_sku", "outbox", "(order_id IS NULL) <> (sku IS NULL)"
    )
    _replace_check("outbox", "outbox_routing_key_valid", _one_of("routing_key", ROUTING_KEYS))

    load_sql("stock_shortage_event/v1.sql")
    op.execute(
        "CREATE TRIGGER stock_levels_shortage AFTER UPDATE OF on_hand, reserved ON stock_levels"
        " FOR EACH ROW"
        " WHEN (greatest(0, OLD.reserved - OLD.on_hand)"
        " IS DISTINCT FROM greatest(0, NEW.reserved - NEW.on_hand))"
        " EXECUTE FUNCTION stock_shortage_event()"
    )
    load_sql("record_adjustments/v1.sql")
    load_sql("ship_orders/v4.sql")
    load_sql("record_shipments/v2.sql")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Fails (and so rolls the downgrade back) while the previous release could not read the
    # state: a short SKU breaks its CHECK, and its relay cannot publish a row without order.
    op.execute(
        """
        DO $check$
        BEGIN
            IF EXISTS (SELECT 1 FROM stock_levels WHERE reserved > on_hand) THEN
                RAISE EXCEPTION 'short SKUs are stored (reserved > on_hand)'
                    USING HINT = 'Settle them (a receipt or the release of their orders) first.';
            END IF;
            IF EXISTS (SELECT 1 FROM outbox WHERE order_id IS NULL) THEN
                RAISE EXCEPTION 'outbox rows about a SKU are stored'
                    USING HINT = 'Let the relay publish them and prune them first.';
            END IF;
        END
        $check$
        """
    )
    load_sql("record_shipments/v1.sql")
    load_sql("ship_orders/v3.sql")
    op.execute(f"DROP FUNCTION {RECORD_ADJUSTMENTS}")
    op.execute("DROP TRIGGER stock_levels_shortage ON stock_levels")
    op.execute("DROP FUNCTION stock_shortage_event()")

    _replace_check("outbox", "outbox_routing_key_valid", _one_of("routing_key", ROUTING_KEYS_V15))
    op.drop_constraint("outbox_order_or_sku", "outbox", type_="check")
    op.drop_column("outbox", "sku")
    op.alter_column("outbox", "order_id", nullable=False)

    op.execute("DELETE FROM warehouse_discrepancies WHERE source = 'adjustment'")
    op.drop_constraint(
        "warehouse_discrepancies_order_unless_adjustment", "warehouse_discrepancies", type_="check"
    )
    _replace_check(
        "warehouse_discrepancies",
        "warehouse_discrepancies_source_valid",
        _one_of("source", DISCREPANCY_SOURCES_V15),
    )
    _replace_check(
        "warehouse_discrepancies",
        "warehouse_discrepancies_kind_valid",
        _one_of("kind", DISCREPANCY_KINDS_V15),
    )
    op.alter_column("warehouse_discrepancies", "order_id", nullable=False)
    op.execute("DELETE FROM webhook_inbox WHERE type = 'inventory.adjusted'")
    _replace_check(
        "webhook_inbox", "webhook_inbox_outcome_valid", _one_of("outcome", WEBHOOK_OUTCOMES_V15)
    )
    _replace_check("webhook_inbox", "webhook_inbox_type_valid", _one_of("type", WEBHOOK_TYPES_V15))

    op.drop_table("warehouse_adjustments")
    op.drop_constraint("stock_levels_within_bounds", "stock_levels", type_="check")
    op.create_check_constraint(
        "stock_levels_reserved_within_on_hand",
        "stock_levels",
        "0 <= reserved AND reserved <= on_hand",
    )
