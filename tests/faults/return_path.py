"""Helpers of the return path's fault tests (the warehouse's shipments and cancellations, and
its adjustments of stock): a round-robin in front of the intake's replicas, the replicas
killed and restarted, the wait until the warehouse and the service settled, and the figures
of a run, counted against what the warehouse simulator recorded.

The simulator sends its webhooks to one URL, as a warehouse does; :class:`RoundRobin` stands
for the load balancer behind it (a Kubernetes Service, an Ingress): each new connection goes
to the next replica, and to the one after when a replica refuses it (it is down), as a
balancer that takes a dead replica out does. It forwards bytes and parses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import ORDER_SHIPPED_DEAD_LETTER_QUEUE
from fulfilment.domain.warehouse_events import warehouse_event_id
from tests.e2e.harness import free_port, queue_depth
from tests.e2e.relay_harness import unpublished
from tests.e2e.warehouse_harness import SimulatorProcess, open_requests
from tests.faults.faultlib import Cluster, inbox_count
from tests.faults.stock_replay import OutboxRow, StockReplay, replay_stock
from tests.support.webhooks import SECRET, IntakeProcess


class RoundRobin:
    """A TCP load balancer on a local port, in front of local ``targets`` (ports), in a thread
    of its own, so that nothing the test blocks on stalls it.

    Each accepted connection is forwarded to the next target in turn; a target that refuses
    the connection is skipped for the next one, and when every target refuses, the
    connection is closed unanswered (the sender sees an error and retries). A connection to a
    target that dies is closed with it.
    """

    def __init__(self, targets: Iterable[int]) -> None:
        """Balance over ``targets`` (ports on 127.0.0.1); nothing listens until :meth:`start`."""
        self.port = free_port()
        self.targets = list(targets)
        self._waiting: Counter[int] = Counter()
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Listen on :attr:`port` (waits until it does, 10 s at most)."""
        self._thread.start()
        if not self._ready.wait(10):
            msg = "the round-robin did not start listening within 10 s"
            raise RuntimeError(msg)

    def stop(self) -> None:
        """Stop listening and drop every connection."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def waiting(self, target: int) -> int:
        """Connections to ``target`` whose last bytes went to it: a request not answered yet."""
        return self._waiting[target]

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
        self._ready.set()
        await self._stop.wait()
        server.close()
        # asyncio.run cancels the connections' tasks as it ends.

    async def _forward(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        first = next(self._turn)
        for step in range(len(self.targets)):
            port = self.targets[(first + step) % len(self.targets)]
            try:
                target_reader, target_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            exchange = _Exchange(port, self._waiting)
            try:
                await asyncio.gather(
                    _pipe(client_reader, target_writer, exchange.asked),
                    _pipe(target_reader, client_writer, exchange.answered),
                )
            finally:
                exchange.answered()
            return
        client_writer.close()


class _Exchange:
    """Whether a connection waits for its target's answer, counted per target."""

    def __init__(self, target: int, waiting: Counter[int]) -> None:
        self._target = target
        self._waiting = waiting
        self._asked = False

    def asked(self) -> None:
        if not self._asked:
            self._asked = True
            self._waiting[self._target] += 1

    def answered(self) -> None:
        if self._asked:
            self._asked = False
            self._waiting[self._target] -= 1


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, moved: Callable[[], None]
) -> None:
    """Copy ``reader`` to ``writer``, calling ``moved`` after each chunk, until either end
    closes; then close ``writer``, so that the other side learns that its peer went away."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
            moved()
    writer.close()


class Intakes:
    """The intake's replicas behind ``balancer``, each on one of its target ports (the
    probes' are free ones), so that one killed comes back where the round-robin sends; each
    start logs to a file of its own."""

    def __init__(self, env: dict[str, str], tmp_path: Path, *, balancer: RoundRobin) -> None:
        self.env = env
        self.tmp_path = tmp_path
        self.balancer = balancer
        self.ports = [(port, free_port()) for port in balancer.targets]
        self.replicas: list[IntakeProcess | None] = [None] * len(self.ports)
        self.starts = 0
        self.kills = 0

    def start(self, index: int) -> None:
        """Start replica ``index`` and wait until it serves."""
        port, http_port = self.ports[index]
        replica = IntakeProcess(
            dict(self.env),
            self.tmp_path / f"intake-{index}-{self.starts}.log",
            port=port,
            http_port=http_port,
        )
        self.starts += 1
        replica.start()
        self.replicas[index] = replica

    async def kill_while_answering(self, index: int) -> None:
        """SIGKILL replica ``index`` as soon as a request sent to it waits for its answer
        (10 s at most), so that the kill leaves at least one attempt unanswered."""
        deadline = time.monotonic() + 10
        # Polled: the round-robin counts in a thread of its own.
        while time.monotonic() < deadline:
            if self.balancer.waiting(self.ports[index][0]):
                break
            await asyncio.sleep(0.001)
        self.kill(index)

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index``: no answer to what it was handling."""
        replica = self.replicas[index]
        assert replica is not None
        assert replica.process is not None
        assert replica.process.poll() is None, f"intake {index} died: {replica.log_tail()}"
        replica.process.kill()
        replica.process.wait(timeout=10)
        self.kills += 1

    def answers(self) -> list[int]:
        """Requests answered, per replica, over all its starts (``webhooks.answered`` lines
        of its logs)."""
        return [
            sum(
                path.read_text(errors="replace").count('"event": "webhooks.answered"')
                for path in self.tmp_path.glob(f"intake-{index}-*.log")
            )
            for index in range(len(self.replicas))
        ]

    def stop(self) -> None:
        for replica in self.replicas:
            if replica is not None:
                replica.stop_quietly()


