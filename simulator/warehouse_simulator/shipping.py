"""The warehouse floor: it cancels what it cannot find and ships the rest, in one or more shipments.

An order received while ``ship_delay_seconds`` is set is worked on that long after its creation:
the warehouse cancels, per SKU with probability ``cancel_rate``, 1 to all the units left of it
(reason ``unfulfillable``; everything left: a cancellation without lines), then splits what is
left into one shipment or, with probability ``split_rate``, 2 to ``max_shipments`` (never more
than the units left), and ships them ``shipment_interval_seconds`` apart. Every unit left ships
or is cancelled exactly once: the shipments and cancellations of an order add up to what it had
left, never more, since a shop's cancellation is refused ``too_late`` once the work began.

A SKU the warehouse keeps on its shelves (:mod:`~.stock`) ships only what is on hand when the
shipment is made: the units of the parcel beyond it are cancelled just before, reason
``unfulfillable``, and the shipment takes the rest off the shelf.

Each shipment and cancellation is the ``data`` object of its webhook (docs/design.md, "Hearing
back from the warehouse"): it is added to its order (``GET {base}/fulfilment-orders/{id}``
lists it) and to :attr:`Floor.shipments` / :attr:`Floor.cancellations`, then handed to
``emit``, which sends the webhook (or does not: a fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from warehouse_simulator.knobs import Faults
from warehouse_simulator.orders import Order

SHIPMENT_SHIPPED = "shipment.shipped"
FULFILMENT_ORDER_CANCELLED = "fulfilment_order.cancelled"

CARRIERS = ("DHL", "UPS", "FedEx", "DPD", "Royal Mail")
"""The carriers a shipment leaves with."""

CANCEL_REASON = "unfulfillable"
"""The reason of the warehouse's own cancellations (a unit it cannot find)."""

Emit = Callable[[str, dict[str, Any]], None]
"""``emit(type, data)``: a change was made; send its webhook."""

Take = Callable[[str, int], int]
"""``take(sku, units)``: take up to ``units`` of ``sku`` off the shelf; the units taken."""


def _all_of(_sku: str, units: int) -> int:
    return units


