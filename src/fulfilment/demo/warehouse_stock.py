"""The demo's look at the stock that follows the warehouse: a receipt, a damage, the drift.

The simulator keeps the same stock as the service: before the first day the demo loads its
shelves with the service's ``on_hand`` of every SKU (``POST /_simulator/inventory``, no
webhook), and when the shop's ``OrderShipped`` ships an order the warehouse never received,
the demo takes those units off its shelves too. Then, once in a run, the warehouse reports two
adjustments the demo stages through its admin endpoint (``POST /_simulator/adjustments``), so
that they happen on every first run rather than at a random rate:

- the day's work of the warehouse is held (the ``work_held`` knob: picks go on, nothing ships)
  and the day is cut before its middle order (:func:`split_at_middle_order`); the morning's
  orders are reserved and handed to the warehouse, unshipped;
- at the cut the warehouse **receives** :data:`RECEIPT_UNITS` of the SKU the morning's orders
  hold most of (``stock.adjusted``: ``on_hand`` rises), and finds units of another SKU those
  orders hold **damaged**, enough that they hold :data:`SHORT_UNITS` more than is left
  (``stock.adjusted``, then ``stock.shortage``: ``reserved > on_hand``). That SKU is one the
  first afternoon order asking for it could have had (:func:`plan_staging`): that order is then
  rejected ``insufficient_stock`` naming it, and no reservation takes it while it is short;
- the work is let go: the warehouse ships what is on its shelf and cancels the rest of the
  short SKU's lines (``unfulfillable``), which **settles the shortage** (``stock.shortage``
  with ``short`` 0);
- after the last day, ``fulfilment stock drift`` (its code, against the simulator) compares
  the two sides' ``on_hand``: every SKU must agree.

Each step is checked, and a mismatch fails the demo with one line (:class:`DemoError`). The
result events' tally must count the staged adjustments and the shortage's changes, and no more
(:meth:`WarehouseStock.tally_failure`). On a database that played the data before, no order
holds stock at the cut, so nothing is staged and the run changes nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from fulfilment import __version__
from fulfilment.adapters.postgres.admin import order_statuses, outbox_last_id
from fulfilment.adapters.postgres.warehouse_news import (
    SkuStock,
    order_lines,
    recorded_adjustments,
    rejection_of,
    shortfalls_after,
    stock_by_sku,
)
from fulfilment.adapters.warehouse.client import WarehouseClientOptions, build_http_client
from fulfilment.contracts.result_events import (
    STOCK_ADJUSTED_ROUTING_KEY,
    STOCK_SHORTAGE_ROUTING_KEY,
)
from fulfilment.dataset.online_retail import RetailOrder
from fulfilment.dataset.retail_lifecycle import RetailCancellation
from fulfilment.demo.errors import DemoError
from fulfilment.demo.handoff import CONCURRENCY, RATE_PER_SECOND, SIMULATOR_TOKEN
from fulfilment.demo.warehouse_system import SIMULATOR_KNOBS
from fulfilment.dispatcher.service import rate_limiter
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.stock_drift import drift_command

if TYPE_CHECKING:
    from fulfilment.adapters.postgres.stock import PostgresStock
    from fulfilment.dataset.retail_lifecycle import RetailDay
    from fulfilment.demo.result_events import ResultEventTally
    from fulfilment.demo.warehouse_system import DayNews, Handoff

Run = tuple[RetailOrder | RetailCancellation, ...]
"""One run of the day's events, of one kind (``RetailDay.runs``)."""

RECEIPT_UNITS = 12
"""Units of the staged receipt."""
SHORT_UNITS = 1
"""Units the damaged SKU's orders hold beyond what is left after the damage. One: whatever
the warehouse's shipments and cancellations of it, the first cancellation that releases a
unit of it settles the shortage, so the run writes exactly two ``stock.shortage``."""
ADJUSTMENT_WAIT_SECONDS = 60.0
"""The demo fails if the service has not applied a staged adjustment after this long."""
ADJUSTMENT_POLL_SECONDS = 0.05
"""Interval between two looks for the staged adjustments in ``warehouse_adjustments``."""
ADMIN_TIMEOUT_SECONDS = 10.0
"""One request's bound on the simulator's admin endpoints and its inventory."""
NEVER_SENT_KNOB = "webhook_never_rate"