def simulator_options(webhook_url: str) -> list[str]:
    """The warehouse's work and its webhooks' faults, every knob on: the return path's
    scenarios add their own."""
    return [
        "--ship-delay-seconds", "1",
        "--shipment-interval-seconds", "0.3",
        "--split-rate", "0.4",
        "--max-shipments", "3",
        "--cancel-rate", "0.1",
        "--webhook-url", webhook_url,
        "--webhook-secret", SECRET,
        "--webhook-timeout-seconds", "3",
        "--webhook-retry-seconds", "0.2,0.5,1,2",
        "--webhook-duplicate-rate", "0.1",
        "--webhook-resend-rate", "0.1",
        "--webhook-reorder-rate", "0.1",
        "--webhook-hold-seconds", "1.5",
        "--webhook-never-rate", "0.08",
        "--webhook-wrong-secret-rate", "0.05",
        "--webhook-stale-rate", "0.05",
    ]  # fmt: skip


async def delivered(simulator: SimulatorProcess) -> int:
    """Webhooks the warehouse has delivered so far (answered 2xx)."""
    record = await asyncio.to_thread(simulator.record)
    return int(record["counts"].get("delivered", 0))


async def wait_until_delivered(simulator: SimulatorProcess, count: int) -> None:
    """Wait (30 s at most) until the warehouse has delivered ``count`` webhooks."""
    deadline = time.monotonic() + 30
    while await delivered(simulator) < count:
        assert time.monotonic() < deadline, f"fewer than {count} webhooks delivered in 30 s"
        await asyncio.sleep(0.1)


