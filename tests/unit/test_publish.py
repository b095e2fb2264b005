"""``fulfilment publish``: what it sends, in which order, with which routing key; no broker."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from fulfilment.contracts.topology import (
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from fulfilment.dataset import publish
from fulfilment.dataset.online_retail import cancellation_event_id_for, event_id_for

SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"
HEADER = "InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country\n"


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, list[str]]]:
    """Each publish_events call as (routing key, message ids); no broker is contacted."""
    calls: list[tuple[str, list[str]]] = []

    @contextlib.asynccontextmanager
    async def connect(_url):
        yield object()

    async def publish_events(_connection, events, *, exchange, routing_key):
        assert exchange == ORDERS_EXCHANGE
        calls.append((routing_key, [event.message_id for event in events]))
        return len(events)

    monkeypatch.setattr(publish, "connect", connect)
    monkeypatch.setattr(publish, "publish_events", publish_events)
    return calls


async def test_by_default_only_the_orders_are_published_and_the_line_is_unchanged(sent):
    lines: list[str] = []

    await publish.publish_command("amqp://unused", [SAMPLE], echo=lines.append)

    assert [key for key, _ in sent] == [ORDER_PLACED_ROUTING_KEY]
    assert len(sent[0][1]) == 170
    assert lines == [
        (
            "published 170 events (skipped: cancelled invoices 33, cancelled lines 62,"
            " non positive lines 2, empty invoices 2)"
        )
    ]


async def test_with_cancellations_the_mapped_ones_go_among_the_orders_in_time_order(sent, tmp_path):
    path = tmp_path / "2010-12-01.csv"
    path.write_text(
        HEADER
        + "1,A,x,6,2010-12-01 08:00:00,1,17850.0,UK\n"
        + "C2,A,x,-2,2010-12-01 09:00:00,1,17850.0,UK\n"
        + "3,A,x,1,2010-12-01 10:00:00,1,17850.0,UK\n"
        + "C4,A,x,-1,2010-12-01 11:00:00,1,,UK\n",
        encoding="utf-8",
    )
    lines: list[str] = []

    await publish.publish_command("amqp://unused", [path], cancellations=True, echo=lines.append)

    assert sent == [
        (ORDER_PLACED_ROUTING_KEY, [str(event_id_for("1"))]),
        (ORDER_CANCELLED_ROUTING_KEY, [str(cancellation_event_id_for("C2"))]),
        (ORDER_PLACED_ROUTING_KEY, [str(event_id_for("3"))]),
    ]
    assert lines == [
        (
            "published 2 OrderPlaced and 1 OrderCancelled events (skipped: cancelled invoices"
            " 2, cancelled lines 2, non positive lines 0, empty invoices 0; cancellations not"
            " mapped: no customer 1, not negative 0, no earlier order 0, not held 0, several"
            " orders 0)"
        )
    ]


async def test_the_sample_with_cancellations_publishes_its_one_mapped_cancellation(sent):
    lines: list[str] = []

    await publish.publish_command("amqp://unused", [SAMPLE], cancellations=True, echo=lines.append)

    kinds = [key for key, _ in sent]
    assert kinds.count(ORDER_CANCELLED_ROUTING_KEY) == 1
    assert sum(len(ids) for key, ids in sent if key == ORDER_PLACED_ROUTING_KEY) == 170
    assert lines[0].startswith("published 170 OrderPlaced and 1 OrderCancelled events")
