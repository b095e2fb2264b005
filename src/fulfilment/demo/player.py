"""The demo's player: the days played through the worker, each run settled before the next.

:func:`play_days` starts the worker and plays the data day by day
(``fulfilment.dataset.retail_lifecycle``): each day's orders and mapped cancellations in time
order, one run of one kind at a time, each run settled before the next is sent; then it waits
until the warehouse has shipped or cancelled the day's orders it received and the service
recorded it (``demo.warehouse_system``), checks that and the stock, and sends the
``OrderShipped`` of any order of the day still reserved (one the warehouse never received),
settled too; then it stops the worker with SIGTERM (it finishes in-flight work and exits 0).

Settled means that the worker has answered every delivery of the run: its
``fulfilment_events_total`` for that event (``/metrics``) grew by as many since the run was
published, whatever the answer (applied, a duplicate, dead-lettered; a requeued delivery is
not an answer, it comes again). The inbox cannot say it, as a second run's events are in it
before they are delivered. The player reads which orders are still reserved only then, and
the day's outcomes from the inbox: an event not in it was dead-lettered, and one that was in
it before it was sent (a second run's) was answered as a duplicate.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from fulfilment.adapters.postgres.admin import (
    StockTotals,
    inbox_outcomes,
    order_statuses,
    outbox_entries_after,
    outbox_last_id,
    processed_event_ids,
    stock_session,
    stock_totals,
)
from fulfilment.adapters.postgres.warehouse_news import (
    adjusted_units_after,
    order_lines,
    outbox_units_after,
    recorded_shipments,
    skus_with_losses,
    stock_by_sku,
)
from fulfilment.adapters.rabbitmq.connection import connect, connection_lost
from fulfilment.adapters.rabbitmq.inspection import queue_state
from fulfilment.contracts.result_events import (
    STOCK_RELEASED_ROUTING_KEY,
    STOCK_RESERVED_ROUTING_KEY,
    STOCK_SHIPPED_ROUTING_KEY,
    ReleaseReason,
)
from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_PLACED, ORDER_SHIPPED
from fulfilment.dataset.online_retail import RetailOrder, shipment_event_id_for
from fulfilment.dataset.publish import publish_in_order
from fulfilment.dataset.retail_lifecycle import (
    CancellationMatch,
    RetailCancellation,
    RetailDay,
    RetailEvent,
    RetailShipment,
)
from fulfilment.demo.children import Child, start_child, stop, wait_ready
from fulfilment.demo.errors import DemoError
from fulfilment.demo.warehouse_news import NewsMismatchError, check_stock
from fulfilment.demo.warehouse_stock import WarehouseStock, split_at_middle_order
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.observability.metrics import REQUEUED
from fulfilment.routes.table import SUBSCRIBED_QUEUES

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from fulfilment.adapters.postgres.stock import PostgresStock
    from fulfilment.demo.warehouse_system import Handoff
    from fulfilment.tools.command import Echo, ToolOptions

SETTLE_POLL_SECONDS = 0.05
"""Interval between two looks at the worker's metrics while a run settles: a run of a few
events takes the worker a few milliseconds, and the demo waits for about 220 runs on the 20
days."""
SETTLE_STALL_SECONDS = 120.0
"""The demo fails if the worker answers nothing more of a run for this long."""
PROGRESS_SECONDS = 5.0
"""A run that takes longer than this to settle says so, then again at this interval."""
WAREHOUSE_CANCELLED: ReleaseReason = "warehouse_cancelled"
"""The ``reason`` of a ``stock.released`` that a cancellation of the warehouse's own wrote."""


async def play_days(  # noqa: PLR0913 - what the play needs, by name
    options: ToolOptions,
    days: Sequence[RetailDay],
    handoff: Handoff,
    *,
    others_ready: Callable[[], Awaitable[None]],
    stop_grace_seconds: float,
    echo: Echo,
) -> tuple[Player, int]:
    """Start the worker, play ``days`` through it, stop it; the player and its exit code.

    The worker records a warehouse request per reservation (``FULFILMENT_WAREHOUSE_URL`` is
    the demo's simulator), which ``handoff``'s dispatcher sends. ``others_ready`` waits until
    the demo's other children are ready: called once the worker is started, so that they all
    start side by side.

    Raises:
        DemoError: the worker did not get ready, exited, or stalled (it is stopped all the same);
            the hand-off stalled or does not match the reservations.
    """
    worker = await start_child(
        "worker", ("-m", "fulfilment"), "FULFILMENT_HTTP_PORT", env=handoff.env
    )
    echo(f"worker started ({worker.describe()})")
    try:
        await others_ready()
        await wait_ready(worker)
        async with (
            connect(options.amqp_url) as connection,
            stock_session(options.database, consumer=options.consumer) as stock,
        ):
            player = Player(
                connection=connection,
                amqp_url=options.amqp_url,
                stock=stock,
                consumer=options.consumer,
                worker=Worker(worker),
                handoff=handoff,
                echo=echo,
            )
            for day in days:
                await player.play(day)
            await player.shelves.drift(options)
        echo(player.published())
        echo("this run's outcomes\n" + await asyncio.to_thread(_run_outcomes, worker.port))
    finally:
        code = await stop(worker.process, stop_grace_seconds)
    echo(f"worker stopped with exit code {code}")
    return player, code


