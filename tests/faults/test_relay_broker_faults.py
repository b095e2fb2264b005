"""The broker goes away under the relay for about 30 s: nothing is lost, order holds.

This restarts the machine's RabbitMQ (``rabbitmqctl stop_app``): run it only with the fault
suite (``make test-faults``), never beside other test sessions.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from harness import wait_for
from relay_harness import (
    RelayProcess,
    assert_in_order_per_order,
    insert_outbox,
    lifecycle_rows,
    spawn_relay,
    take,
    unpublished,
)

from fulfilment.contracts.topology import RESULT_EVENTS_EXCHANGE

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

OUTAGE_SECONDS = 30


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


@pytest.fixture
def relays() -> Iterator[list[RelayProcess]]:
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        relay.stop_quietly()


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
            RESULT_EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
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
