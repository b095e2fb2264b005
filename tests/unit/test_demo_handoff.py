"""The demo's check of the hand-off: what the warehouse received against the reservations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.demo.handoff import HandoffCounts, HandoffMismatchError, WarehouseOrders, check_day
from fulfilment.domain.handoff import RequestKind, RequestRecord, RequestStatus
from fulfilment.domain.lifecycle import OrderStatus

NOW = datetime(2010, 12, 2, 9, 0, tzinfo=UTC)
ORDER = UUID("00000000-0000-0000-0000-000000000001")
OTHER = UUID("00000000-0000-0000-0000-000000000002")


def request(
    order_id: UUID,
    status: RequestStatus,
    *,
    kind: RequestKind = RequestKind.FULFILMENT_ORDER,
    warehouse_id: str | None = "WH-000001",
) -> RequestRecord:
    return RequestRecord(
        id=1,
        idempotency_key=uuid4(),
        kind=kind,
        order_id=order_id,
        causation_id=uuid4(),
        status=status,
        lines=None,
        body=None,
        attempts=1,
        created_at=NOW,
        next_attempt_at=NOW,
        first_attempt_at=NOW,
        last_attempt_at=NOW,
        answered_at=NOW,
        warehouse_id=warehouse_id,
        last_status_code=201,
        last_answer=None,
        traceparent=None,
    )


def held(*orders: tuple[UUID, str]) -> WarehouseOrders:
    return WarehouseOrders(
        [{"id": wid, "reference": str(order_id), "lines": []} for order_id, wid in orders], []
    )


def cancellation(answered: RequestRecord, status: str) -> dict[str, Any]:
    return {
        "order_id": "WH-000001",
        "idempotency_key": str(answered.idempotency_key),
        "status": status,
    }


def entry(order_id: UUID, routing_key: str) -> OutboxEntry:
    return OutboxEntry(1, uuid4(), order_id, routing_key)


def check(
    requests: list[RequestRecord],
    warehouse: WarehouseOrders,
    *,
    reserved: tuple[UUID, ...] = (ORDER,),
    cancellations: list[dict[str, Any]] | None = None,
    entries: list[OutboxEntry] | None = None,
    statuses: dict[UUID, OrderStatus] | None = None,
) -> HandoffCounts:
    return check_day(
        reserved,
        requests=requests,
        warehouse=warehouse,
        cancellations=cancellations or [],
        entries=entries or [],
        statuses=statuses or {},
    )


def test_a_reservation_accepted_once_at_the_warehouse_counts_as_one_order() -> None:
    counts = check([request(ORDER, RequestStatus.ACCEPTED)], held((ORDER, "WH-000001")))

    assert counts == HandoffCounts(reservations=1, orders=1)
    assert counts.describe() == (
        "received 1 fulfilment orders for 1 reservations, cancellations accepted 0, refused 0"
    )


def test_a_withdrawn_request_is_no_order_at_the_warehouse_and_is_said() -> None:
    counts = check([request(ORDER, RequestStatus.WITHDRAWN, warehouse_id=None)], held())

    assert counts == HandoffCounts(reservations=1, withdrawn=1)
    assert "for 1 reservations (withdrawn before sending 1)," in counts.describe()


@pytest.mark.parametrize(
    ("status", "warehouse", "why"),
    [
        (RequestStatus.ACCEPTED, held(), "is 0 orders at the warehouse"),
        (
            RequestStatus.ACCEPTED,
            held((ORDER, "WH-000001"), (ORDER, "WH-000002")),
            "is 2 orders at the warehouse",
        ),
        (RequestStatus.ACCEPTED, held((ORDER, "WH-000009")), "warehouse id WH-000001"),
        (RequestStatus.WITHDRAWN, held((ORDER, "WH-000001")), "its request is withdrawn"),
        (RequestStatus.PENDING, held(), "its request is pending"),
        (RequestStatus.FAILED, held(), "its request is failed"),
    ],
)
def test_a_reservation_that_is_not_exactly_one_order_at_the_warehouse_is_a_mismatch(
    status: RequestStatus, warehouse: WarehouseOrders, why: str
) -> None:
    with pytest.raises(HandoffMismatchError, match=why):
        check([request(ORDER, status)], warehouse)


def test_a_reservation_without_a_request_is_a_mismatch() -> None:
    with pytest.raises(HandoffMismatchError, match="recorded no fulfilment-order request"):
        check([request(OTHER, RequestStatus.ACCEPTED)], held((OTHER, "WH-000001")))


def test_an_accepted_cancellation_that_released_its_units_counts() -> None:
    asked = request(ORDER, RequestStatus.ACCEPTED, kind=RequestKind.CANCELLATION)
    counts = check(
        [request(ORDER, RequestStatus.ACCEPTED), asked],
        held((ORDER, "WH-000001")),
        cancellations=[cancellation(asked, "partially_cancelled")],
        entries=[entry(ORDER, "stock.reserved"), entry(ORDER, "stock.released")],
    )

    assert (counts.accepted, counts.refused) == (1, 0)


def test_an_accepted_cancellation_without_stock_released_is_a_mismatch() -> None:
    asked = request(ORDER, RequestStatus.ACCEPTED, kind=RequestKind.CANCELLATION)

    with pytest.raises(
        HandoffMismatchError, match=r"accepted the cancellation .* released nothing"
    ):
        check(
            [request(ORDER, RequestStatus.ACCEPTED), asked],
            held((ORDER, "WH-000001")),
            cancellations=[cancellation(asked, "cancelled")],
            entries=[entry(ORDER, "stock.reserved")],
        )


def test_a_refused_cancellation_with_stock_cancel_refused_and_the_order_shipped_counts() -> None:
    asked = request(ORDER, RequestStatus.REFUSED, kind=RequestKind.CANCELLATION)
    counts = check(
        [request(ORDER, RequestStatus.ACCEPTED), asked],
        held((ORDER, "WH-000001")),
        cancellations=[cancellation(asked, "too_late")],
        entries=[entry(ORDER, "stock.cancel_refused"), entry(ORDER, "stock.shipped")],
        statuses={ORDER: OrderStatus.SHIPPED},
    )

    assert (counts.accepted, counts.refused) == (0, 1)


def test_a_refused_cancellation_whose_order_the_warehouse_cancelled_itself_may_end_released() -> (
    None
):
    asked = request(ORDER, RequestStatus.REFUSED, kind=RequestKind.CANCELLATION)
    warehouse = WarehouseOrders(
        [
            {
                "id": "WH-000001",
                "reference": str(ORDER),
                "lines": [],
                "cancellations": [{"cancellation_id": "CXL-1"}],
            }
        ],
        [],
    )
    counts = check(
        [request(ORDER, RequestStatus.ACCEPTED), asked],
        warehouse,
        cancellations=[cancellation(asked, "too_late")],
        entries=[entry(ORDER, "stock.cancel_refused"), entry(ORDER, "stock.released")],
        statuses={ORDER: OrderStatus.RELEASED},
    )

    assert (counts.accepted, counts.refused) == (0, 1)


@pytest.mark.parametrize(
    ("routing_key", "status"),
    [
        ("stock.shipped", OrderStatus.SHIPPED),  # no stock.cancel_refused
        # Refused, yet released, and not by a cancellation of the warehouse's own.
        ("stock.cancel_refused", OrderStatus.RELEASED),
    ],
)
def test_a_refused_cancellation_without_its_event_or_its_shipment_is_a_mismatch(
    routing_key: str, status: OrderStatus
) -> None:
    asked = request(ORDER, RequestStatus.REFUSED, kind=RequestKind.CANCELLATION)

    with pytest.raises(HandoffMismatchError, match="refused the cancellation"):
        check(
            [request(ORDER, RequestStatus.ACCEPTED), asked],
            held((ORDER, "WH-000001")),
            cancellations=[cancellation(asked, "too_late")],
            entries=[entry(ORDER, routing_key)],
            statuses={ORDER: status},
        )


def test_an_unanswered_cancellation_or_one_no_request_asked_is_a_mismatch() -> None:
    waiting = request(ORDER, RequestStatus.SENDING, kind=RequestKind.CANCELLATION)
    with pytest.raises(HandoffMismatchError, match="is sending, not answered"):
        check([request(ORDER, RequestStatus.ACCEPTED), waiting], held((ORDER, "WH-000001")))

    stranger = replace(waiting, status=RequestStatus.ACCEPTED)
    with pytest.raises(HandoffMismatchError, match="no request asked"):
        check(
            [request(ORDER, RequestStatus.ACCEPTED)],
            held((ORDER, "WH-000001")),
            cancellations=[cancellation(stranger, "cancelled")],
        )