@dataclass(frozen=True, slots=True)
class DayCounts:
    """What the service answered to one day's events, and how the stock moved.

    Attributes:
        outcomes: the answers to the day's orders and cancellations, by outcome.
        shipments: the warehouse's shipments of the day's orders, by their recorded outcome.
        shop_shipments: the answers to the shop's ``OrderShipped`` of the day (orders the
            warehouse never received), by outcome.
        units: the units of the day's result events, by ``(routing key, reason)``
            (``warehouse_news.outbox_units_after``).
        adjusted: the units the warehouse's adjustments of the day applied, by SKU.
    """

    outcomes: dict[str, Counter[str]]
    shipments: Counter[str]
    shop_shipments: Counter[str]
    units: dict[tuple[str, str], int]
    adjusted: dict[str, int]

    def released(self, *, by_warehouse: bool) -> int:
        """Units given back by the warehouse's own cancellations, or by the shop's."""
        return sum(
            units
            for (key, reason), units in self.units.items()
            if key == STOCK_RELEASED_ROUTING_KEY and (reason == WAREHOUSE_CANCELLED) == by_warehouse
        )


class Player:
    """Plays the days one after the other through the worker, and remembers what it sent."""

    def __init__(  # noqa: PLR0913 - what a player uses, by name
        self,
        *,
        connection: AbstractConnection,
        amqp_url: str,
        stock: PostgresStock,
        consumer: str,
        worker: Worker,
        handoff: Handoff,
        echo: Echo,
    ) -> None:
        self._connection = connection
        self._handoff = handoff
        self._amqp_url = amqp_url
        self._stock = stock
        self._consumer = consumer
        self._worker = worker
        self._echo = echo
        self.sent: Counter[str] = Counter()
        self.shipments: list[RetailShipment] = []
        """The shop's ``OrderShipped`` sent: of orders the warehouse never received."""
        self._start: dict[str, int] | None = None
        """``on_hand`` per SKU before the first day (after the run's load)."""
        self._shipped: Counter[str] = Counter()
        """Units shipped per SKU since, by the warehouse and the shop's ``OrderShipped``."""
        self._began = 0
        """The last ``outbox.id`` before the first day: the run's rows come after it."""
        self.shelves = WarehouseStock(handoff, echo)
        """The warehouse's stock beside the service's: its receipt, damage and drift."""

    def published(self) -> str:
        """One line: the events published, by kind."""
        return (
            f"published {self.sent[ORDER_PLACED.event]} OrderPlaced,"
            f" {self.sent[ORDER_CANCELLED.event]} OrderCancelled and"
            f" {self.sent[ORDER_SHIPPED.event]} OrderShipped events (the shipments of the"
            " orders the warehouse received came from the warehouse)"
        )

    async def play(self, day: RetailDay) -> None:
        """Send the day's runs, each settled, let the warehouse ship; echo the day's lines.

        Before the warehouse picks, it answers every request of the day (a cancel it accepts
        must meet its order reserved); then the day waits until the warehouse has shipped or
        cancelled every order it holds and the service recorded each of its shipments and
        cancellations. What the warehouse received and sent back is then checked, the
        settlement of a shortage staged that day (``demo.warehouse_stock``), and the stock. An
        order of the day still reserved then is one the warehouse never received (reserved
        before this run, without a hand-off): the shop ships it with an ``OrderShipped``, as
        it would without a warehouse, and the demo takes its units off the warehouse's shelves.

        Raises:
            DemoError: the hand-off or the warehouse's news stalled, or do not match the
                day's reservations, or the stock does not match the shipments.
        """
        if self._start is None:
            levels = await stock_by_sku(self._stock)
            self._start = {sku: level.on_hand for sku, level in levels.items()}
            self._began = await outbox_last_id(self._stock)
            # The warehouse starts with the service's stock, so that the drift ends at 0.
            await self.shelves.load_shelves(self._start)
        start = await outbox_last_id(self._stock)
        outcomes = await self._play_runs(day)
        await self._handoff.settle(day, self._stock)
        order_ids = [order.order_id for order in day.orders]
        news = await self._handoff.settle_news(day, self._stock, order_ids)
        await self.shelves.check_settled(day, self._stock, news)
        self._shipped.update(news.shipped_units())
        statuses = await order_statuses(self._stock, order_ids)
        reserved = {order_id: s for order_id, s in statuses.items() if s is OrderStatus.RESERVED}
        shipments = day.shipments(reserved)
        shop_skus: set[str] = set()
        for lines in (await order_lines(self._stock, reserved)).values():
            self._shipped.update({sku: held - shipped for sku, (held, shipped) in lines.items()})
            shop_skus.update(lines)
        shop_shipments = Counter(await self._send(day, shipments))
        if shipments:
            await self.shelves.follow_shop_shipments(self._stock, shop_skus)
        self.shipments += shipments
        counts = DayCounts(
            outcomes=outcomes,
            shipments=Counter(shipment.outcome for shipment in news.shipments),
            shop_shipments=shop_shipments,
            units=await outbox_units_after(self._stock, start),
            adjusted=await adjusted_units_after(self._stock, start),
        )
        after = await stock_totals(self._stock)
        self._echo(_day_line(day, counts, after))
        statuses = await order_statuses(self._stock, order_ids)
        entries = await outbox_entries_after(self._stock, start)
        self._echo(await self._handoff.check(day, self._stock, statuses, entries))
        self._echo(await self._handoff.check_news(day, self._stock, news, entries))
        try:
            short = check_stock(
                self._start,
                self._shipped,
                await adjusted_units_after(self._stock, self._began),
                await stock_by_sku(self._stock),
                losses=await skus_with_losses(self._stock),
            )
        except NewsMismatchError as mismatch:
            msg = f"{day.name}: stock: {mismatch}"
            raise DemoError(msg) from mismatch
        self._echo(
            f"{day.name}: stock checked: on hand = as the run began + adjustments applied - units"
            " shipped, reserved = units the reserved orders' lines hold, for every SKU; short"
            f" SKUs (after a reported loss) {len(short)}"
        )

    async def _play_runs(self, day: RetailDay) -> dict[str, Counter[str]]:
        """Send the day's runs, each settled; the answers to its orders and cancellations.

        Until the warehouse's receipt and damage are staged, the day is cut before its middle
        order, and they are staged at the cut (``demo.warehouse_stock``).
        """
        outcomes: dict[str, Counter[str]] = {"orders": Counter(), "cancellations": Counter()}
        runs, cut = day.runs(), None
        if self.shelves.pending:
            runs, cut = split_at_middle_order(runs)
        if cut is not None:
            # Held until the afternoon's first run is answered, so that the damage at the cut
            # meets the morning's orders unshipped.
            await self.shelves.hold(held=True)
        for index, run in enumerate(runs):
            if index == cut:
                await self._handoff.settle(day, self._stock)
                morning = [e for r in runs[:index] for e in r if isinstance(e, RetailOrder)]
                await self.shelves.stage(day, self._stock, morning, run)
            if not isinstance(run[0], RetailOrder):
                # The orders placed so far reach the warehouse first: a cancellation then
                # meets its order there, and is accepted or, after the pick, refused.
                await self._handoff.settle(day, self._stock)
            answers = await self._send(day, run)
            if isinstance(run[0], RetailOrder):
                outcomes["orders"].update(answers)
            else:
                # A cancel of an order sent to the warehouse releases when the warehouse
                # accepts it: the run is over when its requests are answered.
                await self._handoff.settle(day, self._stock)
                outcomes["cancellations"].update(answers)
            if index == cut:
                await self.shelves.check_refused(day, self._stock)
                await self.shelves.hold(held=False)
        return outcomes

    async def _send(self, day: RetailDay, events: Sequence[RetailEvent]) -> list[str]:
        """Publish ``events`` (of one kind), wait until settled; their outcomes, in no order.

        An event the inbox held before it was sent (played before) counts as ``duplicate``,
        as the worker answered it: the inbox keeps the outcome of its first processing. Any
        other counts with its inbox outcome, or as ``dead_lettered`` when it is not in the
        inbox once settled.
        """
        if not events:
            return []
        event = _EVENT[type(events[0])]
        ids = [sent.event_id for sent in events]
        before = await processed_event_ids(self._stock, self._consumer, ids)
        answered = (await self._worker.answered())[event]
        with connection_lost(self._connection, self._amqp_url):
            await publish_in_order(self._connection, events)
        self.sent[event] += len(events)
        await self._settle(day, event, answered + len(events))
        new = [event_id for event_id in ids if event_id not in before]
        outcomes = await inbox_outcomes(self._stock, self._consumer, new)
        return [
            *outcomes.values(),
            *["duplicate"] * (len(ids) - len(new)),
            *["dead_lettered"] * (len(new) - len(outcomes)),
        ]

    async def _other_consumers(self, event: str) -> str:
        """``; N consumers on <queue> ...`` when more than the demo's worker consume ``event``.

        Another worker on the same queues takes some of the demo's events, which the demo's
        worker then never answers: :meth:`_settle` stops the demo with this, where the wait
        would look like a slow worker and end only after :data:`SETTLE_STALL_SECONDS`.

        Raises:
            BrokerUnavailableError: the broker dropped the demo's connection (exit 3).
        """
        name = next(queue.name for queue in SUBSCRIBED_QUEUES if queue.event == event)
        with connection_lost(self._connection, self._amqp_url):
            state = await queue_state(self._connection, name)
        if state is None or state.consumers <= 1:
            return ""
        return (
            f"; {state.consumers} consumers on {name}: another worker takes the demo's events"
            " (stop it, or give the demo a virtual host of its own in FULFILMENT_AMQP_URL)"
        )

    async def _settle(self, day: RetailDay, event: str, answered: int) -> None:
        """Wait until the worker has answered ``answered`` deliveries of ``event`` in all.

        Every :data:`PROGRESS_SECONDS` of waiting it looks at the event's queue and says how
        many are left.

        Raises:
            DemoError: the worker answered nothing more for :data:`SETTLE_STALL_SECONDS`, or
                the queue has a consumer besides the demo's worker (at the first look that
                sees it, with the progress line that says so), or the worker exited.
            BrokerUnavailableError: the broker dropped the demo's connection (exit 3).
        """
        last, changed = -1, time.monotonic()
        said = changed
        while (now_answered := (await self._worker.answered())[event]) < answered:
            now = time.monotonic()
            if now_answered != last:
                last, changed = now_answered, now
            if now - changed > SETTLE_STALL_SECONDS:
                msg = (
                    f"{day.name}: the worker answered nothing more of the {event} events for"
                    f" {SETTLE_STALL_SECONDS:g} s ({answered - now_answered} waiting;"
                    f" log: {self._worker.log}){await self._other_consumers(event)}"
                )
                raise DemoError(msg)
            if now - said > PROGRESS_SECONDS:
                others = await self._other_consumers(event)
                line = f"{day.name}: waiting for {answered - now_answered} {event} events{others}"
                if others:
                    # The other consumer keeps the events it took: waiting on cannot end well.
                    raise DemoError(line)
                self._echo(line)
                said = now
            await asyncio.sleep(SETTLE_POLL_SECONDS)


