"""The broker restarts, drops the worker's connection, or cancels its consumer under load."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.parse

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import ORDER_PLACED, ORDER_PLACED_QUEUE
from fulfilment.settings import Settings
from fulfilment.worker.topology import INITIAL_GROUP_SIZE, Topology
from tests.e2e.harness import WorkerProcess, put_stock
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    assert_reconciled,
    declare,
    publish,
    record_figures,
    run_until_settled,
    synthetic_orders,
    wait_until_processing,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ORDERS = 1_500


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


def vhost_of(amqp_url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(amqp_url).path.lstrip("/")) or "/"


async def test_a_broker_restart_under_load_loses_nothing_and_applies_nothing_twice(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=21)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    cluster.start(1, wait_ready=True)
    await wait_until_processing(db)

    await asyncio.to_thread(rabbitmqctl, "stop_app")
    await asyncio.sleep(2)
    await asyncio.to_thread(rabbitmqctl, "start_app")
    await asyncio.to_thread(rabbitmqctl, "await_startup")
    resumed_at = time.monotonic()

    async with await aio_pika.connect(amqp_url) as fresh:  # the fixture's is still reconnecting
        restarts = await run_until_settled(cluster, db, fresh, ORDERS, timeout=120)
    assert time.monotonic() - resumed_at < 120
    result = await assert_reconciled(settings, orders)
    record_figures(
        "broker restart",
        f"rabbitmqctl stop_app / start_app under load ({restarts} worker restarts)",
        result,
    )


async def test_a_force_closed_connection_is_recovered_and_loses_nothing(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=22)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    cluster.start(1, wait_ready=True)
    await wait_until_processing(db)

    vhost = vhost_of(amqp_url)
    listing = await asyncio.to_thread(rabbitmqctl, "list_connections", "pid", "vhost")
    closed = 0
    for line in listing.splitlines():
        pid, _, where = line.partition("\t")
        if where == vhost:
            await asyncio.to_thread(rabbitmqctl, "close_connection", pid, "fault suite")
            closed += 1
    assert closed >= 1

    async with await aio_pika.connect(amqp_url) as fresh:  # the test's own was closed too
        restarts = await run_until_settled(cluster, db, fresh, ORDERS, timeout=120)
    result = await assert_reconciled(settings, orders)
    record_figures(
        "connection force-closed",
        f"rabbitmqctl close_connection on {closed} connections ({restarts} worker restarts)",
        result,
    )


async def test_a_consumer_cancelled_by_the_broker_comes_back_within_30_seconds(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    await declare(amqp_url, LIMIT)
    (worker,) = cluster.start(1, wait_ready=True)

    # Deleting the queue makes the broker cancel its consumer (basic.cancel to the worker);
    # aio-pika's robust channel declares the queue again and consumes from it.
    channel = await broker.channel()
    await channel.queue_delete(ORDER_PLACED_QUEUE)
    await channel.close()
    cancelled_at = time.monotonic()
    await asyncio.sleep(0.5)
    assert not worker.ready(), "readiness must say the consumer is gone"
    await _ready_within(worker, 30)
    resumed = time.monotonic() - cancelled_at

    orders = synthetic_orders(200, seed=23)
    await publish(broker, orders)
    await run_until_settled(cluster, db, broker, len(orders), timeout=60, restart=False)
    assert worker.process is not None
    assert worker.process.poll() is None
    result = await assert_reconciled(settings, orders)
    record_figures(
        "consumer cancelled by the broker",
        f"queue deleted under the consumer; it was back in {resumed:.1f} s",
        result,
    )


async def test_a_queue_created_before_the_group_size_setting_is_consumed_and_comes_back(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
) -> None:
    # The main queue as a release before FULFILMENT_QUORUM_INITIAL_GROUP_SIZE declared it.
    await put_stock(db, AMPLE_STOCK)
    arguments = dict(Topology(LIMIT).queue(ORDER_PLACED).arguments or {})
    del arguments[INITIAL_GROUP_SIZE]
    channel = await broker.channel()
    await channel.declare_queue(ORDER_PLACED_QUEUE, durable=True, arguments=arguments)
    await channel.close()

    (worker,) = cluster.start(1, wait_ready=True)
    assert any(
        line.get("event") == "topology.initial_group_size_kept" for line in worker.log_lines()
    )
    # aio-pika declares the queue again, with what the broker accepted at start, when the
    # broker cancels the consumer: the consumer comes back on the queue the worker kept.
    channel = await broker.channel()
    await channel.queue_delete(ORDER_PLACED_QUEUE)
    await channel.close()
    await asyncio.sleep(0.5)
    await _ready_within(worker, 30)

    orders = synthetic_orders(200, seed=24)
    await publish(broker, orders)
    await run_until_settled(cluster, db, broker, len(orders), timeout=60, restart=False)
    assert worker.process is not None
    assert worker.process.poll() is None
    await assert_reconciled(settings, orders)


async def test_a_consumer_that_cannot_come_back_makes_the_worker_exit_1(
    cluster: Cluster,
    broker: aio_pika.abc.AbstractRobustConnection,
    amqp_url: str,
) -> None:
    await declare(amqp_url, LIMIT)
    (worker,) = cluster.start(1, wait_ready=True, FULFILMENT_CONSUMER_LOST_EXIT_SECONDS="5")

    # Someone replaces the queue with a classic one: the robust channel cannot declare it
    # again with the service's arguments, so the consumer stays gone.
    channel = await broker.channel()
    await channel.queue_delete(ORDER_PLACED_QUEUE)
    await channel.declare_queue(
        ORDER_PLACED_QUEUE, durable=True, arguments={"x-queue-type": "classic"}
    )
    await channel.close()
    cancelled_at = time.monotonic()

    assert worker.process is not None
    code = await asyncio.to_thread(worker.process.wait, 60)
    assert code == 1
    assert time.monotonic() - cancelled_at < 30
    assert any(line.get("event") == "consumer.lost" for line in worker.log_lines())


async def _ready_within(worker: WorkerProcess, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await asyncio.to_thread(worker.ready):
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"the worker's consumer did not come back within {seconds:g} s")
