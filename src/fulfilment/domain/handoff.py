"""The hand-off to the warehouse system: requests, their states, and the answers they get.

The shop's warehouse management system (or third-party logistics provider) picks, packs and
ships. Every reservation becomes a *fulfilment order* there and every cancel of an order it
already holds a *cancellation*, each sent over HTTP with an idempotency key minted when the
request is recorded, in the transaction of the change that caused it (docs/design.md,
"Warehouse hand-off"). This module holds the vocabulary that the store, the client and the
dispatcher share, and the specification of what the hand-off changes in the lifecycle (product
contract, "The warehouse system", "What it does to the lifecycle"), as pure functions of an
order's state and its requests' statuses:

=====================================  ==========================================================
the order's fulfilment-order request   an ``OrderCancelled`` of the reserved order
=====================================  ==========================================================
none (reserved before the hand-off)    releases at once, as without the hand-off
``pending`` (never sent)               releases at once; the request shrinks to what the order
                                       still holds, ``withdrawn`` when it holds nothing
``failed``                             releases at once (the warehouse holds no order)
``sending``, ``accepted``, ``expired`` releases nothing: records a cancellation request
                                       (``cancel_requested``); the order stays ``reserved``
=====================================  ==========================================================

``expired`` counts as sent: the warehouse may hold the order, and an operator may re-send it.
A cancel that would release nothing (``ignored``) records nothing either. Then:

- the warehouse accepts the cancellation: the cancel is applied to the order now, by the
  lifecycle's table (:func:`cancellation_accepted`): released, and a ``stock.released`` event
  caused by the cancel; an order shipped meanwhile releases nothing;
- when it is first sent, a cancellation asks for what the order still holds of its lines
  (earlier cancellations may have been accepted since it was recorded), and one that finds
  nothing of them left is ``withdrawn`` unsent (:func:`cancellation_to_send`);
- it refuses (``too_late``): nothing is released, the order stays ``reserved`` and will ship;
  a ``stock.cancel_refused`` event says so;
- the fulfilment order fails: its order's waiting cancellations are applied at once, in the
  order they were recorded (:func:`fulfilment_order_failed`), and are ``withdrawn``;
- a shipment or a cancellation of the warehouse leaves the order holding nothing
  (``fulfilment.domain.warehouse_lifecycle``): nothing is left to cancel, and its
  cancellations not sent yet are ``withdrawn``.

The in-memory stock store of the tests runs these functions; ``cancel_orders()`` v3
(``migrations/sql/cancel_orders/v3.sql``) implements them for a batch, and the property tests
of ``tests/integration/test_postgres_lifecycle.py`` hold the two to the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from fulfilment.domain.lifecycle import (
    CancelKind,
    Cancellation,
    OrderState,
    OrderStatus,
    apply_cancelled,
)
from fulfilment.domain.model import OrderLine


class RequestKind(StrEnum):
    """What a warehouse request asks for: the values of ``warehouse_requests.kind``."""

    FULFILMENT_ORDER = "fulfilment_order"
    """``POST {base}/fulfilment-orders``: pick, pack and ship these lines."""
    CANCELLATION = "cancellation"
    """``POST {base}/fulfilment-orders/{id}/cancellations``: cancel these lines, or all."""


class RequestStatus(StrEnum):
    """Where a warehouse request stands: the values of ``warehouse_requests.status``."""

    PENDING = "pending"
    """Recorded, never attempted: its lines may still shrink, and a cancel may withdraw it."""
    SENDING = "sending"
    """Attempted at least once without a final answer; its body is frozen."""
    ACCEPTED = "accepted"
    """The warehouse took it (created, replayed, or an existing order adopted)."""
    REFUSED = "refused"
    """A cancellation the warehouse refused (``too_late``: picking has begun)."""
    FAILED = "failed"
    """A terminal answer (422, 400, 404, other 4xx): kept for an operator."""
    WITHDRAWN = "withdrawn"
    """Never to be sent: cancelled before it left, or its order failed at the warehouse."""
    EXPIRED = "expired"
    """Unanswered when the warehouse's retention of its key ended: retries stopped."""


OPEN_STATUSES = frozenset({RequestStatus.PENDING, RequestStatus.SENDING})
"""The statuses of a request that is still to be sent or answered."""


@dataclass(frozen=True, slots=True)
class WarehouseRequest:
    """One request claimed for sending.

    ``body`` is the exact bytes to send (frozen at the first attempt); ``attempts`` counts this
    one; ``warehouse_id`` is the warehouse's id of the order (None for a fulfilment order not
    yet accepted; a cancellation always has its order's); ``traceparent`` is the W3C trace
    context of the change that recorded it, or None.
    """

    id: int
    idempotency_key: UUID
    kind: RequestKind
    order_id: UUID
    causation_id: UUID
    body: bytes
    attempts: int
    first_attempt_at: datetime
    warehouse_id: str | None = None
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class Accepted:
    """Created (201), a replay of the same key (200), or ``duplicate_reference`` (409).

    ``warehouse_id``: the warehouse's id of the order (None for a cancellation).
    """

    status_code: int
    answer: str
    warehouse_id: str | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """A cancellation refused for a business reason (409 ``too_late``)."""

    status_code: int
    answer: str
    reason: str = "too_late"