async def settle(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    simulator: SimulatorProcess,
    intakes: Intakes,
    *,
    expected: int,
    timeout: float,
    holding_nothing: Callable[[asyncpg.Connection], Awaitable[set[uuid.UUID]]] | None = None,
) -> int:
    """Wait until the workers processed every event published, the warehouse settled
    (``work_pending`` and ``in_flight`` 0), every change it made is recorded (the poll caught
    up), nothing is left to send, and the relay published the outbox; return the upstream
    ``OrderShipped`` that shipped an order.

    ``expected``: the events published to the workers. ``holding_nothing``: the orders that
    hold no unit, whose changes never sent are never asked about (``unasked_changes``); by
    default those an upstream ``OrderShipped`` shipped. Dead workers are restarted meanwhile;
    after ``timeout`` seconds the test fails, naming what it still waits for.
    """
    holding_nothing = holding_nothing or upstream_shipped
    deadline = time.monotonic() + timeout
    while True:
        cluster.restart_dead()
        record = await asyncio.to_thread(simulator.record)
        made = {s["shipment_id"] for s in record["shipments"]} | {
            c["cancellation_id"] for c in record["cancellations"]
        }
        recorded = {
            row["id"]
            for row in await db.fetch(
                "SELECT shipment_id AS id FROM warehouse_shipments"
                " UNION ALL SELECT cancellation_id FROM warehouse_cancellations"
            )
        }
        # An upstream OrderShipped of an order released meanwhile (the shop's cancel or the
        # warehouse's) is dead-lettered order_not_reserved, and not in the inbox.
        processed = await inbox_count(db) + await queue_depth(
            broker, ORDER_SHIPPED_DEAD_LETTER_QUEUE
        )
        waiting = {
            "events unprocessed": max(0, expected - processed),
            "warehouse work pending": record["work_pending"],
            "webhooks in flight": record["in_flight"],
            "changes not recorded": len(
                made - recorded - unasked_changes(record, await holding_nothing(db))
            ),
            "requests open": await open_requests(db),
            "outbox unpublished": await unpublished(db),
        }
        if not any(waiting.values()):
            return int(
                await db.fetchval("SELECT count(*) FROM inbox_messages WHERE outcome = 'shipped'")
            )
        if time.monotonic() > deadline:
            fates: dict[str, list[str]] = {}
            for webhook in record["webhooks"]:
                fates.setdefault(webhook["subject"], []).append(webhook["fate"])
            references = {
                change.get("shipment_id") or change["cancellation_id"]: change["reference"]
                for change in (*record["shipments"], *record["cancellations"])
            }
            missing = []
            for change in sorted(made - recorded):
                status = await db.fetchval(
                    "SELECT status FROM reservations WHERE order_id = $1::uuid",
                    references[change],
                )
                upstream = await db.fetchval(
                    "SELECT outcome FROM inbox_messages WHERE order_id = $1::uuid"
                    " AND outcome IN ('shipped', 'ship_ignored')",
                    references[change],
                )
                missing.append((change, status, upstream, fates.get(change)))
            pytest.fail(
                f"not settled in {timeout:g} s: {waiting}; intakes answered"
                f" {intakes.answers()}; not recorded: {missing}"
            )
        await asyncio.sleep(0.5)


@dataclass(frozen=True)
class ReturnPathFigures:
    """The fault table's counts of a run of the return path (the first five must be 0).

    Attributes:
        answered_2xx_not_applied: webhooks the intake answered 2xx whose id is not in
            ``webhook_inbox`` or whose shipment or cancellation is not recorded.
        applied_twice: shipments and cancellations whose result event is in the outbox more
            than once, or that took more units of a SKU than the warehouse shipped in them.
        unsigned_or_stale_applied: attempts signed with a wrong secret or a stale timestamp
            that were answered 2xx, and ``webhook_inbox`` rows of a webhook id that no
            correctly signed, fresh attempt carried.
        stock_wrong: SKUs whose ``on_hand`` or ``shipped`` is not the loaded units less the
            units shipped and taken, or whose ``reserved`` is not their held lines.
        result_events_wrong: shipments that took units without exactly one ``stock.shipped``
            (or with one though they took none), cancellations likewise with
            ``stock.released``, and result events of the outbox never published to the bus.
        not_recorded: shipments and cancellations the warehouse made that the service has no
            row of (neither a webhook nor the poll brought them), but those of
            ``unasked``.
        webhooks_answered_2xx: webhooks (distinct ids) the intake answered 2xx.
        shipments, cancellations: what the warehouse made.
        found_by_poll: shipments and cancellations recorded by the dispatcher's poll.
        unasked: changes whose webhook was never sent, of an order an upstream
            ``OrderShipped`` shipped: it holds nothing, so the poll never asks about it
            (product contract: only orders that hold units are asked about), and the change
            would take nothing.
        refused_attempts: attempts answered 401 (a wrong secret or a stale timestamp).
        failed_attempts: attempts without an answer (a replica killed under them, none up).
        duplicates: webhook_inbox rows whose change was recorded before (a duplicate sent
            again under a new id, or found by the poll first).
    """

    answered_2xx_not_applied: int
    applied_twice: int
    unsigned_or_stale_applied: int
    stock_wrong: int
    result_events_wrong: int
    not_recorded: int
    webhooks_answered_2xx: int
    shipments: int
    cancellations: int
    found_by_poll: int
    unasked: int
    refused_attempts: int
    failed_attempts: int
    duplicates: int

    def faults(self) -> dict[str, int]:
        """The counts that must be 0."""
        return {
            "answered_2xx_not_applied": self.answered_2xx_not_applied,
            "applied_twice": self.applied_twice,
            "unsigned_or_stale_applied": self.unsigned_or_stale_applied,
            "stock_wrong": self.stock_wrong,
            "result_events_wrong": self.result_events_wrong,
            "not_recorded": self.not_recorded,
        }


