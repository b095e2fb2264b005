"""``on_order_placed``: its handler logic, and the worker that subscribes it under the policy.

The handler is called directly, and through the worker of ``build_worker`` on FastStream's
in-memory broker with the in-memory warehouse. ``TestRabbitBroker`` has no acknowledgements,
dead-letter exchange or delivery limit, so these tests only check what the worker decides;
the policy's every outcome is tested in ``test_delivery_policy``, the real broker's behaviour
in ``tests/e2e``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from faststream.rabbit import RabbitMessage, TestRabbitBroker

from deliveries import deliver, in_memory_dead_letters, incoming
from fakes import InMemoryWarehouse
from fulfilment.application.ports import OutcomeT, TransientError
from fulfilment.contracts.envelope import MAX_BODY_BYTES
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.topology import ORDER_PLACED_QUEUE, ORDER_PLACED_ROUTING_KEY
from fulfilment.domain.model import Command
from fulfilment.entrypoints.worker import Worker, build_worker
from fulfilment.routes.handling import MalformedEventError
from fulfilment.routes.table import SUBSCRIBED_QUEUES, on_order_placed
from fulfilment.settings import Settings
from fulfilment.worker.delivery import raw_body
from fulfilment.worker.topology import Topology


async def _no_database() -> None:
    return None


@dataclass
class Harness:
    worker: Worker
    warehouse: InMemoryWarehouse
    dead_letters: list[RabbitMessage]
    broker: Any

    async def publish(self, body: bytes, **options: Any) -> None:
        await self.broker.publish(
            body,
            exchange=Topology(5).orders_exchange(),
            routing_key=ORDER_PLACED_ROUTING_KEY,
            **options,
        )

    def outcomes(self) -> list[str]:
        return [
            f"{labels['outcome']}:{labels['reason']}"
            for metric in self.worker.metrics.registry.collect()
            if metric.name == "fulfilment_events"
            for sample in metric.samples
            if sample.name.endswith("_total")
            for labels in [sample.labels]
            for _ in range(int(sample.value))
        ]


async def _harness(
    warehouse: InMemoryWarehouse, settings: Settings | None = None
) -> AsyncIterator[Harness]:
    settings = settings or Settings()
    worker = build_worker(
        settings,
        warehouse=warehouse,
        database_ping=_no_database,
        dead_letter_publisher=in_memory_dead_letters,
    )
    topology = Topology(settings.delivery_limit)
    dead_letters: list[RabbitMessage] = []

    async def capture(_body: bytes) -> None:
        # The worker's broker runs without FastDepends (apply_types=False).
        dead_letters.append(worker.broker.context.get_local("message"))

    for subscribed in SUBSCRIBED_QUEUES:
        worker.broker.subscriber(
            topology.dead_letter_queue(subscribed),
            topology.dead_letter_exchange(),
            decoder=raw_body,
        )(capture)

    async with TestRabbitBroker(worker.broker) as broker:
        try:
            yield Harness(worker, warehouse, dead_letters, broker)
        finally:
            # A test that paused the consumers leaves no task behind to resume them later.
            await worker.consumer_pause.close()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10, "BANK CHARGES": 1})
    async for value in _harness(warehouse):
        yield value


PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)


def a_body(lines: list[tuple[str, int]], event_id: uuid.UUID | None = None) -> bytes:
    return order_placed_body(
        event_id=event_id or uuid.uuid4(),
        order_id=uuid.uuid4(),
        placed_at=PLACED_AT,
        lines=lines,
    )


async def test_a_valid_order_is_reserved_and_nothing_is_dead_lettered(harness: Harness) -> None:
    await harness.publish(a_body([("85123A", 6), ("BANK CHARGES", 1)]))

    stock = await harness.warehouse.stock(["85123A", "BANK CHARGES"])
    assert stock["85123A"].reserved == 6
    assert stock["BANK CHARGES"].reserved == 1
    assert harness.dead_letters == []
    assert harness.outcomes() == ["reserved:"]


async def test_insufficient_stock_is_an_outcome_not_a_failure(harness: Harness) -> None:
    await harness.publish(a_body([("85123A", 11)]))

    assert harness.dead_letters == []
    assert harness.outcomes() == ["rejected:insufficient_stock"]
    assert (await harness.warehouse.stock(["85123A"]))["85123A"].reserved == 0


async def test_a_redelivered_event_is_counted_as_a_duplicate(harness: Harness) -> None:
    body = a_body([("85123A", 1)])
    await harness.publish(body)
    await harness.publish(body)

    assert sorted(harness.outcomes()) == ["duplicate:event", "reserved:"]
    assert (await harness.warehouse.stock(["85123A"]))["85123A"].reserved == 1


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b"\xff\xfe not json", "application/json", "invalid OrderPlaced v1"),
        (b"[1, 2, 3]", "application/json", "invalid OrderPlaced v1"),
        (b'{"version": 2}', "application/json", "version"),
        (
            a_body([("85123A", 1)]).replace(b"+00:00", b"").replace(b"Z", b""),
            "application/json",
            "placed_at",
        ),
        (a_body([("85123A", 1)]), "application/xml", "content type"),
        (b" " * (MAX_BODY_BYTES + 1), "application/json", "exceeds the limit"),
    ],
    ids=["not-utf8", "not-an-object", "unknown-version", "naive-time", "xml", "too-large"],
)
async def test_a_malformed_event_is_dead_lettered_as_permanent_with_its_reason(
    harness: Harness, body: bytes, content_type: str, reason: str
) -> None:
    await harness.publish(body, content_type=content_type)

    assert len(harness.dead_letters) == 1
    headers = harness.dead_letters[0].headers
    assert headers["x-fulfilment-failure-class"] == "permanent"
    assert reason in headers["x-fulfilment-reason"]
    assert harness.dead_letters[0].body == body
    assert harness.outcomes() == ["dead_lettered:permanent"]


class FailingWarehouse(InMemoryWarehouse):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:  # noqa: ARG002 - fails whatever the order
        raise self.error


async def test_an_unknown_error_dead_letters_as_unexpected_with_the_exception() -> None:
    error = KeyError("bug")
    async for harness in _harness(FailingWarehouse(error)):
        await harness.publish(a_body([("85123A", 1)]), message_id="m-1")

        assert len(harness.dead_letters) == 1
        letter = harness.dead_letters[0]
        assert letter.headers["x-fulfilment-failure-class"] == "unexpected"
        assert letter.headers["x-fulfilment-exception-type"] == "KeyError"
        assert "test_on_order_placed.py" in letter.headers["x-fulfilment-stack"]
        assert letter.message_id == "m-1"


async def test_a_database_outage_requeues_the_delivery_and_pauses_the_consumer() -> None:
    async for harness in _harness(FailingWarehouse(TransientError("connection refused"))):
        await harness.publish(a_body([("85123A", 1)]))

        assert harness.dead_letters == []
        assert harness.outcomes() == ["requeued:transient"]
        assert harness.worker.consumer_pause.paused


async def test_an_event_redelivered_past_the_limit_is_poison_and_is_not_reserved() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    body = a_body([("85123A", 1)])
    async for harness in _harness(warehouse, Settings(delivery_limit=3)):
        [subscriber] = [s for s in harness.worker.subscribers if s.queue.name == ORDER_PLACED_QUEUE]

        # Delivery 2 (the first redelivery) goes through; delivery 3 is poison, unprocessed.
        await deliver(subscriber, incoming(body, redelivered=True))
        assert harness.outcomes() == ["reserved:"]
        await deliver(subscriber, incoming(body, redelivered=True))

        [poison] = harness.dead_letters
        assert poison.headers["x-fulfilment-failure-class"] == "poison"
        assert "delivered 3 times" in poison.headers["x-fulfilment-reason"]
        assert (await warehouse.stock(["85123A"]))["85123A"].reserved == 1


async def test_a_first_delivery_is_not_counted_as_a_redelivery() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    async for harness in _harness(warehouse, Settings(delivery_limit=1)):
        await harness.publish(a_body([("85123A", 1)]))

        assert harness.outcomes() == ["reserved:"]
        assert warehouse.redeliveries == {}


async def test_the_handler_reserves_and_says_so_with_the_order_and_its_moment() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    event_id, order_id = uuid.uuid4(), uuid.uuid4()
    body = order_placed_body(
        event_id=event_id, order_id=order_id, placed_at=PLACED_AT, lines=[("85123A", 6)]
    )

    handled = await on_order_placed(body, warehouse=warehouse)

    assert (handled.event_id, handled.order_id) == (event_id, order_id)
    assert handled.outcome == "reserved"
    assert handled.labels == ("reserved", "")
    assert handled.latency_since == PLACED_AT
    assert handled.log_fields == {"skus": None}
    assert (await warehouse.stock(["85123A"]))["85123A"].reserved == 6


async def test_the_handler_names_the_skus_an_order_was_rejected_for() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})

    handled = await on_order_placed(a_body([("85123A", 1), ("NOPE", 1)]), warehouse=warehouse)

    assert handled.outcome == "rejected:unknown_sku"
    assert handled.labels == ("rejected", "unknown_sku")
    assert handled.log_fields == {"skus": ["NOPE"]}
    assert handled.latency_since == PLACED_AT


async def test_the_handler_observes_no_latency_for_a_duplicate() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    body = a_body([("85123A", 1)])
    await on_order_placed(body, warehouse=warehouse)

    handled = await on_order_placed(body, warehouse=warehouse)

    assert handled.outcome == "duplicate:event"
    assert handled.labels == ("duplicate", "event")
    assert handled.latency_since is None


async def test_the_handler_refuses_a_body_that_is_not_an_order_placed_v1() -> None:
    with pytest.raises(MalformedEventError, match="invalid OrderPlaced v1: lines"):
        await on_order_placed(
            b'{"version": 1, "event_id": "%s", "order_id": "%s", '
            b'"placed_at": "2010-12-01T08:26:00+00:00", "lines": []}'
            % (str(uuid.uuid4()).encode(), str(uuid.uuid4()).encode()),
            warehouse=InMemoryWarehouse(),
        )


async def test_the_worker_hands_the_delivery_s_traceparent_to_the_result_event() -> None:
    warehouse = InMemoryWarehouse()
    await warehouse.put_stock({"85123A": 10})
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async for harness in _harness(warehouse, Settings()):
        await harness.publish(a_body([("85123A", 1)]), headers={"traceparent": traceparent})
        await harness.publish(a_body([("85123A", 1)]))

        assert harness.outcomes() == ["reserved:", "reserved:"]
        assert [event.traceparent for event in warehouse.result_events] == [traceparent, None]
