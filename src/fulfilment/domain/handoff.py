"""The hand-off to the warehouse system: requests, their states, and the answers they get.

The shop's warehouse management system (or third-party logistics provider) picks, packs and
ships. Every reservation becomes a *fulfilment order* there and every cancel of an order it
already holds a *cancellation*, each sent over HTTP with an idempotency key minted when the
request is recorded, in the transaction of the change that caused it (README, "The warehouse
system"). This module holds the vocabulary that the store, the client and the dispatcher share;
it is plain data, standard library and ``domain.model`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

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
