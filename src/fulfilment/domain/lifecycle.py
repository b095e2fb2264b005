"""The lifecycle of a reservation: what each event does to an order, by the order's state.

The rule is the state table of docs/design.md, "The reservation lifecycle"; this module
is its specification, as plain functions of an order's state, one per event
(:func:`apply_placed`, :func:`apply_cancelled`, :func:`apply_shipped`). An order holds, per
SKU, its line less what the warehouse's shipments took of it (:attr:`OrderState.held`):

=========  ==============================  ==========================  ============================
state now  OrderPlaced                     OrderCancelled              OrderShipped
=========  ==============================  ==========================  ============================
no row     reserve or reject (``decide``)  a ``cancelled`` tombstone   ``not_reserved``
reserved   duplicate of the order          release the cancelled       ``shipped``: ships all the
                                           units it holds; when it     order holds
                                           holds none, ``released``,
                                           or ``shipped`` when some
                                           of it shipped
rejected   duplicate of the order          ignored                     ``not_reserved``
released   duplicate of the order          ignored                     ``not_reserved``
shipped    duplicate of the order          ``cancel_after_ship``       ignored
cancelled  reserve what the tombstone did  the tombstone remembers     ``not_reserved``
           not cancel, all or nothing;     more
           ``rejected``/``cancelled``
           when nothing remains
=========  ==============================  ==========================  ============================

Cancelling more of a SKU than the order holds cancels what it holds (never what shipped); a
SKU the order does not hold is ignored. A shipment ships everything the order still holds. The
warehouse's own shipments and cancellations (``fulfilment.domain.warehouse_lifecycle``, its
table) take or give back units of a reserved order: it stays ``reserved`` while it holds
units, and then is ``shipped`` when any of them shipped, ``released`` when none did.

Place and cancel commute: with enough stock, an order's cancels applied before its
``OrderPlaced`` (through the tombstone) leave the same stock and the same reserved lines as
applied after it. A cancel and a ship of the same order do not commute (a cancel after the
ship is ``cancel_after_ship``, one before it releases stock first), and a ship before its
order is ``not_reserved`` (dead-lettered; an operator replays it once the order is placed).
Which arrival orders of the warehouse's events commute is in docs/design.md, "Orders of
arrival".

The in-memory stock store of the tests runs these functions. Production runs the PL/pgSQL
functions ``place_orders()``, ``cancel_orders()`` and ``ship_orders()`` (``migrations/sql/``),
which implement the same table for a batch of events in one round trip; the property tests of
``tests/integration/test_postgres_lifecycle.py`` hold the two to the same answers, so a change
to the table is made in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from fulfilment.domain.model import (
    Command,
    Decision,
    OrderLine,
    RejectionReason,
    StockLevel,
    aggregate_demand,
    decide,
)


class OrderStatus(StrEnum):
    """The state of an order: the values of ``reservations.status``."""

    RESERVED = "reserved"
    """Its lines hold stock: all of them, or what did not ship yet of a partial shipment."""
    REJECTED = "rejected"
    """Placed, and refused with a reason; it holds nothing."""
    RELEASED = "released"
    """Reserved, then cancelled until nothing remained, none of it shipped; it holds nothing."""
    SHIPPED = "shipped"
    """Reserved, then shipped: its lines left the warehouse (what was not cancelled of it,
    in one shipment or several); it holds nothing."""
    CANCELLED = "cancelled"
    """Cancelled before it was placed: a tombstone that remembers what was cancelled."""


@dataclass(frozen=True, slots=True)
class CancelOrder(Command["CancelOutcome"]):
    """Command: cancel an order, whole (``lines`` is None) or the given lines.

    ``event_id`` is the producer's idempotency key; ``cancelled_at`` is timezone-aware.
    """

    event_id: UUID
    order_id: UUID
    cancelled_at: datetime
    lines: tuple[OrderLine, ...] | None = None

    def cancelled(self) -> dict[str, int] | None:
        """Units cancelled per SKU, lines of the same SKU summed, keys in code-point order.

        None cancels the whole order.
        """
        return None if self.lines is None else aggregate_demand(self.lines)


@dataclass(frozen=True, slots=True)
class ShipOrder(Command["ShipOutcome"]):
    """Command: ship everything the order still holds.

    ``shipped_at`` is timezone-aware.
    """

    event_id: UUID
    order_id: UUID
    shipped_at: datetime


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What the cancels that came before an order's ``OrderPlaced`` cancelled.

    ``lines`` are units per SKU in code-point order (the cancels summed), or None when the
    whole order was cancelled. The order keeps its tombstone once placed: it says why the
    order holds less than its ``OrderPlaced`` asked for.
    """

    lines: Mapping[str, int] | None = None

    @property
    def whole(self) -> bool:
        """Whether the whole order was cancelled."""
        return self.lines is None

    def merged(self, cancelled: Mapping[str, int] | None) -> Tombstone:
        """This tombstone after one more cancel (None: of the whole order)."""
        if self.lines is None or cancelled is None:
            return Tombstone(None)
        totals = dict(self.lines)
        for sku, units in cancelled.items():
            totals[sku] = totals.get(sku, 0) + units
        return Tombstone(dict(sorted(totals.items())))

    def remaining(self, demand: Mapping[str, int]) -> dict[str, int]:
        """What is left of ``demand`` (units per SKU) once this tombstone is applied.

        SKUs the tombstone does not name keep their units; a SKU cancelled in full or more is
        dropped. Keys keep ``demand``'s order.
        """
        if self.lines is None:
            return {}
        remaining = {sku: units - self.lines.get(sku, 0) for sku, units in demand.items()}
        return {sku: units for sku, units in remaining.items() if units > 0}


