"""SIGTERM again and again; duplicates and races across worker processes; contention on real
orders; a queue that exists with other arguments."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.topology import ORDER_PLACED_QUEUE
from fulfilment.dataset.online_retail import csv_files, read_orders
from fulfilment.dataset.stock_plan import total_demand
from fulfilment.settings import Settings
from tests.e2e.harness import FAST_SETTINGS, free_port, put_stock
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    Order,
    assert_reconciled,
    declare,
    publish,
    record_figures,
    run_until_settled,
    synthetic_orders,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

GRACEFUL = float(FAST_SETTINGS["FULFILMENT_GRACEFUL_TIMEOUT_SECONDS"])
SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"


async def test_repeated_sigterm_under_load_finishes_in_flight_work_and_spends_no_attempt(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    # Enough for at least three stops while the backlog drains, also on an idle machine.
    orders = synthetic_orders(10_000, seed=41)
    await put_stock(db, AMPLE_STOCK)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    stops: list[tuple[int, float]] = []
    for _ in range(5):
        (worker,) = cluster.start(1, wait_ready=True)
        await asyncio.sleep(0.4)
        stops.append(await asyncio.to_thread(worker.terminate))
        if int(await db.fetchval("SELECT count(*) FROM inbox_messages")) >= len(orders):
            break
    cluster.start(1, wait_ready=True)
    await run_until_settled(cluster, db, broker, len(orders), restart=False)

    assert len(stops) >= 3
    assert all(code == 0 for code, _ in stops), stops
    assert max(seconds for _, seconds in stops) < GRACEFUL + 2, stops
    # Every delivery was handled exactly once: in-flight ones finished before the exit, and
    # the consumer was cancelled before the drain, so none was dropped unhandled. A quorum
    # queue on RabbitMQ 3.10 still returns, marked redelivered, the few messages it had
    # assigned to the consumer but not yet sent when the cancel arrived: at most the prefetch
    # per stop, each returned once (4.3+ no longer counts such returns).
    handled = cluster.log_events("order_placed.handled")
    assert len(handled) == len(orders)
    returned = [line for line in handled if line["redelivered"]]
    prefetch = int(FAST_SETTINGS["FULFILMENT_PREFETCH_COUNT"])
    assert len(returned) <= prefetch * len(stops)
    assert all(line["delivery_count"] <= 1 for line in returned)
    assert all(line["outcome"] != "duplicate:event" for line in returned)
    result = await assert_reconciled(settings, orders)
    record_figures(
        "repeated SIGTERM under load",
        f"{len(stops)} graceful stops, slowest {max(s for _, s in stops):.1f} s; "
        f"{len(returned)} unsent messages returned by the queue on cancel, none handled twice",
        result,
    )


async def test_the_same_events_published_many_times_to_several_workers_reserve_once(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(100, seed=42)
    await declare(amqp_url, LIMIT)
    cluster.start(3, wait_ready=True, FULFILMENT_PREFETCH_COUNT="64")
    copies = 10
    events = [order.event() for order in orders]
    # Half of the copies carry no AMQP message id: the event id in the body is the key.
    anonymous = [OutgoingEvent(event.body, "") for event in events]
    await asyncio.gather(*(publish(broker, events if n % 2 else anonymous) for n in range(copies)))

    await _wait_handled(cluster, len(orders) * copies)
    outcomes = [line["outcome"] for line in cluster.log_events("order_placed.handled")]
    assert outcomes.count("reserved") == len(orders)
    assert outcomes.count("duplicate:event") == len(orders) * (copies - 1)
    result = await assert_reconciled(settings, orders)
    record_figures(
        "duplicates across 3 workers",
        f"each event published {copies} times at once, half without a message id",
        result,
    )


async def test_an_order_placed_again_under_a_new_event_id_is_a_duplicate_of_the_order(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    amqp_url: str,
) -> None:
    await put_stock(db, {"SKU001": 10})
    await declare(amqp_url, LIMIT)
    cluster.start(2, wait_ready=True)
    order_id = uuid.uuid4()
    bodies = [
        order_placed_body(
            event_id=uuid.uuid4(),
            order_id=order_id,
            placed_at=datetime.now(UTC),
            lines=[("SKU001", 2)],
        )
        for _ in range(5)
    ]
    await publish(broker, [OutgoingEvent(body, "") for body in bodies])

    await _wait_handled(cluster, 5)
    outcomes = sorted(line["outcome"] for line in cluster.log_events("order_placed.handled"))
    assert outcomes == ["duplicate:order"] * 4 + ["reserved"]
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = 'SKU001'") == 2
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 5


async def test_several_workers_on_real_orders_sharing_hot_skus_never_deadlock_or_oversell(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    data = Path(os.environ.get("FULFILMENT_TEST_ONLINE_RETAIL_DIR", SAMPLE))
    read = read_orders(csv_files(data))
    demand = total_demand(read.orders)
    # Two thirds of what the orders want: the hottest SKUs run out while many workers race.
    await put_stock(db, {sku: units * 2 // 3 for sku, units in demand.items()})
    await declare(amqp_url, LIMIT)
    await publish(broker, [OutgoingEvent(o.body(), str(o.event_id)) for o in read.orders])
    started = time.monotonic()
    cluster.start(3, wait_ready=True, FULFILMENT_PREFETCH_COUNT="64")

    await run_until_settled(cluster, db, broker, len(read.orders), restart=False)
    elapsed = time.monotonic() - started
    orders = [Order(o.event_id, o.lines) for o in read.orders]
    result = await assert_reconciled(settings, orders)
    rejected = await db.fetchval("SELECT count(*) FROM reservations WHERE status = 'rejected'")
    assert rejected > 0, "the stock was meant to run out"
    assert cluster.log_events("order_placed.requeued") == []
    record_figures(
        "contention on real orders",
        f"3 workers x prefetch 64 on {len(read.orders)} real orders, stock at 2/3 of demand "
        f"({rejected} rejected, {elapsed:.1f} s)",
        result,
    )


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"x-queue-type": "quorum", "x-delivery-limit": LIMIT}, "x-dead-letter-exchange"),
        (
            {
                "x-queue-type": "quorum",
                "x-delivery-limit": LIMIT + 1,
                "x-dead-letter-exchange": "fulfilment.dlx",
                "x-dead-letter-routing-key": ORDER_PLACED_QUEUE,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
            "x-delivery-limit",
        ),
        ({"x-queue-type": "classic"}, "x-"),
    ],
    ids=["no-dead-letter-exchange", "other-delivery-limit", "classic-queue"],
)
async def test_a_queue_with_other_arguments_stops_the_start_with_one_line(
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    arguments: dict[str, object],
    named: str,
) -> None:
    channel = await broker.channel()
    await channel.declare_queue(ORDER_PLACED_QUEUE, durable=True, arguments=arguments)
    await channel.close()
    env = {**worker_env, "FULFILMENT_HTTP_PORT": str(free_port())}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fulfilment", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 1
    assert time.monotonic() - started < 30, "it must refuse, not crash-loop"
    lines = [line for line in stderr.decode().splitlines() if "topology_mismatch" in line]
    assert len(lines) == 1
    assert f"queue '{ORDER_PLACED_QUEUE}' exists with {named}" in lines[0]
    assert "the service expects" in lines[0]


async def _wait_handled(cluster: Cluster, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(cluster.log_events("order_placed.handled")) < count:
        assert time.monotonic() < deadline, "not every delivery was handled in time"
        await asyncio.sleep(0.3)
