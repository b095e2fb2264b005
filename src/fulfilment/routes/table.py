"""The list of routes, :data:`ROUTES`, one per input event, and what is made from it.

Each handler is a plain function of the raw body and the stock store: parse, build the
command, apply it, say what it made of the event (``fulfilment.routes.handling``). The
worker subscribes the handler of each queue's route to its queue under the delivery policy
(``worker.delivery``), which does the rest: deadline, redelivery count, dead letters, requeue
and pause, the span, the log line and metric. The queues' routes are written here; the
warehouse's webhooks have a route per ``type`` (``routes.warehouse.WEBHOOK_ROUTES``), whose
handler also takes the webhook id and the source; the intake (``fulfilment webhooks``) and the
dispatcher's poll call it. Each route's SQL function is the one ``PostgresStock.apply`` calls
for its command; its arguments and its rows are read beside the route, so that a new event
changes neither the port nor the adapter (``docs/development.md``, "Adding an input event").

Made from :data:`ROUTES`: :data:`QUEUE_ROUTES`, :data:`SUBSCRIBED_QUEUES`,
:data:`DEAD_LETTER_QUEUES`, :data:`OUTCOMES` (of the queues' routes only), :data:`FUNCTIONS`
(of every route); the worker's subscriptions (``entrypoints.worker.build_worker``), the
AsyncAPI document (``fulfilment.asyncapi``), the runtime role's grants
(``adapters.postgres.privileges``), and the broker definitions, queue policies, KEDA triggers
and per-queue alert rules (``scripts/render-deploy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    OutcomeKind,
    PlaceOrder,
    RejectionReason,
    ReservationOutcome,
)
from fulfilment.observability.metrics import DEAD_LETTERED
from fulfilment.routes.handling import EventRefusedError, Handled, parse_event
from fulfilment.routes.route import BatchFunction, Route, line_arrays, row_lines
from fulfilment.routes.warehouse import WEBHOOK_ROUTES

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
        **line_arrays(command.demand() for command in commands),
    }


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
        **line_arrays(command.cancelled() or {} for command in commands),
    }


def _cancellation(command: CancelOrder, row: Sequence[Any]) -> CancelOutcome:
    """A ``cancel_orders()`` row ``(outcome, status, skus, quantities)`` as its outcome."""
    outcome, status, skus, quantities = row
    return CancelOutcome(
        CancelKind(outcome),
        command.order_id,
        command.event_id,
        row_lines(skus, quantities),
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
        row_lines(skus, quantities),
        None if status is None else OrderStatus(status),
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
    *WEBHOOK_ROUTES.values(),
)
"""Every input event: the queues' in the order the worker declares and subscribes them, then
the warehouse's webhook types."""

QUEUE_ROUTES: tuple[Route[Any, Any, Any, Any], ...] = tuple(
    route for route in ROUTES if isinstance(route.transport, SubscribedQueue)
)
"""The routes whose events arrive on a queue, in the worker's order."""
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
