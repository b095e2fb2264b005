"""Consumer pause and watchdog over several subscribers, against the real RabbitMQ.

Every subscriber needs the database, so one outage met by any of them pauses them all and
resumes them all; the watchdog gives up when any one of them loses its consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aio_pika
import pytest
from faststream import FastStream
from faststream.rabbit import RabbitBroker, RabbitExchange, RabbitQueue
from faststream.rabbit.subscriber import RabbitSubscriber
from structlog.testing import capture_logs

from fulfilment.application.ports import TransientError
from fulfilment.entrypoints.worker import new_metrics
from fulfilment.routes.handling import Handled, Handler
from fulfilment.worker import consumer_control
from fulfilment.worker.consumer_control import (
    ConsumerPause,
    ConsumerWatchdog,
    cancel_consumer,
    consumer_attached,
)
from fulfilment.worker.dead_lettering import DeadLetterChannel
from fulfilment.worker.delivery import DeliveryLimits, DeliveryPolicy, subscribe
from fulfilment.worker.faststream_internals import (
    broker_consumer_tags,
    consumed_queue,
    consumer_tag,
)

pytestmark = pytest.mark.rabbitmq

REFUSED = "connection refused"


@dataclass
class Database:
    up: bool = True

    async def ping(self) -> None:
        if not self.up:
            raise ConnectionRefusedError


@dataclass
class Two:
    """Two subscribers of one worker, on two queues, under one delivery policy."""

    broker: RabbitBroker
    exchange: RabbitExchange
    subscribers: tuple[RabbitSubscriber, RabbitSubscriber]
    pause: ConsumerPause
    database: Database
    handled: dict[str, list[bytes]]

    def attached(self) -> list[bool]:
        return [consumer_attached(subscriber) for subscriber in self.subscribers]

    async def publish(self, routing_key: str) -> None:
        body = b'{"event_id": "%s"}' % str(uuid.uuid4()).encode()
        await self.broker.publish(body, exchange=self.exchange, routing_key=routing_key)


@pytest.fixture
async def two(amqp_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Two]:
    monkeypatch.setattr(consumer_control, "FIRST_CHECK_SECONDS", 0.1)
    suffix = uuid.uuid4().hex[:8]
    broker = RabbitBroker(amqp_url, apply_types=False, logger=logging.getLogger("faststream"))
    FastStream(broker)
    exchange = RabbitExchange(f"test.events-{suffix}", durable=False, auto_delete=True)
    database = Database()
    pause = ConsumerPause(database.ping)
    handled: dict[str, list[bytes]] = {"a": [], "b": []}

    def handler(name: str) -> Handler:
        async def handle(body: bytes) -> Handled:
            if not database.up:
                raise TransientError(REFUSED)
            handled[name].append(body)
            return Handled(uuid.uuid4(), uuid.uuid4(), "reserved", ("reserved", ""))

        return handle

    async def count_redelivery(_event_id: uuid.UUID) -> int:
        return 1

    policy = DeliveryPolicy(
        broker,
        metrics=new_metrics(),
        limits=DeliveryLimits(
            handler_deadline_seconds=5.0,
            dead_letter_publish_seconds=1.0,
            delivery_limit=5,
            dead_letter_hold_seconds=60.0,
        ),
        count_redelivery=count_redelivery,
        pause=pause.trip,
        prefetch_count=4,
        publish_dead_letter=DeadLetterChannel(broker.connect).publish,
    )
    # Durable, and deleted below: RabbitMQ 4 deprecates transient queues that are not
    # exclusive, and an exclusive one would belong to the worker's connection.
    queues = {
        name: RabbitQueue(f"test.{name}-{suffix}", durable=True, routing_key=name)
        for name in ("a", "b")
    }
    a, b = (
        subscribe(policy, queue, exchange, handler(name), name=name)
        for name, queue in queues.items()
    )
    pause.attach([a, b])
    await broker.start()
    try:
        yield Two(broker, exchange, (a, b), pause, database, handled)
    finally:
        await pause.close()
        await broker.stop()
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel()
        for queue in queues.values():
            await channel.queue_delete(queue.name)
        await connection.close()


async def _until(condition: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"not within {seconds:g} s: {what}")


async def test_the_faststream_internals_read_a_started_subscribers_consumer(two: Two) -> None:
    a, _ = two.subscribers
    queue = consumed_queue(a)
    tag = consumer_tag(a)

    assert queue is not None
    assert queue.name == a.queue.name
    assert tag is not None
    assert tag in broker_consumer_tags(queue.channel)
    await cancel_consumer(a)
    assert consumer_tag(a) is None
    assert tag not in broker_consumer_tags(queue.channel)


async def test_one_outage_pauses_every_subscriber_and_resumes_them_all(two: Two) -> None:
    assert two.attached() == [True, True]
    two.database.up = False

    await two.publish("a")  # only a's handler meets the outage

    await _until(lambda: two.attached() == [False, False], "both consumers cancelled")
    assert two.pause.paused
    await two.publish("b")
    await asyncio.sleep(0.5)
    assert two.handled == {"a": [], "b": []}  # b takes nothing while paused

    two.database.up = True

    await _until(lambda: two.attached() == [True, True], "both consumers back")
    await _until(
        lambda: [len(bodies) for bodies in two.handled.values()] == [1, 1],
        "a's requeued delivery and b's waiting one handled",
    )
    assert not two.pause.paused


@pytest.mark.parametrize("lost", [0, 1])
async def test_the_watchdog_watches_each_subscriber(two: Two, lost: int) -> None:
    stopped = asyncio.Event()
    watchdog = ConsumerWatchdog(
        two.subscribers, two.pause, stopped.set, give_up_seconds=0.3, check_seconds=0.05
    )
    with capture_logs() as logs:
        watching = asyncio.create_task(watchdog.run())
        try:
            await asyncio.sleep(0.5)
            assert not stopped.is_set()  # both attached

            await cancel_consumer(two.subscribers[lost])

            await asyncio.wait_for(stopped.wait(), timeout=5)
        finally:
            watching.cancel()
    assert watchdog.gave_up
    [lost_line] = [line for line in logs if line["event"] == "consumer.lost"]
    assert lost_line["queue"] == two.subscribers[lost].queue.name


async def test_the_watchdog_does_not_give_up_on_consumers_paused_on_purpose(two: Two) -> None:
    stopped = asyncio.Event()
    watchdog = ConsumerWatchdog(
        two.subscribers, two.pause, stopped.set, give_up_seconds=0.3, check_seconds=0.05
    )
    watching = asyncio.create_task(watchdog.run())
    try:
        two.database.up = False
        await two.publish("b")
        await _until(lambda: two.attached() == [False, False], "both consumers cancelled")
        await asyncio.sleep(0.8)  # well past give_up_seconds
        assert not stopped.is_set()

        two.database.up = True
        await _until(lambda: two.attached() == [True, True], "both consumers back")
        await asyncio.sleep(0.5)
        assert not stopped.is_set()
    finally:
        watching.cancel()
