"""The handler of each event: raw body -> wire model -> domain command -> use case -> outcome.

Each is a plain function of the raw body and the ports it needs (the delivery's trace
context is the current span's, which the warehouse adapter writes beside the result events),
built from ``worker.handling``; ``main.build_worker`` subscribes it to its queue under the
delivery policy (``worker.delivery``, which handlers never import), which does the rest:
deadline, redelivery count, dead letters, requeue and pause, the span, the log line and metric.
:data:`OUTCOMES` lists the ``(outcome, reason)`` labels each handler can return, so that their
series exist at 0 from the start.
"""

from __future__ import annotations

from fulfilment.application.ports import Warehouse
from fulfilment.contracts.order_cancelled import OrderCancelledV1
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.contracts.order_shipped import OrderShippedV1
from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_PLACED, ORDER_SHIPPED
from fulfilment.domain.lifecycle import CancelKind, ShipKind
from fulfilment.domain.model import DuplicateOf, OutcomeKind, RejectionReason, ReservationOutcome
from fulfilment.observability.metrics import DEAD_LETTERED
from fulfilment.worker.handling import EventRefusedError, Handled, parse_event

ORDER_NOT_RESERVED = "order_not_reserved"
"""The reason of a shipment dead-lettered because its order is not reserved (no row yet,
rejected, released or cancelled): an operator's question, not a bug (``docs/runbook.md``)."""

OUTCOMES: dict[str, tuple[tuple[str, str], ...]] = {
    ORDER_PLACED.event: (
        (str(OutcomeKind.RESERVED), ""),
        *((str(OutcomeKind.REJECTED), str(reason)) for reason in RejectionReason),
        *((str(OutcomeKind.DUPLICATE), str(kind)) for kind in DuplicateOf),
    ),
    ORDER_CANCELLED.event: tuple(
        (str(kind), "event" if kind is CancelKind.DUPLICATE else "") for kind in CancelKind
    ),
    ORDER_SHIPPED.event: (
        *(
            (str(kind), "event" if kind is ShipKind.DUPLICATE else "")
            for kind in ShipKind
            if kind is not ShipKind.NOT_RESERVED
        ),
        (DEAD_LETTERED, ORDER_NOT_RESERVED),
    ),
}
"""Per event (the ``event`` label), the ``(outcome, reason)`` pairs of its handler, the
refusals it raises included; the delivery policy adds its own (dead letters by failure
class, ``requeued``)."""


async def on_order_placed(body: bytes, *, warehouse: Warehouse) -> Handled:
    """Reserve stock for the ``OrderPlaced`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``reserved``, ``rejected`` with its
    reason and SKUs, or ``duplicate`` (of the event, or of the order); the end-to-end latency
    from ``placed_at`` is observed unless it is a duplicate.

    Raises:
        MalformedEventError: the body is not an ``OrderPlaced`` v1 (``parse_event``).
        TransientError: from the warehouse, after its retry budget.
    """
    event = parse_event(OrderPlacedV1, body)
    outcome = await warehouse.reserve(event.to_command())
    return Handled(
        event_id=event.event_id,
        order_id=event.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, _reason_label(outcome)),
        latency_since=None if outcome.kind is OutcomeKind.DUPLICATE else event.placed_at,
        log_fields={"skus": list(outcome.skus) or None},
    )


async def on_order_cancelled(body: bytes, *, warehouse: Warehouse) -> Handled:
    """Cancel the order of the ``OrderCancelled`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``released`` or
    ``partially_released`` (stock given back), ``tombstoned`` (no order yet: remembered for
    it), ``ignored``, ``cancel_after_ship`` or ``duplicate``; the log line says the order's
    status after it. No latency is observed: the histogram is the orders' (placed to
    reserved).

    Raises:
        MalformedEventError: the body is not an ``OrderCancelled`` v1 (``parse_event``).
        TransientError: from the warehouse, after its retry budget.
    """
    event = parse_event(OrderCancelledV1, body)
    outcome = await warehouse.cancel(event.to_command())
    return Handled(
        event_id=event.event_id,
        order_id=event.order_id,
        outcome=outcome.label,
        labels=(outcome.kind, "event" if outcome.kind is CancelKind.DUPLICATE else ""),
        log_fields={"status": outcome.status, "whole": event.lines is None},
    )


async def on_order_shipped(body: bytes, *, warehouse: Warehouse) -> Handled:
    """Ship the order of the ``OrderShipped`` v1 event in ``body``, once per ``event_id``.

    Returns the outcome for the policy to log and count: ``shipped``, ``ignored`` (shipped
    before) or ``duplicate``.

    Raises:
        MalformedEventError: the body is not an ``OrderShipped`` v1 (``parse_event``).
        EventRefusedError: reason :data:`ORDER_NOT_RESERVED`: the order is not reserved (not
            placed yet, rejected, released or cancelled); nothing changed and nothing is
            recorded, so the dead letter ships the order if it is replayed once the order is
            reserved.
        TransientError: from the warehouse, after its retry budget.
    """
    event = parse_event(OrderShippedV1, body)
    outcome = await warehouse.ship(event.to_command())
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


def _reason_label(outcome: ReservationOutcome) -> str:
    if outcome.reason is not None:
        return str(outcome.reason)
    if outcome.duplicate_of is not None:
        return str(outcome.duplicate_of)
    return ""
