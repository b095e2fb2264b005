"""``fulfilment report`` and ``reconcile`` (each kind published) against RabbitMQ and PostgreSQL.

No worker runs: orders are reserved through the PostgreSQL stock store, dead letters are put in
the DLQs as the worker writes them, and the tools read every queue and DLQ of the topology.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import pytest
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.rabbitmq import inspection
from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE, ORDER_SHIPPED
from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.dataset.online_retail import shipment_event_id_for
from fulfilment.dataset.reconcile import reconcile_command
from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import RecordShipment, Source, warehouse_event_id
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from fulfilment.tools.command import CommandError, ToolOptions
from fulfilment.tools.report import collect_report, reconcile, render_report
from fulfilment.worker.topology import Topology, declare_topology
from tests.support.builders import cancellation, order, shipment

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DELIVERY_LIMIT = 5  # the e2e harness's limit: one topology per test vhost


@pytest.fixture
async def options(clean_database: str, amqp_url: str) -> AsyncIterator[ToolOptions]:
    await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))
    await _purge(amqp_url)
    try:
        yield tool_options(
            Settings(
                database=DatabaseSettings(url=SecretStr(clean_database)),
                broker=BrokerSettings(amqp_url=SecretStr(amqp_url)),
            )
        )
    finally:
        await _purge(amqp_url)


async def _purge(amqp_url: str) -> None:
    async with await aio_pika.connect(amqp_url) as connection:
        channel = await connection.channel()
        for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
            await (await channel.get_queue(name)).purge()


async def refused_shipment(amqp_url: str) -> uuid.UUID:
    """A shipment dead-lettered as the worker does when its order is not reserved."""
    event_id = uuid.uuid4()
    body = order_shipped_body(
        event_id=event_id, order_id=uuid.uuid4(), shipped_at=datetime.now(UTC)
    )
    async with await aio_pika.connect(amqp_url) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
        await exchange.publish(
            aio_pika.Message(
                body,
                message_id=str(event_id),
                content_type="application/json",
                headers={
                    h.FAILURE_CLASS: "permanent",
                    h.EXCEPTION_TYPE: "EventRefusedError",
                    h.REASON: "order_not_reserved: order x cannot be shipped: it is released",
                    h.ORIGINAL_QUEUE: ORDER_SHIPPED.name,
                },
            ),
            routing_key=ORDER_SHIPPED.dead_letter_routing_key,
            mandatory=True,
        )
    return event_id


async def test_reconcile_finds_events_of_every_kind_in_the_inbox_or_in_any_dlq(
    options: ToolOptions, amqp_url: str
) -> None:
    engine = create_engine(options.database)
    try:
        stock = PostgresStock(engine, consumer=options.consumer, retry_budget_seconds=2)
        await stock.put_stock({"A": 10})
        placed = order(("A", 2))
        await stock.apply(placed)
    finally:
        await engine.dispose()
    refused = await refused_shipment(amqp_url)
    lost = uuid.uuid4()

    result = await reconcile(options, [placed.event_id, refused, lost])

    assert (result.published, result.processed, result.dead_lettered) == (3, 1, 1)
    assert result.missing == frozenset({lost})
    assert result.dead_lettered_by_queue == {
        "fulfilment.order-placed.dlq": 0,
        "fulfilment.order-cancelled.dlq": 0,
        "fulfilment.order-shipped.dlq": 1,
    }
    assert result.invariants_hold


async def test_the_report_counts_every_dlq_and_every_queue(
    options: ToolOptions, amqp_url: str
) -> None:
    await refused_shipment(amqp_url)

    document = await collect_report(options)

    assert document["dead_lettered"] == {
        "total": 1,
        "by_queue": {
            "fulfilment.order-placed.dlq": 0,
            "fulfilment.order-cancelled.dlq": 0,
            "fulfilment.order-shipped.dlq": 1,
        },
        "by_reason": [
            {
                "queue": "fulfilment.order-shipped.dlq",
                "class": "permanent",
                "reason": "order_not_reserved",
                "count": 1,
            }
        ],
    }
    assert document["pending"] == {
        "ready": 0,
        "consumers": 0,
        "by_queue": {queue.name: {"ready": 0, "consumers": 0} for queue in SUBSCRIBED_QUEUES},
    }
    outcomes = document["outcomes"]
    assert (outcomes["released"], outcomes["shipped"], outcomes["cancelled"]) == (0, 0, 0)
    rendered = render_report(document)
    assert "fulfilment.order-shipped.dlq  permanent: order_not_reserved  1" in rendered
    assert "stock invariants               hold" in rendered
    assert document["shortage"] == {"skus": 0, "units": 0, "examples": []}
    assert "short SKUs (after a reported loss)   0" in rendered
    assert document["outbox"] == {"unpublished": 0, "published": 0}
    assert "outbox (result events)" in rendered


async def test_a_dlq_deeper_than_a_look_can_hold_is_counted_as_unread_not_as_missing(
    options: ToolOptions, amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The look holds what it reads unacknowledged, at most 65,535 (the largest prefetch);
    # three stand for them here, so that five dead letters overflow it.
    monkeypatch.setattr(inspection, "PEEK_LIMIT", 3)
    refused = [await refused_shipment(amqp_url) for _ in range(5)]

    result = await reconcile(options, refused)

    assert (result.dead_lettered, result.unread_dead_letters, len(result.missing)) == (3, 2, 2)
    assert (
        "2 missing (2 dead letters past the first 65,535 of a DLQ were not read: a missing"
        " event may be among them" in result.describe()
    )
    document = await collect_report(options)
    assert document["dead_lettered"]["total"] == 5
    assert document["dead_lettered"]["by_reason"][-1] == {
        "queue": "fulfilment.order-shipped.dlq",
        "class": "unread",
        "reason": "past 65,535",
        "count": 2,
    }


async def test_the_report_says_when_the_virtual_host_has_none_of_the_service_s_queues(
    clean_database: str, private_vhost_url: str
) -> None:
    options = tool_options(
        Settings(
            database=DatabaseSettings(url=SecretStr(clean_database)),
            broker=BrokerSettings(amqp_url=SecretStr(private_vhost_url)),
        )
    )

    document = await collect_report(options)

    every_queue = [*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES]
    assert document["missing_queues"] == every_queue
    # The same note as dlq list's, after the zeros it explains.
    assert render_report(document).splitlines()[-1] == (
        f"note: no queue {', '.join(every_queue)} in this virtual host: is"
        " FULFILMENT_AMQP_URL the service's? (the worker declares them at start)"
    )


DAY = """InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country
536365,85123A,HEART,2,2010-12-01 08:26:00,2.55,17850.0,United Kingdom
536366,22633,HAND WARMER,1,2010-12-01 08:28:00,1.85,13047.0,United Kingdom
C536367,85123A,HEART,-2,2010-12-01 09:41:00,2.55,17850.0,United Kingdom
"""


async def test_reconcile_checks_the_cancellations_and_the_shipments_published_from_the_files(
    options: ToolOptions, tmp_path: Path
) -> None:
    data = tmp_path / "2010-12-01.csv"
    data.write_text(DAY)
    read = read_order_files([data])
    cancelled, shipped = read.orders
    (mapped,) = match_read_cancellations(read).cancellations
    assert mapped.order_id == cancelled.order_id
    engine = create_engine(options.database)
    try:
        stock = PostgresStock(engine, consumer=options.consumer, retry_budget_seconds=2)
        await stock.put_stock({"85123A": 10, "22633": 10})
        for placed in read.orders:
            await stock.apply(
                order(*placed.lines, event_id=placed.event_id, order_id=placed.order_id)
            )
        await stock.apply(cancellation(mapped.order_id, *mapped.lines, event_id=mapped.event_id))

        # The end of the day's shipment of the order still reserved was not processed: lost.
        lines: list[str] = []
        with pytest.raises(CommandError) as missing:
            await reconcile_command(
                options, [data], cancellations=True, shipments=True, echo=lines.append
            )
        assert missing.value.exit_code == 1
        assert [line.split(":")[0] for line in lines] == [
            "OrderPlaced",
            "OrderCancelled",
            "OrderShipped",
        ]
        assert "reconciled 2 published events: 2 processed" in lines[0]
        assert "reconciled 1 published events: 1 processed" in lines[1]
        assert (
            "reconciled 1 published events: 0 processed, 0 in the dead-letter queue, 1 missing"
            in lines[2]
        )

        await stock.apply(
            shipment(shipped.order_id, event_id=shipment_event_id_for(shipped.invoice_no))
        )
    finally:
        await engine.dispose()

    lines.clear()
    await reconcile_command(options, [data], cancellations=True, shipments=True, echo=lines.append)
    assert len(lines) == 3
    assert all(", 0 missing, " in line for line in lines), lines
    assert "reconciled 1 published events: 1 processed" in lines[2]

    # Without the flags, the orders alone, on one line as before.
    lines.clear()
    await reconcile_command(options, [data], echo=lines.append)
    assert len(lines) == 1
    assert lines[0].startswith("reconciled 2 published events: 2 processed")


async def test_reconcile_expects_no_order_shipped_of_an_order_a_shipment_of_the_warehouse_shipped(
    options: ToolOptions, tmp_path: Path
) -> None:
    data = tmp_path / "2010-12-01.csv"
    data.write_text(DAY)
    read = read_order_files([data])
    _, shipped = read.orders
    (mapped,) = match_read_cancellations(read).cancellations
    engine = create_engine(options.database)
    try:
        stock = PostgresStock(engine, consumer=options.consumer, retry_budget_seconds=2)
        await stock.put_stock({"85123A": 10, "22633": 10})
        for placed in read.orders:
            await stock.apply(
                order(*placed.lines, event_id=placed.event_id, order_id=placed.order_id)
            )
        await stock.apply(cancellation(mapped.order_id, *mapped.lines, event_id=mapped.event_id))
        # The demo's warehouse ships the order that is still reserved: no OrderShipped of it.
        await stock.apply(
            RecordShipment(
                event_id=warehouse_event_id("shipment", "SHP-1"),
                shipment_id="SHP-1",
                webhook_id="msg_1",
                fulfilment_order_id="WH-000001",
                order_id=shipped.order_id,
                shipped_at=datetime.now(UTC),
                carrier="DHL",
                tracking_numbers=("JD0146",),
                tracking_url=None,
                lines=tuple(OrderLine(sku, units) for sku, units in shipped.lines),
                source=Source.WEBHOOK,
            )
        )
    finally:
        await engine.dispose()

    lines: list[str] = []
    await reconcile_command(options, [data], cancellations=True, shipments=True, echo=lines.append)

    assert lines[2].startswith(
        "OrderShipped: reconciled 0 published events: 0 processed, 0 in the dead-letter queue,"
        " 0 missing"
    ), lines
