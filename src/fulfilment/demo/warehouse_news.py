"""The demo's look at what the warehouse told the service: its shipments and cancellations.

With the loop closed, the demo's orders ship when the warehouse (the simulator) ships them: after
its pick delay it ships each accepted order in one or several shipments with tracking numbers,
cancels a few lines on its own, and tells the service by signed webhooks to ``fulfilment
webhooks``; a few of those webhooks are never sent, and the dispatcher's poll finds them. The
simulator keeps a record of everything it made (``GET /_simulator/orders``: per order, its
shipments and cancellations and what is left; ``GET /_simulator/webhooks``: each webhook and
its fate, ``never_sent`` for those only the poll finds), which this module
reads (:func:`read_made`) and compares with what the service recorded (:func:`check_news`):

- every shipment and cancellation the warehouse made of the day's orders is recorded once
  (``warehouse_shipments`` / ``warehouse_cancellations``, keyed by its id), applied (``shipped``,
  ``released``), with its lines as sent, every unit taken or released, its tracking numbers;
  one whose webhook never went out is recorded as found by the poll; nothing is recorded that the
  warehouse did not make;
- each of those orders holds nothing: its lines shipped exactly what the warehouse shipped of
  them, and it is ``shipped`` when any unit shipped, ``released`` otherwise;
- one ``stock.shipped`` result event per shipment applied.

:func:`check_stock` checks the stock after each day: per SKU, ``on_hand`` is what the run
started with plus the units the warehouse's adjustments applied minus the units it shipped,
``reserved`` the units the lines of reserved orders hold, and a SKU with more reserved than on
hand (short) is one of which a loss was reported, counted apart. A mismatch is one line
(:class:`NewsMismatchError`), which fails the demo.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.adapters.postgres.warehouse_news import (
    RecordedCancellation,
    RecordedShipment,
    SkuStock,
)
from fulfilment.contracts.result_events import STOCK_SHIPPED_ROUTING_KEY
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.warehouse_events import ShipmentKind, Source, WarehouseCancellationKind


class NewsMismatchError(Exception):
    """What the service recorded does not match what the warehouse made (one line)."""


@dataclass(frozen=True, slots=True)
class MadeShipment:
    """A shipment the simulator made, from its record.

    Attributes:
        shipment_id: its id.
        lines: units per SKU (lines of the same SKU summed).
        tracking_numbers: as sent.
        sent: a webhook told the service of it; False: never sent, only the poll finds it.
    """

    shipment_id: str
    lines: dict[str, int]
    tracking_numbers: tuple[str, ...]
    sent: bool


@dataclass(frozen=True, slots=True)
class MadeCancellation:
    """A cancellation the simulator made on its own (not the shop's), from its record.

    Attributes:
        cancellation_id: its id.
        lines: units per SKU; None cancelled everything the order still held.
        sent: a webhook told the service of it; False: only the poll finds it.
    """

    cancellation_id: str
    lines: dict[str, int] | None
    sent: bool


@dataclass(frozen=True, slots=True)
class WarehouseOrder:
    """One fulfilment order as the simulator holds it.

    Attributes:
        order_id: its ``reference``, the service's order id.
        warehouse_id: the warehouse's id of it.
        ordered: the units the fulfilment order asked for, per SKU.
        remaining: what is left to ship (after the shop's cancellations, the warehouse's and
            its shipments); empty once the warehouse is done with it.
        shipments: what it shipped, in order.
        cancellations: what it cancelled on its own, in order.
    """

    order_id: UUID
    warehouse_id: str
    ordered: dict[str, int]
    remaining: dict[str, int]
    shipments: tuple[MadeShipment, ...]
    cancellations: tuple[MadeCancellation, ...]

    def shipped(self) -> Counter[str]:
        """Units shipped per SKU, over its shipments."""
        units: Counter[str] = Counter()
        for shipment in self.shipments:
            units.update(shipment.lines)
        return units


def _merged(lines: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    merged: Counter[str] = Counter()
    for line in lines:
        merged[str(line["sku"])] += int(line["quantity"])
    return dict(merged)


@dataclass(frozen=True, slots=True)
class Made:
    """The simulator's record: its orders by reference, and its webhooks still in flight."""

    orders: dict[UUID, WarehouseOrder]
    in_flight: int
    """The simulator's work not done yet, and its webhooks waiting, held back or being sent (a
    duplicate of a delivered one included): its record's ``work_pending`` and ``in_flight``."""


def parse_made(orders: Mapping[str, Any], webhooks: Mapping[str, Any]) -> Made:
    """The simulator's record from its ``GET /_simulator/orders`` and ``/_simulator/webhooks``.

    A shipment or cancellation whose first webhook's fate is ``never_sent`` is one only the
    poll can find.

    Raises:
        KeyError, ValueError: the documents are not the simulator's.
    """
    unsent = {
        str(webhook["subject"])
        for webhook in webhooks["webhooks"]
        if webhook["fate"] == "never_sent"
    }
    in_flight = int(webhooks["work_pending"]) + int(webhooks["in_flight"])
    made = {}
    for order in orders["orders"]:
        order_id = UUID(str(order["reference"]))
        made[order_id] = WarehouseOrder(
            order_id=order_id,
            warehouse_id=str(order["id"]),
            ordered=_merged(order["lines"]),
            remaining={str(sku): int(q) for sku, q in order["remaining"].items() if q},
            shipments=tuple(
                MadeShipment(
                    shipment_id=str(shipment["shipment_id"]),
                    lines=_merged(shipment["lines"]),
                    tracking_numbers=tuple(map(str, shipment.get("tracking_numbers", ()))),
                    sent=str(shipment["shipment_id"]) not in unsent,
                )
                for shipment in order.get("shipments", ())
            ),
            cancellations=tuple(
                MadeCancellation(
                    cancellation_id=str(cancellation["cancellation_id"]),
                    lines=None
                    if cancellation.get("lines") is None
                    else _merged(cancellation["lines"]),
                    sent=str(cancellation["cancellation_id"]) not in unsent,
                )
                for cancellation in order.get("cancellations", ())
            ),
        )
    return Made(made, in_flight)


def read_made(admin_url: str) -> Made:
    """Read the simulator's record from ``admin_url`` (``.../_simulator``): :func:`parse_made`.

    Raises:
        OSError: the simulator does not answer.
    """
    documents = []
    for name in ("orders", "webhooks"):
        with urllib.request.urlopen(f"{admin_url}/{name}", timeout=10) as response:  # noqa: S310 - the demo's simulator on loopback
            documents.append(json.loads(response.read()))
    return parse_made(*documents)


def outstanding(
    orders: Iterable[WarehouseOrder],
    shipments: Iterable[RecordedShipment],
    cancellations: Iterable[RecordedCancellation],
) -> int:
    """What the day still waits for, counted.

    The orders the warehouse is not done with, plus the shipments and cancellations it made
    that the service has not recorded yet.
    """
    shipped = {s.shipment_id for s in shipments}
    cancelled = {c.cancellation_id for c in cancellations}
    left = 0
    for order in orders:
        left += bool(order.remaining)
        left += sum(s.shipment_id not in shipped for s in order.shipments)
        left += sum(c.cancellation_id not in cancelled for c in order.cancellations)
    return left


@dataclass
class NewsCounts:
    """What the warehouse told the service for a day, or for the run (:meth:`add`)."""

    orders: int = 0
    """Fulfilment orders the warehouse was done with."""
    shipments: int = 0
    tracking_numbers: int = 0
    shipments_polled: int = 0
    """Shipments the dispatcher's poll recorded before any webhook did."""
    whole: int = 0
    """Orders that shipped every unit the fulfilment order asked for."""
    part: int = 0
    """Orders that shipped some units; the rest was cancelled (by the shop or the warehouse)."""
    none: int = 0
    """Orders that shipped nothing: all cancelled."""
    cancellations: int = 0
    """The warehouse's own cancellations."""
    cancellations_polled: int = 0
    units_shipped: int = 0
    units_released: int = 0
    """Units the warehouse's cancellations gave back."""
    unsent: int = 0
    """Webhooks the warehouse never sent (shipments and cancellations): the poll's to find."""

    def add(self, other: NewsCounts) -> None:
        """Add ``other``'s counts to these."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def describe(self) -> str:
        """E.g. ``shipments 131 of 105 orders (tracking numbers 140, found by the poll 3) ...``."""
        return (
            f"shipments {self.shipments} (tracking numbers {self.tracking_numbers}, found by the"
            f" poll {self.shipments_polled}), orders shipped in whole {self.whole}, in part"
            f" {self.part}, not at all {self.none}; its own cancellations {self.cancellations}"
            f" (found by the poll {self.cancellations_polled}), units released"
            f" {self.units_released}; webhooks never sent {self.unsent}"
        )


@dataclass
class _Recorded:
    shipments: dict[str, RecordedShipment] = field(default_factory=dict)
    cancellations: dict[str, RecordedCancellation] = field(default_factory=dict)


def check_news(  # noqa: PLR0913 - what the check compares, by name
    orders: Mapping[UUID, WarehouseOrder],
    *,
    shipments: Sequence[RecordedShipment],
    cancellations: Sequence[RecordedCancellation],
    lines: Mapping[UUID, Mapping[str, tuple[int, int]]],
    statuses: Mapping[UUID, OrderStatus],
    entries: Iterable[OutboxEntry],
) -> NewsCounts:
    """Check the service's record of the warehouse's news of ``orders``; the day's counts.

    ``orders``: the day's orders at the warehouse, by order id (:func:`read_made`);
    ``shipments``, ``cancellations``: the rows recorded for them; ``lines``: their
    ``reservation_lines`` (``(quantity, shipped)`` per SKU); ``statuses``: theirs;
    ``entries``: the outbox rows the day wrote.

    Raises:
        NewsMismatchError: the first difference (module docstring).
    """
    recorded = _Recorded(
        {s.shipment_id: s for s in shipments}, {c.cancellation_id: c for c in cancellations}
    )
    made_ids = {s.shipment_id for o in orders.values() for s in o.shipments} | {
        c.cancellation_id for o in orders.values() for c in o.cancellations
    }
    for change_id in sorted((recorded.shipments.keys() | recorded.cancellations.keys()) - made_ids):
        msg = f"the service recorded {change_id}, which the warehouse never made"
        raise NewsMismatchError(msg)
    events = Counter(e.order_id for e in entries if e.routing_key == STOCK_SHIPPED_ROUTING_KEY)
    counts = NewsCounts()
    for order in orders.values():
        _check_order(order, recorded, lines.get(order.order_id, {}), statuses, counts)
        if events[order.order_id] != len(order.shipments):
            msg = (
                f"order {order.order_id}: {len(order.shipments)} shipments applied, but"
                f" {events[order.order_id]} stock.shipped result events written"
            )
            raise NewsMismatchError(msg)
    return counts


def _check_order(
    order: WarehouseOrder,
    recorded: _Recorded,
    lines: Mapping[str, tuple[int, int]],
    statuses: Mapping[UUID, OrderStatus],
    counts: NewsCounts,
) -> None:
    where = f"order {order.order_id} ({order.warehouse_id})"
    if order.remaining:
        msg = f"{where}: the warehouse is not done with it (left {order.remaining})"
        raise NewsMismatchError(msg)
    for made in order.shipments:
        _check_shipment(where, made, recorded.shipments.get(made.shipment_id), counts)
    for made_cancellation in order.cancellations:
        row = recorded.cancellations.get(made_cancellation.cancellation_id)
        _check_cancellation(where, made_cancellation, row, counts)
    shipped = order.shipped()
    held = {sku: quantity - taken for sku, (quantity, taken) in lines.items() if quantity > taken}
    line_shipped = {sku: taken for sku, (_, taken) in lines.items() if taken}
    if held or line_shipped != dict(shipped):
        msg = (
            f"{where}: its lines hold {held or 'nothing'} and shipped {line_shipped}; the"
            f" warehouse shipped {dict(shipped)}"
        )
        raise NewsMismatchError(msg)
    expected = OrderStatus.SHIPPED if shipped else OrderStatus.RELEASED
    if statuses.get(order.order_id) is not expected:
        msg = f"{where} is {statuses.get(order.order_id)}, not {expected}"
        raise NewsMismatchError(msg)
    counts.orders += 1
    total = shipped.total()
    if not total:
        counts.none += 1
    elif total == sum(order.ordered.values()):
        counts.whole += 1
    else:
        counts.part += 1


def _check_shipment(
    where: str, made: MadeShipment, row: RecordedShipment | None, counts: NewsCounts
) -> None:
    if row is None:
        how = "its webhook was sent" if made.sent else "its webhook was never sent"
        msg = f"{where}: shipment {made.shipment_id} is not recorded ({how})"
        raise NewsMismatchError(msg)
    sent = {sku: quantity for sku, (quantity, _) in row.lines.items()}
    taken = {sku: units for sku, (_, units) in row.lines.items()}
    if (
        row.outcome != ShipmentKind.SHIPPED
        or sent != made.lines
        or taken != made.lines
        or row.tracking_numbers != made.tracking_numbers
    ):
        msg = (
            f"{where}: shipment {made.shipment_id} of {made.lines} (tracking"
            f" {list(made.tracking_numbers)}) is recorded {row.outcome}, lines {row.lines}"
            f" (sent, taken), tracking {list(row.tracking_numbers)}"
        )
        raise NewsMismatchError(msg)
    if not made.sent and row.source != Source.POLL:
        msg = f"{where}: shipment {made.shipment_id} was never sent, yet came by {row.source}"
        raise NewsMismatchError(msg)
    counts.shipments += 1
    counts.tracking_numbers += len(made.tracking_numbers)
    counts.shipments_polled += row.source == Source.POLL
    counts.units_shipped += sum(made.lines.values())
    counts.unsent += not made.sent


def _check_cancellation(
    where: str, made: MadeCancellation, row: RecordedCancellation | None, counts: NewsCounts
) -> None:
    if row is None:
        how = "its webhook was sent" if made.sent else "its webhook was never sent"
        msg = (
            f"{where}: the warehouse's cancellation {made.cancellation_id} is not recorded ({how})"
        )
        raise NewsMismatchError(msg)
    released = {sku: units for sku, (_, units) in row.lines.items() if units}
    named = {sku: quantity for sku, (quantity, _) in row.lines.items()}
    # A whole cancellation names no lines: the service keeps what it released as its lines.
    if (
        row.outcome != WarehouseCancellationKind.RELEASED
        or row.whole != (made.lines is None)
        or (made.lines is not None and named != made.lines)
        or released != named
    ):
        msg = (
            f"{where}: the warehouse's cancellation {made.cancellation_id} of"
            f" {made.lines or 'everything left'} is recorded {row.outcome}, lines {row.lines}"
            " (named, released)"
        )
        raise NewsMismatchError(msg)
    if not made.sent and row.source != Source.POLL:
        msg = (
            f"{where}: the warehouse's cancellation {made.cancellation_id} was never sent, yet"
            f" came by {row.source}"
        )
        raise NewsMismatchError(msg)
    counts.cancellations += 1
    counts.cancellations_polled += row.source == Source.POLL
    counts.units_released += sum(released.values())
    counts.unsent += not made.sent


def check_stock(
    start: Mapping[str, int],
    shipped: Mapping[str, int],
    adjusted: Mapping[str, int],
    now: Mapping[str, SkuStock],
    *,
    losses: Collection[str],
) -> list[str]:
    """Check the stock against the warehouse's shipments and adjustments of the run.

    ``start``: ``on_hand`` per SKU when the run began (after its load); ``shipped``: the units
    the warehouse shipped per SKU since; ``adjusted``: the units its adjustments applied since
    (``stock.adjusted``'s ``applied``); ``now``: the stock levels and held lines now;
    ``losses``: the SKUs of which a loss was ever reported. Returns the short SKUs (more
    reserved than on hand), each after a reported loss.

    Raises:
        NewsMismatchError: a SKU whose ``on_hand`` is not ``start + adjusted - shipped``, whose
            ``reserved`` is not the units its reserved orders' lines hold, or that is short
            with no loss reported.
    """
    short = []
    for sku in sorted(now.keys() | start.keys() | adjusted.keys()):
        level = now.get(sku)
        expected = start.get(sku, 0) + adjusted.get(sku, 0) - shipped.get(sku, 0)
        if level is None or level.on_hand != expected:
            msg = (
                f"SKU {sku}: on hand {level.on_hand if level else 'missing'}, but the run began"
                f" with {start.get(sku, 0)}, the warehouse's adjustments applied"
                f" {adjusted.get(sku, 0)} and it shipped {shipped.get(sku, 0)}"
            )
            raise NewsMismatchError(msg)
        if level.reserved != level.held:
            msg = (
                f"SKU {sku}: reserved {level.reserved}, but its reserved orders' lines hold"
                f" {level.held}"
            )
            raise NewsMismatchError(msg)
        if level.reserved > level.on_hand:
            if sku not in losses:
                msg = (
                    f"SKU {sku}: reserved {level.reserved} is more than on hand {level.on_hand},"
                    " and no loss of it was reported"
                )
                raise NewsMismatchError(msg)
            short.append(sku)
    return short
