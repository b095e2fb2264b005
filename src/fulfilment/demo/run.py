"""``fulfilment demo``: the main job on real data, from an empty database to a reconciled report.

Steps: create and migrate the database; declare the demo's own queue on the result events'
exchange (:data:`RESULT_EVENTS_QUEUE`); plan stock from the data and load it for the SKUs that
have no stock level yet; start the relay and the worker as child processes and wait until each
is ready; play the data day by day (``fulfilment.dataset.retail_lifecycle``): each day's orders
and mapped cancellations in time order, one run of one kind at a time, each run settled before
the next is sent, then the ``OrderShipped`` of every order of the day still reserved, settled
too; stop the worker with SIGTERM (it finishes in-flight work and exits 0); wait until the
relay has published every outbox row the run wrote, read the demo's queue and check what it
received against those rows (``demo.result_events``), and stop the relay with SIGTERM;
then reconcile every published event of the three kinds against the inbox and the dead-letter
queues and print the report.

Settled means that the worker has answered every delivery of the run: its
``fulfilment_events_total`` for that event (``/metrics``) grew by as many since the run was
published, whatever the answer (applied, a duplicate, dead-lettered; a requeued delivery is
not an answer, it comes again). The inbox cannot say it, as a second run's events are in it
before they are delivered. The demo reads which orders are still reserved only then, and
the day's outcomes from the inbox (an event not in it was dead-lettered).

Stock is loaded only for SKUs without a level, so that a second run keeps what the first
one's shipments took out of ``on_hand`` (a second run re-sends the same events and changes
nothing); ``--reset`` empties everything first, and the whole plan is loaded.

``--reset`` empties only a database the demo recognises as its own: one it created, or found
empty, and marked so in the database's comment (``admin.DEMO_DATABASE_MARK``), or one that
holds no row at all. Any other database is refused, unless the operator names it again with
``--confirm-reset NAME`` (as ``heroku pg:reset --confirm`` asks for the app's name): a wrong
``FULFILMENT_DATABASE_URL`` must not cost a shop its inbox. A reset is recorded: one line of
output (the database, the user, the rows and messages removed), each dead letter it purges in
``dead_letter_audit`` (as ``fulfilment dlq purge`` does), and the database's comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from prometheus_client.parser import text_string_to_metric_families

from fulfilment.adapters.postgres.admin import (
    DEMO_DATABASE_MARK,
    DemoDatabase,
    OutboxEntry,
    StockTotals,
    demo_database,
    ensure_database,
    inbox_outcomes,
    mark_demo_database,
    order_statuses,
    outbox_entries_after,
    outbox_last_id,
    outbox_unpublished_after,
    processed_event_ids,
    reset_tables,
    stock_totals,
    warehouse_session,
)
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.rabbitmq.connection import connect, connection_lost
from fulfilment.adapters.rabbitmq.demo_queue import declare_bound_queue, take_messages
from fulfilment.adapters.rabbitmq.inspection import queue_state
from fulfilment.adapters.rabbitmq.publishing import UnroutableError
from fulfilment.contracts.result_events import STOCK_RESERVED_ROUTING_KEY
from fulfilment.contracts.topology import (
    EVENTS_EXCHANGE,
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_SHIPPED,
)
from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.dataset.online_retail import ReadResult, RetailOrder, shipment_event_id_for
from fulfilment.dataset.publish import publish_in_order
from fulfilment.dataset.reconcile import reconcile_kinds
from fulfilment.dataset.retail_lifecycle import (
    CancellationMatch,
    RetailCancellation,
    RetailDay,
    RetailEvent,
    RetailShipment,
    plan_days,
)
from fulfilment.dataset.stock_plan import plan_stock
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
from fulfilment.demo.result_events import ResultEventTally
from fulfilment.domain.handoff import RequestStatus
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.metrics import REQUEUED
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.dlq import Selection, purge
from fulfilment.tools.dlq_commands import operator_identity
from fulfilment.tools.report import collect_report, render_report

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

    from fulfilment.adapters.postgres.warehouse import PostgresWarehouse

RESULT_EVENTS_QUEUE = "fulfilment.demo.result-events"
"""The demo's own queue (durable, classic), bound to ``fulfilment.events`` with ``#``: a
consumer of every result event, as the shop's other services are. Declared before anything
is published, emptied by reading it at the end of each run, purged by ``--reset``. Not part
of the service's topology: the worker and the relay know nothing of it."""
RESULT_EVENTS_BINDING = "#"
RELAY_COMMAND = ("-c", "from fulfilment.entrypoints.relay import main; main()")
"""``fulfilment relay`` run by this interpreter: what the console script calls, found without
looking for the script on the ``PATH`` (the demo may not import the relay's root)."""
DISPATCHER_COMMAND = ("-c", "from fulfilment.entrypoints.dispatcher import main; main()")
"""``fulfilment dispatcher`` run by this interpreter, as :data:`RELAY_COMMAND`."""
SIMULATOR_PATH = Path(__file__).resolve().parents[3] / "simulator"
"""The checkout's ``simulator/`` folder, which holds ``warehouse_simulator`` (a test and demo
tool, in neither the wheel nor the image)."""
HANDOFF_STALL_SECONDS = 60.0
"""The demo fails if the dispatcher gets none of the open warehouse requests answered for this
long."""
READY_WAIT_SECONDS = 60.0
"""How long the worker and the relay may take to report ready before the demo gives up."""
RELAY_STALL_SECONDS = 60.0
"""The demo fails if the relay publishes none of the run's outbox rows left for this long."""
RELAY_POLL_SECONDS = 0.1
"""Interval between two counts of the run's unpublished outbox rows."""
READ_PREFETCH = 256
"""Messages of the demo's queue unacknowledged at once while it is read: bounds memory."""
READ_IDLE_SECONDS = 10.0
"""How long the read waits for one more of the messages the queue counted."""
SETTLE_POLL_SECONDS = 0.05
"""Interval between two looks at the worker's metrics while a run settles: a run of a few
events takes the worker a few milliseconds, and the demo waits for about 220 runs on the 20
days."""
SETTLE_STALL_SECONDS = 120.0
"""The demo fails if the worker answers nothing more of a run for this long."""
PROGRESS_SECONDS = 5.0
"""A run that takes longer than this to settle says so, then again at this interval."""


