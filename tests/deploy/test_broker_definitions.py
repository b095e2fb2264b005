"""The compose broker's definitions, loaded at boot by a RabbitMQ node, do what the stack needs.

The node is the session's private one (``private_broker`` in ``tests/conftest.py``): it loads
``deploy/rabbitmq/definitions.json`` unchanged, as the compose nodes do, so no user, vhost or
policy of the machine's own broker is touched. Every user logs in with the password its
clients use; there is no ``guest``; once the worker's topology is declared, each of its
queues is governed by the policy meant for it. The worker's user is refused every name that
is not the service's own, and the monitoring user (KEDA's) can count a queue's messages and
nothing else. Runs on RabbitMQ 3.10 here and 4.x in production: definitions import, policy
matching and the permission checks are the same on both (``apply-to: queues`` rather than the
3.12+ ``quorum_queues``).
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import aiormq.channel
import pytest
from aiormq.exceptions import ChannelAccessRefused
from stack import Stack, compose_environment, load_stack

from fulfilment.contracts.topology import EVENTS_EXCHANGE, ORDERS_EXCHANGE
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings
from fulfilment.worker.topology import Topology, declare_topology
from private_broker import PrivateBroker

pytestmark = pytest.mark.rabbitmq

WORKER_USER = "fulfilment"
MONITORING_USER = "fulfilment-monitoring"
MONITORING_PASSWORD = "fulfilment-monitoring"  # noqa: S105 - the local stack's, public (README)
"""The local stack's monitoring password (docs/security.md, "Broker users and permissions")."""

ACCESS_REFUSED = 403


def _worker_password(stack: Stack) -> str:
    """The password of the URL that the compose stack's worker, relay and tools use."""
    url = urllib.parse.urlsplit(compose_environment(stack, "worker")["FULFILMENT_AMQP_URL"])
    assert url.username == WORKER_USER
    assert url.password
    return url.password


@contextlib.asynccontextmanager
async def _connected(url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        yield connection
    finally:
        await connection.close()


async def _refused(
    connection: aio_pika.abc.AbstractConnection,
    operation: Operation,
) -> str:
    """Run ``operation`` on a channel of its own; the text of the broker's refusal.

    aiormq raises ``ChannelAccessRefused`` for the channel's close with reply code 403
    (ACCESS_REFUSED) only (``aiormq.channel.EXCEPTION_MAPPING``), with the reply text.
    """
    assert aiormq.channel.EXCEPTION_MAPPING[ACCESS_REFUSED] is ChannelAccessRefused
    channel = await connection.channel(publisher_confirms=True)
    with pytest.raises(ChannelAccessRefused) as refused:
        await operation(channel)
    return str(refused.value.args[0])


Operation = Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]]


def _publish(exchange: str, routing_key: str) -> Operation:
    async def publish(channel: aio_pika.abc.AbstractChannel) -> Any:
        target = await channel.get_exchange(exchange, ensure=False) if exchange else None
        message = aio_pika.Message(b"{}")
        if target is None:
            return await channel.default_exchange.publish(message, routing_key)
        return await target.publish(message, routing_key)

    return publish


async def _ignore(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


def _consume(queue: str) -> Operation:
    async def consume(channel: aio_pika.abc.AbstractChannel) -> str:
        return await (await channel.get_queue(queue, ensure=False)).consume(_ignore)

    return consume


def _get(queue: str) -> Operation:
    async def get(channel: aio_pika.abc.AbstractChannel) -> Any:
        return await (await channel.get_queue(queue, ensure=False)).get(fail=False)

    return get


async def test_definitions_log_users_in_and_govern_the_queues(
    private_broker: PrivateBroker,
) -> None:
    stack = load_stack()
    users = private_broker.ctl("-q", "list_users", "--formatter", "json")
    assert '"guest"' not in users
    assert [user["name"] for user in stack.definitions["users"]] == [WORKER_USER, MONITORING_USER]
    private_broker.ctl("authenticate_user", WORKER_USER, _worker_password(stack))
    private_broker.ctl("authenticate_user", MONITORING_USER, MONITORING_PASSWORD)

    delivery_limit = Settings.model_fields["delivery_limit"].default
    url = private_broker.url(WORKER_USER, _worker_password(stack))
    await declare_topology(url, Topology(delivery_limit=delivery_limit))

    rows = private_broker.ctl("-q", "list_queues", "--no-table-headers", "name", "policy")
    policy_of = dict(line.split("\t") for line in rows.splitlines() if line.strip())
    # The policy the static check (stack.check_rabbitmq_policies) matched for each queue
    # with Python's regular expressions is the one the broker applies.
    expected = {
        queue: [p["name"] for p in stack.definitions["policies"] if re.search(p["pattern"], queue)]
        for queue in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES)
    }
    assert {queue: [policy_of.get(queue)] for queue in expected} == expected


