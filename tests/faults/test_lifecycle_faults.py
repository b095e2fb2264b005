"""Cancels and shipments interleaved with orders on hot SKUs, across 3 workers killed with
SIGKILL at every point of a transition and stopped with SIGTERM.

Each scenario publishes the events of a seeded plan (``LifecyclePlan``): orders on a few hot
SKUs with stock for all of them, whole and partial cancels of some, a part of those cancels
deliberately published before their orders, and shipments of others, published right behind
their orders so that some overtake them (the queues are not ordered with each other). No
order is both cancelled and shipped: a cancel and a shipment of the same order do not commute
(``fulfilment.domain.lifecycle``), the rest of the table does.

While the workers crash (``FULFILMENT_TEST_CRASH_PLAN``, every crash point, every kind of
event) and are stopped with SIGTERM and started again, the scenario waits until every event
is settled; a shipment that overtook its order is dead-lettered ``order_not_reserved``, and the
scenario replays it once the orders are placed, as an operator would (``fulfilment dlq
replay``). At the end:

- lost: no event is missing (``fulfilment reconcile``: each in the inbox, none left in a DLQ);
- applied twice: every SKU's ``on_hand`` and ``reserved``, and every order's held or shipped
  lines, equal those of the in-order sequence (the in-memory stock store applying each order's
  events in their logical order: placed, its cancels, its shipment);
- out of order: the cancels applied before their order (``tombstoned``) and the shipments
  dead-lettered before theirs, counted for the figures.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
import urllib.parse
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aio_pika
import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.dead_letter_audit import Operator
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent, publish_events
from fulfilment.contracts.order_cancelled import OrderCancelledV1, order_cancelled_body
from fulfilment.contracts.order_placed import OrderPlacedV1, order_placed_body
from fulfilment.contracts.order_shipped import OrderShippedV1, order_shipped_body
from fulfilment.contracts.topology import (
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_SHIPPED,
    ORDERS_EXCHANGE,
    SubscribedQueue,
)
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.warehouse_events import RecordShipment
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings
from fulfilment.tools import dead_letters, dlq
from fulfilment.tools.report import Reconciliation, reconcile
from tests.e2e.harness import WorkerProcess, put_stock, queue_depth
from tests.faults.faultlib import (
    Cluster,
    assert_outbox_tells_the_lifecycle,
    declare,
    inbox_count,
    record_figures,
)
from tests.support.fakes import FakeStock

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.timeout(600)]

HOT_SKUS = tuple(f"HOT{index}" for index in range(4))
STOCK = dict.fromkeys(HOT_SKUS, 1_000_000)
"""Stock for every order: with enough stock, the table gives every arrival order the same
stock and lines (with scarce stock, which orders win depends on the arrival order)."""

CRASHES = "before_transaction:0.003,in_transaction:0.006,after_commit:0.003"
"""Each delivery draws once per point; ``in_transaction`` more often, as in ``test_crashes``,
because it crashes only once its statement has run."""

DELIVERY_LIMIT = "100"
"""High enough that an innocent delivery returned by many crashes is not taken for poison
(``test_crashes`` has that scenario). On brokers before 4.3 every return counts towards the
broker's own limit, including the deliveries a worker had prefetched but not yet handled when
it was killed or drained; a run has about 40 of those returns, and the redelivered messages go
out first again, so one order held through 20 of them was dead-lettered by the broker once
(which this scenario never replays) with a limit of 20."""

WORKERS = 3
SIGTERM_EVERY_WAVES = 1
"""A SIGTERM after every wave: 15 in a plan of 15 waves, whatever the machine's speed. Each
delivery a drain finishes draws the crash points, so some drains end in a crash
(``assert_stopped_cleanly``): 7 of 61 in four runs, where a SIGTERM every second wave met
longer drains (5 of 7 in one run, and all 7 in one CI run)."""
AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)


@dataclass(frozen=True)
class Event:
    """One event of a plan: its queue, ids, and lines (None for a shipment or a whole cancel)."""

    queue: SubscribedQueue
    event_id: uuid.UUID
    order_id: uuid.UUID
    lines: tuple[tuple[str, int], ...] | None = None

    def body(self) -> bytes:
        if self.queue is ORDER_PLACED:
            assert self.lines is not None
            return order_placed_body(
                event_id=self.event_id,
                order_id=self.order_id,
                placed_at=AT,
                lines=list(self.lines),
            )
        if self.queue is ORDER_CANCELLED:
            return order_cancelled_body(
                event_id=self.event_id,
                order_id=self.order_id,
                cancelled_at=AT,
                lines=None if self.lines is None else list(self.lines),
            )
        return order_shipped_body(event_id=self.event_id, order_id=self.order_id, shipped_at=AT)


@dataclass
class LifecyclePlan:
    """The events of a scenario in their logical order, and the order they are published in.

    ``in_order`` holds each order's events as they happen (placed, its cancels, its shipment),
    order after order; ``early`` the cancels published before any order; ``waves`` the rest,
    published wave after wave while the workers run.
    """

    in_order: list[Event] = field(default_factory=list)
    early: list[Event] = field(default_factory=list)
    waves: list[list[Event]] = field(default_factory=list)

    @property
    def events(self) -> list[Event]:
        return [*self.early, *(event for wave in self.waves for event in wave)]

    def count(self, queue: SubscribedQueue) -> int:
        return sum(event.queue is queue for event in self.in_order)


def lifecycle_plan(
    orders: int, *, cancelled: float, shipped: float, early: float, lag: int, seed: int
) -> LifecyclePlan:
    """``orders`` orders on the hot SKUs; a share ``cancelled`` of them cancelled (half whole,
    half by one or two partial cancels, which may ask for more than the order holds), of
    which a share ``early`` before the order is published; a share ``shipped`` of the others
    shipped. Orders go out in waves of 40; the late cancels and the shipments of a wave's
    orders follow ``lag`` waves later (0: right behind them)."""
    rng = random.Random(seed)
    plan = LifecyclePlan()
    placed_waves: list[list[Event]] = [[]]
    behind_waves: list[list[Event]] = [[]]
    for index in range(orders):
        if index and index % 40 == 0:
            placed_waves.append([])
            behind_waves.append([])
        order_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        skus = rng.sample(HOT_SKUS, rng.randint(1, 3))
        lines = tuple((sku, rng.randint(1, 5)) for sku in skus)
        placed = Event(
            ORDER_PLACED, uuid.UUID(int=rng.getrandbits(128), version=4), order_id, lines
        )
        plan.in_order.append(placed)
        placed_waves[-1].append(placed)
        draw = rng.random()
        if draw < cancelled:
            cancels = _cancels(rng, order_id, lines)
            plan.in_order += cancels
            (plan.early if rng.random() < early else behind_waves[-1]).extend(cancels)
        elif draw < cancelled + shipped:
            shipment = Event(
                ORDER_SHIPPED, uuid.UUID(int=rng.getrandbits(128), version=4), order_id
            )
            plan.in_order.append(shipment)
            behind_waves[-1].append(shipment)
    for index in range(len(placed_waves) + lag):
        placed_wave = placed_waves[index] if index < len(placed_waves) else []
        behind = behind_waves[index - lag] if 0 <= index - lag < len(behind_waves) else []
        plan.waves.append([*placed_wave, *behind])
    return plan


def _cancels(
    rng: random.Random, order_id: uuid.UUID, lines: tuple[tuple[str, int], ...]
) -> list[Event]:
    if rng.random() < 0.5:
        return [Event(ORDER_CANCELLED, uuid.UUID(int=rng.getrandbits(128), version=4), order_id)]
    cancels = []
    for _ in range(rng.randint(1, 2)):
        chosen = rng.sample(lines, rng.randint(1, len(lines)))
        partial = tuple((sku, rng.randint(1, quantity + 1)) for sku, quantity in chosen)
        cancels.append(
            Event(
                ORDER_CANCELLED, uuid.UUID(int=rng.getrandbits(128), version=4), order_id, partial
            )
        )
    return cancels


async def publish_plan_events(
    connection: aio_pika.abc.AbstractConnection, events: list[Event]
) -> None:
    """Publish ``events`` in their order, each kind to its routing key, confirmed."""
    position = 0
    while position < len(events):
        queue = events[position].queue
        run = []
        while position < len(events) and events[position].queue is queue:
            run.append(OutgoingEvent(events[position].body(), str(events[position].event_id)))
            position += 1
        await publish_events(
            connection, run, exchange=ORDERS_EXCHANGE, routing_key=queue.routing_key
        )


async def in_order_state(
    plan: LifecyclePlan, then: Sequence[RecordShipment] = ()
) -> tuple[dict[str, tuple[int, int]], dict[uuid.UUID, tuple[str, dict[str, int]]]]:
    """Stock and orders after the in-order sequence, then the warehouse's shipments ``then``,
    on the in-memory stock store."""
    stock = FakeStock()
    await stock.put_stock(STOCK)
    for event in plan.in_order:
        body = event.body()
        if event.queue is ORDER_PLACED:
            await stock.apply(OrderPlacedV1.model_validate_json(body).to_command())
        elif event.queue is ORDER_CANCELLED:
            await stock.apply(OrderCancelledV1.model_validate_json(body).to_command())
        else:
            await stock.apply(OrderShippedV1.model_validate_json(body).to_command())
    for shipment in then:
        await stock.apply(shipment)
    on_hand = {sku: (level.on_hand, level.reserved) for sku, level in stock.levels.items()}
    orders = {
        order_id: _held(str(reservation.status), dict(reservation.lines))
        for order_id, reservation in stock.reservations.items()
    }
    return on_hand, orders


def _held(status: str, lines: dict[str, int]) -> tuple[str, dict[str, int]]:
    """What an order amounts to: its lines if it holds or shipped them; else nothing.

    Released and rejected (``cancelled``) orders both hold nothing: which one an order ends as
    depends on whether its whole cancel came before or after it, and is the same stock.
    """
    if status in {OrderStatus.RESERVED, OrderStatus.SHIPPED}:
        return status, lines
    return "holds nothing", {}


async def database_state(
    db: asyncpg.Connection,
) -> tuple[dict[str, tuple[int, int]], dict[uuid.UUID, tuple[str, dict[str, int]]]]:
    stock = {
        row["sku"]: (row["on_hand"], row["reserved"])
        for row in await db.fetch("SELECT sku, on_hand, reserved FROM stock_levels")
    }
    lines: dict[uuid.UUID, dict[str, int]] = {}
    for row in await db.fetch("SELECT order_id, sku, quantity FROM reservation_lines"):
        lines.setdefault(row["order_id"], {})[row["sku"]] = row["quantity"]
    orders = {
        row["order_id"]: _held(row["status"], lines.get(row["order_id"], {}))
        for row in await db.fetch("SELECT order_id, status FROM reservations")
    }
    return stock, orders


@dataclass
class Run:
    """What happened while a plan ran: SIGTERMs, restarts, replays."""

    sigterms: list[int] = field(default_factory=list)
    crashed_in_drain: list[bool] = field(default_factory=list)
    """Per SIGTERM: whether that worker logged an injected crash (``fault.crash``)."""
    restarts: int = 0
    replayed: set[str] = field(default_factory=set)
    """Shipments that overtook their order, were dead-lettered and then replayed."""


async def run_plan(
    plan: LifecyclePlan,
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    *,
    timeout: float = 420,
) -> Run:
    """Publish the plan under crashes and SIGTERMs; return once every event is in the inbox.

    Shipments dead-lettered as ``order_not_reserved`` are replayed (``tools.dlq.replay``, as
    ``fulfilment dlq replay --queue fulfilment.order-shipped --all --yes``) whenever the
    orders' and shipments' queues are empty.
    """
    run = Run()
    total = len(plan.in_order)
    await publish_plan_events(broker, plan.early)
    cluster.start(
        WORKERS,
        FULFILMENT_TEST_CRASH_PLAN=CRASHES,
        FULFILMENT_DELIVERY_LIMIT=DELIVERY_LIMIT,
        FULFILMENT_PREFETCH_COUNT="16",
    )
    rng = random.Random(5)
    audit = create_engine(tool_options(settings).database)
    try:
        started = time.monotonic()
        waves = deque(plan.waves)
        published = sigterms_due = 0
        while await inbox_count(db) < total:
            assert time.monotonic() - started < timeout, (
                f"{await inbox_count(db)} of {total} events processed in {timeout:g} s; "
                f"{await _where_missing(plan, db, settings)}"
            )
            if sigterms_due and (ready := await _ready(cluster)):
                # A ready worker: one still starting has no handler for the signal yet.
                worker = rng.choice(ready)
                code, _ = await asyncio.to_thread(worker.terminate)
                run.sigterms.append(code)
                run.crashed_in_drain.append(
                    any(line.get("event") == "fault.crash" for line in worker.log_lines())
                )
                sigterms_due -= 1
            # No wave while a SIGTERM is due, so every one is sent before the plan runs out.
            if waves and not sigterms_due:
                await publish_plan_events(broker, waves.popleft())
                published += 1
                if published % SIGTERM_EVERY_WAVES == 0:
                    sigterms_due += 1
            run.restarts += cluster.restart_dead()
            if not waves and await _quiet(broker):
                run.replayed |= await _replay_shipments(broker, audit)
            await asyncio.sleep(0.2 if waves else 1.0)
    finally:
        await audit.dispose()
    return run


async def _where_missing(plan: LifecyclePlan, db: asyncpg.Connection, settings: Settings) -> str:
    """The events missing from the inbox (kind and id, a few) and every queue's ready and
    unacknowledged counts in the scenario's vhost, for a run that timed out."""
    processed = {row["event_id"] for row in await db.fetch("SELECT event_id FROM inbox_messages")}
    missing = [event for event in plan.in_order if event.event_id not in processed]
    vhost = (
        urllib.parse.unquote(
            urllib.parse.urlsplit(settings.broker.amqp_url.get_secret_value()).path.lstrip("/")
        )
        or "/"
    )
    queues = await asyncio.to_thread(
        subprocess.run,
        [
            "rabbitmqctl",
            "-q",
            "list_queues",
            "-p",
            vhost,
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "consumers",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    described = ", ".join(f"{event.queue.event} {event.event_id}" for event in missing[:5])
    return (
        f"missing: {described}; queues (ready, unacked, consumers):\n{queues.stdout}{queues.stderr}"
    )


async def _ready(cluster: Cluster) -> list[WorkerProcess]:
    return [worker for worker in cluster.alive() if await asyncio.to_thread(worker.ready)]


async def _quiet(broker: aio_pika.abc.AbstractConnection) -> bool:
    """No order or shipment waits in its queue (the cancels' do not matter to a shipment)."""
    depths = [await queue_depth(broker, queue.name) for queue in (ORDER_PLACED, ORDER_SHIPPED)]
    return not any(depths)


async def _replay_shipments(
    broker: aio_pika.abc.AbstractConnection, audit: AsyncEngine
) -> set[str]:
    """Replay the shipments' DLQ; the event ids replayed."""
    if await queue_depth(broker, ORDER_SHIPPED.dead_letter_queue) == 0:
        return set()
    result = await dlq.replay(
        broker,
        dead_letters.Selection(everything=True),
        audit=audit,
        execute=True,
        rate_per_second=1000,
        operator=Operator("fault suite", "test-host"),
        comment="the orders are placed now",
        queues=[ORDER_SHIPPED.dead_letter_queue],
    )
    return {letter.description.event_id or "" for letter in result.letters}


@dataclass
class Outcome:
    """How a run compares with the in-order sequence (the figures of the Guarantees table)."""

    reconciliation: Reconciliation
    skus_differing: dict[str, tuple[tuple[int, int], tuple[int, int] | None]]
    orders_differing: int
    inbox: Counter[str]

    @property
    def applied_twice(self) -> int:
        """SKUs and orders that differ from the in-order sequence: an event applied twice, or
        lost half-way, would show here."""
        return len(self.skus_differing) + self.orders_differing


async def compare_with_the_in_order_sequence(
    plan: LifecyclePlan,
    db: asyncpg.Connection,
    settings: Settings,
    then: Sequence[RecordShipment] = (),
) -> Outcome:
    """The database against ``plan``'s in-order sequence, then the warehouse's shipments
    ``then`` (for a run in which the warehouse shipped only what no cancel could take back)."""
    reconciliation = await reconcile(
        tool_options(settings), [event.event_id for event in plan.events]
    )
    expected_stock, expected_orders = await in_order_state(plan, then)
    actual_stock, actual_orders = await database_state(db)
    rows = await db.fetch("SELECT outcome, count(*) AS n FROM inbox_messages GROUP BY outcome")
    return Outcome(
        reconciliation,
        {
            sku: (expected, actual_stock.get(sku))
            for sku, expected in expected_stock.items()
            if expected != actual_stock.get(sku)
        },
        sum(
            expected != actual_orders.get(order_id)
            for order_id, expected in expected_orders.items()
        ),
        Counter({row["outcome"]: row["n"] for row in rows}),
    )


def assert_nothing_lost_nor_applied_twice(plan: LifecyclePlan, outcome: Outcome) -> None:
    result = outcome.reconciliation
    assert result.missing == frozenset(), result.describe()
    assert result.twice == frozenset(), result.describe()
    assert result.invariants_hold, result.describe()
    assert result.dead_lettered == 0, result.describe()
    assert result.processed == len(plan.in_order), result.describe()
    assert outcome.skus_differing == {}
    assert outcome.orders_differing == 0


def figures(
    scenario: str, plan: LifecyclePlan, cluster: Cluster, run: Run, outcome: Outcome
) -> None:
    """One row of the Guarantees table; its ``orders`` column counts events of every kind."""
    crashes = _crashes(cluster)
    kind = {str(event.event_id): event.queue.event for event in plan.in_order}
    by_kind = Counter(
        f"{kind.get(line['event_id'], '?')} {line['point']}"
        for line in cluster.log_events("fault.crash")
    )
    tombstoned = outcome.inbox["tombstoned"]
    record_figures(
        scenario,
        f"{plan.count(ORDER_PLACED)} orders on {len(HOT_SKUS)} hot SKUs, "
        f"{plan.count(ORDER_CANCELLED)} cancels ({tombstoned} applied before their order), "
        f"{plan.count(ORDER_SHIPPED)} shipments ({len(run.replayed)} before their order, "
        f"dead-lettered and replayed); 3 workers, {sum(crashes.values())} SIGKILLs at the crash "
        f"points, {len(run.sigterms)} SIGTERMs",
        outcome.reconciliation,
        applied_twice=outcome.applied_twice,
        out_of_order=tombstoned + len(run.replayed),
        kills_by_event=dict(sorted(by_kind.items())),
        sigterm_exits=run.sigterms,
    )


def assert_stopped_cleanly(run: Run) -> None:
    """Each SIGTERM ended in exit 0, unless a crash point killed the worker while it drained
    or just before the signal (-9, with the worker's ``fault.crash`` line: the crash is the
    fault then, its deliveries come back like any crash's); at least one drain was clean."""
    assert len(run.sigterms) >= 3, run.sigterms
    unexplained = [
        code
        for code, crashed in zip(run.sigterms, run.crashed_in_drain, strict=True)
        if code != 0 and not (code == -signal.SIGKILL and crashed)
    ]
    assert unexplained == [], run
    assert 0 in run.sigterms, run.sigterms


async def _prepare(db: asyncpg.Connection, amqp_url: str) -> None:
    await put_stock(db, STOCK)
    await declare(amqp_url, int(DELIVERY_LIMIT))


def _crashes(cluster: Cluster) -> Counter[str]:
    return Counter(line["point"] for line in cluster.log_events("fault.crash"))


async def test_cancels_before_and_after_their_orders_under_kill_9_and_sigterm_lose_nothing(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    plan = lifecycle_plan(600, cancelled=0.6, shipped=0.15, early=0.5, lag=0, seed=17)
    await _prepare(db, amqp_url)

    run = await run_plan(plan, cluster, db, broker, settings)

    outcome = await compare_with_the_in_order_sequence(plan, db, settings)
    figures("cancels interleaved with orders (order-cancelled)", plan, cluster, run, outcome)
    assert_nothing_lost_nor_applied_twice(plan, outcome)
    await assert_outbox_tells_the_lifecycle(
        db, placed=plan.count(ORDER_PLACED), shipped=plan.count(ORDER_SHIPPED)
    )
    assert outcome.inbox["tombstoned"] > 0  # cancels did come before their orders
    assert sum(_crashes(cluster).values()) >= 3, _crashes(cluster)
    assert_stopped_cleanly(run)


async def test_shipments_racing_their_orders_under_kill_9_and_sigterm_lose_nothing(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    plan = lifecycle_plan(600, cancelled=0.2, shipped=0.6, early=0.5, lag=1, seed=23)
    await _prepare(db, amqp_url)

    run = await run_plan(plan, cluster, db, broker, settings)

    outcome = await compare_with_the_in_order_sequence(plan, db, settings)
    figures("shipments interleaved with orders (order-shipped)", plan, cluster, run, outcome)
    assert_nothing_lost_nor_applied_twice(plan, outcome)
    await assert_outbox_tells_the_lifecycle(
        db, placed=plan.count(ORDER_PLACED), shipped=plan.count(ORDER_SHIPPED)
    )
    shipped = await db.fetchval("SELECT count(*) FROM reservations WHERE status = 'shipped'")
    assert shipped == outcome.inbox["shipped"] == plan.count(ORDER_SHIPPED)
    assert sum(_crashes(cluster).values()) >= 3, _crashes(cluster)
    assert_stopped_cleanly(run)


def test_the_plans_cover_what_the_scenarios_claim() -> None:
    plan = lifecycle_plan(600, cancelled=0.6, shipped=0.15, early=0.5, lag=1, seed=17)
    kinds = Counter(event.queue.event for event in plan.in_order)
    assert kinds["order_placed"] == 600
    assert kinds["order_cancelled"] > 300
    assert kinds["order_shipped"] > 50
    assert len(plan.early) > 100
    assert any(event.lines is None for event in plan.early)  # whole cancels first
    assert any(event.lines is not None for event in plan.early)  # partial ones too
    assert sorted(map(id, plan.events)) == sorted(map(id, plan.in_order))
    assert {event.queue for event in plan.events} == set(SUBSCRIBED_QUEUES)
    assert DEAD_LETTER_QUEUES  # every DLQ is read by the reconciliation
