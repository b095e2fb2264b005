"""Looking into RabbitMQ queues without taking anything: depth, consumers, a DLQ's messages."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiormq.exceptions

from fulfilment.contracts.dead_letter import SERVICE_FAILURE_CLASSES, describe_dead_letter

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

BROWSE_IDLE_SECONDS = 1.0
"""How long browsing waits for one more message before deciding the queue has been seen."""

PEEK_LIMIT = 65_535
"""Most messages :func:`peek_messages` reads: the largest prefetch (an AMQP short), since it
holds every message it reads unacknowledged. Deeper queues are paged by
``adapters.rabbitmq.walk.QueueWalk``."""


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue as a passive declare sees it: ready messages and attached consumers."""

    name: str
    ready: int
    consumers: int


@dataclass
class DeadLetterSummary:
    """What a look at the DLQ found: messages by ``(failure class, reason)`` and event ids.

    The class is the service's ``x-fulfilment-failure-class``, or for messages the broker
    dead-lettered itself one read from ``x-death`` (``poison`` after the delivery limit; see
    ``fulfilment.contracts.dead_letter.FailureClass``).
    """

    seen: int = 0
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    event_ids: set[str] = field(default_factory=set)
    unread: int = 0
    """Messages past the first :data:`PEEK_LIMIT` that the look could not read."""


async def queue_state(connection: AbstractConnection, name: str) -> QueueState | None:
    """Ready messages and consumers of queue ``name``, or None when it does not exist."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    else:
        result = queue.declaration_result
        return QueueState(name, result.message_count or 0, result.consumer_count or 0)
    finally:
        if not channel.is_closed:
            await channel.close()


async def browse_dead_letters(connection: AbstractConnection, queue: str) -> DeadLetterSummary:
    """Read every message of the DLQ ``queue`` without removing any, and count them.

    See :func:`peek_messages` for how the messages stay in the queue; a DLQ deeper than
    :data:`PEEK_LIMIT` is counted up to it, and the rest is counted as ``unread``.
    """
    summary = DeadLetterSummary()
    state = await queue_state(connection, queue)
    ready = state.ready if state else 0
    for message in await peek_messages(connection, queue, ready):
        _count(summary, message)
    summary.unread = max(0, ready - summary.seen)
    return summary


async def peek_messages(
    connection: AbstractConnection, queue: str, ready: int
) -> list[AbstractIncomingMessage]:
    """The first :data:`PEEK_LIMIT` of ``queue``'s ``ready`` messages, left in it, in order.

    ``ready`` is the queue's depth, read by the caller.

    Messages are received unacknowledged and returned when the channel closes, so they stay
    in the queue in their order. Each look counts as a delivery on quorum queues (on RabbitMQ
    3.10 to 4.2; 4.3 no longer counts returns), which is why the DLQ is declared with a very
    large delivery limit (``fulfilment.worker.topology``). Never use this on a queue that
    workers consume: it would spend their delivery attempts.
    """
    if ready <= 0:
        return []
    seen: list[AbstractIncomingMessage] = []
    channel: AbstractChannel = await connection.channel()
    try:
        wanted = min(ready, PEEK_LIMIT)
        await channel.set_qos(prefetch_count=wanted)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=False) as messages:
            while len(seen) < wanted:
                try:
                    async with asyncio.timeout(BROWSE_IDLE_SECONDS):
                        message = await anext(aiter(messages))
                except (TimeoutError, StopAsyncIteration):
                    break
                seen.append(message)
    finally:
        # Closing without acknowledging returns every browsed message to the queue.
        if not channel.is_closed:
            await channel.close()
    return seen


async def peek_head(connection: AbstractConnection, queue: str) -> AbstractIncomingMessage | None:
    """The message at the head of ``queue`` (its oldest), left in place; None when empty.

    One ``basic.get`` returned with ``basic.nack(requeue=True)``: on RabbitMQ 4.3+ that return
    is not counted towards the delivery limit; on 3.10 to 4.2 it is, one count per look.
    """
    channel = await connection.channel()
    try:
        source = await channel.get_queue(queue, ensure=False)
        message = await source.get(no_ack=False, fail=False)
        if message is not None:
            await message.nack(requeue=True)
        return message
    finally:
        if not channel.is_closed:
            await channel.close()


def _count(summary: DeadLetterSummary, message: AbstractIncomingMessage) -> None:
    described = describe_dead_letter(message.headers, message.body)
    written = described.failure_class in SERVICE_FAILURE_CLASSES
    reason = described.reason.split(":", 1)[0] if written else ""
    summary.seen += 1
    summary.by_reason[str(described.failure_class), reason] += 1
    if described.event_id is not None:
        summary.event_ids.add(described.event_id)
