"""The dead-letter queue's declaration against the real RabbitMQ: a length cap cannot drop a
dead letter unseen, and a DLQ declared before it had ``x-overflow`` is still accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest
from structlog.testing import capture_logs

from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    DEAD_LETTER_QUEUE,
    DEAD_LETTER_ROUTING_KEY,
    MAIN_QUEUE,
)
from fulfilment.worker.topology import (
    DEAD_LETTER_QUEUE_DELIVERY_LIMIT,
    Topology,
    TopologyMismatchError,
    declare_topology,
)

pytestmark = pytest.mark.rabbitmq

TOPOLOGY = Topology(delivery_limit=5)


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    """A connection; the service's queues are deleted before and after, so each test declares
    them the way it needs and the next one finds them as the worker declares them."""
    connection = await aio_pika.connect(amqp_url)
    await _delete_queues(connection)
    try:
        yield connection
    finally:
        await _delete_queues(connection)
        await declare_topology(amqp_url, TOPOLOGY)
        await connection.close()


async def _delete_queues(connection: aio_pika.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    for name in (MAIN_QUEUE, DEAD_LETTER_QUEUE):
        await channel.queue_delete(name)
    await channel.close()


async def _declare_dlq(connection: aio_pika.abc.AbstractConnection, **arguments: object) -> None:
    channel = await connection.channel()
    await channel.declare_queue(
        DEAD_LETTER_QUEUE,
        durable=True,
        arguments={"x-queue-type": "quorum", **arguments},
    )
    await channel.close()


async def _publish_dead_letters(connection: aio_pika.abc.AbstractConnection, count: int) -> int:
    """Publish ``count`` messages to the DLQ, confirmed; return how many the broker refused."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    refused = 0
    for index in range(count):
        try:
            await exchange.publish(
                aio_pika.Message(f"dead letter {index}".encode()),
                routing_key=DEAD_LETTER_ROUTING_KEY,
                mandatory=True,
            )
        except aio_pika.exceptions.DeliveryError:
            refused += 1
    await channel.close()
    return refused


async def test_a_capped_dead_letter_queue_refuses_a_dead_letter_instead_of_dropping_one(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection
) -> None:
    await declare_topology(amqp_url, TOPOLOGY)
    # A cap that names no overflow, as an operator policy's max-length (which cannot set one).
    channel = await connection.channel()
    await channel.queue_delete(DEAD_LETTER_QUEUE)
    await channel.close()
    spec = TOPOLOGY.dead_letter_queue()
    await _declare_dlq(connection, **(spec.arguments or {}), **{"x-max-length": 2})
    channel = await connection.channel()
    queue = await channel.get_queue(DEAD_LETTER_QUEUE)
    await queue.bind(DEAD_LETTER_EXCHANGE, DEAD_LETTER_ROUTING_KEY)

    refused = await _publish_dead_letters(connection, 6)

    kept = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        kept.append(message.body)
    await channel.close()
    # Quorum queues enforce the cap approximately: one or two over it are taken.
    assert refused >= 2
    assert kept == [f"dead letter {index}".encode() for index in range(6 - refused)]


async def test_a_dead_letter_queue_declared_without_the_overflow_is_accepted_with_a_warning(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection
) -> None:
    await _declare_dlq(connection, **{"x-delivery-limit": DEAD_LETTER_QUEUE_DELIVERY_LIMIT})

    with capture_logs() as logs:
        await declare_topology(amqp_url, TOPOLOGY)

    [warning] = [line for line in logs if line["event"] == "topology.argument_missing"]
    assert warning["queue"] == DEAD_LETTER_QUEUE
    assert warning["argument"] == "x-overflow"
    assert warning["expected"] == "reject-publish"
    assert await _publish_dead_letters(connection, 1) == 0  # bound and usable


async def test_a_dead_letter_queue_capped_by_argument_stops_the_start_with_its_reason(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection
) -> None:
    spec = TOPOLOGY.dead_letter_queue()
    await _declare_dlq(connection, **(spec.arguments or {}), **{"x-max-length": 1})

    with pytest.raises(TopologyMismatchError) as refused:
        await declare_topology(amqp_url, TOPOLOGY)

    assert str(refused.value).startswith(
        f"queue '{DEAD_LETTER_QUEUE}' exists with x-max-length=1, the service expects none"
    )