@dataclass(frozen=True, slots=True)
class OrderState:
    """An order as the stock store keeps it (a row of ``reservations`` with its lines).

    ``lines`` are units per SKU in code-point order, as ``reservation_lines.quantity``, and
    mean by ``status``: ``reserved``, the units it holds plus those that shipped; ``shipped``,
    the units that left; ``rejected``, the units it asked for (after its tombstone);
    ``released`` and ``cancelled``, nothing. ``shipped`` is ``reservation_lines.shipped``: the
    units per SKU that left, the SKUs with none left out (a reserved order may have shipped
    some of its units; a shipped one shipped all its ``lines``). ``tombstone`` is what was
    cancelled before the order was placed, if anything was (always, for ``cancelled``).
    """

    status: OrderStatus
    lines: Mapping[str, int] = field(default_factory=dict)
    tombstone: Tombstone | None = None
    shipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def held(self) -> dict[str, int]:
        """The units per SKU the order holds (reserved in stock), in code-point order.

        Its lines less what shipped of them for a ``reserved`` order, SKUs at 0 left out;
        nothing in any other state.
        """
        if self.status is not OrderStatus.RESERVED:
            return {}
        held = {sku: units - self.shipped.get(sku, 0) for sku, units in self.lines.items()}
        return {sku: units for sku, units in held.items() if units > 0}

    def after_taking(self, taken: Mapping[str, int]) -> OrderState:
        """This reserved order once ``taken`` (units per SKU it holds) left the warehouse.

        It stays ``reserved`` while it holds units, and is ``shipped`` when it holds none.
        """
        shipped = dict(self.shipped)
        for sku, units in taken.items():
            shipped[sku] = shipped.get(sku, 0) + units
        shipped = dict(sorted(shipped.items()))
        after = OrderState(OrderStatus.RESERVED, self.lines, self.tombstone, shipped)
        if after.held:
            return after
        return OrderState(OrderStatus.SHIPPED, self.lines, self.tombstone, shipped)

    def after_releasing(self, given_back: Mapping[str, int]) -> OrderState:
        """This reserved order once ``given_back`` (units per SKU it holds) was released.

        Its lines shrink by them (a line at 0 goes); it stays ``reserved`` while it holds
        units, and when it holds none it is ``shipped`` if any of its units shipped, else
        ``released``.
        """
        lines = {sku: units - given_back.get(sku, 0) for sku, units in self.lines.items()}
        lines = {sku: units for sku, units in lines.items() if units > 0}
        after = OrderState(OrderStatus.RESERVED, lines, self.tombstone, self.shipped)
        if after.held:
            return after
        shipped_some = any(units > 0 for units in self.shipped.values())
        status = OrderStatus.SHIPPED if shipped_some else OrderStatus.RELEASED
        return OrderState(status, lines, self.tombstone, self.shipped)


@dataclass(frozen=True, slots=True)
class Placement:
    """What :func:`apply_placed` concluded.

    ``decision`` is None for a duplicate of the order (``state`` is then the order's state,
    unchanged); otherwise the order is ``reserved`` (``decision.reason`` None, and
    ``state.lines`` are the units to reserve) or ``rejected``.
    """

    decision: Decision | None
    state: OrderState