CONFIRM_RESET_OPTION = "--confirm-reset"
"""The option that names the database ``--reset`` may empty although it is not the demo's."""


class DemoError(CommandError):
    """A step of the demo failed; the message says which and why (exit 1)."""


class ResetRefusedError(CommandError):
    """``--reset`` would empty a database that is not the demo's (exit 2, nothing changed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, ExitCode.BAD_INPUT)


def reset_refusal(database: DemoDatabase, confirmed: str | None) -> str | None:
    """Why ``--reset`` may not empty ``database``, or None when it may.

    It may when the database is marked as the demo's, holds no row of the service, or
    ``confirmed`` (``--confirm-reset``) is its name.
    """
    if confirmed is not None:
        if confirmed == database.name:
            return None
        return (
            f"{CONFIRM_RESET_OPTION} {confirmed!r} does not name the database of"
            f" FULFILMENT_DATABASE_URL, {database.name!r}: nothing was emptied"
        )
    if (database.marked and not database.foreign) or database.empty:
        return None
    held = [f"rows in {', '.join(database.holds)}"] if database.holds else []
    if database.foreign:
        held.append(f"tables that are not the service's: {', '.join(database.foreign)}")
    return (
        f"--reset refused: database {database.name!r} is not the demo's (it did not create it"
        f" or find it empty) and holds {' and '.join(held)}; to empty it anyway,"
        f" name it: --reset {CONFIRM_RESET_OPTION} {database.name}"
        f" (make demo RESET=1 CONFIRM_RESET={database.name})"
    )


async def demo_command(  # noqa: PLR0913 - each option of the command, by name
    options: ToolOptions,
    data: Path,
    *,
    reset: bool,
    stop_grace_seconds: float,
    echo: Echo,
    confirm_reset: str | None = None,
) -> int:
    """Run the demo over the events of ``data`` (a file or folder of Online Retail CSVs).

    ``reset`` empties the service's tables and queues first, if the database is the demo's
    or ``confirm_reset`` is its name (:func:`reset_refusal`); ``stop_grace_seconds`` is how
    long the worker may take to stop after SIGTERM before it is killed (the orchestrator's
    grace period). Returns 0 when every event is accounted for, the worker stopped cleanly
    and the stock invariants hold, else 1.

    Raises:
        CommandError: ``data`` cannot be read, or ``--reset`` was refused (exit 2); a step
            failed, or no queue was bound for the events (exit 1).
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    read = read_order_files([data])
    match = match_read_cancellations(read)
    try:
        return await _demo(
            options,
            read,
            match,
            reset=_Reset(confirmed=confirm_reset) if reset else None,
            stop_grace_seconds=stop_grace_seconds,
            echo=echo,
        )
    except UnroutableError as error:
        raise CommandError(str(error)) from error


