"""``fulfilment demo``: the main job on real data, from an empty database to a reconciled report.

Steps: create and migrate the database (``--reset`` is refused before the migration); plan
stock from the data and load it for the SKUs that have no stock level yet; declare the demo's
own queue on the result events' exchange (:data:`RESULT_EVENTS_QUEUE`), only now, so that a
refused run leaves the broker as it was; start the relay, the warehouse system (the intake
``fulfilment webhooks``, the warehouse simulator, the dispatcher) and the worker as child
processes and wait until each is ready; play the data day by day
(``fulfilment.dataset.retail_lifecycle``): each day's orders and mapped cancellations in time
order, one run of one kind at a time, each run settled before the next is sent, then wait
until the warehouse has shipped or cancelled every order of the day it received, by signed
webhooks or found by the dispatcher's poll, and check it and the stock; an order of the day
still reserved then (the warehouse never received it) ships with the shop's ``OrderShipped``;
once in the run, the warehouse receives units of one SKU and finds units of another damaged
while orders hold them, and the shortage is refused, then settled (``demo.warehouse_stock``);
stop the worker with SIGTERM (it finishes in-flight work and exits 0); compare the service's
stock with the warehouse's (``fulfilment stock drift``: every SKU agrees);
wait until the relay has published every outbox row the run wrote, read the demo's queue and
check what it received against those rows (``demo.result_events``), and stop the relay with
SIGTERM; then reconcile every published event of the three kinds against the inbox and the
dead-letter queues and print the report.

Its jobs are modules of their own: the player (``demo.player``: the days, each run settled),
the child processes (``demo.children``: started, waited for, stopped, their logs in one
folder), the warehouse system (``demo.warehouse_system``) and its checks (``demo.handoff``:
what it received; ``demo.warehouse_news``: what it sent back; ``demo.warehouse_stock``: its
stock),
the reset guard (``demo.reset``) and the result events' tally (``demo.result_events``).

Stock is loaded only for SKUs without a level, so that a second run keeps what the first
one's shipments took out of ``on_hand`` (a second run re-sends the same events and changes
nothing); ``--reset`` empties everything first, and the whole plan is loaded.

``--reset`` empties only a database the demo recognises as its own (``demo.reset``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fulfilment.adapters.postgres.admin import (
    DEMO_DATABASE_MARK,
    demo_database,
    ensure_database,
    outbox_entries_after,
    outbox_last_id,
    outbox_unpublished_after,
    stock_session,
)
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.adapters.rabbitmq.connection import connect, connection_lost
from fulfilment.adapters.rabbitmq.demo_queue import declare_bound_queue, take_messages
from fulfilment.adapters.rabbitmq.publishing import UnroutableError
from fulfilment.contracts.topology import EVENTS_EXCHANGE
from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.dataset.reconcile import reconcile_kinds
from fulfilment.dataset.retail_lifecycle import plan_days
from fulfilment.dataset.stock_plan import plan_stock
from fulfilment.demo.children import LOG_DIR, Child, start_child, stop, wait_ready
from fulfilment.demo.errors import DemoError
from fulfilment.demo.player import PROGRESS_SECONDS, play_days, played_before
from fulfilment.demo.reset import Reset, mark
from fulfilment.demo.result_events import (
    RESULT_EVENTS_BINDING,
    RESULT_EVENTS_QUEUE,
    ResultEventTally,
)
from fulfilment.demo.warehouse_system import warehouse_system
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.report import collect_report, render_report

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

    from fulfilment.adapters.postgres.stock import PostgresStock
    from fulfilment.dataset.online_retail import ReadResult
    from fulfilment.dataset.retail_lifecycle import CancellationMatch

RELAY_COMMAND = ("-c", "from fulfilment.entrypoints.relay import main; main()")
"""``fulfilment relay`` run by this interpreter: what the console script calls, found without
looking for the script on the ``PATH`` (the demo may not import the relay's root)."""
RELAY_STALL_SECONDS = 60.0
"""The demo fails if the relay publishes none of the run's outbox rows left for this long."""
RELAY_POLL_SECONDS = 0.1
"""Interval between two counts of the run's unpublished outbox rows."""
READ_PREFETCH = 256
"""Messages of the demo's queue unacknowledged at once while it is read: bounds memory."""
READ_IDLE_SECONDS = 10.0
"""How long the read waits for one more of the messages the queue counted."""


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
    or ``confirm_reset`` is its name (``demo.reset.reset_refusal``); ``stop_grace_seconds`` is how
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
            reset=Reset(confirmed=confirm_reset) if reset else None,
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
    reset: Reset | None,
    stop_grace_seconds: float,
    echo: Echo,
) -> int:
    started = time.monotonic()
    database_url = options.database.url
    created = await ensure_database(database_url)
    if created:
        echo("created the database")
    elif reset is not None:
        # Refused before the migration, so that a refused reset changes nothing at all.
        async with stock_session(options.database, consumer=options.consumer) as stock:
            reset.check(await demo_database(stock))
    await asyncio.to_thread(migrate, database_url)
    echo("database migrated to head")

    days = plan_days(read.days, read.orders, match.cancellations)
    echo(
        f"read {len(read.orders)} orders and {len(read.cancellations)} cancellation invoices"
        f" from {len(days)} days (skipped: {read.skipped.describe()}); cancellations mapped to"
        f" their order: {len(match.cancellations)} (not mapped: {match.describe()})"
    )
    levels = plan_stock(read.orders)
    async with stock_session(options.database, consumer=options.consumer) as stock:
        database = await demo_database(stock)
        if reset is not None:
            await reset.run(options, stock, database, echo)
        elif created or (database.empty and database.comment is None):
            await mark(stock, f"{DEMO_DATABASE_MARK}: made or found empty by", echo)
        echo(await played_before(stock, options.consumer, read.orders, match))
        loaded = await _load_missing_stock(stock, levels)
        # Taken before the worker starts: every row of the run has a higher id.
        baseline = await outbox_last_id(stock)
    kept = len(levels) - loaded
    echo(
        f"loaded {loaded} planned stock levels"
        + (f"; {kept} SKUs kept the level they had (--reset starts from the plan)" if kept else "")
    )
    # After every check that may refuse the run, so that a refusal leaves the broker as it
    # was; before the relay starts, so that the queue receives every result event of the run.
    async with connect(options.amqp_url) as connection:
        await declare_bound_queue(
            connection,
            RESULT_EVENTS_QUEUE,
            exchange=EVENTS_EXCHANGE,
            binding_key=RESULT_EVENTS_BINDING,
        )
    echo(
        f"result events: the relay publishes them to {EVENTS_EXCHANGE}, where the demo's"
        f" queue {RESULT_EVENTS_QUEUE} (bound with {RESULT_EVENTS_BINDING}) receives them"
    )

    echo(
        f"logs of the relay, the warehouse system and the worker: {LOG_DIR}"
        " (each run replaces them)"
    )
    relay = await start_child("relay", RELAY_COMMAND, "FULFILMENT_RELAY_HTTP_PORT")
    echo(f"relay started ({relay.describe()})")
    try:
        async with warehouse_system(stop_grace_seconds, echo) as handoff:

            async def others_ready() -> None:
                await wait_ready(relay)
                await handoff.ready()

            player, code = await play_days(
                options,
                days,
                handoff,
                others_ready=others_ready,
                stop_grace_seconds=stop_grace_seconds,
                echo=echo,
            )
        tally = await _received_result_events(options, baseline, relay, echo)
        echo("\n".join(tally.lines(RESULT_EVENTS_QUEUE)))
    finally:
        relay_code = await stop(relay.process, stop_grace_seconds)
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
    failure = tally.failure() or player.shelves.tally_failure(tally)
    if failure is not None:
        raise DemoError(failure)
    clean_stops = (
        code == 0
        and relay_code == 0
        and all(handoff.codes.get(child.name) == 0 for child in handoff.children)
    )
    return 0 if reconciled and clean_stops and document["invariants"]["ok"] else 1


