"""Ports: what the use cases need from the outside world."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from uuid import UUID

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
        ``cancel_after_ship``). The inbox row is written in the same transaction, so a second
        call with the same ``event_id`` changes nothing and answers ``duplicate``.

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