async def _demo(  # noqa: PLR0913 - the read data and the command's options, passed through
    options: ToolOptions,
    read: ReadResult,
    match: CancellationMatch,
    *,
    reset: _Reset | None,
    stop_grace_seconds: float,
    echo: Echo,
) -> int:
    started = time.monotonic()
    database_url = options.database.url
    amqp_url = options.amqp_url
    async with connect(amqp_url) as connection:
        # Before anything is published, so that it receives every result event of the run.
        await declare_bound_queue(
            connection,
            RESULT_EVENTS_QUEUE,
            exchange=EVENTS_EXCHANGE,
            binding_key=RESULT_EVENTS_BINDING,
        )
    created = await ensure_database(database_url)
    if created:
        echo("created the database")
    elif reset is not None:
        # Refused before the migration, so that a refused reset changes nothing at all.
        async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
            reset.check(await demo_database(warehouse))
    await asyncio.to_thread(migrate, database_url)
    echo("database migrated to head")

    days = plan_days(read.days, read.orders, match.cancellations)
    echo(
        f"read {len(read.orders)} orders and {len(read.cancellations)} cancellation invoices"
        f" from {len(days)} days (skipped: {read.skipped.describe()}); cancellations mapped to"
        f" their order: {len(match.cancellations)} (not mapped: {match.describe()})"
    )
    levels = plan_stock(read.orders)
    async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
        database = await demo_database(warehouse)
        if reset is not None:
            await reset.run(options, warehouse, database, echo)
        elif created or (database.empty and database.comment is None):
            await _mark(warehouse, f"{DEMO_DATABASE_MARK}: made or found empty by", echo)
        echo(await played_before(warehouse, options.consumer, read.orders, match))
        loaded = await _load_missing_stock(warehouse, levels)
        # Taken before the worker starts: every row of the run has a higher id.
        baseline = await outbox_last_id(warehouse)
    kept = len(levels) - loaded
    echo(
        f"loaded {loaded} planned stock levels"
        + (f"; {kept} SKUs kept the level they had (--reset starts from the plan)" if kept else "")
    )
    echo(
        f"result events: the relay publishes them to {EVENTS_EXCHANGE}, where the demo's"
        f" queue {RESULT_EVENTS_QUEUE} (bound with {RESULT_EVENTS_BINDING}) receives them"
    )

    relay = await _start_child("relay", RELAY_COMMAND, "FULFILMENT_RELAY_HTTP_PORT")
    echo(f"relay started ({relay.describe()})")
    try:
        await _wait_ready(relay)
        async with _warehouse_system(stop_grace_seconds, echo) as handoff:
            player, code = await _play_days(
                options, days, handoff, stop_grace_seconds=stop_grace_seconds, echo=echo
            )
        tally = await _received_result_events(options, baseline, relay, echo)
        echo("\n".join(tally.lines(RESULT_EVENTS_QUEUE)))
    finally:
        relay_code = await _stop(relay.process, stop_grace_seconds)
    echo(f"relay stopped with exit code {relay_code}")

    reconciled, _ = await reconcile_kinds(
        options,
        [
            (kind, [event.event_id for event in events])
            for kind, events in (
                ("OrderPlaced", read.orders),
                ("OrderCancelled", match.cancellations),
                ("OrderShipped", player.shipments),
            )
        ],
        echo=echo,
    )
    document = await collect_report(options)
    echo(render_report(document))
    echo(f"wall time {time.monotonic() - started:.1f} s")
    failure = tally.failure()
    if failure is not None:
        raise DemoError(failure)
    clean_stops = code == 0 and relay_code == 0 and handoff.dispatcher_code == 0
    return 0 if reconciled and clean_stops and document["invariants"]["ok"] else 1


async def _play_days(
    options: ToolOptions,
    days: Sequence[RetailDay],
    handoff: _Handoff,
    *,
    stop_grace_seconds: float,
    echo: Echo,
) -> tuple[_Player, int]:
    """Start the worker, play ``days`` through it, stop it; the player and its exit code.

    The worker records a warehouse request per reservation (``FULFILMENT_WAREHOUSE_URL`` is
    the demo's simulator), which ``handoff``'s dispatcher sends.

    Raises:
        DemoError: the worker did not get ready, exited, or stalled (it is stopped all the same);
            the hand-off stalled or does not match the reservations.
    """
    worker = await _start_child(
        "worker", ("-m", "fulfilment"), "FULFILMENT_HTTP_PORT", env=handoff.env
    )
    echo(f"worker started ({worker.describe()})")
    try:
        await _wait_ready(worker)
        async with (
            connect(options.amqp_url) as connection,
            warehouse_session(options.database, consumer=options.consumer) as warehouse,
        ):
            player = _Player(
                connection=connection,
                amqp_url=options.amqp_url,
                warehouse=warehouse,
                consumer=options.consumer,
                worker=_Worker(worker),
                handoff=handoff,
                echo=echo,
            )
            for day in days:
                await player.play(day)
        echo(player.published())
        echo("this run's outcomes\n" + await asyncio.to_thread(_run_outcomes, worker.port))
    finally:
        code = await _stop(worker.process, stop_grace_seconds)
    echo(f"worker stopped with exit code {code}")
    return player, code


