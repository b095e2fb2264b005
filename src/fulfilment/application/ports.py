"""Ports: what the use cases need from the outside world."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from uuid import UUID

from fulfilment.domain.handoff import (
    Answer,
    Answered,
    RequestBacklog,
    RequestRecord,
    RequestStatus,
    WarehouseRequest,
)
from fulfilment.domain.lifecycle import CancelOrder, CancelOutcome, ShipOrder, ShipOutcome
from fulfilment.domain.model import ReservationOutcome, ReserveStock, StockLevel


class TransientError(Exception):
    """A failure that may succeed if tried again later.

    For example a lost connection, a lock timeout or a serialization failure. Adapters raise
    it once their own retry budget is spent.
    """


class Warehouse(ABC):
    """Stock levels and reservations, with an inbox that makes every event idempotent.

    Implementations: ``PostgresWarehouse`` (the real one) and the in-memory fake of the tests;
    both pass the same contract suite (``tests/contract``).

    The rule :meth:`reserve` applies is :func:`fulfilment.domain.model.decide`, its
    specification. The fake calls it; ``PostgresWarehouse`` calls the PL/pgSQL function
    ``place_orders()`` (``migrations/sql/place_orders/``), which implements the same rule
    for one round trip per batch of orders. The property test
    ``test_one_transaction_gives_every_order_the_outcome_it_gets_one_after_the_other``
    (``tests/integration/test_postgres_batches.py``) holds the two to the same answers.

    The lifecycle that :meth:`reserve`, :meth:`cancel` and :meth:`ship` follow is the state
    table of :mod:`fulfilment.domain.lifecycle`, its specification, which the fake runs;
    ``PostgresWarehouse`` calls ``place_orders()``, ``cancel_orders()`` and
    ``ship_orders()``, and the property tests of
    ``tests/integration/test_postgres_lifecycle.py`` hold the two to the same answers.

    Every event is processed at most once per ``event_id``: its inbox row (``inbox_messages``,
    in this warehouse's consumer namespace, one for all three kinds) is written in the same
    transaction as what it changed. Stock keeps ``0 <= reserved <= on_hand`` throughout.
    """

    @abstractmethod
    async def reserve(self, command: ReserveStock) -> ReservationOutcome:
        """Reserve stock for every line of ``command``, all or nothing, exactly once per event.

        The event id is recorded in the inbox in the same transaction as the reservation or
        rejection, so a second call with the same ``event_id`` (concurrent or later) changes
        nothing and returns a ``duplicate`` outcome.

        Raises:
            TransientError: the store failed in a way worth retrying, after the adapter's own
                retry budget (``FULFILMENT_RETRY_BUDGET_SECONDS``) was spent.
        """

    @abstractmethod
    async def cancel(self, command: CancelOrder) -> CancelOutcome:
        """Cancel ``command``'s order, whole or the given lines, exactly once per event.

        By the order's state (``fulfilment.domain.lifecycle.apply_cancelled``): a reserved
        order gives back the cancelled units (``reserved`` goes down, its lines shrink) and is
        ``released`` when none remain; without a row, a ``cancelled`` tombstone remembers the
        cancel for the ``OrderPlaced`` to come; otherwise nothing changes (``ignored``,
        ``cancel_after_ship``). With the hand-off to the warehouse system on, a cancel of an
        order the warehouse may hold releases nothing yet and records a cancellation request
        (``cancel_requested``), and one of an order never sent shrinks or withdraws its request
        (``fulfilment.domain.handoff``). The inbox row is written in the same transaction, so a
        second call with the same ``event_id`` changes nothing and answers ``duplicate``.

        Raises:
            TransientError: as for :meth:`reserve`.
            ValueError: the command cancels lines, but none.
        """

    @abstractmethod
    async def ship(self, command: ShipOrder) -> ShipOutcome:
        """Ship everything ``command``'s order holds, exactly once per event.

        A reserved order is ``shipped``: ``on_hand`` and ``reserved`` of each of its lines go
        down by its units, in the transaction that writes the inbox row (a second call with
        the same ``event_id`` answers ``duplicate``). A shipped order is ``ignored``. Any
        other order, or none, is ``not_reserved``: nothing changes and the event is not
        recorded in the inbox, so that a replay after the order is placed ships it.

        Raises:
            TransientError: as for :meth:`reserve`.
        """

    @abstractmethod
    async def count_redelivery(self, event_id: UUID) -> int:
        """Record one more redelivery of the event ``event_id``; return how many it has had (>= 1).

        The service's own count of deliveries that ended without a settlement (a crash), so
        that an event that kills every worker is dead-lettered after a bounded number of them
        on every RabbitMQ version (4.3 stopped counting such returns towards the queue's
        delivery limit). Keyed by the event id, like the inbox, so a re-published copy counts
        with the original. Committed on its own, before the delivery is processed.

        Raises:
            TransientError: as for :meth:`reserve`.
        """

    @abstractmethod
    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        """Set ``on_hand`` of each SKU (creating unknown SKUs with nothing reserved).

        Raises:
            ValueError: a level would fall below what is already reserved for that SKU; no
                level is changed.
        """

    @abstractmethod
    async def stock(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        """The current level of each known SKU among ``skus``; unknown SKUs are absent."""


class WarehouseRequests(ABC):
    """The durable requests to the warehouse system, as the dispatcher claims and records them.

    Rows of ``warehouse_requests``, recorded by the stock store (``Warehouse`` built with
    ``handoff=True``) in the transaction of the change that caused them; this port sends
    nothing itself. Implementations: ``PostgresWarehouseRequests`` and the in-memory fake of
    the tests; both pass ``tests/contract/test_warehouse_requests_contract.py``.

    Per order, requests go out in the order they were recorded (``id``): a cancellation is
    claimable only once its order's fulfilment order is ``accepted``, and no request while an
    earlier one of the same order is still open (``pending``/``sending``). One failing order
    holds up no other order.
    """

    @abstractmethod
    async def claim(self, limit: int, *, lease_seconds: float) -> list[WarehouseRequest]:
        """Take up to ``limit`` due requests for sending, each by at most one claimer at a time.

        Due: open, ``next_attempt_at <= now()``, and allowed by the per-order rule. In one
        committed transaction each claimed row gets ``attempts += 1``, ``first_attempt_at``
        (when unset) and ``last_attempt_at`` = now, status ``sending``, its ``body`` frozen
        from its lines when still unset (``request_body()``), and a lease:
        ``next_attempt_at = now + lease_seconds`` (seconds), so the rows of a claimer that dies
        before recording an answer come back when it ends. Rows another claimer holds locked
        are skipped, not waited for. Returned in ``id`` order.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def record(
        self,
        request: WarehouseRequest,
        answer: Answer,
        *,
        retry_in_seconds: float | None = None,
    ) -> None:
        """Record the warehouse's ``answer`` to ``request``, and what it does, in one transaction.

        - ``Retry``, ``RateLimited``, ``CredentialsRefused``: the status stays ``sending``;
          ``next_attempt_at = now + retry_in_seconds`` (seconds; the dispatcher computes it
          from tenacity's wait for ``request.attempts`` or from ``Retry-After``; None: now).
        - ``Accepted``: a fulfilment order becomes ``accepted`` with its ``warehouse_id``,
          which its order's cancellations copy (they become claimable); a cancellation becomes
          ``accepted`` and the cancel is applied to the order by the lifecycle (stock
          released, a ``stock.released`` outbox row caused by the cancel's event).
        - ``Refused``: a cancellation becomes ``refused``; nothing is released; a
          ``stock.cancel_refused`` outbox row (the lines asked, the ``warehouse_id``).
        - ``Failed``: the request becomes ``failed``; for a fulfilment order, its order's
          waiting cancellations are applied locally (the warehouse holds no order to cancel)
          and become ``withdrawn``.

        The status code and the answer are kept (``last_status_code``, ``last_answer``); a
        final answer sets ``answered_at``. An answer to a request that is no longer
        ``sending`` (expired, or recorded already) changes nothing.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    async def record_answers(self, answers: Sequence[Answered]) -> None:
        """Record several answers, each exactly as :meth:`record` would.

        The dispatcher's batch: the answers that came while the previous batch was being
        written. This default records them one by one, in order; a store may write several in
        one transaction, and then a failure leaves all of those unrecorded (their leases bring
        them back, as after a failed :meth:`record`).

        Raises:
            TransientError: the store failed in a way worth retrying; answers before the
                failing one may be recorded.
        """
        for answered in answers:
            await self.record(
                answered.request, answered.answer, retry_in_seconds=answered.retry_in_seconds
            )

    @abstractmethod
    async def expire(self, retention_seconds: float) -> int:
        """Mark ``expired`` every open request first attempted more than ``retention_seconds`` ago.

        The warehouse forgets a key after its retention
        (``FULFILMENT_WAREHOUSE_KEY_RETENTION_SECONDS``), so a retry after it could create a
        second order: such requests stop being sent and wait for an operator. Returns how many
        were expired.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def backlog(self) -> RequestBacklog:
        """How many requests are open, the oldest one's age (seconds), counts by kind and status.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def find(self, statuses: Collection[RequestStatus], limit: int) -> list[RequestRecord]:
        """Up to ``limit`` requests whose status is one of ``statuses``, oldest (``id``) first.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def get(self, idempotency_key: UUID) -> RequestRecord | None:
        """The request with ``idempotency_key``, or None when there is none.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def resend(self, idempotency_key: UUID, *, operator: str) -> bool:
        """Send a ``failed`` or ``expired`` request again, with the same key and body.

        Its status becomes ``sending`` and ``next_attempt_at`` now, in the transaction that
        writes an audit row naming ``operator`` (as ``dlq replay`` does). Returns False, and
        changes nothing, when the request does not exist or is in another status.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """
