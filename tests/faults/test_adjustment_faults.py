"""The warehouse's adjustments of hot SKUs under faults: receipts, damages, losses and counts
arriving while two workers reserve the same SKUs, with the intake's replicas and a worker
killed with SIGKILL.

Real processes throughout, as in ``test_return_path_faults.py``: two ``fulfilment worker``, a
``fulfilment relay``, a ``fulfilment dispatcher`` handing the reserved orders to the warehouse
simulator and polling those with no news, and two ``fulfilment webhooks`` replicas behind a
round-robin (``return_path.RoundRobin``). A handful of SKUs, loaded with few units at the
service and on the simulator's shelves alike, take every order. The simulator ships what it
has on its shelves and cancels the rest, and adjusts its shelves at rate knobs: receipts and
returns, damages and losses (a loss of units that orders hold leaves the SKU short at the
service), counts either way; each a signed ``inventory.adjusted`` webhook with the fault knobs
on (duplicates, resends under a new id, reordering, webhooks never sent, wrong secrets, stale
timestamps). Once all settled, the run is counted against the simulator's record and the
outbox replayed per SKU (``return_path.adjustment_figures``), and its row appended to the fault
table.
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

from fulfilment.settings import Settings
from tests.e2e.harness import put_stock
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take_events
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    start_dispatcher,
    warehouse_env,
)
from tests.faults.faultlib import (
    Cluster,
    Order,
    assert_reconciled,
    declare,
    publish,
    synthetic_orders,
    synthetic_sku,
)
from tests.faults.return_path import (
    Intakes,
    RoundRobin,
    adjustment_figures,
    orders_holding_nothing,
    record_return_path_figures,
    settle,
    simulator_options,
    wait_until_delivered,
)
from tests.support.webhooks import SECRET, WEBHOOK_PATH

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ORDERS = int(os.environ.get("FULFILMENT_TEST_ADJUSTMENT_ORDERS", "240"))
"""Orders of the burst (8 waves), each of 1 to 3 lines of the hot SKUs."""

WAVES = 8
HOT_SKUS = 4
LOADED = {synthetic_sku(index): 30 for index in range(HOT_SKUS)}
"""The units of each hot SKU before the run, at the service and on the warehouse's shelves:
far fewer than the orders ask for, so that receipts decide what is reserved, and a loss
often takes units that orders hold."""

ADJUSTMENT_RATES = {
    "receipts_per_second": 8,
    "returns_per_second": 1,
    "damages_per_second": 2,
    "losses_per_second": 2,
    "counts_per_second": 2,
}
"""The warehouse's adjustments of its shelves a second during the burst, of 1 to
``ADJUSTMENT_MAX_UNITS`` units each (a count either way)."""

ADJUSTMENT_MAX_UNITS = 8

RECONCILE_AFTER_SECONDS = 3
"""The poll's interval: an order with no news for this long is asked about."""

SETTLE_SECONDS = 90.0
"""Longest wait for the warehouse to settle and the service to record all it made."""


async def test_adjustments_of_hot_skus_under_kill_9_apply_once_and_never_reserve_short(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    dispatchers: list[DispatcherProcess],
    relays: list[RelayProcess],
    balancer: RoundRobin,
    settings: Settings,
    amqp_url: str,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    rng = random.Random(37)
    orders = synthetic_orders(ORDERS, skus=HOT_SKUS, seed=38)
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

        await asyncio.to_thread(
            simulator.faults, **ADJUSTMENT_RATES, adjustment_max_units=ADJUSTMENT_MAX_UNITS
        )
        await asyncio.to_thread(simulator.load_stock, LOADED)
        worker_kills = await run_the_burst(cluster, intakes, simulator, broker, orders, rng)
        # The warehouse stops adjusting, so that it can settle.
        await asyncio.to_thread(simulator.faults, **dict.fromkeys(ADJUSTMENT_RATES, 0))
        burst_seconds = time.monotonic() - started
        await settle(
            cluster,
            db,
            broker,
            simulator,
            intakes,
            expected=len(orders),
            timeout=SETTLE_SECONDS,
            holding_nothing=orders_holding_nothing,
        )
        record = await asyncio.to_thread(simulator.record)
        outbox_ids = {str(row["event_id"]) for row in await db.fetch("SELECT event_id FROM outbox")}
        on_the_bus = await take_events(events, outbox_ids, timeout=60)
        figures = await adjustment_figures(
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
    # The product's own reconciliation: every order processed once, its invariants hold.
    await assert_reconciled(settings, orders)
    # Every order settled: the warehouse shipped or cancelled all it held.
    assert held == 0
    # The faults happened: a run without them would prove nothing.
    assert intakes.kills == 2, intakes.kills
    assert worker_kills == 1, worker_kills
    assert figures.failed_attempts > 0, figures  # the killed replicas left attempts unanswered
    assert figures.duplicates > 0, figures
    assert figures.never_sent > 0, figures
    assert figures.short_spells > 0, figures  # a loss left a SKU short
    assert figures.rejected_while_short > 0, figures  # and orders came while it was
    assert figures.reserved_orders > 0, figures
    assert figures.rejected_orders > 0, figures
    assert min(answers) > 0, answers  # both replicas served
    record_return_path_figures(
        "adjustments of hot SKUs under kill -9",
        f"{HOT_SKUS} hot SKUs reserved by 2 workers while the warehouse adjusts them"
        f" ({sum(ADJUSTMENT_RATES.values())}/s: receipts, returns, damages, losses, counts);"
        " SIGKILL of each intake replica during a request"
        f" ({intakes.kills} kills, each restarted) and of a worker; webhooks duplicated, resent,"
        " reordered, never sent, signed wrong or stale",
        figures,
        orders=len(orders),
        answers_per_replica=answers,
        seconds=round(time.monotonic() - started, 1),
        burst_seconds=round(burst_seconds, 1),
    )


async def run_the_burst(
    cluster: Cluster,
    intakes: Intakes,
    simulator: SimulatorProcess,
    broker: aio_pika.abc.AbstractRobustConnection,
    orders: list[Order],
    rng: random.Random,
) -> int:
    """Publish the orders in waves while the warehouse adjusts, and kill: intake replica 0
    once webhooks flow, a worker, then replica 1, each restarted a wave later. Return the
    workers killed."""
    size = len(orders) // WAVES
    worker_kills = 0
    for wave in range(WAVES):
        await publish(broker, orders[wave * size : (wave + 1) * size])
        await asyncio.sleep(rng.uniform(0.8, 1.2))
        if wave == 1:
            await wait_until_delivered(simulator, 20)
            await intakes.kill_while_answering(0)
        elif wave == 2:
            await asyncio.to_thread(intakes.start, 0)
            rng.choice(cluster.alive()).kill()
            worker_kills += 1
            cluster.restart_dead()
        elif wave == 5:
            await intakes.kill_while_answering(1)
        elif wave == 6:
            await asyncio.to_thread(intakes.start, 1)
    return worker_kills
