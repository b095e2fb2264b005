"""The routes of the warehouse's webhooks, :data:`WEBHOOK_ROUTES`, one per webhook ``type``.

Each handler takes the JSON of a webhook's ``data`` object, the webhook id and how it came in
(``Source``): the intake (``fulfilment webhooks``) calls it for a webhook, the dispatcher's poll
for what ``GET /fulfilment-orders/{id}`` listed (no webhook id). Beside each handler are its SQL
function's arguments and rows, as the queues' routes have theirs in ``routes.table``, whose
:data:`~fulfilment.routes.table.ROUTES` ends with these routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from fulfilment.application.ports import Stock
from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
    InventoryAdjustmentV1,
    ShipmentV1,
    WarehouseCancellationV1,
)
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentOutcome,
    Discrepancy,
    DiscrepancyKind,
    DuplicateBy,
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)
from fulfilment.routes.handling import Handled, parse_event
from fulfilment.routes.route import (
    BatchFunction,
    Route,
    WebhookHandler,
    WebhookType,
    line_arrays,
    row_lines,
)

SHIPMENT_SHIPPED_WEBHOOK = WebhookType("shipment_shipped", SHIPMENT_SHIPPED)
FULFILMENT_ORDER_CANCELLED_WEBHOOK = WebhookType(
    "fulfilment_order_cancelled", FULFILMENT_ORDER_CANCELLED
)
INVENTORY_ADJUSTED_WEBHOOK = WebhookType("inventory_adjusted", INVENTORY_ADJUSTED)


def _duplicate_label(duplicate_by: DuplicateBy | None) -> str:
    return "" if duplicate_by is None else str(duplicate_by)


async def on_shipment_shipped(
    data: bytes, *, stock: Stock, webhook_id: str | None, source: Source
) -> Handled:
    """Apply the shipment in ``data``, once per webhook id and once per ``shipment_id``.

    ``data`` is a ``shipment.shipped`` webhook's ``data``, or a shipment of a polled
    fulfilment order (``webhook_id`` None).

    Returns the outcome for the caller to log and count: ``shipped``, ``already_shipped``,
    ``discrepancy`` or ``duplicate`` (its reason ``webhook`` or ``change``); the log fields say
    the order's status after it and the units it could not take.

    Raises:
        MalformedEventError: ``data`` is not a ``Shipment`` v1 (``parse_event``).
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(ShipmentV1, data)
    outcome = await stock.apply(event.to_command(webhook_id=webhook_id, source=source))
    return Handled(
        event_id=outcome.event_id,
        order_id=outcome.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, _duplicate_label(outcome.duplicate_by)),
        log_fields={
            "shipment_id": event.shipment_id,
            "status": outcome.status,
            "unmatched": [f"{line.sku}:{line.quantity}" for line in outcome.unmatched] or None,
        },
    )


def _refuse_no_shipped_lines(command: RecordShipment) -> None:
    if not command.lines:
        msg = f"shipment {command.shipment_id} names no lines"
        raise ValueError(msg)