def merged_lines(order: RetailOrder) -> Counter[str]:
    """The order's units per SKU, its lines of one SKU summed (as the service merges them)."""
    units: Counter[str] = Counter()
    for sku, quantity in order.lines:
        units[sku] += quantity
    return units


def split_at_middle_order(runs: Sequence[Run]) -> tuple[list[Run], int | None]:
    """``runs`` with the run that holds the day's middle order cut before it.

    Returns the runs and the index of the run that begins with the middle order (the
    afternoon's first); None when the day has no order.
    """
    total = sum(len(run) for run in runs if isinstance(run[0], RetailOrder))
    if not total:
        return list(runs), None
    middle, seen = total // 2, 0
    for index, run in enumerate(runs):
        if not isinstance(run[0], RetailOrder):
            continue
        if seen + len(run) > middle:
            cut = middle - seen
            if not cut:
                return list(runs), index
            return [*runs[:index], run[:cut], run[cut:], *runs[index + 1 :]], index + 1
        seen += len(run)
    return list(runs), None  # pragma: no cover - the middle order is in some run


@dataclass(frozen=True, slots=True)
class StockPlan:
    """What the warehouse reports at the cut, chosen from the stock and the afternoon's orders.

    Attributes:
        received_sku: the SKU of the receipt: the one the morning's orders hold most of.
        received_on_hand: its ``on_hand`` at the cut.
        damaged_sku: the SKU found damaged.
        damaged_units: units of the damage: what is available of it, and :data:`SHORT_UNITS`.
        damaged_on_hand: its ``on_hand`` at the cut.
        held: units of it the morning's orders hold (its ``reserved``).
        refused: the afternoon's first order asking for it, which could have had it.
        refused_units: units of it that order asks for.
    """

    received_sku: str
    received_on_hand: int
    damaged_sku: str
    damaged_units: int
    damaged_on_hand: int
    held: int
    refused: RetailOrder
    refused_units: int

    @property
    def available(self) -> int:
        """Units of the damaged SKU that could still be promised before the damage."""
        return self.damaged_on_hand - self.held


def plan_staging(
    levels: Mapping[str, SkuStock],
    morning_held: Mapping[str, int],
    afternoon: Sequence[RetailOrder],
) -> StockPlan | None:
    """The receipt and the damage to stage at the cut; None when no SKU fits.

    ``levels``: every SKU's stock at the cut; ``morning_held``: units the morning's reserved
    orders hold per SKU; ``afternoon``: the run of orders after the cut.

    The damaged SKU is held by the morning's orders alone (every unit it has reserved is
    theirs, so the warehouse has them all), and the afternoon's first order asking for it
    could have been reserved whole at the cut (every SKU of it known and available). Of
    those, the one with the least available (then by name): the smallest damage.
    """
    first_asking: dict[str, tuple[RetailOrder, Counter[str]]] = {}
    for order in afternoon:
        lines = merged_lines(order)
        for sku in lines:
            first_asking.setdefault(sku, (order, lines))

    def available(sku: str) -> int:
        level = levels.get(sku)
        return -1 if level is None else level.on_hand - level.reserved

    candidates = []
    for sku, (order, lines) in first_asking.items():
        level = levels.get(sku)
        if level is None or not morning_held.get(sku):
            continue
        if level.reserved != level.held or level.held != morning_held[sku]:
            continue
        if all(units <= available(line_sku) for line_sku, units in lines.items()):
            candidates.append((available(sku), sku, order, lines[sku]))
    others = sorted(
        (sku for sku in morning_held if morning_held[sku] and sku in levels),
        key=lambda sku: (-morning_held[sku], sku),
    )
    if not candidates:
        return None
    free, damaged, order, units = min(candidates, key=lambda c: (c[0], c[1]))
    received = next((sku for sku in others if sku != damaged), None)
    if received is None:
        return None
    return StockPlan(
        received_sku=received,
        received_on_hand=levels[received].on_hand,
        damaged_sku=damaged,
        damaged_units=free + SHORT_UNITS,
        damaged_on_hand=levels[damaged].on_hand,
        held=levels[damaged].held,
        refused=order,
        refused_units=units,
    )