def _answered_2xx(attempt: Mapping[str, Any]) -> bool:
    status = attempt.get("status")
    return status is not None and 200 <= status < 300


def _forged(attempt: Mapping[str, Any]) -> bool:
    return bool(attempt["wrong_secret"] or attempt["stale"])


def _units(lines: Iterable[Mapping[str, Any]]) -> Counter[str]:
    units: Counter[str] = Counter()
    for line in lines:
        units[line["sku"]] += int(line["quantity"])
    return units


async def return_path_figures(
    db: asyncpg.Connection,
    record: Mapping[str, Any],
    *,
    loaded: Mapping[str, int],
    published: set[uuid.UUID],
) -> ReturnPathFigures:
    """Count the run's figures from the database and the simulator's ``record``
    (``GET /_simulator/webhooks``, taken once it settled).

    ``loaded``: the units of each SKU put in stock before the run. ``published``: the
    ``event_id`` of every result event a queue bound to ``fulfilment.events`` received.

    Every shipment the warehouse made takes its lines from its order, unless an upstream
    ``OrderShipped`` shipped that order first (it ships all the order held, and the
    warehouse's later shipments of it take nothing): those orders' units are read from
    ``reservation_lines.shipped``, every other order's from the simulator's shipments.
    """
    webhooks = list(record["webhooks"])
    shipments = {s["shipment_id"]: s for s in record["shipments"]}
    cancellations = {c["cancellation_id"]: c for c in record["cancellations"]}
    inbox = {
        row["webhook_id"]: row["outcome"]
        for row in await db.fetch("SELECT webhook_id, outcome FROM webhook_inbox")
    }
    shipment_rows = {
        row["shipment_id"]: row
        for row in await db.fetch(
            "SELECT s.shipment_id, s.order_id, s.source, coalesce(sum(l.taken), 0) AS taken"
            " FROM warehouse_shipments s LEFT JOIN warehouse_shipment_lines l USING"
            " (shipment_id) GROUP BY s.shipment_id"
        )
    }
    cancellation_rows = {
        row["cancellation_id"]: row
        for row in await db.fetch(
            "SELECT c.cancellation_id, c.source, coalesce(sum(l.released), 0) AS released"
            " FROM warehouse_cancellations c LEFT JOIN warehouse_cancellation_lines l USING"
            " (cancellation_id) GROUP BY c.cancellation_id"
        )
    }
    recorded = set(shipment_rows) | set(cancellation_rows)
    unrecorded = (set(shipments) | set(cancellations)) - recorded
    unasked = unasked_changes(record, await upstream_shipped(db)) & unrecorded

    # Answered 2xx but not applied: the webhook's id, and its change, must both be recorded.
    answered = {
        webhook["webhook_id"]: webhook["subject"]
        for webhook in webhooks
        if any(_answered_2xx(attempt) for attempt in webhook["attempts"])
    }
    not_applied = sum(
        1
        for webhook_id, subject in answered.items()
        if webhook_id not in inbox or subject not in recorded
    )

    # Unsigned or stale: none answered 2xx, and every inbox row came with a right attempt.
    forged_answered = sum(
        1
        for webhook in webhooks
        for attempt in webhook["attempts"]
        if _forged(attempt) and _answered_2xx(attempt)
    )
    signed_right = {
        webhook["webhook_id"]
        for webhook in webhooks
        if any(not _forged(attempt) for attempt in webhook["attempts"])
    }
    unsigned_applied = forged_answered + sum(
        1 for webhook_id in inbox if webhook_id not in signed_right
    )

    # Applied twice: a change's result event more than once, or more units taken than sent.
    shipped_events = Counter(
        row["shipment_id"]
        for row in await db.fetch(
            "SELECT body->>'shipment_id' AS shipment_id FROM outbox"
            " WHERE routing_key = 'stock.shipped' AND body->>'shipment_id' IS NOT NULL"
        )
    )
    released_events = Counter(
        row["causation_id"]
        for row in await db.fetch(
            "SELECT (body->>'causation_id')::uuid AS causation_id FROM outbox"
            " WHERE routing_key = 'stock.released'"
        )
    )
    taken_lines: dict[str, Counter[str]] = defaultdict(Counter)
    for row in await db.fetch("SELECT shipment_id, sku, taken FROM warehouse_shipment_lines"):
        taken_lines[row["shipment_id"]][row["sku"]] += row["taken"]
    over_taken = {
        shipment_id
        for shipment_id, taken in taken_lines.items()
        if shipment_id in shipments
        and any(
            units > _units(shipments[shipment_id]["lines"])[sku] for sku, units in taken.items()
        )
    }
    cancellation_events = {
        cancellation_id: released_events[warehouse_event_id("cancellation", cancellation_id)]
        for cancellation_id in cancellation_rows
    }
    twice = (
        sum(1 for count in shipped_events.values() if count > 1)
        + sum(1 for count in cancellation_events.values() if count > 1)
        + len(over_taken)
    )

    # Result events: one per change that moved units, none for one that moved none, and
    # every one of them on the bus.
    events_wrong = sum(
        1
        for shipment_id, row in shipment_rows.items()
        if shipped_events[shipment_id] != (1 if row["taken"] > 0 else 0)
    ) + sum(
        1
        for cancellation_id, row in cancellation_rows.items()
        if cancellation_events[cancellation_id] != (1 if row["released"] > 0 else 0)
    )
    outbox_ids = {
        row["event_id"]
        for row in await db.fetch(
            "SELECT event_id FROM outbox WHERE routing_key IN ('stock.shipped', 'stock.released')"
        )
    }
    events_wrong += len(outbox_ids - published)

    stock_wrong = await _stock_wrong(db, record["shipments"], loaded)
    return ReturnPathFigures(
        answered_2xx_not_applied=not_applied,
        applied_twice=twice,
        unsigned_or_stale_applied=unsigned_applied,
        stock_wrong=stock_wrong,
        result_events_wrong=events_wrong,
        not_recorded=len(unrecorded - unasked),
        unasked=len(unasked),
        webhooks_answered_2xx=len(answered),
        shipments=len(shipments),
        cancellations=len(cancellations),
        found_by_poll=sum(
            1
            for row in (*shipment_rows.values(), *cancellation_rows.values())
            if row["source"] == "poll"
        ),
        refused_attempts=sum(1 for w in webhooks for a in w["attempts"] if a.get("status") == 401),
        failed_attempts=sum(1 for w in webhooks for a in w["attempts"] if a.get("status") is None),
        duplicates=sum(1 for outcome in inbox.values() if outcome == "duplicate"),
    )