@dataclass(frozen=True, slots=True)
class Worker:
    """The demo's worker process, seen through its ``/metrics``."""

    child: Child

    @property
    def log(self) -> Path:
        """The worker's log file."""
        return self.child.log

    async def answered(self) -> Counter[str]:
        """Deliveries the worker has settled, per event (the ``event`` label).

        Every final answer counts (applied, duplicate, dead-lettered); a ``requeued`` delivery
        is not one: it comes again.

        Raises:
            DemoError: the worker has exited.
        """
        process = self.child.process
        if process.returncode is not None:
            msg = f"the worker exited with code {process.returncode} (log: {self.log})"
            raise DemoError(msg)
        answered: Counter[str] = Counter()
        for (event, outcome, _), count in (
            await asyncio.to_thread(_events_total, self.child.port)
        ).items():
            if outcome != REQUEUED:
                answered[event] += count
        return answered


_EVENT: dict[type, str] = {
    RetailOrder: ORDER_PLACED.event,
    RetailCancellation: ORDER_CANCELLED.event,
    RetailShipment: ORDER_SHIPPED.event,
}
"""The ``event`` label of each kind of event the demo sends."""


async def played_before(
    stock: PostgresStock,
    consumer: str,
    orders: Sequence[RetailOrder],
    match: CancellationMatch,
) -> str:
    """Whether the database played these events before, from its inbox, in a line.

    Every event the demo can send counts: the orders, the mapped cancellations; and the
    shipments of each order, the warehouse's (recorded in ``warehouse_shipments``) or the
    shop's ``OrderShipped`` (in the inbox). A new user reads there which of the README's two
    endings to expect, or that the run lies between them.
    """
    kinds = (
        [order.event_id for order in orders],
        [cancellation.event_id for cancellation in match.cancellations],
        [shipment_event_id_for(order.invoice_no) for order in orders],
    )
    seen = await processed_event_ids(stock, consumer, [i for ids in kinds for i in ids])
    placed, cancelled, _ = (sum(i in seen for i in ids) for ids in kinds)
    by_warehouse = {
        s.order_id for s in await recorded_shipments(stock, [o.order_id for o in orders])
    }
    shipped = sum(
        order.order_id in by_warehouse or shipment_event_id_for(order.invoice_no) in seen
        for order in orders
    )
    count = len(match.cancellations)
    cancellations = f"{count} cancellation{'' if count == 1 else 's'}"
    if not seen and not shipped:
        return (
            f"none of these events is in this database's inbox yet ({len(orders)} orders,"
            f" {cancellations}, their shipments): a first run"
        )
    return (
        f"played before: this database's inbox already holds {placed} of these {len(orders)}"
        f" orders, {cancelled} of the {cancellations}, and {shipped} of the orders shipped;"
        " those are answered as duplicates and change nothing, any other is applied (--reset,"
        " or make demo RESET=1, plays them all afresh)"
    )


