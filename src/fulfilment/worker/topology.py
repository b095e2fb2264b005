"""The RabbitMQ topology of the product contract, and its safe declaration at start.

| name                             | kind                    | notes                               |
|----------------------------------|-------------------------|-------------------------------------|
| ``orders``                       | topic exchange, durable | owned upstream; declared identically|
| ``fulfilment.order-placed``      | quorum queue            | bound with ``order.placed``         |
| ``fulfilment.order-cancelled``   | quorum queue            | bound with ``order.cancelled``      |
| ``fulfilment.order-shipped``     | quorum queue            | bound with ``order.shipped``        |
| ``fulfilment.dlx``               | direct exchange         | the dead-letter exchange            |
| ``<queue>.dlq``                  | quorum queue            | one per queue, bound with the       |
|                                  |                         | queue's name; never consumed        |

Every subscribed queue (``contracts.topology.SUBSCRIBED_QUEUES``) has the same arguments: the
delivery limit, the dead-letter exchange, at-least-once dead-lettering, and its own name as
the dead-letter routing key, so that its dead letters reach its own DLQ.

Declaring an existing queue with other arguments fails with ``PRECONDITION_FAILED``, which
would crash-loop a pod with a stack trace; :func:`declare_topology` turns it into one line that
names the queue, the argument, and both values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq.exceptions
import structlog
from faststream.rabbit import ExchangeType, QueueType, RabbitExchange, RabbitQueue

from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDERS_EXCHANGE,
    SUBSCRIBED_QUEUES,
    SubscribedQueue,
)

logger = structlog.get_logger("fulfilment.topology")

DEAD_LETTER_QUEUE_DELIVERY_LIMIT = 1_000_000
"""Set explicitly on the DLQ because RabbitMQ 4.0+ gives every quorum queue a limit of 20, and
inspecting the DLQ returns its messages: the DLQ has no dead-letter exchange of its own, so a
message over the limit there would be dropped. A million inspections is out of reach."""

DEAD_LETTER_QUEUE_LATER_ARGUMENTS = frozenset({"x-overflow"})
"""DLQ arguments added after DLQs were first declared in the field. A DLQ declared without
them is accepted, with a warning: RabbitMQ cannot add an argument to a queue in place, and
re-creating the DLQ means moving every dead letter out of it first (README, "Topology and
delivery limit"); the shipped broker policy sets the same overflow on such a queue."""


class TopologyMismatchError(Exception):
    """An exchange or queue exists on the broker with other arguments than the contract's.

    ``str(error)`` is one line naming the object, the argument, and the expected and actual
    values, with what to do about it.
    """


@dataclass(frozen=True, slots=True)
class Topology:
    """The exchanges and queues of one deployment; ``delivery_limit`` is deliveries per message."""

    delivery_limit: int

    def orders_exchange(self) -> RabbitExchange:
        """``orders``: where the shop publishes the events the worker consumes."""
        return RabbitExchange(ORDERS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)

    def queue(self, subscribed: SubscribedQueue) -> RabbitQueue:
        """The quorum queue of ``subscribed`` with its delivery limit and dead-lettering.

        At-least-once dead-lettering needs ``x-overflow: reject-publish``; without it RabbitMQ
        silently falls back to at-most-once (RabbitMQ docs, "Dead Lettering", quorum queues).
        """
        return RabbitQueue(
            subscribed.name,
            queue_type=QueueType.QUORUM,
            routing_key=subscribed.routing_key,
            arguments={
                "x-delivery-limit": self.delivery_limit,
                "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
                "x-dead-letter-routing-key": subscribed.dead_letter_routing_key,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )

    def dead_letter_exchange(self) -> RabbitExchange:
        """``fulfilment.dlx``: the dead-letter exchange of every subscribed queue."""
        return RabbitExchange(DEAD_LETTER_EXCHANGE, type=ExchangeType.DIRECT, durable=True)

    def dead_letter_queue(self, subscribed: SubscribedQueue) -> RabbitQueue:
        """The DLQ of ``subscribed``: held for operators; nothing consumes it by itself.

        ``x-overflow: reject-publish``: a length cap put on the DLQ later (an operator policy's
        ``max-length``, which cannot set the overflow) makes the broker refuse a new dead
        letter, which the worker then holds (``worker.delivery``), instead of dropping the
        oldest one unseen (``drop-head``, the default). A policy that sets ``overflow`` itself
        wins over the argument on quorum queues (RabbitMQ 3.10, verified): README, "Dead
        letters and replay".
        """
        return RabbitQueue(
            subscribed.dead_letter_queue,
            queue_type=QueueType.QUORUM,
            routing_key=subscribed.dead_letter_routing_key,
            arguments={
                "x-delivery-limit": DEAD_LETTER_QUEUE_DELIVERY_LIMIT,
                "x-overflow": "reject-publish",
            },
        )


_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r".*?received (?:the value )?'?(?P<expected>[^' ]+)'?.*?but current is (?P<actual>.+)$"
)


def explain_precondition_failure(error: BaseException) -> str:
    """One line describing a ``PRECONDITION_FAILED`` declare error, for operators.

    For example ``queue 'fulfilment.order-placed' exists with x-delivery-limit=none, the
    service expects 5: ...`` from RabbitMQ's "inequivalent arg 'x-delivery-limit' for queue
    ... received the value '5' ... but current is none".
    """
    text = str(error).replace("\n", " ")
    match = _INEQUIVALENT.search(text)
    if match is None:
        return f"the broker refused the topology: {text}"
    actual = match["actual"].strip().strip("'")
    actual = re.sub(r"^the value '?([^' ]+)'?.*$", r"\1", actual)
    return (
        f"{match['kind']} '{match['name']}' exists with {match['arg']}={actual}, "
        f"the service expects {match['expected']}: make the settings match the broker, or "
        "drain and delete the queue (README, 'Topology and delivery limit')"
    )


async def declare_topology(amqp_url: str, topology: Topology) -> None:
    """Declare every exchange and queue of ``topology`` and their bindings, idempotently.

    That is both exchanges, and every subscribed queue (``SUBSCRIBED_QUEUES``) with its DLQ,
    so a queue declared with other arguments stops the start whichever queue it is. Each
    object is declared on a channel of its own, so a refused declaration is reported for
    what it is instead of as a closed channel.

    Raises:
        TopologyMismatchError: an object exists with other arguments (``PRECONDITION_FAILED``).
        aio_pika.exceptions.AMQPConnectionError: the broker cannot be reached.
    """
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        dlx = await _declare_exchange(connection, topology.dead_letter_exchange())
        orders = await _declare_exchange(connection, topology.orders_exchange())
        for subscribed in SUBSCRIBED_QUEUES:
            # The DLQ first, so that no dead letter of the queue is ever unroutable.
            dlq = await _declare_queue(
                connection,
                topology.dead_letter_queue(subscribed),
                may_lack=DEAD_LETTER_QUEUE_LATER_ARGUMENTS,
            )
            await _bind(connection, dlq, dlx, subscribed.dead_letter_routing_key)
            queue = await _declare_queue(connection, topology.queue(subscribed))
            await _bind(connection, queue, orders, subscribed.routing_key)
    finally:
        await connection.close()


async def _declare_exchange(
    connection: aio_pika.abc.AbstractConnection, spec: RabbitExchange
) -> str:
    channel = await connection.channel()
    try:
        await channel.declare_exchange(
            spec.name,
            type=spec.type.value,
            durable=spec.durable,
            auto_delete=spec.auto_delete,
            arguments=spec.arguments,
        )
    except aiormq.exceptions.ChannelPreconditionFailed as error:
        raise TopologyMismatchError(explain_precondition_failure(error)) from error
    finally:
        await _close_quietly(channel)
    return spec.name


async def _declare_queue(
    connection: aio_pika.abc.AbstractConnection,
    spec: RabbitQueue,
    *,
    may_lack: frozenset[str] = frozenset(),
) -> str:
    """Declare ``spec``; an existing queue lacking only arguments of ``may_lack`` is accepted."""
    arguments: dict[str, Any] = dict(spec.arguments or {})
    while True:
        channel = await connection.channel()
        try:
            await channel.declare_queue(spec.name, durable=spec.durable, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as error:
            lacking = _lacking_argument(error)
            if lacking not in may_lack or lacking not in arguments:
                raise TopologyMismatchError(explain_precondition_failure(error)) from error
            logger.warning(
                "topology.argument_missing",
                queue=spec.name,
                argument=lacking,
                expected=arguments.pop(lacking),
                reason=(
                    "the queue was declared without it by an earlier version; the broker "
                    "policy of deploy/ and k8s/ sets the same (README, 'Topology and delivery "
                    "limit')"
                ),
            )
        else:
            return spec.name
        finally:
            await _close_quietly(channel)


def _lacking_argument(error: BaseException) -> str | None:
    """The argument a ``PRECONDITION_FAILED`` says the existing queue lacks, if that is all."""
    match = _INEQUIVALENT.search(str(error).replace("\n", " "))
    if match is None or match["actual"].strip().strip("'") != "none":
        return None
    return match["arg"]


async def _bind(
    connection: aio_pika.abc.AbstractConnection, queue: str, exchange: str, routing_key: str
) -> None:
    channel = await connection.channel()
    try:
        bound = await channel.get_queue(queue, ensure=False)
        await bound.bind(exchange, routing_key=routing_key)
    finally:
        await _close_quietly(channel)


async def _close_quietly(channel: aio_pika.abc.AbstractChannel) -> None:
    if not channel.is_closed:
        await channel.close()