async def _stock_wrong(
    db: asyncpg.Connection, made: Iterable[Mapping[str, Any]], loaded: Mapping[str, int]
) -> int:
    """SKUs whose ``on_hand``, ``shipped`` or ``reserved`` is not what the run explains."""
    upstream = await upstream_shipped(db)
    taken: Counter[str] = Counter()
    for shipment in made:
        if uuid.UUID(shipment["reference"]) not in upstream:
            taken.update(_units(shipment["lines"]))
    for row in await db.fetch(
        "SELECT sku, sum(shipped) AS shipped FROM reservation_lines"
        " WHERE order_id = ANY($1::uuid[]) GROUP BY sku",
        list(upstream),
    ):
        taken[row["sku"]] += int(row["shipped"])
    held = {
        row["sku"]: int(row["held"])
        for row in await db.fetch(
            "SELECT l.sku, sum(l.quantity - l.shipped) AS held FROM reservation_lines l"
            " JOIN reservations r USING (order_id) WHERE r.status = 'reserved' GROUP BY l.sku"
        )
    }
    wrong = 0
    for row in await db.fetch("SELECT sku, on_hand, reserved, shipped FROM stock_levels"):
        sku = row["sku"]
        expected_on_hand = loaded.get(sku, 0) - taken[sku]
        if (
            row["on_hand"] != expected_on_hand
            or row["shipped"] != taken[sku]
            or row["reserved"] != held.get(sku, 0)
        ):
            wrong += 1
    return wrong


async def upstream_shipped(db: asyncpg.Connection) -> set[uuid.UUID]:
    """The orders an upstream ``OrderShipped`` shipped (it took all they held)."""
    rows = await db.fetch("SELECT order_id FROM inbox_messages WHERE outcome = 'shipped'")
    return {row["order_id"] for row in rows}


async def orders_holding_nothing(db: asyncpg.Connection) -> set[uuid.UUID]:
    """The orders that hold no unit (``rejected``, ``released`` or ``shipped``): the poll
    never asks about them."""
    rows = await db.fetch("SELECT order_id FROM reservations WHERE status <> 'reserved'")
    return {row["order_id"] for row in rows}


