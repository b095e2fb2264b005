"""The demo's look at the hand-off: what the warehouse system received, checked per day.

The demo runs a warehouse simulator (``simulator/warehouse_simulator``, a checkout's, not the
wheel's) and ``fulfilment dispatcher`` beside the worker. After a day's cancellations, it waits
until no warehouse request is open, ships the day, then reads the
simulator's admin API (``GET /_simulator/orders``) and the ``warehouse_requests`` rows and
checks them against the day's reservations (:func:`check_day`):

- every reservation of the day is exactly one fulfilment order at the warehouse (its
  ``reference`` is the order id, its id the request's ``warehouse_id``), or none when a cancel
  withdrew the request before it was ever sent;
- every cancellation the warehouse accepted released its units (a ``stock.released`` row of the
  order in the day's outbox), every one it refused (``too_late``) wrote ``stock.cancel_refused``
  and its order shipped (or, when the warehouse cancelled what was left of it on its own, was
  released); no cancellation request of the day is left unanswered.

A mismatch is one line (:class:`HandoffMismatchError`), which fails the demo.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.contracts.result_events import (
    STOCK_CANCEL_REFUSED_ROUTING_KEY,
    STOCK_RELEASED_ROUTING_KEY,
)
from fulfilment.domain.handoff import RequestKind, RequestRecord, RequestStatus
from fulfilment.domain.lifecycle import OrderStatus

PICK_DELAY_SECONDS = 1.0
"""The simulator picks an order this long after it received it, and ships it; a cancellation
that reaches it later is refused ``too_late``. Short, so that some of the data's same-day
cancellations come too late (which ones depends on the machine's speed), and so that a day
waits little for its shipments."""
SIMULATOR_TOKEN = "demo-token"  # noqa: S105 - the simulator's, for a local demo; not a secret
"""The Bearer token the demo's simulator accepts and its dispatcher sends."""
RATE_PER_SECOND = 200.0
"""The dispatcher's rate cap in the demo (the service's default, 2.5, would take minutes per
day): requests per second."""
CONCURRENCY = 8
"""The dispatcher's requests in flight in the demo."""
ACCEPTED_CANCELLATIONS = frozenset({"cancelled", "partially_cancelled"})
"""The simulator's statuses of a cancellation it accepted."""
TOO_LATE = "too_late"


class HandoffMismatchError(Exception):
    """What the warehouse received does not match the reservations (one line)."""


@dataclass(frozen=True, slots=True)
class WarehouseOrders:
    """The simulator's ``GET /_simulator/orders``: its orders and the cancellations it answered.

    ``orders`` are ``{"id", "reference", "lines", ...}``; ``cancellations``
    ``{"order_id" (the warehouse's id), "lines", "idempotency_key", "status"}``, in the order
    answered (``status``: ``cancelled``, ``partially_cancelled`` or ``too_late``).
    """

    orders: list[dict[str, Any]]
    cancellations: list[dict[str, Any]]


def read_warehouse(admin_url: str) -> WarehouseOrders:
    """Read the simulator's orders and cancellations from ``admin_url`` (``.../_simulator``).

    Raises:
        OSError: the simulator does not answer.
    """
    with urllib.request.urlopen(f"{admin_url}/orders", timeout=10) as response:  # noqa: S310 - the demo's simulator on loopback
        document = json.loads(response.read())
    return WarehouseOrders(list(document["orders"]), list(document["cancellations"]))


@dataclass
class HandoffCounts:
    """What the warehouse received for a day, or for the run (:meth:`add`)."""

    reservations: int = 0
    orders: int = 0
    withdrawn: int = 0
    """Reservations whose request a cancel withdrew before it was ever sent."""
    accepted: int = 0
    refused: int = 0

    def add(self, other: HandoffCounts) -> None:
        """Add ``other``'s counts to these."""
        self.reservations += other.reservations
        self.orders += other.orders
        self.withdrawn += other.withdrawn
        self.accepted += other.accepted
        self.refused += other.refused

    def describe(self) -> str:
        """E.g. ``received 109 fulfilment orders for 109 reservations, cancellations ...``.

        ``(withdrawn before sending N)`` follows the reservations when N > 0.
        """
        withdrawn = f" (withdrawn before sending {self.withdrawn})" if self.withdrawn else ""
        return (
            f"received {self.orders} fulfilment orders for {self.reservations}"
            f" reservations{withdrawn}, cancellations accepted {self.accepted},"
            f" refused {self.refused}"
        )


def check_day(  # noqa: PLR0913 - what the check compares, by name
    reserved: Collection[UUID],
    *,
    requests: Iterable[RequestRecord],
    warehouse: WarehouseOrders,
    cancellations: Iterable[Mapping[str, Any]],
    entries: Iterable[OutboxEntry],
    statuses: Mapping[UUID, OrderStatus],
) -> HandoffCounts:
    """Check a day's hand-off; the day's counts.

    ``reserved``: the orders the day reserved; ``requests``: the ``warehouse_requests`` rows
    (all of them, or at least the day's orders'); ``warehouse``: what the simulator holds;
    ``cancellations``: those of its cancellations answered during the day; ``entries``: the
    outbox rows the day wrote; ``statuses``: the day's orders' statuses after its shipments.

    Raises:
        HandoffMismatchError: a reservation is not exactly one order at the warehouse (or a
            withdrawn one is one), a request of the day is unanswered or failed, an accepted
            cancellation released nothing, a refused one wrote no ``stock.cancel_refused`` or
            its order did not ship.
    """
    requests = list(requests)
    by_reference = Counter(str(order["reference"]) for order in warehouse.orders)
    warehouse_ids = {str(order["reference"]): str(order["id"]) for order in warehouse.orders}
    fulfilment = {r.order_id: r for r in requests if r.kind is RequestKind.FULFILMENT_ORDER}
    counts = HandoffCounts(reservations=len(reserved))
    for order_id in reserved:
        request = fulfilment.get(order_id)
        held = by_reference[str(order_id)]
        if request is None:
            msg = f"order {order_id} was reserved but recorded no fulfilment-order request"
            raise HandoffMismatchError(msg)
        if request.status is RequestStatus.WITHDRAWN and held == 0:
            counts.withdrawn += 1
        elif (
            request.status is RequestStatus.ACCEPTED
            and held == 1
            and warehouse_ids[str(order_id)] == request.warehouse_id
        ):
            counts.orders += 1
        else:
            msg = (
                f"order {order_id} was reserved once and is {held} orders at the warehouse"
                f" (its request is {request.status}, warehouse id {request.warehouse_id})"
            )
            raise HandoffMismatchError(msg)
    day_orders = set(reserved)
    unanswered = [
        r
        for r in requests
        if r.kind is RequestKind.CANCELLATION
        and r.order_id in day_orders
        and r.status not in {RequestStatus.ACCEPTED, RequestStatus.REFUSED}
    ]
    if unanswered:
        first = unanswered[0]
        msg = f"the cancellation of order {first.order_id} is {first.status}, not answered"
        raise HandoffMismatchError(msg)
    by_key = {str(r.idempotency_key): r for r in requests if r.kind is RequestKind.CANCELLATION}
    written = {
        (entry.order_id, entry.routing_key) for entry in entries if entry.order_id is not None
    }
    # The orders the warehouse cancelled lines of on its own: those may end released.
    cancelled_by_warehouse = {
        str(order["reference"]) for order in warehouse.orders if order.get("cancellations")
    }
    for cancellation in cancellations:
        _check_cancellation(
            cancellation,
            by_key,
            written,
            statuses=statuses,
            counts=counts,
            cancelled_by_warehouse=cancelled_by_warehouse,
        )
    return counts


def _check_cancellation(  # noqa: PLR0913 - what the check compares, by name
    cancellation: Mapping[str, Any],
    by_key: Mapping[str, RequestRecord],
    written: Collection[tuple[UUID, str]],
    *,
    statuses: Mapping[UUID, OrderStatus],
    counts: HandoffCounts,
    cancelled_by_warehouse: Collection[str],
) -> None:
    request = by_key.get(str(cancellation["idempotency_key"]))
    answer = str(cancellation["status"])
    if request is None:
        msg = f"the warehouse answered a cancellation no request asked ({answer})"
        raise HandoffMismatchError(msg)
    order_id = request.order_id
    if answer in ACCEPTED_CANCELLATIONS:
        if (
            request.status is not RequestStatus.ACCEPTED
            or (order_id, STOCK_RELEASED_ROUTING_KEY) not in written
        ):
            msg = (
                f"the warehouse accepted the cancellation of order {order_id} ({answer}) but"
                f" it released nothing (its request is {request.status})"
            )
            raise HandoffMismatchError(msg)
        counts.accepted += 1
    elif answer == TOO_LATE:
        # Refused: the order went the warehouse's way, shipped, or released by the
        # warehouse's own cancellation of what was left.
        status = statuses.get(order_id)
        shipped = status is OrderStatus.SHIPPED or (
            status is OrderStatus.RELEASED and str(order_id) in cancelled_by_warehouse
        )
        if (
            request.status is not RequestStatus.REFUSED
            or (order_id, STOCK_CANCEL_REFUSED_ROUTING_KEY) not in written
            or not shipped
        ):
            msg = (
                f"the warehouse refused the cancellation of order {order_id} (too_late) but"
                f" its request is {request.status}, stock.cancel_refused"
                f" {'written' if (order_id, STOCK_CANCEL_REFUSED_ROUTING_KEY) in written else 'missing'},"  # noqa: E501 - one message
                f" order {statuses.get(order_id)}"
            )
            raise HandoffMismatchError(msg)
        counts.refused += 1
    else:
        msg = f"the warehouse answered the cancellation of order {order_id} {answer}"
        raise HandoffMismatchError(msg)
