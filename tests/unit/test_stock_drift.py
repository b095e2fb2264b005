"""The drift report's rule (``adapters.warehouse.drift.compare``) and the inventory read's
refusals of answers that are no inventory (a warehouse answering through
``httpx.MockTransport``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from uuid import uuid4

import httpx
import pytest

from fulfilment.adapters.postgres.stock_drift import HeldAtTheWarehouse, ServiceStock
from fulfilment.adapters.warehouse.drift import DriftState, compare
from fulfilment.adapters.warehouse.inventory import (
    InventoryReadError,
    WarehouseInventory,
    read_inventory,
)
from fulfilment.dispatcher.service import rate_limiter
from fulfilment.tools.stock_drift import render_report, report_document

AS_OF = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


def held(
    units: int, warehouse_id: str | None = "WH-1", status: str = "accepted"
) -> HeldAtTheWarehouse:
    return HeldAtTheWarehouse(uuid4(), warehouse_id, status, units)


def warehouse(**on_hand: int) -> WarehouseInventory:
    return WarehouseInventory(as_of=AS_OF, on_hand=dict(on_hand), pages=1)


def state_of(service: ServiceStock, inventory: WarehouseInventory, sku: str) -> DriftState:
    [drift] = [drift for drift in compare(service, inventory).skus if drift.sku == sku]
    return drift.state


@pytest.mark.parametrize(
    ("service_on_hand", "warehouse_on_hand", "held_units", "state"),
    [
        (10, 10, [], DriftState.AGREES),
        (10, 10, [4], DriftState.AGREES),
        (10, 6, [4], DriftState.IN_FLIGHT),
        (10, 7, [2, 2], DriftState.IN_FLIGHT),
        (10, 6, [3], DriftState.UNEXPLAINED),
        (10, 6, [], DriftState.UNEXPLAINED),
        (10, 12, [4], DriftState.UNEXPLAINED),
    ],
    ids=[
        "equal",
        "equal-orders-not-shipped-yet",
        "all-held-units-shipped",
        "part-of-two-orders-shipped",
        "more-than-the-orders-hold",
        "no-order-in-flight",
        "warehouse-has-more",
    ],
)
def test_a_difference_is_in_flight_only_within_the_units_of_orders_the_warehouse_has(
    service_on_hand: int, warehouse_on_hand: int, held_units: list[int], state: DriftState
) -> None:
    service = ServiceStock({"A": service_on_hand}, {"A": [held(units) for units in held_units]})

    assert state_of(service, warehouse(A=warehouse_on_hand), "A") is state


def test_a_sku_one_side_does_not_list_counts_as_none_there() -> None:
    service = ServiceStock({"ONLY-HERE": 3, "ZERO": 0}, {})
    report = compare(service, warehouse(**{"ONLY-THERE": 2, "ZERO": 0}))

    by_sku = {drift.sku: drift for drift in report.skus}
    assert (by_sku["ONLY-HERE"].difference, by_sku["ONLY-HERE"].listed_by_warehouse) == (3, False)
    assert (by_sku["ONLY-THERE"].difference, by_sku["ONLY-THERE"].known_to_service) == (-2, False)
    assert by_sku["ZERO"].state is DriftState.AGREES
    assert report.count(DriftState.UNEXPLAINED) == 2


def test_the_report_names_the_orders_and_counts_each_state() -> None:
    order = held(4, "WH-000007")
    service = ServiceStock({"A": 10, "B": 5, "C": 1}, {"A": [order]})
    report = compare(service, warehouse(A=6, B=5, C=0))

    lines = render_report(report)
    document = report_document(report)

    assert lines[0].split()[:6] == ["SKU", "WAREHOUSE", "SERVICE", "DIFF", "IN", "FLIGHT"]
    assert lines[1].split()[:6] == ["A", "6", "10", "+4", "4", "in_flight"]
    assert f"{order.order_id} (WH-000007, 4)" in lines[1]
    assert lines[2].split()[:6] == ["C", "0", "1", "+1", "0", "unexplained"]
    assert lines[-1].endswith("1 agree, 1 differ by units of orders in flight, 1 unexplained")
    assert (document["compared"], document["agrees"], document["in_flight"]) == (3, 1, 1)
    assert document["unexplained"] == 1
    assert [sku["sku"] for sku in document["skus"]] == ["A", "C"]
    assert document["skus"][0]["orders"] == [
        {
            "order_id": str(order.order_id),
            "warehouse_id": "WH-000007",
            "status": "accepted",
            "units": 4,
        }
    ]
    json.dumps(document)


def _answering(*bodies: object) -> httpx.AsyncClient:
    pages = iter(bodies)

    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(pages))

    return httpx.AsyncClient(
        base_url="http://wms.test/api/v1/", transport=httpx.MockTransport(answer)
    )


@pytest.mark.parametrize(
    "body",
    [
        {"as_of": "2026-12-06T10:00:00Z", "items": [{"sku": "A", "on_hand": -1}], "next": None},
        {"as_of": "2026-12-06T10:00:00Z", "items": [{"sku": "A", "on_hand": "3"}], "next": None},
        {"as_of": "2026-12-06T10:00:00", "items": [], "next": None},
        {"items": [], "next": None},
        [],
    ],
    ids=["negative", "text", "naive-time", "no-as-of", "not-an-object"],
)
async def test_a_body_that_is_no_inventory_page_fails_the_read(body: object) -> None:
    async with _answering(body) as http:
        with pytest.raises(InventoryReadError, match="is not one"):
            await read_inventory(http, rate_limiter(100), timeout_seconds=1.0)


async def test_a_next_that_does_not_move_forward_fails_the_read() -> None:
    page = {"as_of": "2026-12-06T10:00:00Z", "items": [{"sku": "B", "on_hand": 1}], "next": "B"}
    async with _answering(page, page) as http:
        with pytest.raises(InventoryReadError, match="gives next 'B'"):
            await read_inventory(http, rate_limiter(100), timeout_seconds=1.0)
