"""The return path under faults: the warehouse's webhooks and the poll while the intake, a
worker and the dispatcher are killed with SIGKILL, with the shop's cancels and upstream
shipments in the mix.

Real processes throughout: two ``fulfilment worker``, a ``fulfilment relay``, a ``fulfilment
dispatcher`` polling every few seconds, two ``fulfilment webhooks`` replicas behind a
round-robin (``return_path.RoundRobin``, the one URL the warehouse sends to), and the warehouse
simulator shipping in several shipments, cancelling some units of its own, and sending signed
webhooks with its faults on: duplicates, resends under a new id, reordering, webhooks never
sent, attempts with a wrong secret or a stale timestamp. Once the simulator has settled and
every change it made is recorded, the run is counted against the simulator's record
(``return_path.return_path_figures``) and its row appended to the fault table.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.e2e.harness import put_stock
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take_events
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    cancel,
    ship,
    start_dispatcher,
    warehouse_env,
)
from tests.faults.faultlib import Cluster, Order, declare, publish, synthetic_orders
from tests.faults.return_path import (
    Intakes,
    RoundRobin,
    record_return_path_figures,
    return_path_figures,
    settle,
    simulator_options,
    wait_until_delivered,
)
from tests.support.webhooks import SECRET, WEBHOOK_PATH

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ORDERS = int(os.environ.get("FULFILMENT_TEST_RETURN_PATH_ORDERS", "240"))
"""Orders of the burst (8 waves); each ships in 1 to 3 shipments."""

WAVES = 8
LOADED = {f"SKU{index:03d}": 10_000 for index in range(40)}
"""The units of each SKU before the run: more than the orders take, so nothing is rejected."""

RECONCILE_AFTER_SECONDS = 3
"""The poll's interval: an order with no news for this long is asked about."""

SETTLE_SECONDS = 150.0
"""Longest wait for the warehouse to settle and the service to record all it made."""