def _day_line(day: RetailDay, counts: DayCounts, totals: StockTotals) -> str:
    """E.g. ``2010-12-01: orders 143 (rejected 23, reserved 120), cancellations 2 (...), ...``.

    The shop's shipments are named only when the day sent some.
    """
    parts = [
        _counted("orders", len(day.orders), counts.outcomes["orders"]),
        _counted("cancellations", len(day.cancellations), counts.outcomes["cancellations"]),
        _counted("warehouse shipments", counts.shipments.total(), counts.shipments),
    ]
    if counts.shop_shipments:
        parts.append(
            _counted("shop's shipments", counts.shop_shipments.total(), counts.shop_shipments)
        )
    units = counts.units
    return (
        f"{day.name}: {', '.join(parts)}; units reserved"
        f" {units.get((STOCK_RESERVED_ROUTING_KEY, ''), 0)},"
        f" released {counts.released(by_warehouse=False)},"
        f" released by the warehouse {counts.released(by_warehouse=True)},"
        f" shipped {units.get((STOCK_SHIPPED_ROUTING_KEY, ''), 0)},"
        f" adjusted by the warehouse +{sum(u for u in counts.adjusted.values() if u > 0)}"
        f" -{-sum(u for u in counts.adjusted.values() if u < 0)};"
        f" stock now on hand {totals.on_hand}, reserved {totals.reserved}"
    )