async def _received_result_events(
    options: ToolOptions, baseline: int, relay: Child, echo: Echo
) -> ResultEventTally:
    """Wait until the relay published the run's outbox rows, then read the demo's queue.

    ``baseline`` is the last outbox id before the run. Returns the tally of what the queue
    received against those rows.

    Raises:
        DemoError: the relay exited or stalled with rows of the run unpublished, or the queue
            did not deliver the messages it counted.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        await _wait_published(stock, baseline, relay, echo)
        tally = ResultEventTally(await outbox_entries_after(stock, baseline))

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


async def _wait_published(stock: PostgresStock, baseline: int, relay: Child, echo: Echo) -> None:
    """Wait until no outbox row above ``baseline`` is unpublished.

    Raises:
        DemoError: the relay exited, or published none of the rows left for
            :data:`RELAY_STALL_SECONDS`; the message names its log.
    """
    last, changed = -1, time.monotonic()
    said = changed
    while (left := await outbox_unpublished_after(stock, baseline)) > 0:
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


async def _load_missing_stock(stock: PostgresStock, levels: Mapping[str, int]) -> int:
    """Load the planned level of each SKU that has none; return how many were loaded."""
    known = await stock.levels_of(levels)
    missing = {sku: units for sku, units in levels.items() if sku not in known}
    await stock.put_stock(missing)
    return len(missing)