def apply_placed(
    state: OrderState | None, demand: Mapping[str, int], stock: Mapping[str, StockLevel]
) -> Placement:
    """Apply an ``OrderPlaced`` to an order in ``state`` (None: no row).

    Args:
        state: the order's state, or None when the stock store has no row of it.
        demand: the ``OrderPlaced``'s units per SKU (:meth:`PlaceOrder.demand`).
        stock: the current level of every stocked SKU of the demand; absent means unknown.

    Returns:
        A duplicate of the order when it has a row other than a tombstone. Otherwise the
        decision of :func:`~fulfilment.domain.model.decide` on what remains of ``demand``
        after the tombstone (all of it without one), or a rejection with reason
        ``cancelled`` and no SKUs when nothing remains or the tombstone is of the whole order.
    """
    if state is not None and state.status is not OrderStatus.CANCELLED:
        return Placement(None, state)
    tombstone = None if state is None else state.tombstone
    asked = dict(demand) if tombstone is None else tombstone.remaining(demand)
    if not asked:
        decision = Decision(RejectionReason.CANCELLED)
    else:
        decision = decide(asked, {sku: stock[sku] for sku in asked if sku in stock})
    status = OrderStatus.RESERVED if decision.reason is None else OrderStatus.REJECTED
    return Placement(decision, OrderState(status, asked, tombstone))


class CancelKind(StrEnum):
    """How the processing of one ``OrderCancelled`` ended."""

    RELEASED = "released"
    """A reserved order gave back its last units: it is ``released``, or ``shipped`` when
    some of its units shipped before."""
    PARTIALLY_RELEASED = "partially_released"
    """A reserved order gave back some units and still holds others."""
    TOMBSTONED = "tombstoned"
    """No reservation yet: the ``cancelled`` row remembers the cancel for the ``OrderPlaced``."""
    IGNORED = "ignored"
    """Nothing changed: the order is rejected or released, holds none of the cancelled SKUs,
    or its tombstone is already of the whole order."""
    CANCEL_AFTER_SHIP = "cancel_after_ship"
    """Too late: the order is shipped; nothing changed."""
    CANCEL_REQUESTED = "cancel_requested"
    """The warehouse system may hold the order: a cancellation request is recorded and
    nothing is released until it accepts (``fulfilment.domain.handoff``)."""
    DUPLICATE = "duplicate"
    """This ``event_id`` was processed before; nothing changed."""


class ShipKind(StrEnum):
    """How the processing of one ``OrderShipped`` ended."""

    SHIPPED = "shipped"
    """What the order held left the warehouse: ``on_hand`` and ``reserved`` went down by it."""
    IGNORED = "ignored"
    """The order is already shipped; nothing changed."""
    NOT_RESERVED = "not_reserved"
    """No reserved order to ship (no row, rejected, released or cancelled); nothing changed
    and the event is not recorded, so that a replay once the order is placed ships it."""
    DUPLICATE = "duplicate"
    """This ``event_id`` was processed before; nothing changed."""


def _label(kind: StrEnum) -> str:
    # The same shape as ReservationOutcome.label: a duplicate says what it duplicates.
    return f"{kind}:event" if kind == "duplicate" else str(kind)


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """Result of :meth:`Stock.apply` of a ``CancelOrder``.

    ``lines`` are the units released (whose ``reserved`` went down), one line per SKU in
    code-point order, empty unless ``released`` or ``partially_released``. ``status`` is the
    order's state after the cancel, None for a ``duplicate`` (not looked at).
    """

    kind: CancelKind
    order_id: UUID
    event_id: UUID
    lines: tuple[OrderLine, ...] = ()
    status: OrderStatus | None = None

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics: the kind, or ``duplicate:event``."""
        return _label(self.kind)


@dataclass(frozen=True, slots=True)
class ShipOutcome:
    """Result of :meth:`Stock.apply` of a ``ShipOrder``.

    ``lines`` are the units shipped (whose ``on_hand`` and ``reserved`` went down), one line
    per SKU in code-point order, empty unless ``shipped``. ``status`` is the order's state
    after the event: None when it has no row, and for a ``duplicate`` (not looked at).
    """

    kind: ShipKind
    order_id: UUID
    event_id: UUID
    lines: tuple[OrderLine, ...] = ()
    status: OrderStatus | None = None

    @property
    def label(self) -> str:
        """Short fixed label for logs and metrics: the kind, or ``duplicate:event``."""
        return _label(self.kind)


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What :func:`apply_cancelled` concluded.

    ``state`` is the order's state after the cancel; ``lines`` are the units released, per
    SKU in code-point order (empty unless ``released`` or ``partially_released``).
    """

    kind: CancelKind
    state: OrderState
    lines: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Shipment:
    """What :func:`apply_shipped` concluded.

    ``state`` is the order's state after the event (None: still no row); ``lines`` are the
    units shipped, per SKU in code-point order (empty unless ``shipped``).
    """

    kind: ShipKind
    state: OrderState | None
    lines: Mapping[str, int] = field(default_factory=dict)


