"""Publishing to RabbitMQ, each message confirmed: events, dead letters, replays."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq.exceptions

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

PUBLISH_CONCURRENCY = 64
"""Publishes awaiting their confirm at once: enough to hide the round trip, few enough that a
refused publish stops the run quickly."""


class UnroutableError(Exception):
    """The broker returned a mandatory publish: no queue is bound for its routing key."""


@dataclass(frozen=True, slots=True)
class OutgoingEvent:
    """One event to publish: ``body`` is UTF-8 JSON, ``message_id`` the event id."""

    body: bytes
    message_id: str


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
        failures: list[Exception] = []

        async def send(event: OutgoingEvent) -> None:
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

        async def publish(event: OutgoingEvent) -> None:
            async with limit:
                if failures:
                    return
                try:
                    await send(event)
                except Exception as error:  # noqa: BLE001 - raised below, once the rest settle
                    failures.append(error)

        # The first failure stops new publishes, but those in flight are awaited, not
        # cancelled: aiormq 7.2's channel reader fails on the broker's Basic.Return of a
        # cancelled publish (InvalidStateError) and then waits 10 s for a Channel.CloseOk
        # only it could read.
        await asyncio.gather(*(publish(event) for event in events))
        if failures:
            raise failures[0]
    finally:
        if not channel.is_closed:
            await channel.close()
    return len(events)


async def publish_confirmed(
    channel: AbstractChannel,
    message: aio_pika.Message,
    *,
    exchange: str,
    routing_key: str,
    timeout_seconds: float,
) -> None:
    """Publish ``message`` mandatorily on a confirming channel and wait for the broker's ack.

    ``channel`` must be opened with ``publisher_confirms=True, on_return_raises=True``.

    Raises:
        UnroutableError: no queue is bound for ``routing_key`` on ``exchange``.
        aiormq.exceptions.DeliveryError: the broker refused the message (e.g. a full queue).
        TimeoutError: no confirm within ``timeout_seconds``.
    """
    target = await channel.get_exchange(exchange, ensure=False)
    try:
        await target.publish(
            message, routing_key=routing_key, mandatory=True, timeout=timeout_seconds
        )
    except aiormq.exceptions.PublishError as error:
        msg = f"exchange {exchange!r} has no queue bound for {routing_key!r}"
        raise UnroutableError(msg) from error


def resent(
    message: AbstractIncomingMessage,
    headers: Mapping[str, Any],
    *,
    app_id: str | None = None,
    as_sent: bool = False,
) -> aio_pika.Message:
    """A persistent message with ``message``'s body, ids and content properties, and ``headers``.

    How a received message is sent again: as a dead letter (``worker.dead_lettering``), as a
    replay (``tools.dlq``), as a walk's copy (:class:`QueueWalk`). ``app_id`` replaces the
    sender's when given. Priority, reply address and expiration are dropped unless
    ``as_sent``: a dead letter must not expire in its DLQ nor be answered, and a replay is the
    operator's decision, not to be reordered, answered or expired by what the first sender
    asked for; a walk's copy stands in for the message it replaces, so it keeps them.
    """
    return aio_pika.Message(
        message.body,
        headers=dict(headers),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority if as_sent else None,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to if as_sent else None,
        expiration=message.expiration if as_sent else None,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id if app_id is None else app_id,
    )
