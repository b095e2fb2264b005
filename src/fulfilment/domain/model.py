"""Orders, stock levels, and the outcome of reserving stock for an order.

Where the rule runs: ``domain/`` is its specification. The tests' in-memory stock store
(``tests/support/fakes.py``) runs this code; production does not call it on the hot path but runs
``place_orders()``, a PL/pgSQL implementation of the same rule that reserves a batch of
orders in one round trip (details below, and in ``domain.lifecycle`` for cancels and
shipments).

The rule (docs/design.md, "How it works"): an order is reserved all-or-nothing across its lines,
and the same SKU on several lines is one demand. An order whose SKUs are not all stocked is
rejected with ``unknown_sku``; otherwise one whose demand exceeds what is available
(``on_hand - reserved``) for any SKU is rejected with ``insufficient_stock``. A rejection is a
business outcome, not an error: it is recorded and acknowledged like a reservation.

:func:`decide` is the specification of the rule, and the in-memory stock store of the tests runs
it. Production runs the PL/pgSQL function ``place_orders()``
(``migrations/sql/place_orders/``), an implementation of the same rule that reserves a batch
of orders in one round trip instead of reading stock, deciding here and writing back. The
property test ``test_one_transaction_gives_every_order_the_outcome_it_gets_one_after_the_other``
(``tests/integration/test_postgres_batches.py``) holds the two to the same answers, so a change
to the rule is made in both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Generic, TypeVar
from uuid import UUID

OutcomeT = TypeVar("OutcomeT")


class Command(Generic[OutcomeT]):
    """A command an input event becomes, typed by the outcome applying it gives.

    ``Stock.apply`` takes any command and answers its ``OutcomeT``; the stores find what
    applies it by the command's type (the PostgreSQL adapter, its SQL function; the fake, its
    rule), so a new kind of command changes neither the port nor the adapter. Every command
    carries its event's idempotency key, ``event_id``.
    """

    __slots__ = ()

    event_id: UUID


@dataclass(frozen=True, slots=True)
class OrderLine:
    """One line of an order: ``quantity`` units (> 0) of ``sku`` (case-sensitive stock code)."""

    sku: str
    quantity: int


@dataclass(frozen=True, slots=True)
class PlaceOrder(Command["ReservationOutcome"]):
    """Command: reserve stock for every line of one placed order.

    ``event_id`` is the producer's idempotency key; ``placed_at`` is timezone-aware.
    """

    event_id: UUID
    order_id: UUID
    placed_at: datetime
    lines: tuple[OrderLine, ...]

    def demand(self) -> dict[str, int]:
        """Units wanted per SKU, lines of the same SKU summed, keys in ascending code-point order.

        The order is the lock order of every stock store, so that two reservations sharing SKUs
        always lock them in the same sequence and cannot deadlock.
        """
        return aggregate_demand(self.lines)


def aggregate_demand(lines: Iterable[OrderLine]) -> dict[str, int]:
    """Sum quantities per SKU; keys sorted by code point (the ``COLLATE "C"`` order)."""
    totals: Counter[str] = Counter()
    for line in lines:
        totals[line.sku] += line.quantity
    return dict(sorted(totals.items()))


@dataclass(frozen=True, slots=True)
class StockLevel:
    """Units of one SKU: ``on_hand`` in the warehouse, ``reserved`` of them promised to orders.

    Invariant (enforced by the database too): ``0 <= on_hand`` and ``0 <= reserved``. The
    service never reserves beyond ``on_hand``, but a loss the warehouse reports
    (``fulfilment.domain.adjustments``) may leave ``reserved > on_hand``: the SKU is then
    :attr:`short` and nothing is :attr:`available` until a release or a receipt settles it.
    """

    on_hand: int
    reserved: int = 0

    @property
    def available(self) -> int:
        """Units that can still be promised: ``on_hand - reserved``, 0 when short."""
        return max(0, self.on_hand - self.reserved)

    @property
    def short(self) -> int:
        """Units reserved beyond ``on_hand`` (``reserved - on_hand``), 0 when none."""
        return max(0, self.reserved - self.on_hand)


class OutcomeKind(StrEnum):
    """How the processing of one event ended."""

    RESERVED = "reserved"
    REJECTED = "rejected"
    DUPLICATE = "duplicate"


class RejectionReason(StrEnum):
    """Why an order was rejected; the ``reason`` column of ``reservations``."""

    UNKNOWN_SKU = "unknown_sku"
    INSUFFICIENT_STOCK = "insufficient_stock"
    CANCELLED = "cancelled"
    """Cancelled before it was placed, whole or every line of it: nothing remained to reserve
    (``fulfilment.domain.lifecycle.apply_placed``; :func:`decide` never answers it)."""


class DuplicateOf(StrEnum):
    """What made an event a duplicate.

    ``event``: this ``event_id`` was processed before (a redelivery or a re-publish).
    ``order``: another event already placed this ``order_id``; the order is reserved once and
    the new event is recorded in the inbox without touching stock (docs/design.md, "Duplicates").
    """

    EVENT = "event"
    ORDER = "order"


@dataclass(frozen=True, slots=True)
class ReservationOutcome:
    """Result of :meth:`Stock.apply` of a ``PlaceOrder``.

    ``skus`` names the offending SKUs of a rejection (sorted), and is empty otherwise.
    """

    kind: OutcomeKind
    order_id: UUID
    event_id: UUID
    reason: RejectionReason | None = None
    duplicate_of: DuplicateOf | None = None
    skus: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics.

        One of ``reserved``, ``rejected:<reason>`` or ``duplicate:<event|order>``.
        """
        if self.reason is not None:
            return f"{self.kind}:{self.reason}"
        if self.duplicate_of is not None:
            return f"{self.kind}:{self.duplicate_of}"
        return str(self.kind)


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` concluded: ``reason`` is None when the order can be reserved."""

    reason: RejectionReason | None
    skus: tuple[str, ...] = ()


def decide(demand: Mapping[str, int], stock: Mapping[str, StockLevel]) -> Decision:
    """Apply the reservation rule to an aggregated demand and the current stock of its SKUs.

    The specification of the rule; ``place_orders()`` implements it in PostgreSQL (see the
    module's docstring).

    Args:
        demand: units per SKU (see :meth:`PlaceOrder.demand`).
        stock: the current level of every stocked SKU of the demand; absent means unknown.

    Returns:
        A :class:`Decision`; ``unknown_sku`` wins over ``insufficient_stock``.
    """
    unknown = tuple(sku for sku in demand if sku not in stock)
    if unknown:
        return Decision(RejectionReason.UNKNOWN_SKU, unknown)
    short = tuple(sku for sku, units in demand.items() if stock[sku].available < units)
    if short:
        return Decision(RejectionReason.INSUFFICIENT_STOCK, short)
    return Decision(None)