def unasked_changes(record: Mapping[str, Any], upstream: set[uuid.UUID]) -> set[str]:
    """The changes of ``record`` (``GET /_simulator/webhooks``) that no webhook carried (every
    one ``never_sent``) and whose order is one of ``upstream`` (orders that hold nothing): no
    poll asks about an order that holds nothing."""
    sent = {webhook["subject"] for webhook in record["webhooks"] if webhook["fate"] != "never_sent"}
    return {
        change.get("shipment_id") or change["cancellation_id"]
        for change in (*record["shipments"], *record["cancellations"])
        if uuid.UUID(change["reference"]) in upstream
        and (change.get("shipment_id") or change["cancellation_id"]) not in sent
    }


@dataclass(frozen=True)
class AdjustmentFigures:
    """The fault table's counts of a run of the warehouse's adjustments of hot SKUs (the first
    six must be 0).

    Attributes:
        answered_2xx_not_applied: ``inventory.adjusted`` webhooks the intake answered 2xx
            whose id is not in ``webhook_inbox``, or whose adjustment has no
            ``warehouse_adjustments`` row with the SKU, delta and reason the warehouse sent.
        applied_twice: adjustments with more than one ``stock.adjusted`` in the outbox, or
            more than one webhook recorded ``adjusted`` in ``webhook_inbox``; and rows of an
            adjustment that no webhook carried.
        invariant_violations: SKUs whose ``on_hand`` is not the loaded units, plus the
            adjustments' ``applied``, less the units the shipments took
            (``warehouse_shipment_lines.taken``), plus what they took beyond ``on_hand`` of a
            short SKU (in the replay); whose ``shipped`` is not the units taken, or who had
            more units taken than the warehouse shipped of them (read from the simulator);
            whose ``reserved`` is not their held lines;
            with ``on_hand < 0``, ``reserved < 0``, or ``reserved > on_hand`` though no loss of
            them was reported; or whose levels are not where the replay of their result events
            ends (``stock_replay``).
        reserved_from_short: ``stock.reserved`` events that, in the replay, took a unit of a
            SKU short before them or left one short.
        adjusted_events_wrong: adjustments applied without exactly one ``stock.adjusted`` of
            their id, events whose SKU, delta, applied or reason are not the row's, or whose
            applied and levels are not the replay's, and ``stock.adjusted`` events a queue
            bound to ``fulfilment.events`` never received.
        shortage_events_wrong: ``stock.shortage`` events the replay finds wrong (levels no
            change gave, a shortfall changed without one) and those never received on the bus.
        adjustments: adjustments the warehouse made; ``losses`` of them negative.
        applied: adjustments the service applied (``warehouse_adjustments`` rows), of which
            ``cut_to_on_hand`` a loss of more than ``on_hand`` (the rest a discrepancy).
        never_sent: adjustments whose webhook the warehouse never sent.
        webhooks_answered_2xx: ``inventory.adjusted`` webhooks (distinct ids) answered 2xx.
        duplicates: deliveries of an adjustment already applied: its webhook again (same id)
            answered 2xx, or another webhook of it recorded ``duplicate``.
        failed_attempts: attempts of any webhook without an answer (a replica killed).
        short_spells: times a SKU went short (``stock_replay.StockReplay.short_spells``).
        rejected_while_short: orders rejected naming a SKU that was short then.
        reserved_orders, rejected_orders: the orders' outcomes.
        shipped_beyond_on_hand: units shipments took of a short SKU beyond its ``on_hand``.
        shipped_not_taken: units the warehouse shipped that the service did not take: a
            cancellation without lines ("everything left") applied before the shipment
            released them, and a shipment that came after it, or was never sent (its order
            holds nothing, so the poll never asks), took nothing.
    """

    answered_2xx_not_applied: int
    applied_twice: int
    invariant_violations: int
    reserved_from_short: int
    adjusted_events_wrong: int
    shortage_events_wrong: int
    adjustments: int
    losses: int
    applied: int
    cut_to_on_hand: int
    never_sent: int
    webhooks_answered_2xx: int
    duplicates: int
    failed_attempts: int
    short_spells: int
    rejected_while_short: int
    reserved_orders: int
    rejected_orders: int
    shipped_beyond_on_hand: int
    shipped_not_taken: int

    def faults(self) -> dict[str, int]:
        """The counts that must be 0."""
        return {
            "answered_2xx_not_applied": self.answered_2xx_not_applied,
            "applied_twice": self.applied_twice,
            "invariant_violations": self.invariant_violations,
            "reserved_from_short": self.reserved_from_short,
            "adjusted_events_wrong": self.adjusted_events_wrong,
            "shortage_events_wrong": self.shortage_events_wrong,
        }