def order_id(order: Order) -> uuid.UUID:
    """The order id ``faultlib.Order.event`` gives ``order``."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(order.event_id))


async def reserved_orders(db: asyncpg.Connection, orders: list[Order]) -> list[Order]:
    rows = await db.fetch(
        "SELECT order_id FROM reservations WHERE status = 'reserved' AND order_id = ANY($1)",
        [order_id(order) for order in orders],
    )
    held = {row["order_id"] for row in rows}
    return [order for order in orders if order_id(order) in held]


async def test_the_return_path_under_kill_9_applies_every_answered_webhook_once(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    dispatchers: list[DispatcherProcess],
    relays: list[RelayProcess],
    balancer: RoundRobin,
    amqp_url: str,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    rng = random.Random(61)
    orders = synthetic_orders(ORDERS, seed=62)
    await put_stock(db, LOADED)
    await declare(amqp_url, 20)
    simulator = SimulatorProcess(
        tmp_path / "simulator.log",
        options=simulator_options(f"http://127.0.0.1:{balancer.port}{WEBHOOK_PATH}"),
    )
    simulator.start()
    intakes: Intakes | None = None
    try:
        env = warehouse_env(
            simulator,
            FULFILMENT_DELIVERY_LIMIT="20",
            FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS="3",
            FULFILMENT_WAREHOUSE_RATE_PER_SECOND="100",
            FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS=str(RECONCILE_AFTER_SECONDS),
        )
        cluster.env.update(env)
        intakes = Intakes(
            {
                **cluster.env,
                "FULFILMENT_HTTP_HOST": "127.0.0.1",
                "FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS": SECRET,
            },
            tmp_path,
            balancer=balancer,
        )
        # Bound to every key: the relay holds back an event no queue takes (mandatory).
        events = await bind_events_queue(broker)
        await asyncio.gather(*(asyncio.to_thread(intakes.start, i) for i in range(2)))
        spawn_relay(relays, cluster.env, tmp_path)
        cluster.start(2)
        start_dispatcher(dispatchers, cluster.env, tmp_path)

        extra_events = await run_the_burst(
            cluster, db, broker, dispatchers, intakes, simulator, orders, rng, tmp_path
        )
        burst_seconds = time.monotonic() - started
        shipped_upstream = await settle(
            cluster,
            db,
            broker,
            simulator,
            intakes,
            expected=len(orders) + extra_events,
            timeout=SETTLE_SECONDS,
        )
        record = await asyncio.to_thread(simulator.record)
        outbox_ids = {
            str(row["event_id"])
            for row in await db.fetch(
                "SELECT event_id FROM outbox"
                " WHERE routing_key IN ('stock.shipped', 'stock.released')"
            )
        }
        on_the_bus = await take_events(events, outbox_ids, timeout=60)
        figures = await return_path_figures(
            db,
            record,
            loaded=LOADED,
            published={uuid.UUID(event_id) for event_id in on_the_bus},
        )
        held = await db.fetchval(
            "SELECT count(DISTINCT r.order_id) FROM reservations r JOIN reservation_lines l"
            " USING (order_id) WHERE r.status = 'reserved' AND l.quantity > l.shipped"
        )
        answers = intakes.answers()
    finally:
        if intakes is not None:
            intakes.stop()
        simulator.stop()

    assert figures.faults() == dict.fromkeys(figures.faults(), 0), figures
    # Every order settled: the warehouse shipped or cancelled all it held, or the shop did.
    assert held == 0
    # The faults happened: a run without them would prove nothing.
    assert figures.found_by_poll > 0, figures
    assert figures.refused_attempts > 0, figures
    assert figures.failed_attempts > 0, figures  # the killed replicas left attempts unanswered
    assert figures.duplicates > 0, figures
    assert min(answers) > 0, answers  # both replicas served
    record_return_path_figures(
        "return path: webhooks and the poll under kill -9",
        f"SIGKILL of each intake replica during the burst ({intakes.kills} kills, each"
        " restarted), of a worker and of the dispatcher; webhooks duplicated, resent, reordered,"
        " never sent (found by the poll), signed wrong or stale; shop cancels and upstream"
        " OrderShipped in the mix",
        figures,
        orders=len(orders),
        answers_per_replica=answers,
        upstream_shipped=shipped_upstream,
        seconds=round(time.monotonic() - started, 1),
        burst_seconds=round(burst_seconds, 1),
    )


async def run_the_burst(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    dispatchers: list[DispatcherProcess],
    intakes: Intakes,
    simulator: SimulatorProcess,
    orders: list[Order],
    rng: random.Random,
    tmp_path: Path,
) -> int:
    """Publish the orders in waves with cancels and upstream ships behind them, and kill:
    intake replica 0 once webhooks flow, a worker, the dispatcher, then replica 1. Return the
    cancels and ships published."""
    size = len(orders) // WAVES
    extra_events = 0
    for wave in range(WAVES):
        batch = orders[wave * size : (wave + 1) * size]
        await publish(broker, batch)
        await asyncio.sleep(rng.uniform(0.4, 0.8))
        for order in rng.sample(batch, size // 6):
            whole = rng.random() < 0.5
            await cancel(broker, order_id(order), None if whole else [(order.lines[0][0], 1)])
            extra_events += 1
        # Upstream ships of orders reserved earlier: some before the warehouse's shipments,
        # some between them, some after.
        earlier = await reserved_orders(db, orders[: wave * size])
        for order in rng.sample(earlier, min(len(earlier), 3)):
            await ship(broker, order_id(order))
            extra_events += 1
        if wave == 1:
            await wait_until_delivered(simulator, 20)
            await intakes.kill_while_answering(0)
        elif wave == 2:
            await asyncio.to_thread(intakes.start, 0)
            rng.choice(cluster.alive()).kill()
            cluster.restart_dead()
        elif wave == 4:
            dispatchers[-1].kill()
            await asyncio.sleep(0.5)
            start_dispatcher(dispatchers, cluster.env, tmp_path)
        elif wave == 5:
            await intakes.kill_while_answering(1)
        elif wave == 6:
            await asyncio.to_thread(intakes.start, 1)
    return extra_events
