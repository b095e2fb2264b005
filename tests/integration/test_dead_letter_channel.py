"""Dead letters on a channel of their own, against the real RabbitMQ.

A quorum queue with ``reject-publish`` overflow that refused a message from a channel goes on
refusing that channel after its cap is lifted (RabbitMQ 3.10.8); ``DeadLetterChannel`` takes
a new channel after a refusal, so dead letters are stored again as soon as the DLQ has room.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse

import aio_pika
import aiormq.exceptions
import pytest

from fulfilment.contracts.topology import ORDER_PLACED, ORDER_PLACED_DEAD_LETTER_QUEUE
from fulfilment.worker.dead_lettering import DeadLetterChannel
from fulfilment.worker.topology import Topology, declare_topology

pytestmark = pytest.mark.rabbitmq


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


async def test_dead_letters_are_stored_again_as_soon_as_a_cap_that_refused_them_is_lifted(
    private_vhost_url: str,
) -> None:
    vhost = urllib.parse.unquote(urllib.parse.urlsplit(private_vhost_url).path.lstrip("/"))
    await declare_topology(private_vhost_url, Topology(delivery_limit=5))
    cap = json.dumps({"max-length": 1, "overflow": "reject-publish"})
    rabbitmqctl("set_policy", "-p", vhost, "cap", "^fulfilment\\.order-placed\\.dlq$", cap)
    connection = await aio_pika.connect_robust(private_vhost_url)

    async def connect() -> aio_pika.abc.AbstractConnection:
        return connection

    channel = DeadLetterChannel(connect)

    async def store(index: int) -> str:
        try:
            await channel.publish(
                aio_pika.Message(f"dead letter {index}".encode()),
                routing_key=ORDER_PLACED.dead_letter_routing_key,
                timeout_seconds=5,
            )
        except aiormq.exceptions.DeliveryError:
            return "refused"
        return "stored"

    try:
        under_cap = [await store(index) for index in range(4)]
        rabbitmqctl("clear_policy", "-p", vhost, "cap")
        lifted = [await store(index) for index in range(4, 6)]
        probe = await connection.channel()
        depth = (
            await probe.declare_queue(ORDER_PLACED_DEAD_LETTER_QUEUE, passive=True)
        ).declaration_result
        await probe.close()
    finally:
        await connection.close()

    assert "refused" in under_cap
    assert lifted == ["stored", "stored"]
    assert depth.message_count == under_cap.count("stored") + 2