def rfc3339(seconds: float) -> str:
    """``time.time()`` seconds as RFC 3339 in UTC with milliseconds, e.g. ``...T09:58:00.123Z``."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def split(remaining: dict[str, int], parts: int, rng: random.Random) -> list[dict[str, int]]:
    """``remaining`` (units by SKU) cut into ``parts`` non-empty parcels that add up to it.

    ``parts`` is capped at the units there are. The cuts fall at random units of the SKUs laid
    end to end, so a SKU may be spread over several parcels.
    """
    total = sum(remaining.values())
    parts = max(1, min(parts, total))
    bounds = [0, *sorted(rng.sample(range(1, total), parts - 1)), total]
    parcels: list[dict[str, int]] = [{} for _ in range(parts)]
    start = 0
    for sku, quantity in remaining.items():
        end = start + quantity
        for parcel, low, high in zip(parcels, bounds, bounds[1:], strict=False):
            units = min(end, high) - max(start, low)
            if units > 0:
                parcel[sku] = units
        start = end
    return parcels


class Floor:
    """Works on the orders when they are due, in a task of the running loop (:meth:`start`).

    Args:
        faults: the knobs (read when an order is received and when it is worked on).
        orders: the warehouse's orders by id.
        rng: the simulator's seeded random choices.
        emit: called with each change made.
        take: takes a shipment's units off the shelf (``Shelves.take``); by default every unit
            is there.
    """

    def __init__(
        self,
        faults: Faults,
        orders: dict[str, Order],
        rng: random.Random,
        emit: Emit,
        take: Take = _all_of,
    ) -> None:
        self.faults = faults
        self.orders = orders
        self.shipments: list[dict[str, Any]] = []
        """Every shipment made, in the order made (the webhooks' ``data``)."""
        self.cancellations: list[dict[str, Any]] = []
        """Every cancellation of the warehouse's own, in the order made."""
        self._random = rng
        self._emit = emit
        self._take = take
        self._due: list[tuple[float, int, str]] = []
        """(``time.monotonic()`` due, tie-breaker, order id): the heap of work to do."""
        self._ticket = itertools.count()
        self._plans: dict[str, list[dict[str, int]]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        # Ids unique to this run of the simulator: a restarted one must not make a shipment
        # the service already recorded under the same id.
        self._run = secrets.token_hex(4)

    def received(self, order: Order) -> None:
        """Schedule ``order``'s work if ``ship_delay_seconds`` is set (else it never ships)."""
        delay = self.faults.ship_delay_seconds
        if delay is None:
            return
        self._schedule(order.created_at + delay, order.id)
        self.start()

    @property
    def pending(self) -> int:
        """Steps of work not done yet (an order's first step, or its next shipment)."""
        return len(self._due)

    async def idle(self) -> None:
        """Wait until no work is due (work due later, e.g. a shipment's interval, is waited for)."""
        await self._idle.wait()

    def start(self) -> None:
        """Work in a task of the running loop, unless already working."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._work())

    async def close(self) -> None:
        """Stop working (what is not due yet stays undone)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _schedule(self, when: float, order_id: str) -> None:
        heapq.heappush(self._due, (when, next(self._ticket), order_id))
        self._idle.clear()
        self._wake.set()

    def wake(self) -> None:
        """Look at the knobs again now (``work_held`` changed)."""
        self._wake.set()

    async def _work(self) -> None:
        while True:
            now = time.monotonic()
            held = self.faults.work_held
            while not held and self._due and self._due[0][0] <= now:
                _, _, order_id = heapq.heappop(self._due)
                self._step(self.orders[order_id], now)
            self._wake.clear()
            if not self._due:
                self._idle.set()
            # Held: nothing is due until woken (work_held set false again).
            wait = self._due[0][0] - now if self._due and not held else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _step(self, order: Order, now: float) -> None:
        """The order's first step (cancel, plan, first shipment), or its next shipment."""
        if not order.started:
            order.started = True
            self._cancel_some(order)
            self._plans[order.id] = self._plan(order)
        plan = self._plans.get(order.id)
        if not plan:
            self._plans.pop(order.id, None)
            return
        self._ship(order, plan.pop(0))
        if plan:
            self._schedule(now + self.faults.shipment_interval_seconds, order.id)
        else:
            del self._plans[order.id]

    def _cancel_some(self, order: Order) -> None:
        rate = self.faults.cancel_rate
        cut = {
            sku: self._random.randint(1, quantity)
            for sku, quantity in order.remaining.items()
            if self._random.random() < rate
        }
        self._cancel(order, cut)

    def _cancel(self, order: Order, cut: dict[str, int]) -> None:
        """Cancel ``cut`` (units by SKU, within what is left) of ``order``; nothing if empty."""
        if not cut:
            return
        data: dict[str, Any] = {
            "cancellation_id": f"CXL-{self._run}-{len(self.cancellations) + 1:06d}",
            "fulfilment_order_id": order.id,
            "reference": order.reference,
            "cancelled_at": rfc3339(time.time()),
            "reason": CANCEL_REASON,
        }
        if cut != order.remaining:
            data["lines"] = [{"sku": sku, "quantity": q} for sku, q in cut.items()]
        for sku, quantity in cut.items():
            order.remaining[sku] -= quantity
        order.remaining = {sku: q for sku, q in order.remaining.items() if q}
        order.cancellations.append(data)
        self.cancellations.append(data)
        self._emit(FULFILMENT_ORDER_CANCELLED, data)

    def _plan(self, order: Order) -> list[dict[str, int]]:
        if not order.remaining:
            return []
        parts = 1
        if self._random.random() < self.faults.split_rate and self.faults.max_shipments > 1:
            parts = self._random.randint(2, self.faults.max_shipments)
        return split(order.remaining, parts, self._random)

    def _ship(self, order: Order, parcel: dict[str, int]) -> None:
        taken = {sku: self._take(sku, quantity) for sku, quantity in parcel.items()}
        self._cancel(order, {sku: parcel[sku] - q for sku, q in taken.items() if q < parcel[sku]})
        parcel = {sku: quantity for sku, quantity in taken.items() if quantity}
        if not parcel:
            return
        carrier = self._random.choice(CARRIERS)
        packages = self._random.randint(1, 2)
        tracking = [f"{carrier[:2].upper()}{self._random.randrange(10**11, 10**12)}"]
        tracking += [f"{tracking[0]}-{n}" for n in range(2, packages + 1)]
        data: dict[str, Any] = {
            "shipment_id": f"SHP-{self._run}-{len(self.shipments) + 1:06d}",
            "fulfilment_order_id": order.id,
            "reference": order.reference,
            "shipped_at": rfc3339(time.time()),
            "carrier": carrier,
            "tracking_numbers": tracking,
            "tracking_url": f"https://track.example/{carrier.replace(' ', '-')}/{tracking[0]}",
            "lines": [{"sku": sku, "quantity": q} for sku, q in parcel.items()],
        }
        for sku, quantity in parcel.items():
            order.remaining[sku] -= quantity
        order.remaining = {sku: q for sku, q in order.remaining.items() if q}
        order.shipments.append(data)
        self.shipments.append(data)
        self._emit(SHIPMENT_SHIPPED, data)
