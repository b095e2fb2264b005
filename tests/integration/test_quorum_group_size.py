"""The quorum queues' initial group size against the real (single-node) RabbitMQ.

RabbitMQ caps a queue's members at the nodes the cluster has when it creates the queue, so a
group of 3 declares on one node; it reads the argument only then, so a queue created without
it (every deployment before the setting) is kept, not refused. The three-node case is
``tests/cluster``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest
from structlog.testing import capture_logs

from fulfilment.contracts.topology import ORDER_PLACED, ORDER_PLACED_QUEUE
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.worker.topology import (
    INITIAL_GROUP_SIZE,
    Topology,
    TopologyMismatchError,
    declare_topology,
)

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
async def no_queues(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    """A connection to the session's vhost, without the service's queues before and after."""
    connection = await aio_pika.connect(amqp_url)

    async def delete() -> None:
        channel = await connection.channel()
        for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
            await channel.queue_delete(name)
        await channel.close()

    await delete()
    try:
        yield connection
    finally:
        await delete()
        await connection.close()


async def create_main_queue_as_before(
    connection: aio_pika.abc.AbstractConnection, **changes: object
) -> None:
    """The main queue as a release before the setting declared it: no group size."""
    spec = Topology(delivery_limit=5).queue(ORDER_PLACED)
    arguments = {**(spec.arguments or {}), **changes}
    del arguments[INITIAL_GROUP_SIZE]
    channel = await connection.channel()
    await channel.declare_queue(ORDER_PLACED_QUEUE, durable=True, arguments=arguments)
    await channel.close()


def kept(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [line for line in logs if line["event"] == "topology.initial_group_size_kept"]


async def test_every_quorum_queue_is_declared_with_the_group_size() -> None:
    topology = Topology(delivery_limit=5, quorum_initial_group_size=3)
    for subscribed in SUBSCRIBED_QUEUES:
        for queue in (topology.queue(subscribed), topology.dead_letter_queue(subscribed)):
            assert (queue.arguments or {})[INITIAL_GROUP_SIZE] == 3


@pytest.mark.usefixtures("no_queues")
async def test_a_group_of_3_declares_on_a_single_node_and_is_what_the_queue_keeps(
    amqp_url: str,
) -> None:
    await declare_topology(amqp_url, Topology(delivery_limit=5, quorum_initial_group_size=3))
    with capture_logs() as logs:
        await declare_topology(amqp_url, Topology(delivery_limit=5, quorum_initial_group_size=3))
    assert kept(logs) == []

    # Another size later: the queues keep the 3 they were created with, and say so.
    with capture_logs() as logs:
        await declare_topology(amqp_url, Topology(delivery_limit=5, quorum_initial_group_size=5))
    assert [(line["queue"], line["declared_with"]) for line in kept(logs)] == [
        (name, "3")
        for subscribed in SUBSCRIBED_QUEUES
        for name in (subscribed.dead_letter_queue, subscribed.name)
    ]


async def test_a_queue_created_before_the_setting_is_kept_and_named_in_a_warning(
    amqp_url: str, no_queues: aio_pika.abc.AbstractConnection
) -> None:
    await create_main_queue_as_before(no_queues)
    with capture_logs() as logs:
        await declare_topology(amqp_url, Topology(delivery_limit=5))
    (line,) = kept(logs)
    assert line["queue"] == ORDER_PLACED_QUEUE
    assert line["declared_with"] == "none"
    assert line["configured"] == "3"
    assert line["log_level"] == "warning"
    assert "rabbitmq-queues grow" in str(line["reason"])


async def test_a_queue_created_before_the_setting_with_another_delivery_limit_is_refused(
    amqp_url: str, no_queues: aio_pika.abc.AbstractConnection
) -> None:
    await create_main_queue_as_before(no_queues, **{"x-delivery-limit": 7})
    with pytest.raises(TopologyMismatchError) as refused:
        await declare_topology(amqp_url, Topology(delivery_limit=5))
    assert str(refused.value).startswith(
        f"queue '{ORDER_PLACED_QUEUE}' exists with x-delivery-limit=7, the service expects 5"
    )
