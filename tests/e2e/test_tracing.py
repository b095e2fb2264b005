"""Traces, end to end: a real worker and relay export over OTLP/HTTP to a receiver of the tests.

One order placed, partly cancelled and shipped, each event with its producer's
``traceparent``, gives one connected trace per event: the delivery's consumer span (child of
the producer's), the group commit (child of the delivery, linked to it) with the database
call inside, and the relay's publish of the result event (child of the delivery, whose
context the outbox row kept). A collector that is down or hangs costs counted spans, not the
drain or readiness.
"""

from __future__ import annotations

import socket
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import (
    ORDER_CANCELLED_QUEUE,
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_PLACED_QUEUE,
    ORDER_SHIPPED_QUEUE,
    ORDER_SHIPPED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from tests.e2e.harness import (
    WorkerProcess,
    free_port,
    order_event,
    publish,
    put_stock,
    spawn,
    wait_for,
)
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take
from tests.support.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

EXPORT_QUICKLY = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
"""Batches every 0.1 s instead of 5 s, so the spans arrive while the test waits."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


def producer_trace() -> tuple[str, str, str]:
    """A producer's ``(traceparent, trace id, span id)``, new ids each time."""
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def one(spans: list[ReceivedSpan], **wanted: object) -> ReceivedSpan:
    found = [
        span for span in spans if all(getattr(span, key) == value for key, value in wanted.items())
    ]
    assert len(found) == 1, (wanted, [(span.service, span.name, span.trace_id) for span in spans])
    return found[0]


def worker_metric(worker: WorkerProcess, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=2) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    msg = f"{series} not in /metrics"
    raise AssertionError(msg)


async def test_each_event_of_an_order_is_one_trace_from_its_producer_to_the_result_event(
    receiver: Receiver,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    worker_env: dict[str, str],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    otel = {
        **EXPORT_QUICKLY,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
    }
    await put_stock(db, {"85123A": 10, "71053": 10})
    results = await bind_events_queue(broker)
    worker = spawn(workers, {**worker_env, **otel}, tmp_path)
    relay = spawn_relay(relays, {**relay_env, **otel}, tmp_path)
    order_id, now = uuid.uuid4(), datetime.now(UTC)
    placed, cancelled, shipped = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    events = [
        (
            "order_placed",
            ORDER_PLACED_QUEUE,
            placed,
            order_placed_body(
                event_id=placed,
                order_id=order_id,
                placed_at=now,
                lines=[("85123A", 3), ("71053", 2)],
            ),
            "order.placed",
            "reserved",
            "place_orders",
            "stock.reserved",
        ),
        (
            "order_cancelled",
            ORDER_CANCELLED_QUEUE,
            cancelled,
            order_cancelled_body(
                event_id=cancelled, order_id=order_id, cancelled_at=now, lines=[("71053", 1)]
            ),
            ORDER_CANCELLED_ROUTING_KEY,
            "partially_released",
            "cancel_orders",
            "stock.released",
        ),
        (
            "order_shipped",
            ORDER_SHIPPED_QUEUE,
            shipped,
            order_shipped_body(event_id=shipped, order_id=order_id, shipped_at=now),
            ORDER_SHIPPED_ROUTING_KEY,
            "shipped",
            "ship_orders",
            "stock.shipped",
        ),
    ]
    traces = []
    for _, _, _, body, routing_key, *_, result_key in events:
        traceparent, trace_id, parent_id = producer_trace()
        await publish(broker, body, routing_key=routing_key, headers={"traceparent": traceparent})
        # One at a time: each event's group commit carries it alone.
        (message,) = await take(results, 1)
        assert message.routing_key == result_key
        traces.append((trace_id, parent_id, message))
    wanted = {trace_id for trace_id, _, _ in traces}
    spans = receiver.wait_until(
        lambda spans: all(
            sum(span.trace_id == trace_id for span in spans) >= 4 for trace_id in wanted
        )
    )
    assert worker.terminate()[0] == 0
    assert relay.terminate()[0] == 0

    for (event, queue, event_id, _, _, outcome, function, result_key), (
        trace_id,
        parent_id,
        message,
    ) in zip(events, traces, strict=True):
        in_trace = [span for span in spans if span.trace_id == trace_id]
        consumer = one(in_trace, name=f"process {queue}")
        assert (consumer.service, consumer.kind, consumer.parent_id) == (
            "fulfilment-worker",
            "consumer",
            parent_id,
        )
        assert consumer.attributes["messaging.system"] == "rabbitmq"
        assert consumer.attributes["messaging.destination.name"] == ORDERS_EXCHANGE
        assert consumer.attributes["fulfilment.event"] == event
        assert consumer.attributes["fulfilment.order_id"] == str(order_id)
        assert consumer.attributes["fulfilment.event_id"] == str(event_id)
        assert consumer.attributes["fulfilment.outcome"] == outcome
        group = one(in_trace, name="group commit")
        assert group.parent_id == consumer.span_id
        assert group.links == [(trace_id, consumer.span_id)]
        assert group.attributes["fulfilment.group_commit.size"] == 1
        database = one(in_trace, name=f"SELECT {function}")
        assert (database.kind, database.parent_id) == ("client", group.span_id)
        assert database.attributes["db.system"] == "postgresql"
        assert database.attributes["db.operation.name"] == "SELECT"
        publish_span = one(in_trace, name="publish fulfilment.events")
        assert (publish_span.service, publish_span.kind, publish_span.parent_id) == (
            "fulfilment-relay",
            "producer",
            consumer.span_id,
        )
        assert publish_span.attributes["messaging.rabbitmq.destination.routing_key"] == result_key
        assert publish_span.attributes["messaging.message.id"] == message.message_id
        assert 0 <= publish_span.attributes["fulfilment.outbox.lag_seconds"] < 60
        # The result event's consumers continue the same trace, under the publish.
        assert message.headers["traceparent"] == f"00-{trace_id}-{publish_span.span_id}-01"
        assert len(in_trace) == 4, [span.name for span in in_trace]


async def test_a_dead_letter_s_span_names_its_class_and_a_malformed_traceparent_starts_a_trace(
    receiver: Receiver,
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
) -> None:
    otel = {**EXPORT_QUICKLY, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"}
    worker = spawn(workers, {**worker_env, **otel}, tmp_path)
    shipment = order_shipped_body(
        event_id=uuid.uuid4(), order_id=uuid.uuid4(), shipped_at=datetime.now(UTC)
    )
    await publish(
        broker,
        shipment,
        routing_key=ORDER_SHIPPED_ROUTING_KEY,
        headers={"traceparent": "00-not-a-trace-context-01"},
    )

    spans = receiver.wait_until(
        lambda spans: any(span.name == f"process {ORDER_SHIPPED_QUEUE}" for span in spans)
    )
    consumer = one(spans, name=f"process {ORDER_SHIPPED_QUEUE}")
    assert consumer.parent_id == ""  # a new trace, as W3C Trace Context asks
    assert consumer.attributes["fulfilment.outcome"] == "dead_lettered:order_not_reserved"
    assert consumer.attributes["fulfilment.dead_letter.class"] == "permanent"
    assert worker.terminate()[0] == 0


@pytest.fixture(params=["down", "hanging"])
def collector_port(request: pytest.FixtureRequest) -> Iterator[int]:
    """A collector that is down (nothing listens) or hangs (connects, never answers)."""
    if request.param == "down":
        yield free_port()
        return
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(128)  # never accepted: the kernel completes connects, nobody answers
        yield listening.getsockname()[1]


async def test_a_collector_that_is_down_or_hangs_costs_counted_spans_not_drain_or_readiness(
    collector_port: int,
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    otel = {
        **EXPORT_QUICKLY,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}",
        # Each export waits up to 3 s (retrying a refused connection after 1 s and 2 s).
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
        "OTEL_BSP_MAX_QUEUE_SIZE": "16",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8",
    }
    orders = 300
    await put_stock(db, {"85123A": orders})
    worker = spawn(workers, {**worker_env, **otel}, tmp_path)
    for _ in range(orders):
        body, event_id = order_event([("85123A", 1)])
        await publish(broker, body, message_id=event_id)

    async def drained() -> bool:
        assert worker.ready()  # readiness never drops while spans are lost
        return int(await db.fetchval("SELECT count(*) FROM reservations")) == orders

    await wait_for(drained, timeout=90, what="every order reserved")
    queue_full = 'fulfilment_trace_spans_dropped_total{reason="queue_full"}'
    export_failed = 'fulfilment_trace_spans_dropped_total{reason="export_failed"}'

    async def export_failed_counted() -> bool:
        return worker_metric(worker, export_failed) > 0

    await wait_for(export_failed_counted, timeout=20, what="a failed export counted")
    # Each order is at least a delivery span and its share of a group commit: far more
    # than the queue of 16 holds while the exporter waits for a collector that is not there.
    assert worker_metric(worker, queue_full) > orders / 2
    code, seconds = worker.terminate()
    assert code == 0
    assert seconds < 15  # the exit gives queued spans at most 5 s