async def adjustment_figures(
    db: asyncpg.Connection,
    record: Mapping[str, Any],
    *,
    loaded: Mapping[str, int],
    published: set[uuid.UUID],
) -> AdjustmentFigures:
    """Count the run's figures from the database and the simulator's ``record``
    (``GET /_simulator/webhooks``, taken once it settled).

    ``loaded``: the units of each SKU put in stock before the run, at the service and on the
    warehouse's shelves alike. ``published``: the ``event_id`` of every result event a queue
    bound to ``fulfilment.events`` received. Assumes that the warehouse's shipments and
    cancellations are the only other changes of stock besides the orders' reservations (no
    shop's cancel, no upstream ``OrderShipped``): every unit a shipment lists was taken.
    """
    made = {a["adjustment_id"]: a for a in record["adjustments"]}
    webhooks = [w for w in record["webhooks"] if w["type"] == "inventory.adjusted"]
    inbox = {
        row["webhook_id"]: row["outcome"]
        for row in await db.fetch(
            "SELECT webhook_id, outcome FROM webhook_inbox WHERE type = 'inventory.adjusted'"
        )
    }
    rows = {
        row["adjustment_id"]: row
        for row in await db.fetch(
            "SELECT adjustment_id, sku, delta, applied, reason FROM warehouse_adjustments"
        )
    }
    outbox = [
        OutboxRow.of(row)
        for row in await db.fetch(
            "SELECT id, event_id, routing_key, sku, body::text AS body, created_at FROM outbox"
            " ORDER BY id"
        )
    ]
    replay = replay_stock(outbox, loaded)

    # Answered 2xx but not applied: its webhook id, and its adjustment as sent, recorded.
    answered = {
        webhook["webhook_id"]: webhook["subject"]
        for webhook in webhooks
        if any(_answered_2xx(attempt) for attempt in webhook["attempts"])
    }

    def applied_as_sent(adjustment_id: str) -> bool:
        row, sent = rows.get(adjustment_id), made[adjustment_id]
        return row is not None and (row["sku"], row["delta"], row["reason"]) == (
            sent["sku"],
            sent["delta"],
            sent["reason"],
        )

    not_applied = sum(
        1
        for webhook_id, subject in answered.items()
        if webhook_id not in inbox or not applied_as_sent(subject)
    )

    # Applied twice: two result events, or two webhooks that each applied it; or applied
    # though no webhook of it was sent.
    adjusted = [row for row in outbox if row.routing_key == "stock.adjusted"]
    events_of: dict[str, list[OutboxRow]] = defaultdict(list)
    for row in adjusted:
        events_of[str(row.body["adjustment_id"])].append(row)
    applied_by: Counter[str] = Counter(
        subject
        for webhook_id, subject in {w["webhook_id"]: w["subject"] for w in webhooks}.items()
        if inbox.get(webhook_id) == "adjusted"
    )
    sent = {w["subject"] for w in webhooks if w["fate"] != "never_sent"}
    twice = (
        sum(1 for events in events_of.values() if len(events) > 1)
        + sum(1 for count in applied_by.values() if count > 1)
        + sum(1 for adjustment_id in rows if adjustment_id not in sent)
    )

    # stock.adjusted: one per row, saying what the row did, at the levels the replay gives.
    events_wrong = set(replay.adjusted_wrong)
    for adjustment_id, row in rows.items():
        events = events_of.get(adjustment_id, [])
        if len(events) != 1:
            events_wrong.add(adjustment_id)
            continue
        body = events[0].body
        if (body["sku"], body["delta"], body["applied"], body["reason"]) != (
            row["sku"],
            row["delta"],
            row["applied"],
            row["reason"],
        ):
            events_wrong.add(events[0].event_id)
    events_wrong |= {str(adjustment_id) for adjustment_id in events_of if adjustment_id not in rows}
    events_wrong |= {row.event_id for row in adjusted if uuid.UUID(row.event_id) not in published}
    shortage_wrong = replay.shortage_wrong + sum(
        1
        for row in outbox
        if row.routing_key == "stock.shortage" and uuid.UUID(row.event_id) not in published
    )

    violations, not_taken = await _adjusted_stock_wrong(
        db, record["shipments"], loaded, rows, replay
    )
    outcomes = {
        row["status"]: int(row["count"])
        for row in await db.fetch("SELECT status, count(*) FROM reservations GROUP BY status")
    }
    return AdjustmentFigures(
        answered_2xx_not_applied=not_applied,
        applied_twice=twice,
        invariant_violations=violations,
        reserved_from_short=len(replay.reserved_from_short),
        adjusted_events_wrong=len(events_wrong),
        shortage_events_wrong=shortage_wrong,
        adjustments=len(made),
        losses=sum(1 for a in made.values() if a["delta"] < 0),
        applied=len(rows),
        cut_to_on_hand=sum(1 for row in rows.values() if row["applied"] != row["delta"]),
        never_sent=sum(1 for w in webhooks if w["fate"] == "never_sent"),
        webhooks_answered_2xx=len(answered),
        duplicates=sum(
            1
            for w in webhooks
            if w["cause"] == "duplicate" and any(_answered_2xx(a) for a in w["attempts"])
        )
        + sum(1 for outcome in inbox.values() if outcome == "duplicate"),
        failed_attempts=sum(
            1 for w in record["webhooks"] for a in w["attempts"] if a.get("status") is None
        ),
        short_spells=replay.short_spells,
        rejected_while_short=len(replay.rejected_while_short),
        reserved_orders=sum(n for status, n in outcomes.items() if status != "rejected"),
        rejected_orders=outcomes.get("rejected", 0),
        shipped_beyond_on_hand=sum(replay.shipped_beyond_on_hand.values()),
        shipped_not_taken=not_taken,
    )


