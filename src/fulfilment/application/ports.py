"""Ports: what the use cases need from the outside world."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TypeVar
from uuid import UUID

from fulfilment.domain.handoff import (
    Answer,
    Answered,
    RequestBacklog,
    RequestRecord,
    RequestStatus,
    WarehouseRequest,
)
from fulfilment.domain.model import Command, StockLevel
from fulfilment.domain.polls import FulfilmentOrderToPoll

OutcomeT = TypeVar("OutcomeT")


class TransientError(Exception):
    """A failure that may succeed if tried again later.

    For example a lost connection, a lock timeout or a serialization failure. Adapters raise
    it once their own retry budget is spent.
    """


class Stock(ABC):
    """Stock levels and reservations, with an inbox that makes every event idempotent.

    Implementations: ``PostgresStock`` (the real one) and the in-memory fake of the tests;
    both pass the same contract suite (``tests/contract``).

    The rule :meth:`apply` follows for a ``PlaceOrder`` is
    :func:`fulfilment.domain.model.decide`, its specification, and for the lifecycle's commands
    (``PlaceOrder``, ``CancelOrder``, ``ShipOrder``) the state table of
    :mod:`fulfilment.domain.lifecycle`: the fake runs them. ``PostgresStock`` calls the
    PL/pgSQL function of the command's kind (``place_orders()``, ``cancel_orders()``,
    ``ship_orders()``: ``migrations/sql/``, named by each input event's route,
    ``fulfilment.routes.table``), which implements the same rule for one round trip per batch.
    The property tests of ``tests/integration/test_postgres_batches.py`` and
    ``test_postgres_lifecycle.py`` hold the two to the same answers.

    Every event is processed at most once per ``event_id``: its inbox row (``inbox_messages``,
    in this store's consumer namespace, one for every kind) is written in the same
    transaction as what it changed. Stock keeps ``0 <= on_hand`` and ``0 <= reserved``
    throughout, and ``reserved <= on_hand`` wherever no loss was reported: a loss the warehouse
    reports (``RecordAdjustment``) may leave a SKU short, which then takes no reservation
    (``fulfilment.domain.adjustments``).
    """

    @abstractmethod
    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:
        """Apply ``command`` exactly once per event; answer its outcome.

        Each kind of command has its rule: ``PlaceOrder`` reserves every line, all or
        nothing (``decide``), or rejects; ``CancelOrder`` and ``ShipOrder`` follow the state
        table of :mod:`fulfilment.domain.lifecycle` (``apply_cancelled``, ``apply_shipped``;
        with the hand-off on, a cancel of an order the warehouse system may hold records a
        cancellation request instead, ``fulfilment.domain.handoff``). The event id is recorded
        in the inbox in the same transaction as what the command changed, so a second call
        with the same ``event_id`` (concurrent or later) changes nothing and answers
        ``duplicate``; a shipment that is ``not_reserved`` is the exception, recorded nowhere,
        so that a replay once the order is placed ships it.

        Raises:
            TransientError: the store failed in a way worth retrying, after the adapter's own
                retry budget (``FULFILMENT_RETRY_BUDGET_SECONDS``) was spent.
            ValueError: the command cannot be applied as it is (an order without lines, a
                cancel of lines that names none).
            LookupError: the store knows no rule for the command's type.
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
            TransientError: as for :meth:`apply`.
        """

    @abstractmethod
    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        """Set ``on_hand`` of each SKU (creating unknown SKUs with nothing reserved).

        Raises:
            ValueError: a level would fall below what is already reserved for that SKU; no
                level is changed.
        """

    @abstractmethod
    async def levels_of(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        """The current level of each known SKU among ``skus``; unknown SKUs are absent."""


class WarehouseRequests(ABC):
    """The durable requests to the warehouse system, as the dispatcher claims and records them.

    Rows of ``warehouse_requests``, recorded by the stock store (``Stock`` built with
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


class FulfilmentOrderPolls(ABC):
    """Which accepted fulfilment orders the dispatcher asks the warehouse about, and when.

    Due: a fulfilment order ``accepted`` by the warehouse whose order is ``reserved`` (it still
    holds units), last heard of (``warehouse_requests.news_at``, the last shipment or
    cancellation of the warehouse recorded for the order, by webhook or poll; else
    ``polled_at``, the last poll; else ``answered_at``, its acceptance; the latest of them)
    at least ``after_seconds`` ago (``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS``). So an
    order is asked about an interval after its last news, then every interval while it holds
    units (product contract, "Hearing back from the warehouse", "Pulled as a fallback").
    Implementation: ``PostgresWarehouseRequests``.
    """

    @abstractmethod
    async def due_polls(
        self, limit: int, *, after_seconds: float, excluding: Collection[int] = ()
    ) -> list[FulfilmentOrderToPoll]:
        """Up to ``limit`` fulfilment orders due to be asked about, longest unheard of first.

        Reads only: one dispatcher polls at a time (the advisory lock), and it leaves out the
        requests whose polls are in flight (``excluding``, request ids). A poll that ends
        without :meth:`record_polls` (a stop, a gate closed before it was sent) is due again.

        Raises:
            TransientError: the store failed in a way worth retrying.
            ValueError: ``limit`` is below 1 or ``after_seconds`` is not positive.
        """

    @abstractmethod
    async def record_polls(self, request_ids: Collection[int]) -> None:
        """Set ``polled_at`` to now on the fulfilment orders ``request_ids``: asked about now.

        Called once the warehouse answered (a 200, but also a 404 or a 5xx, so that a failing
        order is asked again an interval later, not at every turn) and what it listed was
        applied.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """

    @abstractmethod
    async def orders_without_news(self, after_seconds: float) -> int:
        """How many accepted fulfilment orders hold units with no news for ``after_seconds``.

        No news: no shipment or cancellation of the warehouse recorded for the order
        (``news_at``), nor its acceptance (``answered_at``), within ``after_seconds``; a
        poll that found nothing is no news. The gauge
        ``fulfilment_warehouse_orders_without_news``.

        Raises:
            TransientError: the store failed in a way worth retrying.
        """