@dataclass(frozen=True, slots=True)
class Staged:
    """A staged plan, with where the run's outbox stood before it (its events come after)."""

    plan: StockPlan
    day: str
    outbox_id: int
    adjustment_ids: tuple[str, str]


class WarehouseStock:
    """The warehouse's stock beside the service's during the run (module docstring)."""

    def __init__(self, handoff: Handoff, echo: Echo) -> None:
        self._handoff = handoff
        self._echo = echo
        self.staged: Staged | None = None
        self.pending = True
        """Nothing staged yet: each day is held and cut until a plan fits."""
        self.shortfalls: list[int] = []
        """The ``short`` of the damaged SKU's ``stock.shortage`` events, once settled."""

    async def _admin(self, name: str, document: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /_simulator/<name>`` with ``document``; the answer's JSON.

        Raises:
            DemoError: the simulator refused it (its answer named).
        """
        url = f"{self._handoff.simulator_admin}/{name}"
        async with httpx.AsyncClient(timeout=ADMIN_TIMEOUT_SECONDS) as client:
            answer = await client.post(url, json=document)
        if answer.status_code not in {200, 201}:
            msg = f"the warehouse simulator refused POST {url}: {answer.status_code} {answer.text}"
            raise DemoError(msg)
        result: dict[str, Any] = answer.json()
        return result

    async def load_shelves(self, levels: Mapping[str, int]) -> None:
        """Set the simulator's ``on_hand`` of the SKUs of ``levels`` (no webhook)."""
        if levels:
            await self._admin("inventory", {"levels": dict(levels)})

    async def follow_shop_shipments(self, stock: PostgresStock, skus: Collection[str]) -> None:
        """Take what the shop's ``OrderShipped`` shipped of ``skus`` off the simulator's shelves.

        Called once the day is settled: the two sides then agree on every other SKU, and these
        left the building with the shop's shipment, which the warehouse never made.
        """
        levels = await stock_by_sku(stock)
        await self.load_shelves({sku: levels[sku].on_hand for sku in skus if sku in levels})

    async def hold(self, *, held: bool) -> None:
        """Hold the warehouse's work (nothing ships), or let it go."""
        await self._admin("faults", {"work_held": held})

    async def stage(
        self,
        day: RetailDay,
        stock: PostgresStock,
        morning: Collection[RetailOrder],
        afternoon: Run,
    ) -> None:
        """At the cut: plan the receipt and the damage, make them, check what they did.

        ``morning``: the day's orders sent before the cut (reserved and handed to the
        warehouse, whose work is held); ``afternoon``: the run sent next.

        Raises:
            DemoError: the service did not apply them in time, or not as the warehouse made
                them, or the damaged SKU is not short by :data:`SHORT_UNITS`.
        """
        ids = [order.order_id for order in morning]
        statuses = await order_statuses(stock, ids)
        held: Counter[str] = Counter()
        for order_id, lines in (await order_lines(stock, ids)).items():
            if statuses.get(order_id) is OrderStatus.RESERVED:
                held.update({sku: quantity - shipped for sku, (quantity, shipped) in lines.items()})
        orders = [event for event in afternoon if isinstance(event, RetailOrder)]
        plan = plan_staging(await stock_by_sku(stock), +held, orders)
        at = f"{orders[0].placed_at:%H:%M}" if orders else "the cut"
        if plan is None:
            self._echo(
                f"{day.name}: at {at} no order holds stock the afternoon also asks for: the"
                " warehouse's receipt and damage wait for another day"
            )
            return
        outbox_id = await outbox_last_id(stock)
        # An adjustment has no poll to find it if its webhook is never sent (the drift report
        # would): the staged ones are always sent, the other faults still apply.
        await self._admin("faults", {NEVER_SENT_KNOB: 0.0})
        try:
            receipt = await self._admin(
                "adjustments",
                {"sku": plan.received_sku, "delta": RECEIPT_UNITS, "reason": "received"},
            )
            damage = await self._admin(
                "adjustments",
                {"sku": plan.damaged_sku, "delta": -plan.damaged_units, "reason": "damaged"},
            )
        finally:
            await self._admin("faults", {NEVER_SENT_KNOB: SIMULATOR_KNOBS[NEVER_SENT_KNOB]})
        staged = Staged(
            plan, day.name, outbox_id, (str(receipt["adjustment_id"]), str(damage["adjustment_id"]))
        )
        await self._wait_applied(day, stock, staged)
        self.staged = staged
        self.pending = False
        self._echo(
            f"{day.name}: at {at}, the warehouse's work held, it received {RECEIPT_UNITS} of"
            f" {plan.received_sku} (on hand {plan.received_on_hand} ->"
            f" {plan.received_on_hand + RECEIPT_UNITS}) and found {plan.damaged_units} of"
            f" {plan.damaged_sku} damaged while the morning's orders held {plan.held} of its"
            f" {plan.damaged_on_hand}: on hand {plan.damaged_on_hand - plan.damaged_units},"
            f" reserved {plan.held}, short {SHORT_UNITS} (stock.adjusted 2, stock.shortage"
            f" short {SHORT_UNITS})"
        )

    async def _wait_applied(self, day: RetailDay, stock: PostgresStock, staged: Staged) -> None:
        """Wait until the service applied both staged adjustments, then check them.

        Raises:
            DemoError: not applied within :data:`ADJUSTMENT_WAIT_SECONDS` (or a child of the
                warehouse system exited), applied otherwise than made, or the damaged SKU is
                not short by :data:`SHORT_UNITS` with one ``stock.shortage`` saying so.
        """
        plan = staged.plan
        deadline = time.monotonic() + ADJUSTMENT_WAIT_SECONDS
        while len(found := await recorded_adjustments(stock, staged.adjustment_ids)) < 2:  # noqa: PLR2004 - the receipt and the damage
            self._handoff.exited(day, "the warehouse's receipt and damage awaited")
            if time.monotonic() > deadline:
                msg = (
                    f"{day.name}: the service applied {sorted(found)} of the warehouse's"
                    f" adjustments {list(staged.adjustment_ids)} in"
                    f" {ADJUSTMENT_WAIT_SECONDS:g} s (log: {self._handoff.intake.log})"
                )
                raise DemoError(msg)
            await asyncio.sleep(ADJUSTMENT_POLL_SECONDS)
        receipt, damage = (found[adjustment_id] for adjustment_id in staged.adjustment_ids)
        expected = [
            (plan.received_sku, RECEIPT_UNITS, plan.received_on_hand + RECEIPT_UNITS),
            (plan.damaged_sku, -plan.damaged_units, plan.damaged_on_hand - plan.damaged_units),
        ]
        got = [(row.sku, row.applied, row.on_hand) for row in (receipt, damage)]
        if got != expected or damage.reserved != plan.held:
            msg = (
                f"{day.name}: the warehouse's adjustments (sku, units, on hand after) {expected}"
                f" (reserved {plan.held}) were applied as {got} (reserved {damage.reserved})"
            )
            raise DemoError(msg)
        shortfalls = await shortfalls_after(stock, staged.outbox_id, plan.damaged_sku)
        if shortfalls != [SHORT_UNITS]:
            msg = (
                f"{day.name}: {plan.damaged_sku} should be short by {SHORT_UNITS} after the"
                f" damage; its stock.shortage events say {shortfalls}"
            )
            raise DemoError(msg)

    async def check_refused(self, day: RetailDay, stock: PostgresStock) -> None:
        """After the afternoon's first run: the short SKU's order was refused, nothing taken.

        Raises:
            DemoError: that order was not rejected ``insufficient_stock`` naming the short
                SKU, or the SKU's ``reserved`` changed while it was short.
        """
        if self.staged is None or self.staged.day != day.name:
            return
        plan = self.staged.plan
        rejection = await rejection_of(stock, plan.refused.order_id)
        level = (await stock_by_sku(stock))[plan.damaged_sku]
        if (
            rejection is None
            or rejection[0] != "insufficient_stock"
            or (plan.damaged_sku not in rejection[1])
        ):
            msg = (
                f"{day.name}: order {plan.refused.invoice_no}, asking for {plan.refused_units} of"
                f" the short {plan.damaged_sku}, was not rejected insufficient_stock naming it"
                f" ({rejection or 'no stock.rejected'})"
            )
            raise DemoError(msg)
        if level.reserved != plan.held:
            msg = (
                f"{day.name}: {plan.damaged_sku} is short, yet its reserved went from"
                f" {plan.held} to {level.reserved}"
            )
            raise DemoError(msg)
        self._echo(
            f"{day.name}: {plan.damaged_sku} short: order {plan.refused.invoice_no} asking for"
            f" {plan.refused_units} of it ({plan.available} were available before the damage)"
            f" rejected insufficient_stock naming it; its reserved stays {level.reserved}"
        )

    async def check_settled(self, day: RetailDay, stock: PostgresStock, news: DayNews) -> None:
        """Once the warehouse is done with the day: its cancellations settled the shortage.

        Raises:
            DemoError: the SKU is still short, none of the warehouse's cancellations released
                it, or its ``stock.shortage`` events do not go from :data:`SHORT_UNITS` to 0
                one change at a time.
        """
        if self.staged is None or self.staged.day != day.name:
            return
        sku = self.staged.plan.damaged_sku
        level = (await stock_by_sku(stock))[sku]
        cancellations = {
            row.cancellation_id: row.lines[sku][1]
            for row in news.cancellations
            if row.lines.get(sku, (0, 0))[1]
        }
        shortfalls = await shortfalls_after(stock, self.staged.outbox_id, sku)
        if (
            level.reserved > level.on_hand
            or not cancellations
            or not shortfalls
            or shortfalls[0] != SHORT_UNITS
            or shortfalls[-1] != 0
            or any(later >= earlier for earlier, later in itertools.pairwise(shortfalls))
        ):
            msg = (
                f"{day.name}: the shortage of {sku} is not settled by the warehouse's"
                f" cancellations: on hand {level.on_hand}, reserved {level.reserved}, its"
                f" cancellations {cancellations or 'none'}, stock.shortage short {shortfalls}"
            )
            raise DemoError(msg)
        self.shortfalls = shortfalls
        released = sum(cancellations.values())
        self._echo(
            f"{day.name}: the shortage of {sku} settled by the warehouse's cancellation of"
            f" {released} unit{'' if released == 1 else 's'} of it"
            f" ({', '.join(sorted(cancellations))}, unfulfillable): on hand {level.on_hand},"
            f" reserved {level.reserved}; stock.shortage short"
            f" {' -> '.join(map(str, shortfalls))}"
        )

    def tally_failure(self, tally: ResultEventTally) -> str | None:
        """One line when the run's ``stock.adjusted``, ``stock.shortage`` are not as staged."""
        expected = {
            STOCK_ADJUSTED_ROUTING_KEY: 2 if self.staged else 0,
            STOCK_SHORTAGE_ROUTING_KEY: len(self.shortfalls),
        }
        wrong = [
            f"{key} published {tally.published[key]}, staged {count}"
            for key, count in expected.items()
            if tally.published[key] != count
        ]
        return "result events: " + ", ".join(wrong) if wrong else None

    async def drift(self, options: ToolOptions) -> None:
        """``fulfilment stock drift`` against the simulator; echo its report.

        Raises:
            DemoError: a SKU differs (every order is done: no difference is in flight), or the
                simulator's inventory cannot be read.
        """
        http = build_http_client(
            WarehouseClientOptions(
                url=self._handoff.env["FULFILMENT_WAREHOUSE_URL"],
                token=SIMULATOR_TOKEN,
                timeout_seconds=ADMIN_TIMEOUT_SECONDS,
                ca_file=None,
                max_connections=CONCURRENCY,
                user_agent=f"fulfilment/{__version__}",
            )
        )
        lines: list[str] = []
        try:
            async with http:
                report = await drift_command(
                    options,
                    http,
                    rate_limiter(RATE_PER_SECOND),
                    timeout_seconds=ADMIN_TIMEOUT_SECONDS,
                    as_json=False,
                    echo=lines.append,
                )
        except CommandError as error:
            self._echo_drift(lines)
            msg = f"stock drift: {error}"
            raise DemoError(msg) from error
        self._echo_drift(lines)
        if report.differing:
            names = ", ".join(sku.sku for sku in report.differing)
            msg = f"stock drift: {len(report.differing)} SKU(s) differ from the warehouse: {names}"
            raise DemoError(msg)

    def _echo_drift(self, lines: Sequence[str]) -> None:
        self._echo(
            "stock drift (fulfilment stock drift, the service's on hand beside the warehouse's):\n"
            + "\n".join(f"  {line}" for line in lines)
        )
