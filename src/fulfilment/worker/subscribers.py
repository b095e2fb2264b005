"""The handler of each event: raw body -> wire model -> domain command -> use case -> outcome.

Each is a plain function of the raw body and the ports it needs; ``main.build_worker``
subscribes it to its queue under the delivery policy (``worker.delivery``), which does the
rest: deadline, redelivery count, dead letters, requeue and pause, the log line and metric.
"""

from __future__ import annotations

from fulfilment.application.handlers import reserve_stock
from fulfilment.application.ports import Warehouse
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.domain.model import OutcomeKind, ReservationOutcome
from fulfilment.worker.delivery import Handled, parse_event


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
    outcome = await reserve_stock(event.to_command(), warehouse=warehouse)
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