async def _received_result_events(
    options: ToolOptions, baseline: int, relay: _Child, echo: Echo
) -> ResultEventTally:
    """Wait until the relay published the run's outbox rows, then read the demo's queue.

    ``baseline`` is the last outbox id before the run. Returns the tally of what the queue
    received against those rows.

    Raises:
        DemoError: the relay exited or stalled with rows of the run unpublished, or the queue
            did not deliver the messages it counted.
    """
    async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
        await _wait_published(warehouse, baseline, relay, echo)
        tally = ResultEventTally(await outbox_entries_after(warehouse, baseline))

    def count(message: AbstractIncomingMessage) -> None:
        tally.receive(message.routing_key or "", message.body)

    async with connect(options.amqp_url) as connection:
        try:
            with connection_lost(connection, options.amqp_url):
                await take_messages(
                    connection,
                    RESULT_EVENTS_QUEUE,
                    count,
                    prefetch=READ_PREFETCH,
                    idle_seconds=READ_IDLE_SECONDS,
                )
        except TimeoutError as error:
            msg = (
                f"{RESULT_EVENTS_QUEUE} delivered no message for {READ_IDLE_SECONDS:g} s while it"
                " counted more: is another consumer reading it?"
            )
            raise DemoError(msg) from error
    return tally


async def _wait_published(
    warehouse: PostgresWarehouse, baseline: int, relay: _Child, echo: Echo
) -> None:
    """Wait until no outbox row above ``baseline`` is unpublished.

    Raises:
        DemoError: the relay exited, or published none of the rows left for
            :data:`RELAY_STALL_SECONDS`; the message names its log.
    """
    last, changed = -1, time.monotonic()
    said = changed
    while (left := await outbox_unpublished_after(warehouse, baseline)) > 0:
        if relay.process.returncode is not None:
            msg = (
                f"the relay exited with code {relay.process.returncode} with {left} result"
                f" events of this run unpublished (log: {relay.log})"
            )
            raise DemoError(msg)
        now = time.monotonic()
        if left != last:
            last, changed = left, now
        if now - changed > RELAY_STALL_SECONDS:
            msg = (
                f"the relay published none of the {left} result events of this run left in the"
                f" outbox for {RELAY_STALL_SECONDS:g} s (log: {relay.log})"
            )
            raise DemoError(msg)
        if now - said > PROGRESS_SECONDS:
            echo(f"waiting for the relay to publish {left} result events")
            said = now
        await asyncio.sleep(RELAY_POLL_SECONDS)


async def _load_missing_stock(warehouse: PostgresWarehouse, levels: Mapping[str, int]) -> int:
    """Load the planned level of each SKU that has none; return how many were loaded."""
    known = await warehouse.stock(levels)
    missing = {sku: units for sku, units in levels.items() if sku not in known}
    await warehouse.put_stock(missing)
    return len(missing)


@dataclass
class _DayCounts:
    """What the service answered to one day's events, and how the stock moved."""

    outcomes: dict[str, Counter[str]] = field(
        default_factory=lambda: {"orders": Counter(), "cancellations": Counter()}
    )
    shipments: Counter[str] = field(default_factory=Counter)
    reserved: int = 0
    """Units the day's orders reserved (``reserved`` went up by this in their runs)."""
    released: int = 0
    """Units the day's cancellations released."""
    shipped: int = 0
    """Units the day's shipments took out of ``on_hand``."""


