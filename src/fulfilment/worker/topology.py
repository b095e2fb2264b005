"""The RabbitMQ topology (docs/events.md, "Topology and delivery limit"), and its safe declaration.

| name                             | kind                    | notes                               |
|----------------------------------|-------------------------|-------------------------------------|
| ``orders``                       | topic exchange, durable | owned upstream; declared identically|
| ``fulfilment.order-placed``      | quorum queue            | bound with ``order.placed``         |
| ``fulfilment.order-cancelled``   | quorum queue            | bound with ``order.cancelled``      |
| ``fulfilment.order-shipped``     | quorum queue            | bound with ``order.shipped``        |
| ``fulfilment.dlx``               | direct exchange         | the dead-letter exchange            |
| ``<queue>.dlq``                  | quorum queue            | one per queue, bound with the       |
|                                  |                         | queue's name; never consumed        |

Every subscribed queue (``routes.table.SUBSCRIBED_QUEUES``) has the same arguments: the
delivery limit, the dead-letter exchange, at-least-once dead-lettering, and its own name as
the dead-letter routing key, so that its dead letters reach its own DLQ.

Every quorum queue is declared with an explicit initial group size (its members when RabbitMQ
creates it). Declaring an existing queue with other arguments fails with
``PRECONDITION_FAILED``, which would crash-loop a pod with a stack trace; :func:`declare_topology`
turns it into one line that names the queue, the argument, and both values. The one exception
is the initial group size, which RabbitMQ reads only when it creates the queue: a queue created
without it, or with another, runs as it is, so it is declared again with its own value and the
difference is logged (docs/events.md, "Topology and delivery limit").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import aio_pika
import aiormq.exceptions
import structlog
from faststream.rabbit import ExchangeType, QueueType, RabbitExchange, RabbitQueue
from faststream.rabbit.schemas.queue import QuorumQueueArgs

from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    EVENTS_EXCHANGE,
    ORDERS_EXCHANGE,
    SubscribedQueue,
)
from fulfilment.routes.table import SUBSCRIBED_QUEUES

logger = structlog.get_logger("fulfilment.topology")

INITIAL_GROUP_SIZE: Final = "x-quorum-initial-group-size"
"""The argument RabbitMQ reads once, when it creates a quorum queue, for how many members to
start (``rabbit_quorum_queue:start_cluster``, 3.10): at most the nodes the cluster has then."""

DEAD_LETTER_QUEUE_DELIVERY_LIMIT = 1_000_000
"""Set explicitly on the DLQ because RabbitMQ 4.0+ gives every quorum queue a limit of 20, and
inspecting the DLQ returns its messages: the DLQ has no dead-letter exchange of its own, so a
message over the limit there would be dropped. A million inspections is out of reach."""

DEAD_LETTER_QUEUE_LATER_ARGUMENTS = frozenset({"x-overflow"})
"""DLQ arguments added after DLQs were first declared in the field. A DLQ declared without
them is accepted, with a warning: RabbitMQ cannot add an argument to a queue in place, and
re-creating the DLQ means moving every dead letter out of it first (docs/events.md, "Topology and
delivery limit"); the shipped broker policy sets the same overflow on such a queue."""


DeclaredArguments: TypeAlias = dict[str, dict[str, Any]]
"""The arguments each subscribed queue was declared with at start, by queue name."""


class TopologyMismatchError(Exception):
    """An exchange or queue exists on the broker with other arguments than the contract's.

    ``str(error)`` is one line naming the object, the argument, and the expected and actual
    values, with what to do about it.
    """


@dataclass(frozen=True, slots=True)
class Topology:
    """The exchanges and queues of one deployment.

    ``delivery_limit`` is deliveries per message; ``quorum_initial_group_size`` the members
    each quorum queue starts with (3: the cluster's nodes; a single node caps it at 1).
    """

    delivery_limit: int
    quorum_initial_group_size: int = 3

    def orders_exchange(self) -> RabbitExchange:
        """``orders``: where the shop publishes the events the worker consumes."""
        return RabbitExchange(ORDERS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)

    def result_events_exchange(self) -> RabbitExchange:
        """``fulfilment.events``: where the relay publishes the result events."""
        return RabbitExchange(EVENTS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)

    def queue(self, subscribed: SubscribedQueue) -> RabbitQueue:
        """The quorum queue of ``subscribed`` with its delivery limit and dead-lettering.

        At-least-once dead-lettering needs ``x-overflow: reject-publish``; without it RabbitMQ
        silently falls back to at-most-once (RabbitMQ docs, "Dead Lettering", quorum queues).
        """
        return self.quorum_queue(
            subscribed.name,
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
        wins over the argument on quorum queues (RabbitMQ 3.10, verified): docs/runbook.md, "Dead
        letters and replay".
        """
        return self.quorum_queue(
            subscribed.dead_letter_queue,
            routing_key=subscribed.dead_letter_routing_key,
            arguments={
                "x-delivery-limit": DEAD_LETTER_QUEUE_DELIVERY_LIMIT,
                "x-overflow": "reject-publish",
            },
        )

    def quorum_queue(
        self, name: str, *, routing_key: str, arguments: QuorumQueueArgs
    ) -> RabbitQueue:
        """A durable quorum queue with ``arguments`` and the deployment's initial group size.

        Every quorum queue of the service is built here, so each gets the same group size.
        """
        return RabbitQueue(
            name,
            queue_type=QueueType.QUORUM,
            routing_key=routing_key,
            arguments={**arguments, INITIAL_GROUP_SIZE: self.quorum_initial_group_size},
        )


_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r".*?received (?:the value )?'?(?P<expected>[^' ]+)'?.*?but current is (?P<actual>.+)$"
)


@dataclass(frozen=True, slots=True)
class _Inequivalent:
    """One argument of an existing object that differs from the declaration's (``none``: absent)."""

    kind: str
    name: str
    argument: str
    expected: str
    actual: str


def _inequivalent(error: BaseException) -> _Inequivalent | None:
    """What RabbitMQ's refusal says, or None for a refusal of another kind.

    From "inequivalent arg ... received the value '5' ... but current is none".
    """
    match = _INEQUIVALENT.search(str(error).replace("\n", " "))
    if match is None:
        return None
    actual = match["actual"].strip().strip("'")
    actual = re.sub(r"^the value '?([^' ]+)'?.*$", r"\1", actual)
    return _Inequivalent(match["kind"], match["name"], match["arg"], match["expected"], actual)


def explain_precondition_failure(error: BaseException) -> str:
    """One line describing a ``PRECONDITION_FAILED`` declare error, for operators.

    For example ``queue 'fulfilment.order-placed' exists with x-delivery-limit=none, the
    service expects 5: ...`` from RabbitMQ's "inequivalent arg 'x-delivery-limit' for queue
    ... received the value '5' ... but current is none".
    """
    found = _inequivalent(error)
    if found is None:
        text = str(error).replace("\n", " ")
        return f"the broker refused the topology: {text}"
    return (
        f"{found.kind} '{found.name}' exists with {found.argument}={found.actual}, "
        f"the service expects {found.expected}: make the settings match the broker, or "
        "drain and delete the queue (docs/events.md, 'Topology and delivery limit')"
    )


async def declare_topology(amqp_url: str, topology: Topology) -> DeclaredArguments:
    """Declare every exchange and queue of ``topology`` and their bindings, idempotently.

    That is the three exchanges (the result events' too, which the relay also declares), and
    every subscribed queue (``SUBSCRIBED_QUEUES``) with its DLQ, so a queue declared with
    other arguments stops the start whichever queue it is. Each object is declared on a
    channel of its own, so a refused declaration is reported for what it is instead of as a
    closed channel.

    Returns the arguments each subscribed queue was accepted with, by queue name: the
    contract's, except an initial group size the queue kept from its creation. The
    subscribers declare their queues with exactly these (:func:`use_declared_arguments`).

    Raises:
        TopologyMismatchError: an object exists with other arguments (``PRECONDITION_FAILED``).
        aio_pika.exceptions.AMQPConnectionError: the broker cannot be reached.
    """
    declared: DeclaredArguments = {}
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        dlx = await _declare_exchange(connection, topology.dead_letter_exchange())
        orders = await _declare_exchange(connection, topology.orders_exchange())
        await _declare_exchange(connection, topology.result_events_exchange())
        for subscribed in SUBSCRIBED_QUEUES:
            # The DLQ first, so that no dead letter of the queue is ever unroutable.
            dlq = topology.dead_letter_queue(subscribed)
            await _declare_queue(connection, dlq, may_lack=DEAD_LETTER_QUEUE_LATER_ARGUMENTS)
            await _bind(connection, dlq.name, dlx, subscribed.dead_letter_routing_key)
            spec = topology.queue(subscribed)
            declared[spec.name] = await _declare_queue(connection, spec)
            await _bind(connection, spec.name, orders, subscribed.routing_key)
    finally:
        await connection.close()
    return declared


def use_declared_arguments(queues: Iterable[RabbitQueue], declared: DeclaredArguments) -> None:
    """Give each of ``queues`` (the subscribers' own) the arguments its queue was accepted with.

    Called at start, after :func:`declare_topology` and before the subscribers declare their
    queues. aio-pika declares a queue again with the arguments it was first declared with
    when the broker cancels its consumer (the queue was deleted) and after each reconnect:
    with the contract's full set, a queue that kept an older initial group size would be
    refused with ``PRECONDITION_FAILED`` there, and its consumer would not come back; with no
    arguments (a passive declaration), a deleted queue would not be created again.

    Raises:
        KeyError: one of ``queues`` is not a subscribed queue of ``declared``.
    """
    for queue in queues:
        queue.arguments = dict(declared[queue.name])


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
) -> dict[str, Any]:
    """Declare ``spec``, checking every argument against an existing queue.

    Returns the arguments the queue was accepted with.

    Two differences are accepted with a warning, and the queue declared again without them:
    an argument of ``may_lack`` that the existing queue lacks (added by a later version; a
    broker policy sets the same), and the initial group size, which RabbitMQ reads only when
    it creates the queue, so the queue keeps the members it got then.
    """
    arguments: dict[str, Any] = dict(spec.arguments or {})
    while True:
        channel = await connection.channel()
        try:
            await channel.declare_queue(spec.name, durable=spec.durable, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as error:
            found = _inequivalent(error)
            if (
                found is not None
                and found.argument == INITIAL_GROUP_SIZE
                and INITIAL_GROUP_SIZE in arguments
            ):
                _keep_initial_group_size(spec.name, found, arguments)
            elif found is not None and found.actual == "none" and found.argument in may_lack:
                logger.warning(
                    "topology.argument_missing",
                    queue=spec.name,
                    argument=found.argument,
                    expected=arguments.pop(found.argument),
                    reason=(
                        "the queue was declared without it by an earlier version; the broker "
                        "policy of deploy/ and k8s/ sets the same (docs/events.md, 'Topology and "
                        "delivery limit')"
                    ),
                )
            else:
                raise TopologyMismatchError(explain_precondition_failure(error)) from error
        else:
            return arguments
        finally:
            await _close_quietly(channel)


def _keep_initial_group_size(queue: str, found: _Inequivalent, arguments: dict[str, Any]) -> None:
    """Declare the queue again with the group size it was created with, and say so."""
    logger.warning(
        "topology.initial_group_size_kept",
        queue=queue,
        declared_with=found.actual,
        configured=found.expected,
        reason=(
            f"queue '{queue}' was created with {INITIAL_GROUP_SIZE}={found.actual}, "
            f"not {found.expected}; RabbitMQ reads it only at creation, so the queue keeps "
            "its members: see them with `rabbitmq-queues quorum_status`, add one with "
            "`rabbitmq-queues grow` (docs/events.md, 'Topology and delivery limit')"
        ),
    )
    if found.actual == "none":
        del arguments[INITIAL_GROUP_SIZE]
    else:
        arguments[INITIAL_GROUP_SIZE] = int(found.actual)


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
