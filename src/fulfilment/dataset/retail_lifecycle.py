"""The rest of an Online Retail order's life: its cancellations, its shipment, and their timing.

The files record orders and cancellation invoices, never shipments, and a cancellation names
no order (``fulfilment.dataset.online_retail``). This module decides which order a cancellation
cancels, when it can be told, and has the shop ship at the end of each day what is still
reserved, so that the demo sends all three events of the reservation lifecycle (product
contract, "The reservation lifecycle"). The figures quoted are those of the 20 files of
December 2010 (1,629 orders, 326 cancellation invoices).

Which order a cancellation cancels (:func:`match_cancellations`)
    A cancellation invoice becomes one ``OrderCancelled`` when exactly one order can be the one
    it cancels. An order is a *candidate* when all of these hold:

    - it has the cancellation's customer (``CustomerID``, compared as written);
    - it was placed at or before the cancellation's time: the files keep minutes only, and an
      order of the same minute may be the one cancelled (``C537408`` and ``537407``, both at
      14:55 on 6 December);
    - for every SKU of the cancellation, it still holds at least the cancelled units (the
      cancellation's lines summed per SKU, as the service sums them). *Still*: the units that
      earlier mapped cancellations took from it are no longer there, so a second cancellation
      of the same units points elsewhere or nowhere. Cancellations are mapped in time order
      (at the same minute, in the order the files list them), each after those before it.

    The event carries the cancellation's lines as recorded (quantities made positive, a SKU
    on several lines stays on several lines), and never the contract's "whole order" form:
    even when the lines are all the order holds, the shop cancelled those lines, and the
    service's answer is the same (``released`` when nothing remains). ``event_id`` is
    :func:`~fulfilment.dataset.online_retail.cancellation_event_id_for` of the cancellation's
    number, ``order_id`` the candidate's :func:`~fulfilment.dataset.online_retail.order_id_for`.

    A cancellation is not sent when it has no customer id (18), a line whose quantity is not
    negative (none in the data: a cancellation is sent with all its lines or not at all), no
    order of its customer at or before it in the files given (119: its order was placed
    before the first file), no such order that still holds its lines (61), or several that do
    (8). The rest, 120, are sent. Each reason is counted (:class:`Unmatched`); the demo and
    ``fulfilment publish --cancellations`` print the counts.

Shipments (:meth:`RetailDay.shipments`)
    At the end of each day (file), every order of that day that is still reserved ships: one
    ``OrderShipped`` per order, ``event_id`` :func:`~fulfilment.dataset.online_retail.
    shipment_event_id_for` of its invoice number, ``shipped_at`` the time of the day's last
    order or cancellation sent. Orders of earlier days shipped at the end of theirs, so a
    later cancellation of one of them comes too late (``cancel_after_ship``): 105 of the 120
    cancel an order of an earlier day. Which orders are still reserved is the service's
    answer, read once the day's orders and cancellations are settled; an order that already
    shipped (a second run) ships again, which the service answers as a duplicate, so that a
    second run sends the same events as the first.

The order of sending within a day (:meth:`RetailDay.runs`)
    Orders at their ``placed_at`` and cancellations at their ``cancelled_at``, in time order;
    at the same minute, orders first, then in the order the files list them. Consecutive events
    of one kind form a *run*; the demo sends a run and waits until the service has settled it
    before it sends the next, so that a cancellation meets the orders placed before it, and
    not those placed after (the two queues are consumed independently, and a cancel that
    overtook its order would leave a tombstone instead: the same stock with enough of it, but
    not with scarce stock). The day's shipments are the last run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_placed import MAX_LINES
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.dataset.online_retail import (
    CancellationInvoice,
    OnlineRetailError,
    RetailOrder,
    cancellation_event_id_for,
    order_id_for,
    shipment_event_id_for,
)
from fulfilment.domain.lifecycle import OrderStatus

SHIPPABLE = frozenset({OrderStatus.RESERVED, OrderStatus.SHIPPED})
"""Statuses whose orders ship at the end of their day: ``reserved``, and ``shipped`` again (a
second run re-sends the same ``OrderShipped``, answered as a duplicate)."""


class Unmatched(StrEnum):
    """Why a cancellation invoice is not sent as an ``OrderCancelled`` (module docstring)."""

    NO_CUSTOMER = "no_customer"
    """It has no ``CustomerID``."""
    NOT_NEGATIVE = "not_negative"
    """One of its lines has a quantity of 0 or more: it cancels nothing on that line."""
    NO_EARLIER_ORDER = "no_earlier_order"
    """No order of its customer was placed at or before it, in the files read."""
    NOT_HELD = "not_held"
    """Orders of its customer came before it, but none still holds its lines."""
    SEVERAL = "several_orders"
    """More than one order could be the one it cancels."""


@dataclass(frozen=True, slots=True)
class RetailCancellation:
    """A cancellation invoice mapped to the one order it cancels: one ``OrderCancelled`` v1.

    Attributes:
        invoice_no: the cancellation's number, e.g. ``"C536391"``.
        cancels: the invoice number of the order it cancels, e.g. ``"536368"``.
        event_id: ``cancellation_event_id_for(invoice_no)``.
        order_id: ``order_id_for(cancels)``.
        cancelled_at: the cancellation's earliest time, aware, in ``Europe/London``.
        lines: ``(sku, units)`` pairs in file order, units >= 1 (the recorded quantities,
            negated); a SKU may repeat.
        source: ``"<file name>:<line>"`` of its first line.
        day: the name of its file without the suffix.
    """

    invoice_no: str
    cancels: str
    event_id: UUID
    order_id: UUID
    cancelled_at: datetime
    lines: tuple[tuple[str, int], ...]
    source: str
    day: str

    def body(self) -> bytes:
        """The UTF-8 JSON body of the ``OrderCancelled`` (always with its lines).

        Raises:
            pydantic.ValidationError: never for a cancellation made by
                :func:`match_cancellations`: its SKUs and units are those of a read order.
        """
        return order_cancelled_body(
            event_id=self.event_id,
            order_id=self.order_id,
            cancelled_at=self.cancelled_at,
            lines=list(self.lines),
        )


@dataclass(frozen=True, slots=True)
class RetailShipment:
    """The shipment of one order at the end of its day: one ``OrderShipped`` v1.

    Attributes:
        invoice_no: the order's invoice number.
        event_id: ``shipment_event_id_for(invoice_no)``.
        order_id: ``order_id_for(invoice_no)``, the order's own.
        shipped_at: the end of its day (:attr:`RetailDay.closes_at`).
    """

    invoice_no: str
    event_id: UUID
    order_id: UUID
    shipped_at: datetime

    def body(self) -> bytes:
        """The UTF-8 JSON body of the ``OrderShipped``."""
        return order_shipped_body(
            event_id=self.event_id, order_id=self.order_id, shipped_at=self.shipped_at
        )


RetailEvent = RetailOrder | RetailCancellation | RetailShipment
"""One event of the data: ``OrderPlaced``, ``OrderCancelled`` or ``OrderShipped``."""


@dataclass(frozen=True, slots=True)
class CancellationMatch:
    """What :func:`match_cancellations` made of the cancellation invoices.

    Attributes:
        cancellations: one per mapped invoice, in the order the invoices were given.
        unmatched: invoices not mapped, per reason; every reason is a key, 0 included.
    """

    cancellations: list[RetailCancellation]
    unmatched: Mapping[Unmatched, int]

    def describe(self) -> str:
        """One line for people, e.g. ``no customer 1, not negative 0, ...``."""
        return ", ".join(
            f"{reason.value.replace('_', ' ')} {count}" for reason, count in self.unmatched.items()
        )


def match_cancellations(
    orders: Sequence[RetailOrder], invoices: Sequence[CancellationInvoice]
) -> CancellationMatch:
    """Map each cancellation invoice to the one order it can only mean (module docstring).

    Args:
        orders: the orders read (``ReadResult.orders``): the only candidates.
        invoices: the cancellation invoices read (``ReadResult.cancellations``).

    Returns:
        The mapped cancellations and the counts of those not mapped. The same arguments give
        the same result.

    Raises:
        OnlineRetailError: a mapped cancellation has more lines than an event carries
            (``MAX_LINES``); it is never split.
    """
    by_customer: dict[str, list[RetailOrder]] = {}
    for order in orders:
        if order.customer is not None:
            by_customer.setdefault(order.customer, []).append(order)
    held: dict[str, dict[str, int]] = {}  # what each order still holds, once a cancel touched it
    unmatched = dict.fromkeys(Unmatched, 0)
    mapped: dict[int, RetailCancellation] = {}
    in_time_order = sorted(enumerate(invoices), key=lambda item: item[1].cancelled_at)
    for position, invoice in in_time_order:
        if invoice.customer is None:
            unmatched[Unmatched.NO_CUSTOMER] += 1
            continue
        if any(quantity >= 0 for _, quantity in invoice.lines):
            unmatched[Unmatched.NOT_NEGATIVE] += 1
            continue
        cancelled = _summed((sku, -quantity) for sku, quantity in invoice.lines)
        earlier = [
            order
            for order in by_customer.get(invoice.customer, [])
            if order.placed_at <= invoice.cancelled_at
        ]
        candidates = [
            order
            for order in earlier
            if _holds(held.get(order.invoice_no) or _summed(order.lines), cancelled)
        ]
        if len(candidates) != 1:
            reason = (
                Unmatched.NO_EARLIER_ORDER
                if not earlier
                else Unmatched.NOT_HELD
                if not candidates
                else Unmatched.SEVERAL
            )
            unmatched[reason] += 1
            continue
        (order,) = candidates
        remaining = held.get(order.invoice_no) or _summed(order.lines)
        held[order.invoice_no] = {
            sku: units - cancelled.get(sku, 0) for sku, units in remaining.items()
        }
        mapped[position] = _cancellation(invoice, order)
    return CancellationMatch(
        cancellations=[mapped[position] for position in sorted(mapped)], unmatched=unmatched
    )


def _summed(lines: Iterable[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for sku, units in lines:
        totals[sku] = totals.get(sku, 0) + units
    return totals


def _holds(held: Mapping[str, int], cancelled: Mapping[str, int]) -> bool:
    return all(held.get(sku, 0) >= units for sku, units in cancelled.items())


def _cancellation(invoice: CancellationInvoice, order: RetailOrder) -> RetailCancellation:
    if len(invoice.lines) > MAX_LINES:
        msg = (
            f"{invoice.source}: cancellation {invoice.invoice_no} has {len(invoice.lines)} lines;"
            f" an OrderCancelled carries at most {MAX_LINES} and a cancellation is never split"
        )
        raise OnlineRetailError(msg)
    return RetailCancellation(
        invoice_no=invoice.invoice_no,
        cancels=order.invoice_no,
        event_id=cancellation_event_id_for(invoice.invoice_no),
        order_id=order_id_for(order.invoice_no),
        cancelled_at=invoice.cancelled_at,
        lines=tuple((sku, -quantity) for sku, quantity in invoice.lines),
        source=invoice.source,
        day=invoice.day,
    )


@dataclass(frozen=True, slots=True)
class RetailDay:
    """The events of one day (one file) of the data.

    Attributes:
        name: the file's name without the suffix, e.g. ``"2010-12-01"``.
        orders: the day's orders, in the order they were read.
        cancellations: the day's mapped cancellations, in the order they were read.
    """

    name: str
    orders: tuple[RetailOrder, ...] = ()
    cancellations: tuple[RetailCancellation, ...] = ()

    @property
    def closes_at(self) -> datetime | None:
        """The time of the day's last order or cancellation; None for a day without either."""
        times = [order.placed_at for order in self.orders]
        times += [cancellation.cancelled_at for cancellation in self.cancellations]
        return max(times, default=None)

    def runs(self) -> list[tuple[RetailOrder | RetailCancellation, ...]]:
        """The day's orders and cancellations in time order, cut into runs of one kind.

        At the same time, orders come before cancellations; events of one kind and time keep
        the order they were read in (module docstring, "The order of sending").
        """
        timeline: list[tuple[datetime, int, int, RetailOrder | RetailCancellation]] = [
            (order.placed_at, 0, index, order) for index, order in enumerate(self.orders)
        ]
        timeline += [
            (cancellation.cancelled_at, 1, index, cancellation)
            for index, cancellation in enumerate(self.cancellations)
        ]
        timeline.sort(key=lambda entry: entry[:3])
        return [
            tuple(entry[3] for entry in run)
            for _, run in itertools.groupby(timeline, key=lambda entry: entry[1])
        ]

    def shipments(self, statuses: Mapping[UUID, OrderStatus]) -> list[RetailShipment]:
        """The ``OrderShipped`` of each of the day's orders whose status is in :data:`SHIPPABLE`.

        Args:
            statuses: the service's status of the day's orders by ``order_id``, read once the
                day's orders and cancellations are settled; an order absent from it does not
                ship.

        Returns:
            One shipment per such order, in the order the orders were read, each at
            :attr:`closes_at`.
        """
        closes_at = self.closes_at
        if closes_at is None:
            return []
        return [
            RetailShipment(
                invoice_no=order.invoice_no,
                event_id=shipment_event_id_for(order.invoice_no),
                order_id=order.order_id,
                shipped_at=closes_at,
            )
            for order in self.orders
            if statuses.get(order.order_id) in SHIPPABLE
        ]


def plan_days(
    days: Sequence[str],
    orders: Sequence[RetailOrder],
    cancellations: Sequence[RetailCancellation],
) -> list[RetailDay]:
    """The events of each day of ``days`` (``ReadResult.days``), in that order.

    Events whose day is not in ``days`` are left out.
    """
    orders_of: dict[str, list[RetailOrder]] = {}
    for order in orders:
        orders_of.setdefault(order.day, []).append(order)
    cancellations_of: dict[str, list[RetailCancellation]] = {}
    for cancellation in cancellations:
        cancellations_of.setdefault(cancellation.day, []).append(cancellation)
    return [
        RetailDay(
            name=name,
            orders=tuple(orders_of.get(name, ())),
            cancellations=tuple(cancellations_of.get(name, ())),
        )
        for name in dict.fromkeys(days)
    ]
