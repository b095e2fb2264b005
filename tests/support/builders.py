"""Test data: the commands the warehouse tests apply, the worker's parse of a body,
example result events, and a relay that is not connected."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from opentelemetry import context as otel_context

from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.contracts.result_events import (
    RESULT_ROUTING_KEYS,
    STOCK_ADJUSTED_ROUTING_KEY,
    STOCK_CANCEL_REFUSED_ROUTING_KEY,
    STOCK_REJECTED_ROUTING_KEY,
    STOCK_RELEASED_ROUTING_KEY,
    STOCK_RESERVED_ROUTING_KEY,
    STOCK_SHIPPED_ROUTING_KEY,
    STOCK_SHORTAGE_ROUTING_KEY,
)
from fulfilment.domain.lifecycle import CancelOrder, ShipOrder
from fulfilment.domain.model import OrderLine, PlaceOrder
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.observability.tracing import context_of
from fulfilment.relay.service import Relay, RelayOptions
from fulfilment.routes.handling import check_body, parse_event

PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
"""When the test orders were placed: the first day of the Online Retail data."""

CANCELLED_AT = datetime(2010, 12, 1, 9, 41, tzinfo=UTC)
"""When the test orders were cancelled."""

SHIPPED_AT = datetime(2010, 12, 2, 7, 5, tzinfo=UTC)
"""When the test orders were shipped."""

EVENT_ID = "3d0c2b7e-1f4a-4c55-9b0e-7a1d2c3e4f50"
"""The ``event_id`` of the example result events."""
CAUSATION_ID = "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11"
"""Their ``causation_id``: the ``event_id`` of the product contract's example order."""
ORDER_ID = "0b6e3c9a-55d4-4f7e-8a59-0c1d2e3f4a5b"
"""Their ``order_id``: the example order's."""
OCCURRED_AT = "2026-11-30T10:15:02.123456+00:00"
"""Their ``occurred_at``, as PostgreSQL writes a ``timestamptz`` into ``jsonb``."""

_COMMON: dict[str, Any] = {
    "version": 1,
    "event_id": EVENT_ID,
    "causation_id": CAUSATION_ID,
    "order_id": ORDER_ID,
    "occurred_at": OCCURRED_AT,
}

RESULT_EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    STOCK_RESERVED_ROUTING_KEY: {
        **_COMMON,
        "lines": [{"sku": "71053", "quantity": 6}, {"sku": "85123A", "quantity": 12}],
    },
    STOCK_REJECTED_ROUTING_KEY: {
        **_COMMON,
        "reason": "insufficient_stock",
        "skus": ["85123A"],
    },
    STOCK_RELEASED_ROUTING_KEY: {
        **_COMMON,
        "lines": [{"sku": "85123A", "quantity": 2}],
        "order_status": "reserved",
    },
    STOCK_SHIPPED_ROUTING_KEY: {
        **_COMMON,
        "lines": [{"sku": "71053", "quantity": 6}, {"sku": "85123A", "quantity": 10}],
    },
    STOCK_CANCEL_REFUSED_ROUTING_KEY: {
        **_COMMON,
        "lines": [{"sku": "85123A", "quantity": 2}],
        "warehouse_id": "WH-000123",
    },
}
"""One body per routing key of the events about an order, as ``place_orders()``,
``cancel_orders()``, ``ship_orders()`` and the dispatcher's store write them into the outbox."""

SKU_EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    STOCK_ADJUSTED_ROUTING_KEY: {
        "version": 1,
        "event_id": EVENT_ID,
        "causation_id": CAUSATION_ID,
        "occurred_at": "2026-11-30T10:15:02.123456+00:00",
        "adjustment_id": "ADJ-5531",
        "sku": "85123A",
        "delta": -3,
        "applied": -3,
        "reason": "damaged",
        "source": "webhook",
        "on_hand": 4,
        "reserved": 6,
        "available": 0,
    },
    STOCK_SHORTAGE_ROUTING_KEY: {
        "version": 1,
        "event_id": EVENT_ID,
        "occurred_at": "2026-11-30T10:15:02.123456+00:00",
        "sku": "85123A",
        "on_hand": 4,
        "reserved": 6,
        "short": 2,
    },
}
"""One body per routing key of the events about a SKU, as ``record_adjustments()`` and the
trigger of ``stock_levels`` write them into the outbox."""


@contextmanager
def in_trace(traceparent: str | None) -> Iterator[None]:
    """Run the block with ``traceparent`` as the current (remote) span, as a delivery's span
    is current while its handler runs; None: no trace."""
    token = otel_context.attach(context_of(traceparent))
    try:
        yield
    finally:
        otel_context.detach(token)


def order(
    *lines: tuple[str, int],
    event_id: UUID | None = None,
    order_id: UUID | None = None,
) -> PlaceOrder:
    """A ``PlaceOrder`` of ``(sku, quantity)`` lines; new ids unless given."""
    return PlaceOrder(
        event_id=event_id or uuid4(),
        order_id=order_id or uuid4(),
        placed_at=PLACED_AT,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
    )


def cancellation(
    order_id: UUID,
    *lines: tuple[str, int],
    event_id: UUID | None = None,
) -> CancelOrder:
    """A ``CancelOrder`` of ``order_id``: of its ``(sku, quantity)`` lines, or whole without."""
    return CancelOrder(
        event_id=event_id or uuid4(),
        order_id=order_id,
        cancelled_at=CANCELLED_AT,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines) if lines else None,
    )


def shipment(order_id: UUID, *, event_id: UUID | None = None) -> ShipOrder:
    """A ``ShipOrder`` of ``order_id``; a new event id unless given."""
    return ShipOrder(
        event_id=event_id or uuid4(),
        order_id=order_id,
        shipped_at=SHIPPED_AT,
    )


def parse_order_placed(body: bytes, content_type: str | None) -> OrderPlacedV1:
    """What the worker does with a delivery before any write: the delivery policy's checks of
    every body, then ``on_order_placed``'s parse (both raise ``MalformedEventError``)."""
    check_body(body, content_type)
    return parse_event(OrderPlacedV1, body)


def a_relay(publish_timeout_seconds: float = 1) -> tuple[Relay, RelayMetrics]:
    """A relay that has not connected (local URLs, batches of 10, no window), and its metrics."""
    metrics = RelayMetrics(RESULT_ROUTING_KEYS)
    options = RelayOptions(
        amqp_url="amqp://guest:guest@localhost:5672/",
        database_url="postgresql://postgres@localhost:5432/fulfilment",
        batch_size=10,
        poll_seconds=1,
        batch_window_seconds=0,
        connect_timeout_seconds=1,
        publish_timeout_seconds=publish_timeout_seconds,
        app_id="fulfilment-test",
    )
    return Relay(options, metrics), metrics