class _Player:
    """Plays the days one after the other through the worker, and remembers what it sent."""

    def __init__(  # noqa: PLR0913 - what a player uses, by name
        self,
        *,
        connection: AbstractConnection,
        amqp_url: str,
        warehouse: PostgresWarehouse,
        consumer: str,
        worker: _Worker,
        handoff: _Handoff,
        echo: Echo,
    ) -> None:
        self._connection = connection
        self._handoff = handoff
        self._amqp_url = amqp_url
        self._warehouse = warehouse
        self._consumer = consumer
        self._worker = worker
        self._echo = echo
        self.sent: Counter[str] = Counter()
        self.shipments: list[RetailShipment] = []

    def published(self) -> str:
        """One line: the events published, by kind."""
        return (
            f"published {self.sent[ORDER_PLACED.event]} OrderPlaced,"
            f" {self.sent[ORDER_CANCELLED.event]} OrderCancelled and"
            f" {self.sent[ORDER_SHIPPED.event]} OrderShipped events"
        )

    async def play(self, day: RetailDay) -> None:
        """Send the day's runs and its shipments, each settled; echo the day's two lines.

        Before the shipments, the warehouse answers every request of the day (a cancel it
        accepts must meet its order reserved); after them, what it received is checked.

        Raises:
            DemoError: the hand-off stalled, or does not match the day's reservations.
        """
        counts = _DayCounts()
        start = await outbox_last_id(self._warehouse)
        for run in day.runs():
            if not isinstance(run[0], RetailOrder):
                # The orders placed so far reach the warehouse first: a cancellation then
                # meets its order there, and is accepted or, after the pick, refused.
                await self._handoff.settle(day, self._warehouse)
            before = await stock_totals(self._warehouse)
            outcomes = await self._send(day, run)
            after = await stock_totals(self._warehouse)
            if isinstance(run[0], RetailOrder):
                counts.outcomes["orders"].update(outcomes)
                counts.reserved += after.reserved - before.reserved
            else:
                # A cancel of an order sent to the warehouse releases when the warehouse
                # accepts it: the run is over when its requests are answered.
                await self._handoff.settle(day, self._warehouse)
                after = await stock_totals(self._warehouse)
                counts.outcomes["cancellations"].update(outcomes)
                counts.released += before.reserved - after.reserved
        await self._handoff.settle(day, self._warehouse)
        statuses = await order_statuses(self._warehouse, [order.order_id for order in day.orders])
        shipments = day.shipments(statuses)
        before = await stock_totals(self._warehouse)
        counts.shipments.update(await self._send(day, shipments))
        after = await stock_totals(self._warehouse)
        counts.shipped = before.on_hand - after.on_hand
        self.shipments += shipments
        self._echo(_day_line(day, counts, after))
        statuses = await order_statuses(self._warehouse, [order.order_id for order in day.orders])
        entries = await outbox_entries_after(self._warehouse, start)
        self._echo(await self._handoff.check(day, self._warehouse, statuses, entries))

    async def _send(self, day: RetailDay, events: Sequence[RetailEvent]) -> list[str]:
        """Publish ``events`` (of one kind), wait until settled; their inbox outcomes, in no order.

        An event that is not in the inbox once settled counts as ``dead_lettered``.
        """
        if not events:
            return []
        event = _EVENT[type(events[0])]
        answered = (await self._worker.answered())[event]
        with connection_lost(self._connection, self._amqp_url):
            await publish_in_order(self._connection, events)
        self.sent[event] += len(events)
        await self._settle(day, event, answered + len(events))
        outcomes = await inbox_outcomes(
            self._warehouse, self._consumer, [event.event_id for event in events]
        )
        return [*outcomes.values(), *["dead_lettered"] * (len(events) - len(outcomes))]

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
class _Child:
    """A process the demo started: the worker or the relay, with its HTTP port and log."""

    name: str
    process: asyncio.subprocess.Process
    port: int
    log: Path

    def describe(self) -> str:
        """``pid 123, port 45678, log /tmp/fulfilment-demo-relay-45678.log``."""
        return f"pid {self.process.pid}, port {self.port}, log {self.log}"


async def _start_child(
    name: str,
    arguments: Sequence[str],
    port_variable: str | None,
    *,
    env: Mapping[str, str] | None = None,
) -> _Child:
    """Start ``python <arguments>`` with its HTTP server on a free port, its output in a log.

    ``port_variable`` is the setting of that port (``FULFILMENT_HTTP_PORT`` ...); None: the
    port is given as ``--port N`` after ``arguments``. A port of its own: whatever else answers
    on the configured one is not this process. ``env`` is added to the demo's environment.
    """
    port = _free_port()
    log_path = Path(tempfile.gettempdir()) / f"fulfilment-demo-{name}-{port}.log"
    port_env = {port_variable: str(port)} if port_variable else {}
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *arguments,
            *([] if port_variable else ["--port", str(port)]),
            stdout=log,
            stderr=log,
            env={**os.environ, **(env or {}), **port_env},
        )
    return _Child(name, process, port, log_path)


