"""Ports: what the use cases need from the outside world."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from uuid import UUID

from fulfilment.domain.model import ReservationOutcome, ReserveStock, StockLevel


class TransientError(Exception):
    """A failure that may succeed if tried again later.

    For example a lost connection, a lock timeout or a serialization failure. Adapters raise
    it once their own retry budget is spent.
    """


class Warehouse(ABC):
    """Stock levels and reservations, with an inbox that makes ``reserve`` idempotent.

    Implementations: ``PostgresWarehouse`` (the real one) and the in-memory fake of the tests;
    both pass the same contract suite (``tests/contract``).

    The rule :meth:`reserve` applies is :func:`fulfilment.domain.model.decide`, its
    specification. The fake calls it; ``PostgresWarehouse`` calls the PL/pgSQL function
    ``reserve_orders()`` (``migrations/sql/reserve_orders/``), which implements the same rule
    for one round trip per batch of orders. The property test
    ``test_one_transaction_gives_every_order_the_outcome_it_gets_one_after_the_other``
    (``tests/integration/test_postgres_batches.py``) holds the two to the same answers.
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
