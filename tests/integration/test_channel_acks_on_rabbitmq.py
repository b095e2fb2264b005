"""``ChannelAcks`` on the real RabbitMQ: coalesced acks settle exactly the deliveries decided.

A quorum queue's deliveries are settled in a shuffled order, in rounds, through one
``ChannelAcks``: some acknowledged, some rejected back to the queue, some left in flight.
A ``basic.ack`` that named a tag the broker no longer holds unacknowledged would close the
channel (``PRECONDITION_FAILED``); one with ``multiple`` that reached too far would take a
message that should have come back. Closing the channel returns what is in flight, so the
queue must then hold exactly the requeued and the unsettled messages.
"""

from __future__ import annotations

import asyncio
import random

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from fulfilment.worker.acknowledgements import ChannelAcks

pytestmark = pytest.mark.rabbitmq

MESSAGES = 120


async def test_coalesced_acks_settle_exactly_the_deliveries_decided(
    private_vhost_url: str,
) -> None:
    connection = await aio_pika.connect_robust(private_vhost_url)
    try:
        setup = await connection.channel(publisher_confirms=True)
        queue = await setup.declare_queue(
            "acks.test", durable=True, arguments={"x-queue-type": "quorum"}
        )
        for index in range(MESSAGES):
            await setup.default_exchange.publish(
                aio_pika.Message(str(index).encode()), routing_key=queue.name
            )

        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=MESSAGES)
        received: list[AbstractIncomingMessage] = []
        all_in = asyncio.Event()

        async def on_message(message: AbstractIncomingMessage) -> None:
            received.append(message)
            if len(received) == MESSAGES:
                all_in.set()

        consumed = await consuming.get_queue(queue.name)
        tag = await consumed.consume(on_message)
        await asyncio.wait_for(all_in.wait(), timeout=30)
        await consumed.cancel(tag)

        plan = random.Random(7).choices(["ack", "requeue", "never"], weights=[6, 2, 2], k=MESSAGES)
        settling = [
            (message, how) for message, how in zip(received, plan, strict=True) if how != "never"
        ]
        random.Random(8).shuffle(settling)
        acks = ChannelAcks()
        for start in range(0, len(settling), 16):
            await asyncio.gather(
                *(
                    acks.ack(message) if how == "ack" else acks.reject(message, requeue=True)
                    for message, how in settling[start : start + 16]
                )
            )
        await asyncio.sleep(0.5)  # a channel error would arrive by now
        assert not consuming.is_closed
        await consuming.close()

        back = {
            message.body.decode()
            for message, how in zip(received, plan, strict=True)
            if how in {"requeue", "never"}
        }
        returned: set[str] = set()
        for _ in range(len(back) + 1):
            message = await queue.get(no_ack=True, fail=False, timeout=5)
            if message is None:
                break
            returned.add(message.body.decode())
        assert returned == back
        assert len(back) < MESSAGES  # the plan acknowledged some
    finally:
        await connection.close()