@dataclass(frozen=True, slots=True)
class Retry:
    """Transient: 409 ``in_flight``, a 5xx, a timeout or a connection error.

    ``status_code`` is None when no answer came (timeout, connection error); the warehouse may
    have committed, so the retry sends the same key and body. ``after_seconds`` is the
    warehouse's ``Retry-After`` when it gave one.
    """

    answer: str
    status_code: int | None = None
    after_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class RateLimited:
    """429: no request may be sent to this account for ``after_seconds``."""

    after_seconds: float
    answer: str
    status_code: int = 429


@dataclass(frozen=True, slots=True)
class Failed:
    """Terminal: 422, 400, 404, another 4xx, or an answer that breaks the API's contract."""

    reason: str
    answer: str
    status_code: int | None = None


@dataclass(frozen=True, slots=True)
class CredentialsRefused:
    """401 or 403: stop sending until the credentials work; nothing is marked failed."""

    status_code: int
    answer: str


Answer = Accepted | Refused | Retry | RateLimited | Failed | CredentialsRefused
"""Every class of answer the warehouse's API can give a request."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A claimed request with the answer to record for it (``WarehouseRequests.record_answers``).

    ``retry_in_seconds``: when the request is due again, for an answer that sends it again
    (``Retry``, ``RateLimited``, ``CredentialsRefused``); None for a final one, or now.
    """

    request: WarehouseRequest
    answer: Answer
    retry_in_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of ``warehouse_requests`` as an operator sees it (``list``, ``show``).

    ``lines`` is what the request asks, merged per SKU and sorted by SKU, or None for a
    cancellation of the whole order. ``body`` is the exact bytes sent, None before the first
    attempt. Times are timezone-aware; ``first_attempt_at``, ``last_attempt_at`` and
    ``answered_at`` are None until they happen. ``last_status_code`` is None when no answer
    came (timeout, connection error) or none yet; ``last_answer`` is the warehouse's body or
    the error, kept for operators.
    """

    id: int
    idempotency_key: UUID
    kind: RequestKind
    order_id: UUID
    causation_id: UUID
    status: RequestStatus
    lines: tuple[OrderLine, ...] | None
    body: bytes | None
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    first_attempt_at: datetime | None
    last_attempt_at: datetime | None
    answered_at: datetime | None
    warehouse_id: str | None
    last_status_code: int | None
    last_answer: str | None
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class RequestBacklog:
    """How far the hand-off is behind: what the dispatcher's gauges and the report show.

    ``open_count`` counts requests in :data:`OPEN_STATUSES`; ``oldest_open_age_seconds`` is
    the age (seconds, from ``created_at`` to the store's ``now()``) of the oldest of them, None
    when none is open; ``by_kind_and_status`` counts every request by ``(kind, status)``, the
    pairs without requests absent.
    """

    open_count: int
    oldest_open_age_seconds: float | None
    by_kind_and_status: Mapping[tuple[RequestKind, RequestStatus], int]


SENT_STATUSES = frozenset({RequestStatus.SENDING, RequestStatus.ACCEPTED, RequestStatus.EXPIRED})
"""The statuses of a fulfilment order the warehouse may hold: a cancel of its order must ask."""


@dataclass(frozen=True, slots=True)
class HandoffCancellation:
    """What :func:`cancel_with_handoff` concluded.

    ``cancellation`` is what happens to the order now (its ``kind`` is ``cancel_requested``
    when the warehouse must be asked, and then nothing is released). ``fulfilment_lines`` is
    the pending fulfilment order's lines after the cancel (units per SKU), None when it does
    not change; ``withdrawn`` says that it is never to be sent. ``ask`` says whether a
    cancellation request is recorded, and ``asked`` its lines (units per SKU the order holds,
    at most those cancelled; None: the whole order).
    """

    cancellation: Cancellation
    fulfilment_lines: Mapping[str, int] | None = None
    withdrawn: bool = False
    ask: bool = False
    asked: Mapping[str, int] | None = None


def cancel_with_handoff(
    state: OrderState | None,
    cancelled: Mapping[str, int] | None,
    request: RequestStatus | None,
) -> HandoffCancellation:
    """Apply an ``OrderCancelled`` with the hand-off on (the table of this module).

    Args:
        state: the order's state, None without a row.
        cancelled: units cancelled per SKU (``CancelOrder.cancelled()``), None: the whole order.
        request: the status of the order's fulfilment-order request, None when it has none.

    Returns:
        The cancel of :func:`~fulfilment.domain.lifecycle.apply_cancelled`, unless the order is
        reserved, the cancel would release something, and ``request`` is one of
        :data:`SENT_STATUSES`: then ``cancel_requested`` with the order unchanged and a
        cancellation to record. A ``pending`` request shrinks with a release, or is withdrawn.
    """
    cancellation = apply_cancelled(state, cancelled)
    released = cancellation.kind in {CancelKind.RELEASED, CancelKind.PARTIALLY_RELEASED}
    if not released or state is None:
        return HandoffCancellation(cancellation)
    if request in SENT_STATUSES:
        waiting = Cancellation(CancelKind.CANCEL_REQUESTED, state)
        asked = None if cancelled is None else dict(cancellation.lines)
        return HandoffCancellation(waiting, ask=True, asked=asked)
    if request is RequestStatus.PENDING:
        if cancellation.kind is CancelKind.RELEASED:
            return HandoffCancellation(cancellation, withdrawn=True)
        return HandoffCancellation(cancellation, fulfilment_lines=cancellation.state.held)
    return HandoffCancellation(cancellation)


@dataclass(frozen=True, slots=True)
class CancellationToSend:
    """What a cancellation asks the warehouse for at its first send (:func:`cancellation_to_send`).

    ``send`` False: it is not sent at all, and is ``withdrawn``. Else ``lines`` are the units
    per SKU its body asks for, None for the whole order.
    """

    send: bool
    lines: Mapping[str, int] | None = None


def cancellation_to_send(
    state: OrderState | None, asked: Mapping[str, int] | None
) -> CancellationToSend:
    """The lines a cancellation's body asks for, fixed when it is first sent.

    ``asked`` is what the cancel asked and the order held when it was recorded (None: the
    whole order). A request is due only once every earlier request of its order is answered,
    so at the first send the warehouse's order holds what the reservation in ``state`` holds
    now: earlier cancellations it accepted have been applied to both. Asking for more than
    that would be refused (a WMS refuses a cancellation of units an order no longer has), and
    the lifecycle says a cancel of more than the order holds cancels what it holds (product
    contract, "The reservation lifecycle"). So:

    - the order is reserved: the whole order stays the whole order; lines become what the
      order still holds of them (:func:`~fulfilment.domain.lifecycle.apply_cancelled`), and
      when it holds none of them any more the cancellation is not sent;
    - the order was released (an earlier cancellation gave everything back): not sent;
    - otherwise (shipped, or no reservation): sent as recorded, and the warehouse answers
      (``too_late`` for an order that left).
    """
    if state is None or state.status not in {OrderStatus.RESERVED, OrderStatus.RELEASED}:
        return CancellationToSend(send=True, lines=asked)
    if state.status is OrderStatus.RELEASED:
        return CancellationToSend(send=False)
    if asked is None:
        return CancellationToSend(send=True, lines=None)
    cancellation = apply_cancelled(state, asked)
    if not cancellation.lines:
        return CancellationToSend(send=False)
    return CancellationToSend(send=True, lines=dict(cancellation.lines))


def cancellation_accepted(state: OrderState, asked: Mapping[str, int] | None) -> Cancellation:
    """The cancel the warehouse accepted, applied to the order in ``state`` now.

    ``asked`` is the cancellation's lines (None: the whole order). It is the lifecycle's
    cancel (:func:`~fulfilment.domain.lifecycle.apply_cancelled`) on the order as it is when
    the answer comes: a reserved order gives back what it still holds of ``asked``; a shipped
    one releases nothing (``cancel_after_ship``); a released one nothing (``ignored``).
    """
    return apply_cancelled(state, asked)


def cancellation_refused(state: OrderState) -> Cancellation:
    """A cancellation the warehouse refused (``too_late``): nothing changes, nothing is released.

    The order keeps its state (``reserved``: it will ship); the kind is ``ignored``.
    """
    return Cancellation(CancelKind.IGNORED, state)


def fulfilment_order_failed(
    state: OrderState, waiting: Sequence[Mapping[str, int] | None]
) -> tuple[OrderState, list[Cancellation]]:
    """Apply an order's ``waiting`` cancellations (in the order recorded) once its order failed.

    The warehouse holds no order to cancel, so each is the lifecycle's cancel applied locally,
    one after the other (None in ``waiting``: a cancel of the whole order). Returns the order's
    state after all of them and each one's :class:`~fulfilment.domain.lifecycle.Cancellation`.
    """
    results: list[Cancellation] = []
    for asked in waiting:
        cancellation = apply_cancelled(state, asked)
        results.append(cancellation)
        state = cancellation.state
    return state, results
