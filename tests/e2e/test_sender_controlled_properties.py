"""What the sender controls besides the body changes nothing the worker does.

AMQP properties and headers are set by whoever publishes: a reply address, a priority, an
expiration, ids, an encoding, a type, and headers that look like the broker's own
(``x-delivery-count``, ``x-death``) or the service's (``x-fulfilment-*``). A valid order is
reserved once whatever they say, nothing but its reservation comes of it (no reply, no
message published anywhere), and a dead letter's headers say what happened, not what the
sender wrote. docs/events.md, "What the sender controls", lists every property with its verdict.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.dead_letter import FailureClass, describe_dead_letter
from fulfilment.contracts.topology import (
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from fulfilment.worker.topology import Topology, declare_topology
from tests.e2e.harness import WorkerProcess, order_event, put_stock, queue_depth, spawn, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

REPLY_QUEUE = "test.replies"
"""A queue of the test's own (fixture ``reply_queue``); the two reply addresses naming it
route to it."""
REPLY_EXCHANGE = "amq.direct"

REPLY_ADDRESSES = [
    "no-such-queue",  # FastStream's reply would be returned unroutable
    ORDER_PLACED_ROUTING_KEY,  # a routing key, read as a queue name of the default exchange
    ORDER_PLACED_QUEUE,  # the worker's own queue: an empty reply would come back as a delivery
    f"{ORDER_PLACED_ROUTING_KEY}|{ORDERS_EXCHANGE}",  # FastStream's "queue|exchange" form
    # A queue that exists and takes whatever reaches it, so a reply would stay there to be
    # seen: through the default exchange, and through another in the "queue|exchange" form.
    REPLY_QUEUE,
    f"{REPLY_QUEUE}|{REPLY_EXCHANGE}",
]


async def publish_with(
    connection: aio_pika.abc.AbstractConnection, body: bytes, **properties: Any
) -> None:
    """Publish ``body`` to ``orders`` with any AMQP properties, confirmed and mandatory."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        exchange = await channel.get_exchange(ORDERS_EXCHANGE)
        properties.setdefault("content_type", "application/json")
        properties.setdefault("delivery_mode", aio_pika.DeliveryMode.PERSISTENT)
        await exchange.publish(
            aio_pika.Message(body, **properties),
            routing_key=ORDER_PLACED_ROUTING_KEY,
            mandatory=True,
        )
    finally:
        await channel.close()


def log_events(worker: WorkerProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in worker.log_lines() if line.get("event") == name]


@pytest.fixture
async def reply_queue(broker: aio_pika.abc.AbstractRobustConnection) -> AsyncIterator[str]:
    """:data:`REPLY_QUEUE`, empty, bound to :data:`REPLY_EXCHANGE` by its own name (where
    FastStream would send a reply to ``<queue>|<exchange>``); deleted at the end."""
    channel = await broker.channel()
    # Durable, and deleted below: RabbitMQ 4 deprecates transient queues that are not
    # exclusive.
    queue = await channel.declare_queue(REPLY_QUEUE, durable=True)
    await queue.bind(REPLY_EXCHANGE, routing_key=REPLY_QUEUE)
    await queue.purge()
    try:
        yield REPLY_QUEUE
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await channel.close()


async def send_as_a_reply(broker: aio_pika.abc.AbstractConnection, reply_to: str) -> None:
    """Publish an empty message where FastStream sends the reply to ``reply_to``: the exchange
    after a ``|`` (the default exchange without one), the part before it as the routing key.
    Confirmed and mandatory, so an address that routes nowhere raises."""
    routing_key, _, exchange_name = reply_to.partition("|")
    channel = await broker.channel(publisher_confirms=True, on_return_raises=True)
    try:
        exchange = (
            await channel.get_exchange(exchange_name) if exchange_name else channel.default_exchange
        )
        await exchange.publish(aio_pika.Message(b""), routing_key=routing_key, mandatory=True)
    finally:
        await channel.close()


async def settled_quietly(
    worker: WorkerProcess, broker: aio_pika.abc.AbstractConnection, handled: int
) -> None:
    """Wait until ``handled`` deliveries were handled, then a moment more for any aftermath
    (a dead letter, an empty message coming back); assert there was none."""

    async def all_handled() -> bool:
        return len(log_events(worker, "order_placed.handled")) >= handled

    await wait_for(all_handled, what=f"{handled} deliveries handled")
    await asyncio.sleep(1.5)
    assert len(log_events(worker, "order_placed.handled")) == handled
    assert log_events(worker, "order_placed.dead_lettered") == []
    assert await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 0
    assert await queue_depth(broker, ORDER_PLACED_QUEUE) == 0


async def test_an_order_with_a_reply_address_is_reserved_once_and_no_reply_is_sent(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
    reply_queue: str,
) -> None:
    await put_stock(db, {"85123A": 100})
    worker = spawn(workers, worker_env, tmp_path)

    for reply_to in REPLY_ADDRESSES:
        body, event_id = order_event([("85123A", 1)])
        await publish_with(broker, body, message_id=event_id, reply_to=reply_to)

    await settled_quietly(worker, broker, handled=len(REPLY_ADDRESSES))
    assert await db.fetchval("SELECT count(*) FROM reservations") == len(REPLY_ADDRESSES)
    assert await db.fetchval("SELECT reserved FROM stock_levels") == len(REPLY_ADDRESSES)
    assert await queue_depth(broker, reply_queue) == 0
    # The empty queue proves something only if a reply to those addresses would have landed
    # in it: one sent the way FastStream routes a reply does.
    real = [address for address in REPLY_ADDRESSES if address.split("|")[0] == reply_queue]
    for reply_to in real:
        await send_as_a_reply(broker, reply_to)
    assert await queue_depth(broker, reply_queue) == len(real) == 2


