"""``on_order_cancelled`` and ``on_order_shipped``: their handler logic, and the worker.

The handlers are called directly, and through the worker of ``build_worker`` on FastStream's
in-memory broker with the in-memory warehouse, which runs the lifecycle's state table
(``fulfilment.domain.lifecycle``). As in ``test_on_order_placed``, the in-memory broker has no
acknowledgements, dead-letter exchange or delivery limit: these tests check what the worker
decides, and which dead-letter queue each refusal goes to.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from faststream.rabbit import RabbitMessage, TestRabbitBroker

from builders import in_trace, order
from deliveries import in_memory_dead_letters
from fakes import InMemoryWarehouse
from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import (
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_SHIPPED,
    SubscribedQueue,
)
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.entrypoints.worker import Worker, build_worker
from fulfilment.routes.handling import EventRefusedError, MalformedEventError
from fulfilment.routes.table import SUBSCRIBED_QUEUES, on_order_cancelled, on_order_shipped
from fulfilment.settings import Settings
from fulfilment.worker.delivery import raw_body
from fulfilment.worker.topology import Topology

AT = datetime(2010, 12, 1, 9, 41, tzinfo=UTC)


async def _no_database() -> None:
    return None


def placed(order_id: uuid.UUID, lines: list[tuple[str, int]]) -> bytes:
    return order_placed_body(event_id=uuid.uuid4(), order_id=order_id, placed_at=AT, lines=lines)


def cancelled(
    order_id: uuid.UUID,
    lines: list[tuple[str, int]] | None = None,
    event_id: uuid.UUID | None = None,
) -> bytes:
    return order_cancelled_body(
        event_id=event_id or uuid.uuid4(), order_id=order_id, cancelled_at=AT, lines=lines
    )


def shipped(order_id: uuid.UUID, event_id: uuid.UUID | None = None) -> bytes:
    return order_shipped_body(event_id=event_id or uuid.uuid4(), order_id=order_id, shipped_at=AT)


@dataclass
class Harness:
    worker: Worker
    warehouse: InMemoryWarehouse
    dead_letters: list[tuple[str, RabbitMessage]]
    broker: Any

    async def publish(self, queue: SubscribedQueue, body: bytes, **options: Any) -> None:
        await self.broker.publish(
            body,
            exchange=Topology(5).orders_exchange(),
            routing_key=queue.routing_key,
            **options,
        )

    def outcomes(self) -> list[str]:
        return [
            f"{labels['event']} {labels['outcome']}:{labels['reason']}"
            for metric in self.worker.metrics.registry.collect()
            if metric.name == "fulfilment_events"
            for sample in metric.samples
            if sample.name.endswith("_total")
            for labels in [sample.labels]
            for _ in range(int(sample.value))
        ]

    async def level(self, sku: str) -> tuple[int, int]:
        level = (await self.warehouse.stock([sku]))[sku]
        return level.on_hand, level.reserved


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10, "71053": 10})
    worker = build_worker(
        Settings(),
        warehouse=warehouse,
        database_ping=_no_database,
        dead_letter_publisher=in_memory_dead_letters,
    )
    topology = Topology(5)
    dead_letters: list[tuple[str, RabbitMessage]] = []

    def capture(dlq: str) -> Callable[[bytes], Awaitable[None]]:
        async def captured(_body: bytes) -> None:
            # The worker's broker runs without FastDepends (apply_types=False).
            dead_letters.append((dlq, worker.broker.context.get_local("message")))

        return captured

    for subscribed in SUBSCRIBED_QUEUES:
        worker.broker.subscriber(
            topology.dead_letter_queue(subscribed),
            topology.dead_letter_exchange(),
            decoder=raw_body,
        )(capture(subscribed.dead_letter_queue))

    async with TestRabbitBroker(worker.broker) as broker:
        try:
            yield Harness(worker, warehouse, dead_letters, broker)
        finally:
            # A test that paused the consumers leaves no task behind to resume them later.
            await worker.consumer_pause.close()


async def test_the_worker_subscribes_one_consumer_per_queue_of_the_topology(
    harness: Harness,
) -> None:
    queues = [subscriber.queue for subscriber in harness.worker.subscribers]
    assert [queue.name for queue in queues] == [queue.name for queue in SUBSCRIBED_QUEUES]
    assert [queue.routing_key for queue in queues] == [
        queue.routing_key for queue in SUBSCRIBED_QUEUES
    ]
    # The contract's arguments until the start-up hook replaces them with those each queue
    # was accepted with (tests/faults/test_broker_faults.py: a queue that kept an older set).
    for queue, subscribed in zip(queues, SUBSCRIBED_QUEUES, strict=True):
        assert queue.declare
        assert queue.arguments == Topology(Settings().delivery_limit).queue(subscribed).arguments


async def test_a_partial_cancel_releases_its_units_and_a_whole_one_the_rest(
    harness: Harness,
) -> None:
    order_id = uuid.uuid4()
    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6), ("71053", 2)]))

    await harness.publish(ORDER_CANCELLED, cancelled(order_id, [("85123A", 4)]))
    assert await harness.level("85123A") == (10, 2)
    await harness.publish(ORDER_CANCELLED, cancelled(order_id))

    assert await harness.level("85123A") == (10, 0)
    assert await harness.level("71053") == (10, 0)
    assert harness.warehouse.reservations[order_id].status is OrderStatus.RELEASED
    assert harness.dead_letters == []
    assert harness.outcomes() == [
        "order_placed reserved:",
        "order_cancelled released:",
        "order_cancelled partially_released:",
    ]


async def test_a_cancel_before_its_order_is_remembered_and_the_order_reserves_what_remains(
    harness: Harness,
) -> None:
    order_id = uuid.uuid4()
    await harness.publish(ORDER_CANCELLED, cancelled(order_id, [("85123A", 4)]))
    assert await harness.level("85123A") == (10, 0)

    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))

    assert await harness.level("85123A") == (10, 2)
    assert harness.outcomes() == ["order_placed reserved:", "order_cancelled tombstoned:"]


async def test_a_shipment_takes_the_order_s_units_out_of_stock(harness: Harness) -> None:
    order_id = uuid.uuid4()
    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))

    await harness.publish(ORDER_SHIPPED, shipped(order_id))
    await harness.publish(ORDER_SHIPPED, shipped(order_id))  # another event: nothing left

    assert await harness.level("85123A") == (4, 0)
    assert harness.outcomes() == [
        "order_placed reserved:",
        "order_shipped shipped:",
        "order_shipped ignored:",
    ]


async def test_a_cancel_after_the_shipment_changes_nothing_and_is_counted(
    harness: Harness,
) -> None:
    order_id = uuid.uuid4()
    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))
    await harness.publish(ORDER_SHIPPED, shipped(order_id))

    await harness.publish(ORDER_CANCELLED, cancelled(order_id))

    assert await harness.level("85123A") == (4, 0)
    assert "order_cancelled cancel_after_ship:" in harness.outcomes()


@pytest.mark.parametrize("before", ["nothing", "a whole cancel"])
async def test_a_shipment_of_an_order_that_is_not_reserved_is_dead_lettered_for_an_operator(
    harness: Harness, before: str
) -> None:
    order_id = uuid.uuid4()
    if before == "a whole cancel":
        await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))
        await harness.publish(ORDER_CANCELLED, cancelled(order_id))
    body = shipped(order_id)

    await harness.publish(ORDER_SHIPPED, body, message_id="ship-1")

    [(dlq, letter)] = harness.dead_letters
    assert dlq == ORDER_SHIPPED.dead_letter_queue
    assert letter.body == body
    assert letter.message_id == "ship-1"
    headers = letter.headers
    assert headers["x-fulfilment-failure-class"] == "permanent"
    assert headers["x-fulfilment-reason"].startswith("order_not_reserved: ")
    assert headers["x-fulfilment-original-queue"] == ORDER_SHIPPED.name
    assert headers["x-fulfilment-original-routing-key"] == ORDER_SHIPPED.routing_key
    assert "order_shipped dead_lettered:order_not_reserved" in harness.outcomes()
    assert await harness.level("85123A") == (10, 0)


async def test_a_dead_lettered_shipment_ships_the_order_when_replayed_once_it_is_placed(
    harness: Harness,
) -> None:
    order_id = uuid.uuid4()
    body = shipped(order_id)
    await harness.publish(ORDER_SHIPPED, body)
    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))

    await harness.publish(ORDER_SHIPPED, body)  # the operator's replay: the same event

    assert await harness.level("85123A") == (4, 0)
    assert harness.outcomes().count("order_shipped shipped:") == 1


@pytest.mark.parametrize("queue", [ORDER_CANCELLED, ORDER_SHIPPED], ids=lambda q: q.event)
async def test_a_malformed_event_goes_to_the_dead_letter_queue_of_its_own_queue(
    harness: Harness, queue: SubscribedQueue
) -> None:
    await harness.publish(queue, b'{"version": 1, "lines": null}')

    [(dlq, letter)] = harness.dead_letters
    assert dlq == queue.dead_letter_queue
    assert letter.headers["x-fulfilment-failure-class"] == "permanent"
    assert letter.headers["x-fulfilment-original-queue"] == queue.name
    assert f"{queue.event} dead_lettered:permanent" in harness.outcomes()


async def test_a_redelivered_cancel_is_a_duplicate_and_releases_once(harness: Harness) -> None:
    order_id = uuid.uuid4()
    await harness.publish(ORDER_PLACED, placed(order_id, [("85123A", 6)]))
    body = cancelled(order_id, [("85123A", 1)])

    await harness.publish(ORDER_CANCELLED, body)
    await harness.publish(ORDER_CANCELLED, body)

    assert await harness.level("85123A") == (10, 5)
    assert "order_cancelled duplicate:event" in harness.outcomes()


async def test_the_cancel_handler_says_what_it_did_and_observes_no_latency() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    event_id, order_id = uuid.uuid4(), uuid.uuid4()

    handled = await on_order_cancelled(cancelled(order_id, event_id=event_id), warehouse=warehouse)

    assert (handled.event_id, handled.order_id) == (event_id, order_id)
    assert handled.outcome == "tombstoned"
    assert handled.labels == ("tombstoned", "")
    assert handled.latency_since is None
    assert handled.log_fields == {"status": OrderStatus.CANCELLED, "whole": True}


async def test_the_ship_handler_labels_a_duplicate_by_the_event() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    order_id = uuid.uuid4()
    await warehouse.apply(order(("85123A", 1), order_id=order_id))
    body = shipped(order_id)
    await on_order_shipped(body, warehouse=warehouse)

    handled = await on_order_shipped(body, warehouse=warehouse)

    assert handled.outcome == "duplicate:event"
    assert handled.labels == ("duplicate", "event")


async def test_the_ship_handler_refuses_an_order_it_cannot_ship_naming_the_order() -> None:
    order_id = uuid.uuid4()
    with pytest.raises(EventRefusedError) as refused:
        await on_order_shipped(shipped(order_id), warehouse=InMemoryWarehouse())

    assert refused.value.reason == "order_not_reserved"
    assert str(refused.value) == (
        f"order_not_reserved: order {order_id} cannot be shipped: it has not been placed"
    )


@pytest.mark.parametrize(
    ("handler", "title"),
    [(on_order_cancelled, "OrderCancelled v1"), (on_order_shipped, "OrderShipped v1")],
)
async def test_the_handlers_refuse_a_body_that_is_not_their_event(handler: Any, title: str) -> None:
    with pytest.raises(MalformedEventError, match=f"invalid {title}"):
        await handler(b'{"version": 1}', warehouse=InMemoryWarehouse())


async def test_the_handlers_hand_the_trace_context_to_the_result_events() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"A": 10})
    placed = order(("A", 2))
    place_trace = "00-" + "1" * 32 + "-" + "1" * 16 + "-01"
    with in_trace(place_trace):
        await warehouse.apply(placed)
    cancel_trace, ship_trace = "00-" + "2" * 32 + "-" + "2" * 16 + "-01", None

    with in_trace(cancel_trace):
        await on_order_cancelled(cancelled(placed.order_id, [("A", 1)]), warehouse=warehouse)
    with in_trace(ship_trace):
        await on_order_shipped(shipped(placed.order_id), warehouse=warehouse)

    assert [(event.routing_key, event.traceparent) for event in warehouse.result_events] == [
        ("stock.reserved", place_trace),
        ("stock.released", cancel_trace),
        ("stock.shipped", None),
    ]
