"""The demo's warehouse system: the simulator, the intake and the dispatcher, while they run.

:func:`warehouse_system` starts the intake (``fulfilment webhooks``, with a secret made for the
run), the simulator (from the checkout's ``simulator/``) with its webhooks pointed at the
intake and signed with that secret, and the dispatcher (which also polls the fulfilment orders
with no news, after :data:`RECONCILE_AFTER_SECONDS`), and yields a :class:`Handoff`, through
which the player waits until no warehouse request is open, checks what the warehouse received
(``demo.handoff.check_day``), then waits for the warehouse's shipments and cancellations of the
day and checks them (``demo.warehouse_news``); it stops all three whatever happens, and says
what the warehouse received and sent back in all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from prometheus_client.parser import text_string_to_metric_families

from fulfilment.adapters.postgres.admin import order_statuses
from fulfilment.adapters.postgres.warehouse_news import (
    RecordedCancellation,
    RecordedShipment,
    order_lines,
    recorded_cancellations,
    recorded_shipments,
)
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.contracts.result_events import STOCK_RESERVED_ROUTING_KEY
from fulfilment.demo.children import Child, free_port, start_child, stop, wait_ready
from fulfilment.demo.errors import DemoError
from fulfilment.demo.handoff import (
    CONCURRENCY,
    PICK_DELAY_SECONDS,
    RATE_PER_SECOND,
    SIMULATOR_TOKEN,
    HandoffCounts,
    HandoffMismatchError,
    WarehouseOrders,
    check_day,
    read_warehouse,
)
from fulfilment.demo.warehouse_news import (
    NewsCounts,
    NewsMismatchError,
    WarehouseOrder,
    check_news,
    outstanding,
    read_made,
)
from fulfilment.domain.handoff import RequestStatus

if TYPE_CHECKING:
    from fulfilment.adapters.postgres.admin import OutboxEntry
    from fulfilment.adapters.postgres.stock import PostgresStock
    from fulfilment.dataset.retail_lifecycle import RetailDay
    from fulfilment.domain.lifecycle import OrderStatus
    from fulfilment.tools.command import Echo

DISPATCHER_COMMAND = ("-c", "from fulfilment.entrypoints.dispatcher import main; main()")
"""``fulfilment dispatcher`` run by this interpreter: what the console script calls, found
without looking for the script on the ``PATH`` (the demo may not import the dispatcher's root)."""
WEBHOOKS_COMMAND = ("-c", "from fulfilment.entrypoints.webhooks import main; main()")
"""``fulfilment webhooks`` (the intake) run by this interpreter, as the dispatcher is."""
WEBHOOKS_READY_PATH = "/health/ready"
"""The intake's readiness (its database answers), on ``FULFILMENT_WEBHOOKS_HTTP_PORT``."""
WEBHOOK_PATH = "/webhooks/warehouse"
"""The intake's endpoint, on ``FULFILMENT_WEBHOOKS_PORT``, where the simulator sends."""
SIMULATOR_PATH = Path(__file__).resolve().parents[3] / "simulator"
"""The checkout's ``simulator/`` folder, which holds ``warehouse_simulator`` (a test and demo
tool, in neither the wheel nor the image)."""

RECONCILE_AFTER_SECONDS = 1.5
"""``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS`` of the demo's dispatcher (the service's
default is an hour): an accepted order still holding units and with no news for this long is
polled. Longer than the pick delay, so that the orders whose webhooks come are not polled for
nothing; short, so that a day waits a few seconds for what only the poll finds."""
SHIPMENT_INTERVAL_SECONDS = 0.1
"""Seconds between the shipments of one order in the demo."""
SIMULATOR_KNOBS: Mapping[str, object] = {
    "ship_delay_seconds": PICK_DELAY_SECONDS,
    "shipment_interval_seconds": SHIPMENT_INTERVAL_SECONDS,
    "split_rate": 0.3,
    "max_shipments": 3,
    "cancel_rate": 0.004,
    "webhook_never_rate": 0.03,
    "webhook_duplicate_rate": 0.05,
}
"""The simulator's knobs for the demo, besides its webhooks' target and secret: the warehouse
works on an order when it picks it (a shop's cancellation is refused ``too_late`` from then
on), ships 30 % of the orders in two or three shipments, cancels on its own 1 to all the units
of 0.4 % of the order lines (a few cancellations per day), never sends 3 % of its webhooks
(only the poll finds them) and sends 5 % of the delivered ones twice (the intake answers the
second as a duplicate)."""
SIMULATOR_SEED = 36
"""The seed of the simulator's choices: a run ships and cancels the same way each time, up to
the order in which the dispatcher's requests reach it."""

HANDOFF_POLL_SECONDS = 0.05
"""Interval between two counts of the open warehouse requests while the day's hand-off settles:
the dispatcher answers a request in milliseconds at the demo's caps."""
HANDOFF_STALL_SECONDS = 60.0
"""The demo fails if the dispatcher gets none of the open warehouse requests answered for this
long."""
NEWS_POLL_SECONDS = 0.2
"""Interval between two looks at the warehouse's record and the service's while the day's
shipments and cancellations come in."""
NEWS_STALL_SECONDS = 60.0
"""The demo fails if nothing more of the day's news arrives for this long (the poll finds an
unsent webhook within :data:`RECONCILE_AFTER_SECONDS` and a poll interval)."""


def webhook_secret() -> str:
    """A fresh Standard Webhooks secret, ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True, slots=True)
class DayNews:
    """What the warehouse made of a day's orders and what the service recorded of it.

    Attributes:
        orders: the day's orders at the warehouse, from its record, by order id.
        shipments: the ``warehouse_shipments`` rows of the day's orders.
        cancellations: the ``warehouse_cancellations`` rows of the day's orders.
    """

    orders: dict[UUID, WarehouseOrder]
    shipments: list[RecordedShipment]
    cancellations: list[RecordedCancellation]

    def shipped_units(self) -> Counter[str]:
        """Units the warehouse shipped of the day's orders, per SKU."""
        units: Counter[str] = Counter()
        for order in self.orders.values():
            units.update(order.shipped())
        return units


class Handoff:
    """The demo's warehouse system while it runs: the simulator, the intake, the dispatcher.

    Counts what the warehouse received and what it sent back, day by day, and checks both
    (:func:`fulfilment.demo.handoff.check_day`, :func:`fulfilment.demo.warehouse_news.check_news`).
    """

    def __init__(self, simulator: Child, dispatcher: Child, intake: Child) -> None:
        self.simulator = simulator
        self.dispatcher = dispatcher
        self.intake = intake
        self.codes: dict[str, int] = {}
        """Exit codes of the stopped children, by name."""
        self.total = HandoffCounts()
        self.news = NewsCounts()
        self._cancellations_seen = 0

    @property
    def env(self) -> dict[str, str]:
        """The settings of the hand-off, for the worker (and the dispatcher)."""
        return _handoff_env(self.simulator)

    async def ready(self) -> None:
        """Wait until the intake, the simulator and the dispatcher are ready.

        They start side by side, with the relay and the worker: the simulator sends nothing
        before the worker reserves, and the dispatcher retries a warehouse that does not
        answer yet.

        Raises:
            DemoError: one exited, or was not ready in time (its log named).
        """
        await wait_ready(self.intake, WEBHOOKS_READY_PATH)
        await wait_ready(self.simulator, "/_simulator/stats")
        await wait_ready(self.dispatcher)

    @property
    def children(self) -> tuple[Child, ...]:
        """The processes of the warehouse system."""
        return (self.dispatcher, self.simulator, self.intake)

    def exited(self, day: RetailDay, waiting: str) -> None:
        """Raise if a child of the warehouse system has exited.

        Raises:
            DemoError: naming it, its exit code and log, and what the day was waiting for.
        """
        for child in self.children:
            if child.process.returncode is not None:
                msg = (
                    f"{day.name}: the {child.name} exited with code {child.process.returncode}"
                    f" with {waiting} (log: {child.log})"
                )
                raise DemoError(msg)

    async def settle(self, day: RetailDay, stock: PostgresStock) -> None:
        """Wait until no warehouse request is open (``pending`` or ``sending``).

        Raises:
            DemoError: a child of the warehouse system exited, or no open request was
                answered for :data:`HANDOFF_STALL_SECONDS`.
        """
        requests = PostgresWarehouseRequests(stock.engine, retry_budget_seconds=10.0)
        last, changed = -1, time.monotonic()
        while (left := (await requests.backlog()).open_count) > 0:
            self.exited(day, f"{left} warehouse requests open")
            now = time.monotonic()
            if left != last:
                last, changed = left, now
            if now - changed > HANDOFF_STALL_SECONDS:
                msg = (
                    f"{day.name}: the dispatcher got none of the {left} open warehouse requests"
                    f" answered for {HANDOFF_STALL_SECONDS:g} s (log: {self.dispatcher.log})"
                )
                raise DemoError(msg)
            await asyncio.sleep(HANDOFF_POLL_SECONDS)

    async def settle_news(
        self, day: RetailDay, stock: PostgresStock, order_ids: Collection[UUID]
    ) -> DayNews:
        """Wait until the warehouse is done with the day's orders and the service recorded it.

        Done: every order of ``order_ids`` at the warehouse has nothing left to ship, and
        every shipment and cancellation it made of them is a row of the service's (by webhook
        or by the poll).

        Raises:
            DemoError: a child of the warehouse system exited, or nothing more arrived for
                :data:`NEWS_STALL_SECONDS`.
        """
        wanted = set(order_ids)
        last, changed = -1, time.monotonic()
        while True:
            made = await asyncio.to_thread(read_made, self.simulator_admin)
            orders = {order_id: made.orders[order_id] for order_id in wanted & made.orders.keys()}
            news = DayNews(
                orders,
                await recorded_shipments(stock, orders.keys()),
                await recorded_cancellations(stock, orders.keys()),
            )
            # The webhooks in flight too (a duplicate of one delivered): the intake answers
            # them before the day ends, so the run's counts are whole.
            left = made.in_flight + outstanding(orders.values(), news.shipments, news.cancellations)
            if not left:
                return news
            self.exited(day, f"{left} of the warehouse's shipments and cancellations awaited")
            now = time.monotonic()
            if left != last:
                last, changed = left, now
            if now - changed > NEWS_STALL_SECONDS:
                msg = (
                    f"{day.name}: nothing more of the warehouse's shipments and cancellations"
                    f" came for {NEWS_STALL_SECONDS:g} s ({left} awaited; logs:"
                    f" {self.simulator.log}, {self.intake.log}, {self.dispatcher.log})"
                )
                raise DemoError(msg)
            await asyncio.sleep(NEWS_POLL_SECONDS)

    async def check(
        self,
        day: RetailDay,
        stock: PostgresStock,
        statuses: Mapping[UUID, OrderStatus],
        entries: Sequence[OutboxEntry],
    ) -> str:
        """Check what the warehouse received for ``day``; the day's warehouse line.

        ``entries`` are the outbox rows the day wrote, ``statuses`` its orders' after the
        warehouse's news.

        Raises:
            DemoError: it does not match the day's reservations (one line).
        """
        requests = PostgresWarehouseRequests(stock.engine, retry_budget_seconds=10.0)
        records = await requests.find(list(RequestStatus), limit=10**9)
        received = await asyncio.to_thread(read_warehouse, self.simulator_admin)
        answered = received.cancellations[self._cancellations_seen :]
        self._cancellations_seen = len(received.cancellations)
        reserved = {
            e.order_id
            for e in entries
            if e.routing_key == STOCK_RESERVED_ROUTING_KEY and e.order_id is not None
        }
        try:
            counts = check_day(
                reserved,
                requests=records,
                warehouse=received,
                cancellations=answered,
                entries=entries,
                statuses=statuses,
            )
        except HandoffMismatchError as mismatch:
            msg = f"{day.name}: warehouse hand-off: {mismatch}"
            raise DemoError(msg) from mismatch
        self.total.add(counts)
        return f"{day.name}: warehouse {counts.describe()}"

    async def check_news(
        self,
        day: RetailDay,
        stock: PostgresStock,
        news: DayNews,
        entries: Sequence[OutboxEntry],
    ) -> str:
        """Check the service's record of the warehouse's news of ``day``; the day's news line.

        Raises:
            DemoError: it does not match what the warehouse made (one line).
        """
        statuses = await order_statuses(stock, news.orders.keys())
        lines = await order_lines(stock, news.orders.keys())
        try:
            counts = check_news(
                news.orders,
                shipments=news.shipments,
                cancellations=news.cancellations,
                lines=lines,
                statuses=statuses,
                entries=entries,
            )
        except NewsMismatchError as mismatch:
            msg = f"{day.name}: the warehouse's news: {mismatch}"
            raise DemoError(msg) from mismatch
        self.news.add(counts)
        return f"{day.name}: warehouse sent {counts.describe()}"

    @property
    def simulator_admin(self) -> str:
        """The simulator's admin endpoints, ``http://127.0.0.1:N/_simulator``."""
        return f"http://127.0.0.1:{self.simulator.port}/_simulator"

    def summary(self, received: WarehouseOrders) -> str:
        """The run's line: what the warehouse received and sent back, checked, and the exits."""
        extra = len(received.orders) - self.total.orders
        return (
            f"warehouse system (simulator, pick delay {PICK_DELAY_SECONDS:g} s): "
            f"{self.total.describe()}"
            + (f" (and {extra} orders of earlier runs' requests)" if extra else "")
            + f"; sent {self.news.describe()}; each checked against the reservations and the"
            f" simulator's record; dispatcher stopped with exit code"
            f" {self.codes.get(self.dispatcher.name)}"
        )


def _handoff_env(simulator: Child) -> dict[str, str]:
    """The hand-off's settings: the simulator's API, its token, the demo's caps and poll."""
    return {
        "FULFILMENT_WAREHOUSE_URL": f"http://127.0.0.1:{simulator.port}/api/v1",
        "FULFILMENT_WAREHOUSE_TOKEN": SIMULATOR_TOKEN,
        "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": f"{RATE_PER_SECOND:g}",
        "FULFILMENT_WAREHOUSE_CONCURRENCY": str(CONCURRENCY),
        "FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS": f"{RECONCILE_AFTER_SECONDS:g}",
    }


def intake_received(port: int) -> str:
    """The intake's ``fulfilment_webhooks_received_total``, one line: type: outcome count, ...

    Read from its ``/metrics`` on ``port``; ``none`` before any webhook.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[str, Counter[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fulfilment_webhooks_received_total" and sample.value:
                by_type = counts.setdefault(sample.labels["type"], Counter())
                by_type[sample.labels["outcome"]] += int(sample.value)
    return (
        "; ".join(
            f"{kind}: " + ", ".join(f"{outcome} {n}" for outcome, n in sorted(by.items()))
            for kind, by in sorted(counts.items())
        )
        or "none"
    )


async def _start_simulator(webhook_url: str, secret: str) -> Child:
    """Start the simulator on a free port, its webhooks to ``webhook_url`` signed with ``secret``.

    Its knobs are its command line's options (:data:`SIMULATOR_KNOBS`); it is not waited for.
    """
    python_path = os.pathsep.join(
        p for p in (str(SIMULATOR_PATH), os.environ.get("PYTHONPATH", "")) if p
    )
    knobs = {**SIMULATOR_KNOBS, "webhook_url": webhook_url, "webhook_secret": secret}
    return await start_child(
        "warehouse-simulator",
        (
            "-m",
            "warehouse_simulator",
            "--token",
            SIMULATOR_TOKEN,
            "--pick-delay-seconds",
            f"{PICK_DELAY_SECONDS:g}",
            "--seed",
            str(SIMULATOR_SEED),
            *(f"--{name.replace('_', '-')}={value}" for name, value in knobs.items()),
        ),
        None,
        env={"PYTHONPATH": python_path},
    )


@contextlib.asynccontextmanager
async def warehouse_system(stop_grace_seconds: float, echo: Echo) -> AsyncIterator[Handoff]:
    """Start the intake, the simulator and the dispatcher; yield them; stop them; echo the sum.

    They are not waited for (:meth:`Handoff.ready`). None is left running, whatever happens:
    after a run, the three stop side by side (every day settled, nothing is in flight between
    them); after a failure, the dispatcher first, then the simulator, then the intake (the
    simulator's webhooks in flight get their answers).

    Raises:
        DemoError: the simulator is not in this checkout.
    """
    if not (SIMULATOR_PATH / "warehouse_simulator").is_dir():
        msg = f"the warehouse simulator is not in this checkout ({SIMULATOR_PATH})"
        raise DemoError(msg)
    codes: dict[str, int] = {}

    async def stopped(child: Child) -> None:
        codes.setdefault(child.name, await stop(child.process, stop_grace_seconds))

    async with contextlib.AsyncExitStack() as stack:
        secret = webhook_secret()
        webhooks_port = free_port()
        intake = await start_child(
            "webhooks",
            WEBHOOKS_COMMAND,
            "FULFILMENT_WEBHOOKS_HTTP_PORT",
            env={
                "FULFILMENT_WEBHOOKS_PORT": str(webhooks_port),
                "FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS": secret,
            },
        )
        stack.push_async_callback(stopped, intake)
        webhook_url = f"http://127.0.0.1:{webhooks_port}{WEBHOOK_PATH}"
        simulator = await _start_simulator(webhook_url, secret)
        stack.push_async_callback(stopped, simulator)
        env = _handoff_env(simulator)
        dispatcher = await start_child(
            "dispatcher", DISPATCHER_COMMAND, "FULFILMENT_DISPATCHER_PORT", env=env
        )
        stack.push_async_callback(stopped, dispatcher)
        handoff = Handoff(simulator, dispatcher, intake)
        handoff.codes = codes
        echo(
            f"warehouse system: simulator at {env['FULFILMENT_WAREHOUSE_URL']} (pid"
            f" {simulator.process.pid}, pick delay {PICK_DELAY_SECONDS:g} s, log"
            f" {simulator.log}), webhooks to {webhook_url} (intake pid {intake.process.pid},"
            f" log {intake.log}), dispatcher started ({dispatcher.describe()}, polls orders"
            f" with no news for {RECONCILE_AFTER_SECONDS:g} s)"
        )
        yield handoff
        # Every day settled: nothing is in flight between the three, so they stop side by side,
        # once the simulator's record and the intake's counts are read.
        received = await asyncio.to_thread(read_warehouse, handoff.simulator_admin)
        answered = await asyncio.to_thread(intake_received, intake.port)
        await asyncio.gather(*(stopped(child) for child in handoff.children))
        echo(handoff.summary(received))
        echo(f"webhooks the intake answered: {answered}")
        echo(f"intake stopped with exit code {codes[intake.name]}")
