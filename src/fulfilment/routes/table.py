"""The list of routes, :data:`ROUTES`, one per input event, and what is made from it.

Each handler is a plain function of the raw body and the stock store: parse, build the
command, apply it, say what it made of the event (``fulfilment.routes.handling``). The
worker subscribes the handler of each queue's route to its queue under the delivery policy
(``worker.delivery``), which does the rest: deadline, redelivery count, dead letters, requeue
and pause, the span, the log line and metric. The warehouse's webhooks have a route per
``type`` (:data:`WEBHOOK_ROUTES`), whose handler also takes the webhook id and the source;
the intake (``fulfilment webhooks``) and the dispatcher's poll call it. Each route's SQL
function is the one ``PostgresStock.apply`` calls for its command; its arguments and its rows
are read here, beside the route, so that a new event changes neither the port nor the adapter
(``docs/development.md``, "Adding an input event").

Made from :data:`ROUTES`: :data:`QUEUE_ROUTES`, :data:`WEBHOOK_ROUTES`,
:data:`SUBSCRIBED_QUEUES`, :data:`DEAD_LETTER_QUEUES`, :data:`OUTCOMES` (of the queues' routes
only), :data:`FUNCTIONS` (of every route); the worker's subscriptions
(``entrypoints.worker.build_worker``), the AsyncAPI document (``fulfilment.asyncapi``), the
runtime role's grants (``adapters.postgres.privileges``), and the broker definitions, queue
policies, KEDA triggers and per-queue alert rules (``scripts/render-deploy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from fulfilment.application.ports import Stock
from fulfilment.contracts.order_cancelled import OrderCancelledV1
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.contracts.order_shipped import OrderShippedV1
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_SHIPPED,
    SubscribedQueue,
)
from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
    InventoryAdjustmentV1,
    ShipmentV1,
    WarehouseCancellationV1,
)
from fulfilment.domain.lifecycle import (
    CancelKind,
    CancelOrder,
    CancelOutcome,
    OrderStatus,
    ShipKind,
    ShipOrder,
    ShipOutcome,
)
from fulfilment.domain.model import (
    DuplicateOf,
    OrderLine,
    OutcomeKind,
    PlaceOrder,
    RejectionReason,
    ReservationOutcome,
)
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
from fulfilment.observability.metrics import DEAD_LETTERED
from fulfilment.routes.handling import EventRefusedError, Handled, parse_event
from fulfilment.routes.route import BatchFunction, Route, WebhookHandler, WebhookType

ORDER_NOT_RESERVED = "order_not_reserved"
"""The reason of a shipment dead-lettered because its order is not reserved (no row yet,
rejected, released or cancelled): an operator's question, not a bug (``docs/runbook.md``)."""


# --- OrderPlaced ------------------------------------------------------------------------------


async def on_order_placed(body: bytes, *, stock: Stock) -> Handled:
    """Reserve stock for the ``OrderPlaced`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``reserved``, ``rejected`` with its
    reason and SKUs, or ``duplicate`` (of the event, or of the order); the end-to-end latency
    from ``placed_at`` is observed unless it is a duplicate.

    Raises:
        MalformedEventError: the body is not an ``OrderPlaced`` v1 (``parse_event``).
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(OrderPlacedV1, body)
    outcome = await stock.apply(event.to_command())
    return Handled(
        event_id=event.event_id,
        order_id=event.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, _reason_label(outcome)),
        latency_since=None if outcome.kind is OutcomeKind.DUPLICATE else event.placed_at,
        log_fields={"skus": list(outcome.skus) or None},
    )


def _reason_label(outcome: ReservationOutcome) -> str:
    if outcome.reason is not None:
        return str(outcome.reason)
    if outcome.duplicate_of is not None:
        return str(outcome.duplicate_of)
    return ""


def _refuse_no_lines(command: PlaceOrder) -> None:
    if not command.lines:
        msg = f"order {command.order_id} has no lines"
        raise ValueError(msg)


def _place_arguments(commands: Sequence[PlaceOrder]) -> dict[str, list[Any]]:
    """The arrays of ``place_orders()``: the orders', then their lines' (merged per SKU)."""
    # The check has refused orders without lines, so every ordinal gets at least one.
    return {
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "placed_at": [command.placed_at for command in commands],
        **_line_arrays(command.demand() for command in commands),
    }


def _line_arrays(lines_per_command: Iterable[Mapping[str, int]]) -> dict[str, list[Any]]:
    """``line_orders``, ``line_skus``, ``line_quantities``: each command's lines, flattened.

    ``line_orders`` holds the 1-based ordinal of the command a line belongs to, as the batch
    functions join lines to their command by it.
    """
    line_orders: list[int] = []
    line_skus: list[str] = []
    line_quantities: list[int] = []
    for ordinal, lines in enumerate(lines_per_command, start=1):
        line_orders.extend([ordinal] * len(lines))
        line_skus.extend(lines)
        line_quantities.extend(lines.values())
    return {"line_orders": line_orders, "line_skus": line_skus, "line_quantities": line_quantities}


def _placement(command: PlaceOrder, row: Sequence[Any]) -> ReservationOutcome:
    """A ``place_orders()`` row ``(outcome, reason, skus)`` as the command's outcome."""
    outcome, reason, skus = row
    kind = OutcomeKind(outcome)
    if kind is OutcomeKind.DUPLICATE:
        return ReservationOutcome(
            kind=kind,
            order_id=command.order_id,
            event_id=command.event_id,
            duplicate_of=DuplicateOf(str(reason)),
        )
    return ReservationOutcome(
        kind=kind,
        order_id=command.order_id,
        event_id=command.event_id,
        reason=None if reason is None else RejectionReason(reason),
        skus=tuple(skus or ()),
    )