def _counted(what: str, total: int, outcomes: Counter[str]) -> str:
    if not total:
        return f"{what} 0"
    return f"{what} {total} (" + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + ")"


def _events_total(port: int) -> Counter[tuple[str, str, str]]:
    """``fulfilment_events_total`` of the demo's worker by ``(event, outcome, reason)``.

    Read from its ``/metrics``; series at 0 are left out.
    """
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    counts: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "fulfilment_events":
            continue
        for sample in family.samples:
            if sample.name == "fulfilment_events_total" and sample.value:
                labels = sample.labels
                counts[labels["event"], labels["outcome"], labels["reason"]] += int(sample.value)
    return counts


def _run_outcomes(port: int) -> str:
    """The worker's outcomes, one line per event that had a delivery, in the topology's order.

    E.g. ``  order_placed: rejected:unknown_sku 7, reserved 132``; ``  none`` without any.
    """
    by_event: dict[str, Counter[str]] = {}
    for (event, outcome, reason), count in _events_total(port).items():
        by_event.setdefault(event, Counter())[f"{outcome}:{reason}" if reason else outcome] += count
    order = [queue.event for queue in SUBSCRIBED_QUEUES]
    lines = [
        f"  {event}: " + ", ".join(f"{label} {count}" for label, count in sorted(by.items()))
        for event, by in sorted(
            by_event.items(), key=lambda item: order.index(item[0]) if item[0] in order else 9
        )
    ]
    return "\n".join(lines) or "  none"
