"""The queue poll of the worker's monitors against the real RabbitMQ: every queue of the topology.

One poll (``worker.monitors.poll_once``) sets the depth and consumers of every subscribed queue
and of every DLQ, and the age of the oldest dead letter among the DLQs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest

from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE, ORDER_CANCELLED, ORDER_SHIPPED
from fulfilment.entrypoints.worker import new_metrics
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.worker.monitors import _DeadLetterHead, poll_once
from fulfilment.worker.topology import Topology, declare_topology

pytestmark = pytest.mark.rabbitmq

DELIVERY_LIMIT = 5  # the e2e harness's limit: one topology per test vhost


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))
    connection = await aio_pika.connect(amqp_url)
    try:
        await _purge(connection)
        yield connection
    finally:
        await _purge(connection)
        await connection.close()


async def _purge(connection: aio_pika.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
        await (await channel.get_queue(name)).purge()
    await channel.close()


async def dead_letter(
    connection: aio_pika.abc.AbstractConnection, routing_key: str, at: datetime
) -> None:
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    await exchange.publish(
        aio_pika.Message(
            b"{}", headers={h.FAILURE_CLASS: "permanent", h.DEAD_LETTERED_AT: at.isoformat()}
        ),
        routing_key=routing_key,
        mandatory=True,
    )
    await channel.close()


async def test_one_poll_reads_every_queue_and_the_oldest_dead_letter_of_all_dlqs(
    connection: aio_pika.abc.AbstractConnection,
) -> None:
    now = datetime.now(UTC)
    await dead_letter(connection, ORDER_SHIPPED.dead_letter_routing_key, now - timedelta(hours=2))
    await dead_letter(connection, ORDER_SHIPPED.dead_letter_routing_key, now)
    await dead_letter(connection, ORDER_CANCELLED.dead_letter_routing_key, now - timedelta(hours=1))
    await asyncio.sleep(0.5)  # quorum queues count a published message a moment later
    metrics = new_metrics()
    heads = {name: _DeadLetterHead() for name in DEAD_LETTER_QUEUES}

    await poll_once(connection, metrics, heads)

    ready = {
        sample.labels["queue"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "fulfilment_queue_messages_ready"
        for sample in family.samples
    }
    assert ready == {
        "fulfilment.order-placed": 0,
        "fulfilment.order-cancelled": 0,
        "fulfilment.order-shipped": 0,
        "fulfilment.order-placed.dlq": 0,
        "fulfilment.order-cancelled.dlq": 1,
        "fulfilment.order-shipped.dlq": 2,
    }
    consumers = {
        sample.labels["queue"]
        for family in metrics.registry.collect()
        if family.name == "fulfilment_queue_consumers"
        for sample in family.samples
    }
    assert consumers == set(ready)
    age = metrics.registry.get_sample_value("fulfilment_dead_letters_oldest_age_seconds") or 0
    assert 2 * 3600 <= age < 2 * 3600 + 60  # the shipped DLQ's head, the oldest of all