# --- OrderCancelled ---------------------------------------------------------------------------


async def on_order_cancelled(body: bytes, *, stock: Stock) -> Handled:
    """Cancel the order of the ``OrderCancelled`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``released`` or
    ``partially_released`` (stock given back), ``tombstoned`` (no order yet: remembered for
    it), ``ignored``, ``cancel_after_ship`` or ``duplicate``; the log line says the order's
    status after it. No latency is observed: the histogram is the orders' (placed to
    reserved).

    Raises:
        MalformedEventError: the body is not an ``OrderCancelled`` v1 (``parse_event``).
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(OrderCancelledV1, body)
    outcome = await stock.apply(event.to_command())
    return Handled(
        event_id=event.event_id,
        order_id=event.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, "event" if outcome.kind is CancelKind.DUPLICATE else ""),
        log_fields={"status": outcome.status, "whole": event.lines is None},
    )


def _refuse_no_cancelled_lines(command: CancelOrder) -> None:
    if command.lines is not None and not command.lines:
        msg = f"the cancel of order {command.order_id} names no lines"
        raise ValueError(msg)


def _cancel_arguments(commands: Sequence[CancelOrder]) -> dict[str, list[Any]]:
    """The arrays of ``cancel_orders()``: the cancels', then their lines' (merged per SKU)."""
    return {
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "cancelled_at": [command.cancelled_at for command in commands],
        "whole": [command.lines is None for command in commands],
        **_line_arrays(command.cancelled() or {} for command in commands),
    }


def _cancellation(command: CancelOrder, row: Sequence[Any]) -> CancelOutcome:
    """A ``cancel_orders()`` row ``(outcome, status, skus, quantities)`` as its outcome."""
    outcome, status, skus, quantities = row
    return CancelOutcome(
        CancelKind(outcome),
        command.order_id,
        command.event_id,
        _lines(skus, quantities),
        None if status is None else OrderStatus(status),
    )


# --- OrderShipped -----------------------------------------------------------------------------


async def on_order_shipped(body: bytes, *, stock: Stock) -> Handled:
    """Ship the order of the ``OrderShipped`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``shipped``, ``ignored`` (shipped
    before) or ``duplicate``.

    Raises:
        MalformedEventError: the body is not an ``OrderShipped`` v1 (``parse_event``).
        EventRefusedError: reason :data:`ORDER_NOT_RESERVED`: the order is not reserved (not
            placed yet, rejected, released or cancelled); nothing changed and nothing is
            recorded, so the dead letter ships the order if it is replayed once the order is
            reserved.
        TransientError: from the stock store, after its retry budget.
    """
    event = parse_event(OrderShippedV1, body)
    outcome = await stock.apply(event.to_command())
    if outcome.kind is ShipKind.NOT_RESERVED:
        state = f"it is {outcome.status}" if outcome.status else "it has not been placed"
        detail = f"order {event.order_id} cannot be shipped: {state}"
        raise EventRefusedError(ORDER_NOT_RESERVED, detail)
    return Handled(
        event_id=event.event_id,
        order_id=event.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, "event" if outcome.kind is ShipKind.DUPLICATE else ""),
        log_fields={"status": outcome.status},
    )


def _ship_arguments(commands: Sequence[ShipOrder]) -> dict[str, list[Any]]:
    """The arrays of ``ship_orders()``."""
    return {
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "shipped_at": [command.shipped_at for command in commands],
    }


def _shipment(command: ShipOrder, row: Sequence[Any]) -> ShipOutcome:
    """A ``ship_orders()`` row ``(outcome, status, skus, quantities)`` as its outcome."""
    outcome, status, skus, quantities = row
    return ShipOutcome(
        ShipKind(outcome),
        command.order_id,
        command.event_id,
        _lines(skus, quantities),
        None if status is None else OrderStatus(status),
    )


def _lines(skus: Sequence[str], quantities: Sequence[int]) -> tuple[OrderLine, ...]:
    return tuple(OrderLine(sku, quantity) for sku, quantity in zip(skus, quantities, strict=True))


# --- the warehouse's webhooks -------------------------------------------------------------------

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
        **_line_arrays(command.shipped() for command in commands),
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
        lines=_lines(skus, quantities),
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
        **_line_arrays(command.cancelled() or {} for command in commands),
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
        lines=_lines(skus, quantities),
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

ROUTES: tuple[Route[Any, Any, Any, Any], ...] = (
    Route(
        transport=ORDER_PLACED,
        model=OrderPlacedV1,
        summary=(
            "An order to reserve stock for, all lines or none: answered by stock.reserved or "
            "stock.rejected."
        ),
        command=PlaceOrder,
        handler=on_order_placed,
        outcomes=(
            (str(OutcomeKind.RESERVED), ""),
            *((str(OutcomeKind.REJECTED), str(reason)) for reason in RejectionReason),
            *((str(OutcomeKind.DUPLICATE), str(kind)) for kind in DuplicateOf),
        ),
        function=BatchFunction(
            "place_orders",
            _place_arguments,
            _placement,
            ("reserved", "rejected", "duplicate_order"),
            handoff=True,
            check=_refuse_no_lines,
        ),
    ),
    Route(
        transport=ORDER_CANCELLED,
        model=OrderCancelledV1,
        summary=(
            "Cancels the whole order (no lines) or the given quantities: reserved units go back "
            "(stock.released); before its order, it is remembered for it."
        ),
        command=CancelOrder,
        handler=on_order_cancelled,
        outcomes=tuple(
            (str(kind), "event" if kind is CancelKind.DUPLICATE else "") for kind in CancelKind
        ),
        function=BatchFunction(
            "cancel_orders",
            _cancel_arguments,
            _cancellation,
            (
                "released",
                "partially_released",
                "tombstoned",
                "cancel_ignored",
                "cancel_after_ship",
                "cancel_requested",
            ),
            handoff=True,
            check=_refuse_no_cancelled_lines,
        ),
    ),
    Route(
        transport=ORDER_SHIPPED,
        model=OrderShippedV1,
        summary=(
            "Ships everything the order still holds (stock.shipped); dead-lettered when the "
            "order is not reserved."
        ),
        command=ShipOrder,
        handler=on_order_shipped,
        outcomes=(
            *(
                (str(kind), "event" if kind is ShipKind.DUPLICATE else "")
                for kind in ShipKind
                if kind is not ShipKind.NOT_RESERVED
            ),
            (DEAD_LETTERED, ORDER_NOT_RESERVED),
        ),
        function=BatchFunction(
            "ship_orders", _ship_arguments, _shipment, ("shipped", "ship_ignored")
        ),
    ),
    Route(
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
    Route(
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
    Route(
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
)
"""Every input event: the queues' in the order the worker declares and subscribes them, then
the warehouse's webhook types."""

QUEUE_ROUTES: tuple[Route[Any, Any, Any, Any], ...] = tuple(
    route for route in ROUTES if isinstance(route.transport, SubscribedQueue)
)
"""The routes whose events arrive on a queue, in the worker's order."""

WEBHOOK_ROUTES: Mapping[str, Route[Any, Any, Any, WebhookHandler]] = {
    route.transport.type: route for route in ROUTES if isinstance(route.transport, WebhookType)
}
"""The routes of the warehouse's webhooks, by webhook ``type`` (``shipment.shipped``): what
the intake applies, and what the dispatcher's poll applies the polled changes through."""

SUBSCRIBED_QUEUES: tuple[SubscribedQueue, ...] = tuple(
    route.transport for route in ROUTES if isinstance(route.transport, SubscribedQueue)
)
"""Every queue the worker consumes, in the order it declares them: the worker declares,
checks, subscribes and polls them, and the tools look into their dead-letter queues."""

DEAD_LETTER_QUEUES = tuple(queue.dead_letter_queue for queue in SUBSCRIBED_QUEUES)
"""Every dead-letter queue, in the same order."""

OUTCOMES: Mapping[str, tuple[tuple[str, str], ...]] = {
    route.event: route.outcomes for route in QUEUE_ROUTES
}
"""Per event of a queue (the ``event`` label of the worker's ``fulfilment_events_total``), the
``(outcome, reason)`` pairs of its handler, the refusals it raises included; the delivery
policy adds its own (dead letters by failure class, ``requeued``)."""

FUNCTIONS: Mapping[type[Any], BatchFunction[Any, Any]] = {
    route.command: route.function for route in ROUTES
}
"""The SQL function of each kind of command, by the command's type."""


def route_to(queue: str) -> tuple[str, str]:
    """``(exchange, routing key)`` that put a message at the tail of ``queue``.

    For a DLQ, :data:`DEAD_LETTER_EXCHANGE` and its queue's dead-letter routing key: the
    service's own exchange, which the broker user of the shipped definitions may publish to
    (it may not publish to the default exchange, which reaches every queue of the vhost).
    For any other queue, the default exchange and the queue's name.
    """
    for subscribed in SUBSCRIBED_QUEUES:
        if subscribed.dead_letter_queue == queue:
            return DEAD_LETTER_EXCHANGE, subscribed.dead_letter_routing_key
    return "", queue