@dataclass(frozen=True, slots=True)
class _Worker:
    """The demo's worker process, seen through its ``/metrics``."""

    child: _Child

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


class _Handoff:
    """The demo's warehouse system (the simulator) and ``fulfilment dispatcher``, while they run.

    Counts what the warehouse received, day by day, and checks it
    (:func:`fulfilment.demo.handoff.check_day`).
    """

    def __init__(self, simulator: _Child, dispatcher: _Child) -> None:
        self.simulator = simulator
        self.dispatcher = dispatcher
        self.dispatcher_code: int | None = None
        self.total = HandoffCounts()
        self._cancellations_seen = 0

    @property
    def env(self) -> dict[str, str]:
        """The settings of the hand-off, for the worker (and the dispatcher)."""
        return _handoff_env(self.simulator)

    async def settle(self, day: RetailDay, warehouse: PostgresWarehouse) -> None:
        """Wait until no warehouse request is open (``pending`` or ``sending``).

        Raises:
            DemoError: the dispatcher or the simulator exited, or no open request was
                answered for :data:`HANDOFF_STALL_SECONDS`.
        """
        requests = PostgresWarehouseRequests(warehouse.engine, retry_budget_seconds=10.0)
        last, changed = -1, time.monotonic()
        while (left := (await requests.backlog()).open_count) > 0:
            for child in (self.dispatcher, self.simulator):
                if child.process.returncode is not None:
                    msg = (
                        f"{day.name}: the {child.name} exited with code"
                        f" {child.process.returncode} with {left} warehouse requests open"
                        f" (log: {child.log})"
                    )
                    raise DemoError(msg)
            now = time.monotonic()
            if left != last:
                last, changed = left, now
            if now - changed > HANDOFF_STALL_SECONDS:
                msg = (
                    f"{day.name}: the dispatcher got none of the {left} open warehouse requests"
                    f" answered for {HANDOFF_STALL_SECONDS:g} s (log: {self.dispatcher.log})"
                )
                raise DemoError(msg)
            await asyncio.sleep(SETTLE_POLL_SECONDS)

    async def check(
        self,
        day: RetailDay,
        warehouse: PostgresWarehouse,
        statuses: Mapping[UUID, OrderStatus],
        entries: Sequence[OutboxEntry],
    ) -> str:
        """Check what the warehouse received for ``day``; the day's warehouse line.

        ``entries`` are the outbox rows the day wrote, ``statuses`` its orders' after the
        shipments.

        Raises:
            DemoError: it does not match the day's reservations (one line).
        """
        requests = PostgresWarehouseRequests(warehouse.engine, retry_budget_seconds=10.0)
        records = await requests.find(list(RequestStatus), limit=10**9)
        received = await asyncio.to_thread(read_warehouse, self.simulator_admin)
        answered = received.cancellations[self._cancellations_seen :]
        self._cancellations_seen = len(received.cancellations)
        reserved = {e.order_id for e in entries if e.routing_key == STOCK_RESERVED_ROUTING_KEY}
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

    @property
    def simulator_admin(self) -> str:
        """The simulator's admin endpoints, ``http://127.0.0.1:N/_simulator``."""
        return f"http://127.0.0.1:{self.simulator.port}/_simulator"

    def summary(self, received: WarehouseOrders) -> str:
        """The run's line: what the warehouse received, checked, and the dispatcher's exit."""
        extra = len(received.orders) - self.total.orders
        return (
            f"warehouse system (simulator, pick delay {PICK_DELAY_SECONDS:g} s): "
            f"{self.total.describe()}"
            + (f" (and {extra} orders of earlier runs' requests)" if extra else "")
            + f"; each checked against the reservations; dispatcher stopped with exit code"
            f" {self.dispatcher_code}"
        )


def _handoff_env(simulator: _Child) -> dict[str, str]:
    """The hand-off's settings: the simulator's API, its token, the demo's caps."""
    return {
        "FULFILMENT_WAREHOUSE_URL": f"http://127.0.0.1:{simulator.port}/api/v1",
        "FULFILMENT_WAREHOUSE_TOKEN": SIMULATOR_TOKEN,
        "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": f"{RATE_PER_SECOND:g}",
        "FULFILMENT_WAREHOUSE_CONCURRENCY": str(CONCURRENCY),
    }