async def _adjusted_stock_wrong(
    db: asyncpg.Connection,
    shipments: Iterable[Mapping[str, Any]],
    loaded: Mapping[str, int],
    adjustments: Mapping[str, Mapping[str, Any]],
    replay: StockReplay,
) -> tuple[int, int]:
    """SKUs whose levels break the stock invariants or are not what the run explains
    (:class:`AdjustmentFigures`, ``invariant_violations``), and the units the warehouse
    shipped that the service did not take."""
    sent: Counter[str] = Counter()
    for shipment in shipments:
        sent.update(_units(shipment["lines"]))
    taken = Counter(
        {
            row["sku"]: int(row["taken"])
            for row in await db.fetch(
                "SELECT sku, sum(taken) AS taken FROM warehouse_shipment_lines GROUP BY sku"
            )
        }
    )
    applied: Counter[str] = Counter()
    lost: set[str] = set()
    for row in adjustments.values():
        applied[row["sku"]] += row["applied"]
        if row["delta"] < 0:
            lost.add(row["sku"])
    held = {
        row["sku"]: int(row["held"])
        for row in await db.fetch(
            "SELECT l.sku, sum(l.quantity - l.shipped) AS held FROM reservation_lines l"
            " JOIN reservations r USING (order_id) WHERE r.status = 'reserved' GROUP BY l.sku"
        )
    }
    wrong = 0
    for row in await db.fetch("SELECT sku, on_hand, reserved, shipped FROM stock_levels"):
        sku = row["sku"]
        on_hand, reserved = row["on_hand"], row["reserved"]
        explained = (
            loaded.get(sku, 0) + applied[sku] - taken[sku] + replay.shipped_beyond_on_hand[sku]
        )
        if (
            on_hand != explained
            or row["shipped"] != taken[sku]
            or taken[sku] > sent[sku]
            or reserved != held.get(sku, 0)
            or on_hand < 0
            or reserved < 0
            or (reserved > on_hand and sku not in lost)
            or replay.levels.get(sku, (loaded.get(sku, 0), 0)) != (on_hand, reserved)
        ):
            wrong += 1
    return wrong, sum((sent - taken).values())


def record_return_path_figures(
    scenario: str,
    injected: str,
    figures: ReturnPathFigures | AdjustmentFigures,
    **extra: Any,
) -> None:
    """Append the run's row of the return path's table, or of the adjustments', to
    ``FULFILMENT_TEST_FAULT_FIGURES`` (JSON lines, beside the other scenarios' rows), if set."""
    target = os.environ.get("FULFILMENT_TEST_FAULT_FIGURES")
    if not target:
        return
    row = {
        "scenario": scenario,
        "injected": injected,
        **asdict(figures),
        **extra,
    }
    with Path(target).open("a", encoding="utf-8") as lines:
        lines.write(json.dumps(row) + "\n")
