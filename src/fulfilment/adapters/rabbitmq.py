"""Publishing events and inspecting queues, for the command line (not the worker's hot path)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractIncomingMessage

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection

PUBLISH_CONCURRENCY = 64
"""Publishes awaiting their confirm at once: enough to hide the round trip, few enough that a
refused publish stops the run quickly."""

BROWSE_IDLE_SECONDS = 1.0
"""How long browsing waits for one more message before deciding the queue has been seen."""


class BrokerUnavailableError(Exception):
    """RabbitMQ cannot be reached or refused the connection; the message says where."""


class UnroutableError(Exception):
    """The broker returned a mandatory publish: no queue is bound for its routing key."""


@dataclass(frozen=True, slots=True)
class OutgoingEvent:
    """One event to publish: ``body`` is UTF-8 JSON, ``message_id`` the event id."""

    body: bytes
    message_id: str


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue as a passive declare sees it: ready messages and attached consumers."""

    name: str
    ready: int
    consumers: int


@dataclass
class DeadLetterSummary:
    """What a look at the DLQ found: messages by ``(failure class, reason)`` and event ids.

    The class is the service's ``x-fulfilment-failure-class``, or ``broker:<reason>`` (from
    ``x-death``, e.g. ``broker:delivery_limit``) for messages the broker dead-lettered itself.
    """

    seen: int = 0
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    event_ids: set[str] = field(default_factory=set)


@contextlib.asynccontextmanager
async def connect(
    amqp_url: str, *, timeout_seconds: float = 10.0
) -> AsyncIterator[AbstractConnection]:
    """A plain (not robust) connection, closed on exit.

    Raises:
        BrokerUnavailableError: the broker does not answer or refuses the login.
    """
    try:
        connection = await aio_pika.connect(amqp_url, timeout=timeout_seconds)
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as error:
        where = aio_pika.connection.make_url(amqp_url).with_password("***")
        msg = f"RabbitMQ at {where} is not reachable: {type(error).__name__}: {error}"
        raise BrokerUnavailableError(msg) from error
    try:
        yield connection
    finally:
        await connection.close()


async def publish_events(
    connection: AbstractConnection,
    events: Sequence[OutgoingEvent],
    *,
    exchange: str,
    routing_key: str,
) -> int:
    """Publish ``events`` persistently and mandatorily to ``exchange``, each confirmed.

    The exchange is declared as a durable topic exchange (idempotent; the contract's
    ``orders``). Returns the number of events confirmed by the broker.

    Raises:
        UnroutableError: no queue is bound for ``routing_key`` (start the worker first: it
            declares its queue); events published before it stay published.
        aiormq.exceptions.DeliveryError: the broker refused a message (e.g. the queue is full).
    """
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        target = await channel.declare_exchange(
            exchange, type=aio_pika.ExchangeType.TOPIC, durable=True
        )
        limit = asyncio.Semaphore(PUBLISH_CONCURRENCY)

        async def publish(event: OutgoingEvent) -> None:
            async with limit:
                message = aio_pika.Message(
                    event.body,
                    message_id=event.message_id,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                try:
                    await target.publish(message, routing_key=routing_key, mandatory=True)
                except aiormq.exceptions.PublishError as error:
                    msg = (
                        f"exchange {exchange!r} has no queue bound for {routing_key!r}: "
                        "start the worker first, it declares its queue"
                    )
                    raise UnroutableError(msg) from error

        async with asyncio.TaskGroup() as group:
            for event in events:
                group.create_task(publish(event))
    except ExceptionGroup as errors:
        raise errors.exceptions[0] from errors
    finally:
        if not channel.is_closed:
            await channel.close()
    return len(events)


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
    """Read every message of the DLQ ``queue`` without removing any.

    Messages are received unacknowledged and returned when the channel closes, so they stay
    in the queue in their order. Each look counts as a delivery on quorum queues, which is why
    the DLQ is declared with a very large delivery limit (``fulfilment.entrypoints.topology``).
    """
    summary = DeadLetterSummary()
    state = await queue_state(connection, queue)
    if state is None or state.ready == 0:
        return summary
    channel: AbstractChannel = await connection.channel()
    try:
        await channel.set_qos(prefetch_count=state.ready)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=False) as messages:
            while summary.seen < state.ready:
                try:
                    async with asyncio.timeout(BROWSE_IDLE_SECONDS):
                        message = await anext(aiter(messages))
                except (TimeoutError, StopAsyncIteration):
                    break
                _count(summary, message)
    finally:
        # Closing without acknowledging returns every browsed message to the queue.
        if not channel.is_closed:
            await channel.close()
    return summary


def _count(summary: DeadLetterSummary, message: AbstractIncomingMessage) -> None:
    headers = message.headers or {}
    failure_class = headers.get("x-fulfilment-failure-class")
    if isinstance(failure_class, str):
        reason = str(headers.get("x-fulfilment-reason", ""))
        key = (failure_class, reason.split(":", 1)[0])
    else:
        deaths = headers.get("x-death")
        death_reason = "unknown"
        if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
            death_reason = str(deaths[0].get("reason", "unknown"))
        key = (f"broker:{death_reason}", "")
    summary.seen += 1
    summary.by_reason[key] += 1
    event_id = _event_id(message.body)
    if event_id is not None:
        summary.event_ids.add(event_id)


def _event_id(body: bytes) -> str | None:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    value = document.get("event_id") if isinstance(document, dict) else None
    return value if isinstance(value, str) else None