@contextlib.asynccontextmanager
async def _warehouse_system(stop_grace_seconds: float, echo: Echo) -> AsyncIterator[_Handoff]:
    """Start the simulator and ``fulfilment dispatcher``, yield them, stop them, echo the sum.

    Neither is left running, whatever happens (the simulator is stopped last: the dispatcher's
    requests in flight get their answers).

    Raises:
        DemoError: the simulator is not in this checkout, or either did not get ready.
    """
    if not (SIMULATOR_PATH / "warehouse_simulator").is_dir():
        msg = f"the warehouse simulator is not in this checkout ({SIMULATOR_PATH})"
        raise DemoError(msg)
    python_path = os.pathsep.join(
        p for p in (str(SIMULATOR_PATH), os.environ.get("PYTHONPATH", "")) if p
    )
    simulator = await _start_child(
        "warehouse-simulator",
        (
            "-m",
            "warehouse_simulator",
            "--token",
            SIMULATOR_TOKEN,
            "--pick-delay-seconds",
            f"{PICK_DELAY_SECONDS:g}",
        ),
        None,
        env={"PYTHONPATH": python_path},
    )
    try:
        await _wait_ready(simulator, "/_simulator/stats")
        dispatcher: _Child | None = None
        handoff: _Handoff | None = None
        try:
            env = _handoff_env(simulator)
            dispatcher = await _start_child(
                "dispatcher", DISPATCHER_COMMAND, "FULFILMENT_DISPATCHER_PORT", env=env
            )
            handoff = _Handoff(simulator, dispatcher)
            echo(
                f"warehouse system: simulator at {env['FULFILMENT_WAREHOUSE_URL']} (pid"
                f" {simulator.process.pid}, pick delay {PICK_DELAY_SECONDS:g} s, log"
                f" {simulator.log}), dispatcher started"
                f" ({dispatcher.describe()})"
            )
            await _wait_ready(dispatcher)
            yield handoff
        finally:
            if dispatcher is not None:
                code = await _stop(dispatcher.process, stop_grace_seconds)
                if handoff is not None:
                    handoff.dispatcher_code = code
        received = await asyncio.to_thread(read_warehouse, handoff.simulator_admin)
        echo(handoff.summary(received))
    finally:
        await _stop(simulator.process, stop_grace_seconds)


_EVENT: dict[type, str] = {
    RetailOrder: ORDER_PLACED.event,
    RetailCancellation: ORDER_CANCELLED.event,
    RetailShipment: ORDER_SHIPPED.event,
}
"""The ``event`` label of each kind of event the demo sends."""


async def played_before(
    warehouse: PostgresWarehouse,
    consumer: str,
    orders: Sequence[RetailOrder],
    match: CancellationMatch,
) -> str:
    """Whether the database played these events before, from its inbox, in a line.

    Every event the demo can send counts: the orders, the mapped cancellations and a shipment
    of each order (sent only for those reserved). A new user reads there which of the README's
    two endings to expect, or that the run lies between them.
    """
    kinds = (
        [order.event_id for order in orders],
        [cancellation.event_id for cancellation in match.cancellations],
        [shipment_event_id_for(order.invoice_no) for order in orders],
    )
    seen = await processed_event_ids(warehouse, consumer, [i for ids in kinds for i in ids])
    placed, cancelled, shipped = (sum(i in seen for i in ids) for ids in kinds)
    count = len(match.cancellations)
    cancellations = f"{count} cancellation{'' if count == 1 else 's'}"
    if not seen:
        return (
            f"none of these events is in this database's inbox yet ({len(orders)} orders,"
            f" {cancellations}, their shipments): a first run"
        )
    return (
        f"played before: this database's inbox already holds {placed} of these {len(orders)}"
        f" orders, {cancelled} of the {cancellations} and the shipments of {shipped} orders;"
        " those are answered as duplicates and change nothing, any other is applied (--reset,"
        " or make demo RESET=1, plays them all afresh)"
    )


def _day_line(day: RetailDay, counts: _DayCounts, totals: StockTotals) -> str:
    """E.g. ``2010-12-01: orders 143 (rejected 23, reserved 120), cancellations 2 (...), ...``."""
    parts = [
        _counted("orders", len(day.orders), counts.outcomes["orders"]),
        _counted("cancellations", len(day.cancellations), counts.outcomes["cancellations"]),
        _counted("shipments", counts.shipments.total(), counts.shipments),
    ]
    return (
        f"{day.name}: {', '.join(parts)}; units reserved {counts.reserved},"
        f" released {counts.released}, shipped {counts.shipped};"
        f" stock now on hand {totals.on_hand}, reserved {totals.reserved}"
    )


def _counted(what: str, total: int, outcomes: Counter[str]) -> str:
    if not total:
        return f"{what} 0"
    return f"{what} {total} (" + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + ")"


