"""The demo's queue on ``fulfilment.events``: declared, bound, and emptied as it reads it.

Only the demo (``fulfilment demo``) uses these; they move with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import aio_pika

from fulfilment.adapters.rabbitmq.inspection import queue_state

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage


async def declare_bound_queue(
    connection: AbstractConnection, queue: str, *, exchange: str, binding_key: str
) -> None:
    """Declare the durable topic ``exchange``, a durable classic ``queue``, and bind them.

    Idempotent. The exchange is declared with the arguments the service gives it (durable
    topic), so declaring it before the service does is the same as after.

    Raises:
        aiormq.exceptions.ChannelPreconditionFailed: ``queue`` or ``exchange`` exists with
            other arguments.
    """
    channel = await connection.channel()
    try:
        source = await channel.declare_exchange(
            exchange, type=aio_pika.ExchangeType.TOPIC, durable=True
        )
        target = await channel.declare_queue(queue, durable=True)
        await target.bind(source, routing_key=binding_key)
    finally:
        if not channel.is_closed:
            await channel.close()


async def take_messages(
    connection: AbstractConnection,
    queue: str,
    handle: Callable[[AbstractIncomingMessage], None],
    *,
    prefetch: int,
    idle_seconds: float,
) -> int:
    """Remove the messages ``queue`` holds now: ``handle`` each, then acknowledge it.

    At most ``prefetch`` messages are unacknowledged at once, so memory stays bounded however
    deep the queue is. Messages that arrive meanwhile are left for later. Returns how many
    were taken (0 when the queue is missing or empty). If ``handle`` raises, the message and
    those after it stay in the queue.

    Raises:
        TimeoutError: no message came for ``idle_seconds`` while the queue still counted some
            (another consumer took them).
    """
    state = await queue_state(connection, queue)
    if state is None or state.ready == 0:
        return 0
    channel: AbstractChannel = await connection.channel()
    taken = 0
    try:
        await channel.set_qos(prefetch_count=prefetch)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=False) as messages:
            while taken < state.ready:
                async with asyncio.timeout(idle_seconds):
                    message = await anext(aiter(messages))
                handle(message)
                await message.ack()
                taken += 1
    finally:
        # Closing returns every message received and not acknowledged, prefetched included.
        if not channel.is_closed:
            await channel.close()
    return taken