async def test_properties_and_look_alike_headers_of_the_sender_change_no_outcome(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await put_stock(db, {"85123A": 100})
    worker = spawn(workers, worker_env, tmp_path)
    other_event = str(uuid.uuid4())
    forged_death = [{"count": 9, "reason": "delivery_limit", "queue": ORDER_PLACED_QUEUE}]
    variants: list[dict[str, Any]] = [
        {"priority": 9},
        {"expiration": 60},
        {"message_id": other_event},  # another event's id: the body's event_id is the key
        {"message_id": other_event},  # ... twice: still two events, both reserved
        {"correlation_id": other_event, "type": "OrderCancelled", "app_id": "checkout"},
        {"content_encoding": "gzip"},  # not decoded: the body is what is parsed
        {"timestamp": datetime(2001, 1, 1, tzinfo=UTC), "user_id": "guest"},
        {"delivery_mode": aio_pika.DeliveryMode.NOT_PERSISTENT},
        {"headers": {"x-delivery-count": 4}},  # a redelivery count on a first delivery
        {"headers": {"x-death": forged_death, "x-first-death-reason": "delivery_limit"}},
        {"headers": {"x-fulfilment-failure-class": "poison", "x-fulfilment-replay-id": "x"}},
    ]
    for properties in variants:
        body, _ = order_event([("85123A", 1)])
        await publish_with(broker, body, **properties)

    await settled_quietly(worker, broker, handled=len(variants))
    outcomes = [line["outcome"] for line in log_events(worker, "order_placed.handled")]
    assert outcomes == ["reserved"] * len(variants)
    # The log says what the broker counted, not what the sender wrote.
    assert {line["delivery_count"] for line in log_events(worker, "order_placed.handled")} == {0}
    assert await db.fetchval("SELECT reserved FROM stock_levels") == len(variants)


async def test_a_dead_letter_says_what_happened_whatever_headers_the_sender_forged(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
) -> None:
    spawn(workers, worker_env, tmp_path)
    forged = {
        "x-delivery-count": 4,
        "x-death": [{"count": 9, "reason": "delivery_limit", "queue": ORDER_PLACED_QUEUE}],
        "x-first-death-reason": "delivery_limit",
        "x-fulfilment-failure-class": "poison",
        "x-fulfilment-delivery-count": 99,
        "x-fulfilment-made-up": "by the sender",
        "traceparent": "00-abc-def-01",
    }
    await publish_with(broker, b'{"version": 1}', message_id="forged", headers=forged)

    channel = await broker.channel()
    queue = await channel.get_queue(ORDER_PLACED_DEAD_LETTER_QUEUE)

    async def taken() -> aio_pika.abc.AbstractIncomingMessage | None:
        return await queue.get(no_ack=True, fail=False)

    letter = None
    deadline = asyncio.get_running_loop().time() + 20
    while letter is None and asyncio.get_running_loop().time() < deadline:
        letter = await taken()
        if letter is None:
            await asyncio.sleep(0.2)
    await channel.close()
    assert letter is not None, "no dead letter within 20 s"
    headers = letter.headers
    assert headers["x-fulfilment-failure-class"] == "permanent"
    assert headers["x-fulfilment-delivery-count"] == 0
    assert "x-death" not in headers
    assert "x-first-death-reason" not in headers
    assert "x-fulfilment-made-up" not in headers
    assert headers["traceparent"] == "00-abc-def-01"  # the producer's own header stays
    described = describe_dead_letter(headers, letter.body)
    assert described.failure_class is FailureClass.PERMANENT
    assert described.delivery_count == 0


async def test_an_order_whose_expiration_passed_in_the_queue_is_kept_in_the_dlq_with_a_reason(
    amqp_url: str,
    broker: aio_pika.abc.AbstractRobustConnection,
) -> None:
    # No worker runs: the order waits in the queue past the expiration its sender set, and the
    # broker dead-letters it itself (the service cannot turn a sender's expiration off).
    await declare_topology(amqp_url, Topology(delivery_limit=5))
    body, event_id = order_event([("85123A", 1)])
    await publish_with(broker, body, message_id=event_id, expiration=0.2)

    async def dead_lettered() -> bool:
        return await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 1

    await wait_for(dead_lettered, timeout=15, what="the expired order in the DLQ")
    channel = await broker.channel()
    letter = await (await channel.get_queue(ORDER_PLACED_DEAD_LETTER_QUEUE)).get(no_ack=True)
    await channel.close()
    assert letter.body == body
    assert letter.expiration is None  # the broker drops it on dead-lettering: kept for good
    described = describe_dead_letter(letter.headers, letter.body)
    assert described.failure_class is FailureClass.BROKER_OTHER
    assert "expired" in described.reason
    assert "expiration" in described.reason  # says whose doing it was, and what to do
    assert described.event_id == event_id