@dataclass(frozen=True, slots=True)
class _Reset:
    """``--reset``, with the database name of ``--confirm-reset`` if given."""

    confirmed: str | None

    def check(self, database: DemoDatabase) -> None:
        """Raise :class:`ResetRefusedError` when :func:`reset_refusal` refuses ``database``."""
        refusal = reset_refusal(database, self.confirmed)
        if refusal is not None:
            raise ResetRefusedError(refusal)

    async def run(
        self,
        options: ToolOptions,
        warehouse: PostgresWarehouse,
        database: DemoDatabase,
        echo: Echo,
    ) -> None:
        """Empty the tables and the queues, if :func:`reset_refusal` allows, and record it.

        Raises:
            ResetRefusedError: the database is not the demo's, and was not named.
        """
        self.check(database)
        rows = await reset_tables(warehouse)
        # Dead letters as `fulfilment dlq purge --all --yes` removes them: each recorded in
        # dead_letter_audit (which the reset keeps) before it leaves its queue.
        async with connect(options.amqp_url) as connection:
            dead = await purge(
                connection,
                Selection(everything=True),
                audit=warehouse.engine,
                execute=True,
                operator=operator_identity(f"{database.user} (fulfilment demo --reset)"),
                comment="fulfilment demo --reset",
                queues=DEAD_LETTER_QUEUES,
            )
        pending = await _purge_queues(options.amqp_url)
        how = f" ({CONFIRM_RESET_OPTION} {self.confirmed})" if self.confirmed else ""
        echo(
            f"reset{how}: database {database.name} as {database.user}: emptied"
            f" {sum(rows.values())} rows ({', '.join(f'{t} {n}' for t, n in rows.items())});"
            f" purged {sum(pending.values())} queued messages"
            f" ({', '.join(f'{q} {n}' for q, n in pending.items() if n) or 'none'}) and"
            f" {dead.done} dead letters, each recorded in dead_letter_audit (run {dead.run_id})"
        )
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        await _mark(
            warehouse,
            f"{DEMO_DATABASE_MARK}: last emptied by `fulfilment demo --reset`{how} at {stamp} as",
            echo,
        )


async def _mark(warehouse: PostgresWarehouse, comment: str, echo: Echo) -> None:
    """Mark the database as the demo's, ``comment`` followed by the user; say so if it cannot."""
    database = await demo_database(warehouse)
    if not await mark_demo_database(warehouse, f"{comment} {database.user}"):
        echo(
            f"could not mark database {database.name} as the demo's (only its owner may comment"
            f" on it): a later --reset of it will ask for {CONFIRM_RESET_OPTION} {database.name}"
        )


async def _purge_queues(amqp_url: str) -> dict[str, int]:
    """Purge the consumed queues and the demo's own; the messages each held (0 if missing)."""
    names = (*(queue.name for queue in SUBSCRIBED_QUEUES), RESULT_EVENTS_QUEUE)
    purged = dict.fromkeys(names, 0)
    async with connect(amqp_url) as connection:
        for name in names:
            # A channel per queue: a missing queue closes the channel it was asked on.
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                queue = await channel.get_queue(name, ensure=True)
                result = await queue.purge()
                purged[name] = int(getattr(result, "message_count", 0) or 0)
            if not channel.is_closed:
                await channel.close()
    return purged


async def _wait_ready(child: _Child, path: str = "/health/ready") -> None:
    url = f"http://127.0.0.1:{child.port}{path}"
    deadline = time.monotonic() + READY_WAIT_SECONDS
    while time.monotonic() < deadline:
        if child.process.returncode is not None:
            text = await asyncio.to_thread(child.log.read_text, errors="replace")
            msg = (
                f"the {child.name} exited with code {child.process.returncode}:"
                f" {_first_error(text)}"
            )
            raise DemoError(msg)
        if await asyncio.to_thread(_http_ok, url):
            return
        await asyncio.sleep(0.5)
    msg = (
        f"the {child.name} was not ready at {url} within {READY_WAIT_SECONDS:g} s"
        f" (log: {child.log})"
    )
    raise DemoError(msg)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a fixed http URL on loopback
            return 200 <= int(response.status) < 300  # noqa: PLR2004 - the 2xx range
    except (urllib.error.URLError, OSError):
        return False


async def _stop(process: asyncio.subprocess.Process, grace_seconds: float) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_seconds):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode if process.returncode is not None else -1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _first_error(log: str) -> str:
    """The first error-level line's reason in a JSON log, else its last line."""
    lines = log.strip().splitlines()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") == "error":
            return str(entry.get("reason") or entry.get("event"))
    return lines[-1] if lines else "(no output)"


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
