"""The warehouse call in the order's trace: a real worker, relay and dispatcher, the simulator.

An order placed with its producer's ``traceparent`` and the hand-off on: the worker records
the fulfilment-order request with the delivery span's context (as the outbox row), the
dispatcher sends it to the warehouse simulator under a ``CLIENT`` span, child of that
delivery span, and the request carries that span's context as its ``traceparent`` header.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.order_placed import order_placed_body
from tests.e2e.harness import WorkerProcess, publish, put_stock, spawn, wait_for
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take
from tests.e2e.warehouse_harness import DispatcherProcess
from tests.support.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.support.simulated_warehouse import TOKEN
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
async def simulator() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN), seed=1)) as running:
        yield running


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


def metric(port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    msg = f"{series} not in /metrics"
    raise AssertionError(msg)


async def test_the_warehouse_call_is_a_client_span_in_the_order_s_trace(
    receiver: Receiver,
    simulator: SimulatorServer,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    worker_env: dict[str, str],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    env = {
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "FULFILMENT_WAREHOUSE_URL": simulator.url,
        "FULFILMENT_WAREHOUSE_TOKEN": TOKEN,
    }
    await put_stock(db, {"85123A": 10})
    results = await bind_events_queue(broker)
    spawn(workers, {**worker_env, **env}, tmp_path)
    spawn_relay(relays, {**relay_env, **env}, tmp_path)
    dispatcher = DispatcherProcess({**worker_env, **env}, tmp_path / "dispatcher.log")
    workers.append(dispatcher)  # killed at the end with the workers
    dispatcher.start()
    order_id, event_id = uuid.uuid4(), uuid.uuid4()
    trace_id, producer_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    await publish(
        broker,
        order_placed_body(
            event_id=event_id,
            order_id=order_id,
            placed_at=datetime.now(UTC),
            lines=[("85123A", 3)],
        ),
        message_id=str(event_id),
        headers={"traceparent": f"00-{trace_id}-{producer_span}-01"},
    )
    (reserved,) = await take(results, 1)
    assert reserved.routing_key == "stock.reserved"

    def in_trace() -> list[ReceivedSpan]:
        return [span for span in receiver.spans if span.trace_id == trace_id]

    async def delivery_and_warehouse_call_exported() -> bool:
        spans = in_trace()
        return any(span.service == "fulfilment-dispatcher" for span in spans) and any(
            span.name.startswith("process ") for span in spans
        )

    # Not receiver.wait_until: it blocks the loop the simulator answers on.
    await wait_for(
        delivery_and_warehouse_call_exported,
        timeout=30,
        what="the delivery's span and the warehouse call's",
    )
    spans = in_trace()
    [consumer] = [span for span in spans if span.name.startswith("process ")]
    [call] = [span for span in spans if span.service == "fulfilment-dispatcher"]
    key, stored_traceparent = await db.fetchrow(
        "SELECT idempotency_key, traceparent FROM warehouse_requests WHERE order_id = $1",
        order_id,
    )
    outbox_traceparent = await db.fetchval(
        "SELECT traceparent FROM outbox WHERE order_id = $1", order_id
    )
    # The request continues the trace where its outbox row does: at the delivery's span.
    assert stored_traceparent == outbox_traceparent == f"00-{trace_id}-{consumer.span_id}-01"
    assert (call.name, call.kind, call.parent_id) == (
        "POST /fulfilment-orders",
        "client",
        consumer.span_id,
    )
    assert call.attributes["fulfilment.idempotency_key"] == str(key)
    assert call.attributes["fulfilment.warehouse.answer"] == "accepted"
    assert call.attributes["http.request.method"] == "POST"
    assert call.attributes["http.response.status_code"] == 201
    assert call.attributes["fulfilment.order_id"] == str(order_id)
    assert call.status_code == 0  # unset: an accepted request is no error
    # The warehouse system got the context of the call's span, not the stored one.
    [received] = list(simulator.simulator.orders.values())
    assert received.traceparent == f"00-{trace_id}-{call.span_id}-01"
    assert received.idempotency_key == str(key)
    for reason in ("queue_full", "export_failed"):
        series = f'fulfilment_trace_spans_dropped_total{{reason="{reason}"}}'
        assert metric(dispatcher.port, series) == 0
    assert dispatcher.terminate()[0] == 0
