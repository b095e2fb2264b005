"""classify_poll: every class of answer to ``GET /fulfilment-orders/{id}``, and what a 200 lists."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from fulfilment.adapters.warehouse.answers import classify_poll
from fulfilment.domain.handoff import CredentialsRefused, Failed, RateLimited, Retry
from fulfilment.domain.model import OrderLine
from fulfilment.domain.polls import FulfilmentOrderToPoll, NotFound, Polled
from fulfilment.domain.warehouse_events import (
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
    warehouse_event_id,
)

ORDER = FulfilmentOrderToPoll(request_id=7, order_id=uuid.uuid4(), warehouse_id="WH-1")


def shipment(shipment_id: str, shipped_at: str, *lines: tuple[str, int]) -> dict[str, Any]:
    return {
        "shipment_id": shipment_id,
        "fulfilment_order_id": ORDER.warehouse_id,
        "reference": str(ORDER.order_id),
        "shipped_at": shipped_at,
        "carrier": "DHL",
        "tracking_numbers": [f"JD{shipment_id}"],
        "tracking_url": "https://track.example/x",
        "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
    }


def cancellation(cancellation_id: str, cancelled_at: str) -> dict[str, Any]:
    return {
        "cancellation_id": cancellation_id,
        "fulfilment_order_id": ORDER.warehouse_id,
        "reference": str(ORDER.order_id),
        "cancelled_at": cancelled_at,
        "reason": "unfulfillable",
    }


def fulfilment_order(**changes: object) -> bytes:
    document: dict[str, object] = {
        "id": ORDER.warehouse_id,
        "reference": str(ORDER.order_id),
        "status": "partially_shipped",
        "shipments": [],
        "cancellations": [],
    }
    document.update(changes)
    return json.dumps(document).encode()


def test_a_200_lists_its_shipments_and_cancellations_as_commands_of_the_poll_in_time_order() -> (
    None
):
    body = fulfilment_order(
        shipments=[
            shipment("SHP-2", "2026-12-06T10:05:00Z", ("B", 1)),
            shipment("SHP-1", "2026-12-06T10:00:00Z", ("A", 2), ("A", 1)),
        ],
        cancellations=[cancellation("CXL-1", "2026-12-06T10:02:00Z")],
    )

    answer = classify_poll(ORDER, 200, body, {})

    assert isinstance(answer, Polled)
    assert answer.status == "partially_shipped"
    assert [type(change) for change in answer.changes] == [
        RecordShipment,
        RecordWarehouseCancellation,
        RecordShipment,
    ]
    first = answer.changes[0]
    assert isinstance(first, RecordShipment)
    assert first.shipment_id == "SHP-1"
    assert first.event_id == warehouse_event_id("shipment", "SHP-1")
    assert first.order_id == ORDER.order_id
    assert first.webhook_id is None
    assert first.source is Source.POLL
    assert first.lines == (OrderLine("A", 2), OrderLine("A", 1))
    assert first.tracking_numbers == ("JDSHP-1",)
    assert first.shipped_at == datetime(2026, 12, 6, 10, tzinfo=UTC)
    cancelled = answer.changes[1]
    assert isinstance(cancelled, RecordWarehouseCancellation)
    assert cancelled.lines is None
    assert cancelled.source is Source.POLL
    assert cancelled.webhook_id is None


def test_a_shipment_comes_before_a_cancellation_of_the_same_instant() -> None:
    at = "2026-12-06T10:00:00Z"
    body = fulfilment_order(
        cancellations=[cancellation("CXL-1", at)], shipments=[shipment("SHP-1", at, ("A", 1))]
    )

    answer = classify_poll(ORDER, 200, body, {})

    assert isinstance(answer, Polled)
    assert [type(change) for change in answer.changes] == [
        RecordShipment,
        RecordWarehouseCancellation,
    ]


def test_an_order_with_nothing_shipped_yet_lists_no_change() -> None:
    answer = classify_poll(ORDER, 200, fulfilment_order(status="received"), {})
    assert answer == Polled(status_code=200, status="received", changes=())


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        fulfilment_order(status="lost"),
        fulfilment_order(shipments=[{"shipment_id": "SHP-1"}]),
        fulfilment_order(id="WH-2"),
        fulfilment_order(reference=str(uuid.uuid4())),
    ],
    ids=["not-json", "not-an-object", "unknown-status", "bad-shipment", "other-id", "other-order"],
)
def test_a_200_that_is_not_the_fulfilment_order_asked_about_is_failed(body: bytes) -> None:
    answer = classify_poll(ORDER, 200, body, {})
    assert isinstance(answer, Failed)
    assert answer.reason == "unexpected_answer"
    assert answer.status_code == 200


def test_a_404_is_not_found() -> None:
    assert classify_poll(ORDER, 404, b'{"error": "not_found"}', {}) == NotFound(
        answer='{"error": "not_found"}'
    )


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_are_credentials_refused(status: int) -> None:
    assert isinstance(classify_poll(ORDER, status, b"{}", {}), CredentialsRefused)


def test_a_429_is_rate_limited_for_its_retry_after() -> None:
    answer = classify_poll(ORDER, 429, b"{}", {"retry-after": "3"})
    assert isinstance(answer, RateLimited)
    assert answer.after_seconds == 3


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_5xx_is_retried(status: int) -> None:
    answer = classify_poll(ORDER, status, b"{}", {})
    assert isinstance(answer, Retry)
    assert answer.status_code == status


def test_no_answer_is_retried() -> None:
    answer = classify_poll(ORDER, None, None, {}, httpx.ConnectError("refused"))
    assert isinstance(answer, Retry)
    assert answer.status_code is None
    assert "ConnectError" in answer.answer


@pytest.mark.parametrize("status", [201, 400, 409, 410])
def test_another_status_is_failed(status: int) -> None:
    answer = classify_poll(ORDER, status, b'{"id": "WH-1", "error": "in_flight"}', {})
    assert isinstance(answer, Failed)
    assert answer.status_code == status