def apply_cancelled(state: OrderState | None, cancelled: Mapping[str, int] | None) -> Cancellation:
    """Apply an ``OrderCancelled`` (``cancelled`` units per SKU, None: the whole order).

    Returns:
        A :class:`Cancellation`: ``tombstoned`` without a row, or on a tombstone of lines
        (which adds the cancel to it); ``released`` or ``partially_released`` on a reserved
        order (``lines`` released: each cancelled SKU's units, at most what the order holds,
        never what shipped; ``released`` leaves it ``shipped`` when some of it shipped), or
        ``ignored`` when it holds none of them; ``cancel_after_ship`` on a shipped order;
        ``ignored`` on a rejected or released one, and on a tombstone of the whole order.
    """
    if state is None:
        first = Tombstone(None if cancelled is None else dict(cancelled))
        return Cancellation(CancelKind.TOMBSTONED, OrderState(OrderStatus.CANCELLED, {}, first))
    if state.status is OrderStatus.RESERVED:
        return _release(state, cancelled)
    tombstone = state.tombstone
    if state.status is OrderStatus.CANCELLED and tombstone is not None and not tombstone.whole:
        after = OrderState(OrderStatus.CANCELLED, {}, tombstone.merged(cancelled))
        return Cancellation(CancelKind.TOMBSTONED, after)
    if state.status is OrderStatus.SHIPPED:
        return Cancellation(CancelKind.CANCEL_AFTER_SHIP, state)
    return Cancellation(CancelKind.IGNORED, state)


def _release(state: OrderState, cancelled: Mapping[str, int] | None) -> Cancellation:
    held = state.held
    given_back = (
        held
        if cancelled is None
        else {sku: min(units, held[sku]) for sku, units in cancelled.items() if sku in held}
    )
    if not given_back:
        return Cancellation(CancelKind.IGNORED, state)
    after = state.after_releasing(given_back)
    kind = CancelKind.PARTIALLY_RELEASED if after.held else CancelKind.RELEASED
    return Cancellation(kind, after, given_back)


def apply_shipped(state: OrderState | None) -> Shipment:
    """Apply an ``OrderShipped`` to an order in ``state`` (None: no row).

    Returns:
        A :class:`Shipment` of a :class:`ShipKind`: ``shipped`` (``lines``: everything the
        order still held, what the warehouse's shipments had not taken) on a reserved order,
        ``ignored`` on a shipped one, ``not_reserved`` on any other state or without a row.
    """
    if state is None:
        return Shipment(ShipKind.NOT_RESERVED, None)
    if state.status is OrderStatus.RESERVED:
        held = state.held
        return Shipment(ShipKind.SHIPPED, state.after_taking(held), held)
    if state.status is OrderStatus.SHIPPED:
        return Shipment(ShipKind.IGNORED, state)
    return Shipment(ShipKind.NOT_RESERVED, state)


def released(level: StockLevel, units: int) -> StockLevel:
    """``level`` after a cancel gave back ``units`` reserved units (``reserved -= units``)."""
    return StockLevel(level.on_hand, level.reserved - units)


def shipped(level: StockLevel, units: int) -> StockLevel:
    """``level`` after ``units`` reserved units left the warehouse (both go down by them).

    ``on_hand`` never goes below 0: a short SKU (``fulfilment.domain.adjustments``) whose
    shipment takes more than it has on hand shipped units the warehouse had reported lost.
    """
    return StockLevel(max(0, level.on_hand - units), level.reserved - units)


def as_lines(units: Mapping[str, int]) -> tuple[OrderLine, ...]:
    """Units per SKU as order lines, in code-point order of SKU (an outcome's ``lines``)."""
    return tuple(OrderLine(sku, quantity) for sku, quantity in sorted(units.items()))