def _record_shipments_arguments(commands: Sequence[RecordShipment]) -> dict[str, list[Any]]:
    """The arrays of ``record_shipments()``: shipments', tracking numbers', lines' (merged)."""
    tracking_orders: list[int] = []
    tracking_numbers: list[str] = []
    for ordinal, command in enumerate(commands, start=1):
        tracking_orders.extend([ordinal] * len(command.tracking_numbers))
        tracking_numbers.extend(command.tracking_numbers)
    return {
        "event_ids": [command.event_id for command in commands],
        "shipment_ids": [command.shipment_id for command in commands],
        "webhook_ids": [command.webhook_id for command in commands],
        "sources": [str(command.source) for command in commands],
        "fulfilment_order_ids": [command.fulfilment_order_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "shipped_at": [command.shipped_at for command in commands],
        "carriers": [command.carrier for command in commands],
        "tracking_urls": [command.tracking_url for command in commands],
        "tracking_orders": tracking_orders,
        "tracking_numbers": tracking_numbers,
        **line_arrays(command.shipped() for command in commands),
    }


def _discrepancies(
    kinds: Sequence[str],
    skus: Sequence[str | None],
    quantities: Sequence[int | None],
    statuses: Sequence[str | None],
) -> tuple[Discrepancy, ...]:
    """The ``warehouse_discrepancies`` rows a function returned, as parallel arrays."""
    return tuple(
        Discrepancy(
            DiscrepancyKind(kind), sku, quantity, None if status is None else OrderStatus(status)
        )
        for kind, sku, quantity, status in zip(kinds, skus, quantities, statuses, strict=True)
    )


def _recorded_shipment(command: RecordShipment, row: Sequence[Any]) -> ShipmentOutcome:
    """A ``record_shipments()`` row as its outcome.

    The row is ``(outcome, duplicate_by, status, skus, quantities, discrepancy_kinds,
    discrepancy_skus, discrepancy_quantities, discrepancy_statuses)``.
    """
    outcome, duplicate_by, status, skus, quantities, *discrepancies = row
    return ShipmentOutcome(
        kind=ShipmentKind(outcome),
        order_id=command.order_id,
        event_id=command.event_id,
        lines=row_lines(skus, quantities),
        discrepancies=_discrepancies(*discrepancies),
        status=None if status is None else OrderStatus(status),
        duplicate_by=None if duplicate_by is None else DuplicateBy(duplicate_by),
    )


async def on_fulfilment_order_cancelled(
    data: bytes, *, stock: Stock, webhook_id: str | None, source: Source
) -> Handled:
    """Apply the warehouse's cancellation in ``data``, once per webhook id and cancellation id.

    ``data`` is a ``fulfilment_order.cancelled`` webhook's ``data``, or a cancellation of a
    polled fulfilment order (``webhook_id`` None).

    Returns the outcome for the caller to log and count: ``released``, ``ignored``,
    ``discrepancy`` or ``duplicate`` (its reason ``webhook`` or ``change``); the log fields say
    the order's status after it and whether it cancelled the whole order.

    Raises:
        MalformedEventError: ``data`` is not a ``WarehouseCancellation`` v1 (``parse_event``).
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(WarehouseCancellationV1, data)
    outcome = await stock.apply(event.to_command(webhook_id=webhook_id, source=source))
    return Handled(
        event_id=outcome.event_id,
        order_id=outcome.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, _duplicate_label(outcome.duplicate_by)),
        log_fields={
            "cancellation_id": event.cancellation_id,
            "status": outcome.status,
            "whole": event.lines is None,
        },
    )


def _refuse_no_warehouse_cancelled_lines(command: RecordWarehouseCancellation) -> None:
    if command.lines is not None and not command.lines:
        msg = f"cancellation {command.cancellation_id} names no lines"
        raise ValueError(msg)


def _record_cancellations_arguments(
    commands: Sequence[RecordWarehouseCancellation],
) -> dict[str, list[Any]]:
    """The arrays of ``record_warehouse_cancellations()``: the cancellations', their lines'.

    Lines are merged per SKU; a whole cancellation has none.
    """
    return {
        "event_ids": [command.event_id for command in commands],
        "cancellation_ids": [command.cancellation_id for command in commands],
        "webhook_ids": [command.webhook_id for command in commands],
        "sources": [str(command.source) for command in commands],
        "fulfilment_order_ids": [command.fulfilment_order_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "cancelled_at": [command.cancelled_at for command in commands],
        "reasons": [command.reason for command in commands],
        "whole": [command.lines is None for command in commands],
        **line_arrays(command.cancelled() or {} for command in commands),
    }


def _recorded_cancellation(
    command: RecordWarehouseCancellation, row: Sequence[Any]
) -> WarehouseCancellationOutcome:
    """A ``record_warehouse_cancellations()`` row as its outcome.

    The row is ``(outcome, duplicate_by, status, skus, quantities, discrepancy_kinds,
    discrepancy_skus, discrepancy_quantities, discrepancy_statuses)``.
    """
    outcome, duplicate_by, status, skus, quantities, *discrepancies = row
    return WarehouseCancellationOutcome(
        kind=WarehouseCancellationKind(outcome),
        order_id=command.order_id,
        event_id=command.event_id,
        lines=row_lines(skus, quantities),
        discrepancies=_discrepancies(*discrepancies),
        status=None if status is None else OrderStatus(status),
        duplicate_by=None if duplicate_by is None else DuplicateBy(duplicate_by),
    )


async def on_inventory_adjusted(
    data: bytes, *, stock: Stock, webhook_id: str | None, source: Source
) -> Handled:
    """Apply the adjustment of ``on_hand`` in ``data``, once per webhook id and adjustment id.

    ``data`` is an ``inventory.adjusted`` webhook's ``data``.

    Returns the outcome for the caller to log and count: ``adjusted`` or ``duplicate`` (its
    reason ``webhook`` or ``change``); the log fields say the SKU, the units applied, those of
    a loss beyond ``on_hand`` (a discrepancy), and the shortfall after it. ``Handled`` names
    an order; an adjustment has none, so ``order_id`` is None.

    Raises:
        MalformedEventError: ``data`` is not an ``InventoryAdjustment`` v1 (``parse_event``).
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(InventoryAdjustmentV1, data)
    outcome = await stock.apply(event.to_command(webhook_id=webhook_id, source=source))
    return Handled(
        event_id=outcome.event_id,
        order_id=None,
        outcome=outcome.label,
        labels=(outcome.kind, _duplicate_label(outcome.duplicate_by)),
        log_fields={
            "adjustment_id": event.adjustment_id,
            "sku": event.sku,
            "delta": event.delta,
            "reason": str(event.reason),
            "applied": outcome.applied,
            "discrepancy": outcome.discrepancy or None,
            "short": outcome.short or None,
        },
    )


def _record_adjustments_arguments(commands: Sequence[RecordAdjustment]) -> dict[str, list[Any]]:
    """The arrays of ``record_adjustments()``: one element per adjustment."""
    operators = [command.operator for command in commands]
    return {
        "event_ids": [command.event_id for command in commands],
        "adjustment_ids": [command.adjustment_id for command in commands],
        "webhook_ids": [command.webhook_id for command in commands],
        "sources": [str(command.source) for command in commands],
        "skus": [command.sku for command in commands],
        "deltas": [command.delta for command in commands],
        "reasons": [str(command.reason) for command in commands],
        "occurred_at": [command.occurred_at for command in commands],
        "operators": [None if who is None else who.operator for who in operators],
        "comments": [None if who is None else who.comment for who in operators],
        "os_users": [None if who is None else who.os_user for who in operators],
        "hosts": [None if who is None else who.host for who in operators],
    }


def _refuse_zero_delta(command: RecordAdjustment) -> None:
    if command.delta == 0:
        msg = f"adjustment {command.adjustment_id} changes nothing (delta 0)"
        raise ValueError(msg)


def _recorded_adjustment(command: RecordAdjustment, row: Sequence[Any]) -> AdjustmentOutcome:
    """A ``record_adjustments()`` row as its outcome.

    The row is ``(outcome, duplicate_by, on_hand, reserved, applied, discrepancy)``, the last
    four NULL for a duplicate.
    """
    outcome, duplicate_by, on_hand, reserved, applied, discrepancy = row
    return AdjustmentOutcome(
        kind=AdjustmentKind(outcome),
        sku=command.sku,
        event_id=command.event_id,
        on_hand=on_hand or 0,
        reserved=reserved or 0,
        applied=applied or 0,
        discrepancy=discrepancy or 0,
        duplicate_by=None if duplicate_by is None else DuplicateBy(duplicate_by),
        reason=command.reason,
        discrepancies=(
            (Discrepancy(DiscrepancyKind.MORE_THAN_ON_HAND, command.sku, discrepancy, None),)
            if discrepancy
            else ()
        ),
    )


def _webhook_outcomes(kinds: Iterable[StrEnum]) -> tuple[tuple[str, str], ...]:
    """The ``(outcome, reason)`` labels of a webhook route; a duplicate's: what it repeated."""
    return tuple(
        (str(kind), str(by))
        for kind in kinds
        for by in (DuplicateBy if kind == "duplicate" else ("",))
    )


# --- the list ---------------------------------------------------------------------------------

WEBHOOK_ROUTES: Mapping[str, Route[Any, Any, Any, WebhookHandler]] = {
    SHIPMENT_SHIPPED_WEBHOOK.type: Route(
        transport=SHIPMENT_SHIPPED_WEBHOOK,
        model=ShipmentV1,
        summary=(
            "A shipment of the warehouse: takes from the order what it still holds of the "
            "lines (stock.shipped with the carrier and tracking numbers); the rest is a "
            "discrepancy."
        ),
        command=RecordShipment,
        handler=on_shipment_shipped,
        outcomes=_webhook_outcomes(ShipmentKind),
        function=BatchFunction(
            "record_shipments",
            _record_shipments_arguments,
            _recorded_shipment,
            (),
            check=_refuse_no_shipped_lines,
        ),
    ),
    FULFILMENT_ORDER_CANCELLED_WEBHOOK.type: Route(
        transport=FULFILMENT_ORDER_CANCELLED_WEBHOOK,
        model=WarehouseCancellationV1,
        summary=(
            "The warehouse cancelled the lines (no lines: all) it cannot fulfil: what the "
            "order still holds of them goes back (stock.released, reason "
            "warehouse_cancelled)."
        ),
        command=RecordWarehouseCancellation,
        handler=on_fulfilment_order_cancelled,
        outcomes=_webhook_outcomes(WarehouseCancellationKind),
        function=BatchFunction(
            "record_warehouse_cancellations",
            _record_cancellations_arguments,
            _recorded_cancellation,
            (),
            check=_refuse_no_warehouse_cancelled_lines,
        ),
    ),
    INVENTORY_ADJUSTED_WEBHOOK.type: Route(
        transport=INVENTORY_ADJUSTED_WEBHOOK,
        model=InventoryAdjustmentV1,
        summary=(
            "The warehouse's stock of a SKU changed other than by a shipment (received, "
            "returned, found, counted, damaged, lost): on_hand changes by delta, never below 0 "
            "(stock.adjusted; stock.shortage when a loss leaves it short)."
        ),
        command=RecordAdjustment,
        handler=on_inventory_adjusted,
        outcomes=_webhook_outcomes(AdjustmentKind),
        function=BatchFunction(
            "record_adjustments",
            _record_adjustments_arguments,
            _recorded_adjustment,
            (),
            check=_refuse_zero_delta,
        ),
    ),
}
"""The routes of the warehouse's webhooks, by webhook ``type`` (``shipment.shipped``): what
the intake applies, and what the dispatcher's poll applies the polled changes through. They
close ``routes.table.ROUTES``, in this order."""
