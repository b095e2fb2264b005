"""The start-up declaration against the real RabbitMQ: every queue and DLQ of the topology.

``declare_topology`` is what the worker runs before it consumes; on any queue of the list that
exists with other arguments it refuses with one line naming that queue (the worker then exits
1, ``tests/e2e/test_worker.py``).
"""

from __future__ import annotations

import aio_pika
import pytest

from fulfilment.contracts.topology import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.worker.topology import Topology, TopologyMismatchError, declare_topology

pytestmark = pytest.mark.rabbitmq

DELIVERY_LIMIT = 5  # the e2e harness's limit: one topology per test vhost
QUEUES = [*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES]


async def test_every_queue_and_dlq_of_the_list_is_declared_with_its_arguments(
    amqp_url: str,
) -> None:
    await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))

    topology = Topology(DELIVERY_LIMIT)
    async with await aio_pika.connect(amqp_url) as connection:
        for subscribed in SUBSCRIBED_QUEUES:
            for spec in (topology.queue(subscribed), topology.dead_letter_queue(subscribed)):
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
            await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))
    finally:
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            await channel.queue_delete(name)
        await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))

    assert str(refused.value).startswith(f"queue '{name}' exists with x-"), str(refused.value)
    assert "=none, the service expects" in str(refused.value)
