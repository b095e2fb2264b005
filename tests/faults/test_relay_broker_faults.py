"""The broker goes away under the relay for about 30 s: nothing is lost, order holds.

This restarts the machine's RabbitMQ (``rabbitmqctl stop_app``): run it only with the fault
suite (``make test-faults``), never beside other test sessions.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import EVENTS_EXCHANGE
from fulfilment.settings import Settings
from tests.e2e.harness import put_stock, wait_for
from tests.e2e.relay_harness import (
    OutboxEvent,
    RelayProcess,
    assert_in_order_per_order,
    insert_outbox,
    lifecycle_rows,
    spawn_relay,
    take,
    unpublished,
)
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    assert_outbox_tells_the_lifecycle,
    assert_reconciled,
    declare,
    publish,
    record_figures,
    run_until_settled,
    synthetic_orders,
    wait_until_processing,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

OUTAGE_SECONDS = 30
ORDERS = 1_500


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


async def test_the_broker_down_for_30_seconds_under_the_relay_loses_no_event_and_keeps_order(
    relays: list[RelayProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    amqp_url: str,
    db: asyncpg.Connection,
) -> None:
    # A durable queue with persistent messages: what was published before the outage stays.
    queue_name = f"relay-outage-{uuid.uuid4().hex[:8]}"
    async with await aio_pika.connect(amqp_url) as setup:
        channel = await setup.channel()
        exchange = await channel.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(queue_name, durable=True)
        await queue.bind(exchange, "#")
    relay = spawn_relay(relays, {**worker_env, "FULFILMENT_RELAY_POLL_SECONDS": "0.2"}, tmp_path)
    before = await insert_outbox(db, lifecycle_rows(20))

    async def before_published() -> bool:
        return await unpublished(db) == 0

    await wait_for(before_published, what="the rows before the outage published")

    await asyncio.to_thread(rabbitmqctl, "stop_app")
    try:
        during = await insert_outbox(db, lifecycle_rows(20))
        await asyncio.sleep(OUTAGE_SECONDS)
        assert await unpublished(db) == len(during)  # nothing marked without a confirm
        assert relay.process is not None
        assert relay.process.poll() is None  # the relay waits for the broker, it does not exit
    finally:
        await asyncio.to_thread(rabbitmqctl, "start_app")
        await asyncio.to_thread(rabbitmqctl, "await_startup")
    after = await insert_outbox(db, lifecycle_rows(20))

    await wait_for(before_published, timeout=120, what="every row published after the outage")
    events = before + during + after
    async with await aio_pika.connect(amqp_url) as fresh:
        channel = await fresh.channel()
        queue = await channel.get_queue(queue_name)
        messages = await take(queue, len(events))
        # A publish in flight when the broker stopped may arrive twice: with its event_id.
        while (extra := await queue.get(fail=False, no_ack=True)) is not None:
            messages.append(extra)
        assert_in_order_per_order(messages, events)
        await queue.delete()
    assert relay.readiness().get("role") == "active"


async def test_the_broker_down_for_30_seconds_under_a_worker_and_a_relay_loses_no_result_event(
    cluster: Cluster,
    relays: list[RelayProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=25)
    await declare(amqp_url, LIMIT)
    # A consumer's durable queue: what reached it before the outage stays through it.
    queue_name = f"result-events-{uuid.uuid4().hex[:8]}"
    async with await aio_pika.connect(amqp_url) as setup:
        channel = await setup.channel()
        exchange = await channel.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(queue_name, durable=True)
        await queue.bind(exchange, "#")
    await publish(broker, orders)
    cluster.start(1, wait_ready=True)
    relay = spawn_relay(relays, {**worker_env, "FULFILMENT_RELAY_POLL_SECONDS": "0.2"}, tmp_path)
    await wait_until_processing(db)

    stopped_at = await db.fetchval("SELECT now()")
    await asyncio.to_thread(rabbitmqctl, "stop_app")
    try:
        await asyncio.sleep(OUTAGE_SECONDS)
        # Deliveries the worker held when the broker went away were still applied; their
        # result events wait in the outbox: none is marked without a confirm (a confirm in
        # flight at the stop may be marked a moment later).
        waiting = await unpublished(db)
        marked_during = await db.fetchval(
            "SELECT count(*) FROM outbox"
            " WHERE published_at > $1::timestamptz + interval '5 seconds'",
            stopped_at,
        )
        assert marked_during == 0
        assert relay.process is not None
        assert relay.process.poll() is None  # the relay waits for the broker, it does not exit
    finally:
        await asyncio.to_thread(rabbitmqctl, "start_app")
        await asyncio.to_thread(rabbitmqctl, "await_startup")

    async with await aio_pika.connect(amqp_url) as fresh:
        restarts = await run_until_settled(cluster, db, fresh, ORDERS, timeout=180)

        async def outbox_drained() -> bool:
            return await unpublished(db) == 0

        await wait_for(outbox_drained, timeout=120, what="the outbox drained after the outage")
        result = await assert_reconciled(settings, orders)
        written = await assert_outbox_tells_the_lifecycle(db, placed=ORDERS)
        rows = await db.fetch("SELECT event_id, order_id, routing_key FROM outbox ORDER BY id")
        events = [
            OutboxEvent(row["event_id"], row["order_id"], row["routing_key"], {}, None)
            for row in rows
        ]
        channel = await fresh.channel()
        queue = await channel.get_queue(queue_name)
        messages = await take(queue, len(events))
        # A publish in flight when the broker stopped may arrive twice: with its event_id.
        while (extra := await queue.get(fail=False, no_ack=True)) is not None:
            messages.append(extra)
        assert_in_order_per_order(messages, events)
        await queue.delete()
    record_figures(
        "broker down 30 s under a worker and the relay",
        f"rabbitmqctl stop_app for {OUTAGE_SECONDS} s while orders drain ({restarts} worker "
        f"restarts); {waiting} result events waited in the outbox",
        result,
        result_events=dict(sorted(written.items())),
        result_events_received=len(messages),
        result_events_duplicated=len(messages) - len(events),
    )
