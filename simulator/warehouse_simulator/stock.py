"""The warehouse's shelves: an on-hand count per SKU, and the adjustments that change it.

Only the SKUs given a level (``POST /_simulator/inventory``, :meth:`Shelves.load`) are kept:
the others ship without limit, as before the warehouse kept stock, and are not listed by
``GET {base}/inventory``. A kept SKU's on hand changes:

- when a shipment leaves (:mod:`~.shipping`): it falls by the units shipped, at the moment the
  shipment is made, the moment its ``shipment.shipped`` webhook is emitted. A parcel holding
  more units of a SKU than are on hand ships what is there; the rest is cancelled first, reason
  ``unfulfillable`` (the warehouse cannot find it). Receiving an order, or a shop's
  cancellation, leaves it alone: the warehouse reserves nothing on its shelf;
- by an adjustment: a receipt, a return, a damage, a loss or a count, made at the rate knobs
  (:class:`~.knobs.Faults`, ``*_per_second``) on a kept SKU chosen at random, or on demand
  (``POST /_simulator/adjustments``). Each is the ``data`` of an ``inventory.adjusted``
  webhook: ``{"adjustment_id", "sku", "delta", "reason", "occurred_at"}``. On hand never falls
  below 0: a damage, a loss or a count takes at most what is on hand.

A load is the first count of the shelves, not an adjustment: it sends no webhook (the service
loads its own levels with ``fulfilment stock load``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Callable
from typing import Any

from warehouse_simulator.knobs import Faults
from warehouse_simulator.shipping import rfc3339

INVENTORY_ADJUSTED = "inventory.adjusted"

REASONS = ("received", "returned", "found", "counted", "damaged", "lost")
"""The reasons of an adjustment, as the API's ``inventory.adjusted`` gives them."""

RATE_KNOBS = {
    "receipts_per_second": "received",
    "returns_per_second": "returned",
    "damages_per_second": "damaged",
    "losses_per_second": "lost",
    "counts_per_second": "counted",
}
"""The knob of each kind of adjustment the warehouse makes on its own, and its reason."""

DEFAULT_PAGE_LIMIT = 100
"""The items of a ``GET {base}/inventory`` page when the request gives no ``limit``."""

MAX_PAGE_LIMIT = 1000
"""The most items of one page; a larger ``limit`` is answered 400."""

Emit = Callable[[str, dict[str, Any]], None]
"""``emit(type, data)``: an adjustment was made; send its webhook."""


class Shelves:
    """The on-hand counts and the adjustments, made in a task of the running loop (:meth:`start`).

    Args:
        faults: the knobs (the ``*_per_second`` rates and ``adjustment_max_units``, read at
            each adjustment).
        rng: the simulator's seeded random choices.
        emit: called with each adjustment made.
    """

    def __init__(self, faults: Faults, rng: random.Random, emit: Emit) -> None:
        self.faults = faults
        self.on_hand: dict[str, int] = {}
        """Units on the shelf by SKU, for the SKUs kept."""
        self.adjustments: list[dict[str, Any]] = []
        """Every adjustment made, in the order made (the webhooks' ``data``)."""
        self._random = rng
        self._emit = emit
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Ids unique to this run, as the shipments' are.
        self._run = secrets.token_hex(4)

    def load(self, levels: dict[str, int]) -> None:
        """Set the on hand of the SKUs in ``levels`` (the others stay as they are); no webhook.

        Raises:
            ValueError: a SKU that is not a non-empty string, a level that is not an integer
                >= 0 (nothing is set).
        """
        for sku, level in levels.items():
            if not isinstance(sku, str) or not sku:
                msg = "a SKU must be a non-empty string"
                raise ValueError(msg)
            if type(level) is not int or level < 0:
                msg = f"the level of {sku!r} must be an integer >= 0"
                raise ValueError(msg)
        self.on_hand.update(levels)

    def take(self, sku: str, wanted: int) -> int:
        """Take up to ``wanted`` units of ``sku`` off the shelf; the units taken.

        A SKU not kept gives all of them (it is not counted).
        """
        if sku not in self.on_hand:
            return wanted
        taken = min(wanted, self.on_hand[sku])
        self.on_hand[sku] -= taken
        return taken

    def adjust(self, sku: str, delta: int, reason: str) -> dict[str, Any]:
        """Make an adjustment now and send its webhook; its ``data``.

        A SKU not kept becomes kept, from 0, by a positive delta.

        Raises:
            ValueError: a reason not in :data:`REASONS`, a delta that is 0 or not an integer,
                or one that would take the on hand below 0.
        """
        if reason not in REASONS:
            msg = f"reason must be one of {', '.join(REASONS)}"
            raise ValueError(msg)
        if type(delta) is not int or delta == 0:
            msg = "delta must be a non-zero integer"
            raise ValueError(msg)
        if not isinstance(sku, str) or not sku:
            msg = "a SKU must be a non-empty string"
            raise ValueError(msg)
        if self.on_hand.get(sku, 0) + delta < 0:
            msg = f"{sku} has {self.on_hand.get(sku, 0)} on hand: a delta of {delta} is more"
            raise ValueError(msg)
        self.on_hand[sku] = self.on_hand.get(sku, 0) + delta
        data: dict[str, Any] = {
            "adjustment_id": f"ADJ-{self._run}-{len(self.adjustments) + 1:06d}",
            "sku": sku,
            "delta": delta,
            "reason": reason,
            "occurred_at": rfc3339(time.time()),
        }
        self.adjustments.append(data)
        self._emit(INVENTORY_ADJUSTED, data)
        return data

    def page(self, after: str, limit: int) -> dict[str, Any]:
        """The answer of ``GET {base}/inventory?after=<sku>&limit=<n>``.

        The kept SKUs after ``after`` in code point order (``COLLATE "C"`` of UTF-8 text), at
        most ``limit``; ``next`` is the last SKU of the page when more follow, else null.
        """
        skus = sorted(sku for sku in self.on_hand if sku > after)
        items = [{"sku": sku, "on_hand": self.on_hand[sku]} for sku in skus[:limit]]
        more = len(skus) > limit
        return {
            "as_of": rfc3339(time.time()),
            "items": items,
            "next": items[-1]["sku"] if more else None,
        }

    def start(self) -> None:
        """Make the adjustments of the rate knobs in a task of the running loop, unless already."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._work())
        self._wake.set()

    async def close(self) -> None:
        """Stop making adjustments."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _work(self) -> None:
        """Adjustments as Poisson arrivals at the sum of the rates, each of a reason by its rate."""
        while True:
            rates = {reason: getattr(self.faults, knob) for knob, reason in RATE_KNOBS.items()}
            total = sum(rates.values())
            if total <= 0 or not self.on_hand:
                # Nothing to do until a knob or a load changes: wait to be woken.
                self._wake.clear()
                await self._wake.wait()
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._random.expovariate(total))
                # Woken (a knob changed): draw the wait again at the new rates.
                continue
            reason = self._random.choices(list(rates), weights=list(rates.values()))[0]
            self._random_adjustment(reason)

    def _random_adjustment(self, reason: str) -> None:
        """One adjustment of ``reason`` on a kept SKU at random (none when it would be 0)."""
        sku = self._random.choice(sorted(self.on_hand))
        units = self._random.randint(1, self.faults.adjustment_max_units)
        if reason in {"received", "returned"}:
            delta = units
        elif reason == "counted":
            delta = self._random.choice((-1, 1)) * units
        else:
            delta = -units
        delta = max(delta, -self.on_hand[sku])
        if delta:
            self.adjust(sku, delta, reason)