async def test_the_worker_user_is_refused_every_name_but_the_services_own(
    private_broker: PrivateBroker,
) -> None:
    url = private_broker.url(WORKER_USER, _worker_password(load_stack()))
    async with _connected(url) as connection:
        # Its own names: the service's queues and exchanges, and the upstream `orders`.
        channel = await connection.channel()
        await channel.declare_exchange(ORDERS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        own = await channel.declare_queue("fulfilment.test-access", exclusive=True)
        await own.bind(ORDERS_EXCHANGE, "order.test-access")
        await channel.close()

        said = [
            await _refused(connection, lambda c: c.declare_queue("shipping.orders")),
            await _refused(
                connection, lambda c: c.declare_exchange("shipping", aio_pika.ExchangeType.TOPIC)
            ),
            await _refused(connection, _publish("", "shipping.orders")),
            await _refused(connection, _publish("amq.topic", "order.placed")),
            await _refused(connection, _consume("shipping.orders")),
            await _refused(connection, _get("shipping.orders")),
        ]

    refused = "in vhost '/' refused for user 'fulfilment'"
    assert said == [
        f"ACCESS_REFUSED - access to queue 'shipping.orders' {refused}",
        f"ACCESS_REFUSED - access to exchange 'shipping' {refused}",
        f"ACCESS_REFUSED - access to exchange 'amq.default' {refused}",
        f"ACCESS_REFUSED - access to exchange 'amq.topic' {refused}",
        f"ACCESS_REFUSED - access to queue 'shipping.orders' {refused}",
        f"ACCESS_REFUSED - access to queue 'shipping.orders' {refused}",
    ]


async def test_the_monitoring_user_counts_messages_and_can_do_nothing_else(
    private_broker: PrivateBroker,
) -> None:
    worker_url = private_broker.url(WORKER_USER, _worker_password(load_stack()))
    await declare_topology(worker_url, Topology(delivery_limit=5))
    url = private_broker.url(MONITORING_USER, MONITORING_PASSWORD)
    queue = SUBSCRIBED_QUEUES[0].name
    async with _connected(url) as connection:
        # What KEDA's rabbitmq scaler does with protocol amqp: a passive declare.
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        assert declared.declaration_result.message_count is not None
        await channel.close()

        said = [
            await _refused(connection, _publish(ORDERS_EXCHANGE, "order.placed")),
            await _refused(connection, _publish(EVENTS_EXCHANGE, "stock.reserved")),
            await _refused(connection, lambda c: c.declare_queue("fulfilment.monitoring")),
            await _refused(
                connection,
                lambda c: c.declare_exchange(
                    ORDERS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
                ),
            ),
            await _refused(connection, _get(queue)),
        ]

    refused = "in vhost '/' refused for user 'fulfilment-monitoring'"
    assert said == [
        f"ACCESS_REFUSED - access to exchange 'orders' {refused}",
        f"ACCESS_REFUSED - access to exchange 'fulfilment.events' {refused}",
        f"ACCESS_REFUSED - access to queue 'fulfilment.monitoring' {refused}",
        f"ACCESS_REFUSED - access to exchange 'orders' {refused}",
        f"ACCESS_REFUSED - access to queue '{queue}' {refused}",
    ]
