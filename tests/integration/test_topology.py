"""The start-up declaration against the real RabbitMQ: every queue and DLQ of the topology.

``declare_topology`` is what the worker runs before it consumes; on any queue of the list that
exists with other arguments it refuses with one line naming that queue (the worker then exits
1, ``tests/e2e/test_worker.py``). A length cap cannot drop a dead letter of any DLQ unseen, and
a DLQ declared before it had ``x-overflow`` is still accepted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest
from structlog.testing import capture_logs

from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE, SubscribedQueue
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.worker.topology import (
    DEAD_LETTER_QUEUE_DELIVERY_LIMIT,
    Topology,
    TopologyMismatchError,
    declare_topology,
)

pytestmark = pytest.mark.rabbitmq

DELIVERY_LIMIT = 5  # the e2e harness's limit: one topology per test vhost
TOPOLOGY = Topology(DELIVERY_LIMIT)
QUEUES = [*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES]
EVERY_QUEUE = pytest.mark.parametrize(
    "subscribed", SUBSCRIBED_QUEUES, ids=[queue.event for queue in SUBSCRIBED_QUEUES]
)


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
    for name in QUEUES:
        await channel.queue_delete(name)
    await channel.close()


async def _declare_dlq(
    connection: aio_pika.abc.AbstractConnection, name: str, **arguments: object
) -> None:
    channel = await connection.channel()
    await channel.declare_queue(
        name,
        durable=True,
        arguments={"x-queue-type": "quorum", **arguments},
    )
    await channel.close()


async def _publish_dead_letters(
    connection: aio_pika.abc.AbstractConnection, routing_key: str, count: int
) -> int:
    """Publish ``count`` messages to the DLQ of ``routing_key``, confirmed; return how many the
    broker refused."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    refused = 0
    for index in range(count):
        try:
            await exchange.publish(
                aio_pika.Message(f"dead letter {index}".encode()),
                routing_key=routing_key,
                mandatory=True,
            )
        except aio_pika.exceptions.DeliveryError:
            refused += 1
    await channel.close()
    return refused


@EVERY_QUEUE
async def test_a_capped_dead_letter_queue_refuses_a_dead_letter_instead_of_dropping_one(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection, subscribed: SubscribedQueue
) -> None:
    await declare_topology(amqp_url, TOPOLOGY)
    # A cap that names no overflow, as an operator policy's max-length (which cannot set one).
    channel = await connection.channel()
    await channel.queue_delete(subscribed.dead_letter_queue)
    await channel.close()
    spec = TOPOLOGY.dead_letter_queue(subscribed)
    await _declare_dlq(connection, spec.name, **(spec.arguments or {}), **{"x-max-length": 2})
    channel = await connection.channel()
    queue = await channel.get_queue(subscribed.dead_letter_queue)
    await queue.bind(DEAD_LETTER_EXCHANGE, subscribed.dead_letter_routing_key)

    refused = await _publish_dead_letters(connection, subscribed.dead_letter_routing_key, 6)

    kept = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        kept.append(message.body)
    await channel.close()
    # Quorum queues enforce the cap approximately: one or two over it are taken.
    assert refused >= 2
    assert kept == [f"dead letter {index}".encode() for index in range(6 - refused)]


@EVERY_QUEUE
async def test_a_dead_letter_queue_declared_without_the_overflow_is_accepted_with_a_warning(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection, subscribed: SubscribedQueue
) -> None:
    await _declare_dlq(
        connection,
        subscribed.dead_letter_queue,
        **{"x-delivery-limit": DEAD_LETTER_QUEUE_DELIVERY_LIMIT},
    )

    with capture_logs() as logs:
        await declare_topology(amqp_url, TOPOLOGY)

    [warning] = [line for line in logs if line["event"] == "topology.argument_missing"]
    assert warning["queue"] == subscribed.dead_letter_queue
    assert warning["argument"] == "x-overflow"
    assert warning["expected"] == "reject-publish"
    # bound and usable
    assert await _publish_dead_letters(connection, subscribed.dead_letter_routing_key, 1) == 0


@EVERY_QUEUE
async def test_a_dead_letter_queue_capped_by_argument_stops_the_start_with_its_reason(
    amqp_url: str, connection: aio_pika.abc.AbstractConnection, subscribed: SubscribedQueue
) -> None:
    spec = TOPOLOGY.dead_letter_queue(subscribed)
    await _declare_dlq(connection, spec.name, **(spec.arguments or {}), **{"x-max-length": 1})

    with pytest.raises(TopologyMismatchError) as refused:
        await declare_topology(amqp_url, TOPOLOGY)

    assert str(refused.value).startswith(
        f"queue '{subscribed.dead_letter_queue}' exists with x-max-length=1, "
        "the service expects none"
    )


async def test_every_queue_and_dlq_of_the_list_is_declared_with_its_arguments(
    amqp_url: str,
) -> None:
    await declare_topology(amqp_url, TOPOLOGY)

    async with await aio_pika.connect(amqp_url) as connection:
        for subscribed in SUBSCRIBED_QUEUES:
            for spec in (TOPOLOGY.queue(subscribed), TOPOLOGY.dead_letter_queue(subscribed)):
                channel = await connection.channel()
                # Declared again with the same arguments: the broker accepts it as is.
                await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)


@pytest.mark.parametrize("name", QUEUES)
async def test_a_queue_of_the_list_with_other_arguments_stops_the_start_naming_it(
    amqp_url: str, name: str
) -> None:
    async with await aio_pika.connect(amqp_url) as connection:
        channel = await connection.channel()
        await channel.queue_delete(name)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    try:
        with pytest.raises(TopologyMismatchError) as refused:
            await declare_topology(amqp_url, TOPOLOGY)
    finally:
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            await channel.queue_delete(name)
        await declare_topology(amqp_url, TOPOLOGY)

    assert str(refused.value).startswith(f"queue '{name}' exists with x-"), str(refused.value)
    assert "=none, the service expects" in str(refused.value)
