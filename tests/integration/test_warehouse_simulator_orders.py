"""``GET {base}/fulfilment-orders/{id}`` of the simulator: the order as the warehouse knows it.

Its answers are read with the service's own model, ``FulfilmentOrderV1``, as the dispatcher's
poll reads them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from fulfilment.contracts.warehouse_events import FulfilmentOrderV1
from tests.support.simulated_warehouse import TOKEN, order_body
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN), seed=1)) as running:
        yield running


@pytest.fixture
async def http(server: SimulatorServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    ) as client:
        yield client


async def create(http: httpx.AsyncClient, lines: list[tuple[str, int]]) -> tuple[str, uuid.UUID]:
    """Create a fulfilment order; its warehouse id and reference."""
    reference = uuid.uuid4()
    answer = await http.post(
        "/fulfilment-orders",
        content=order_body(reference, lines),
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], reference


async def cancel(http: httpx.AsyncClient, order_id: str, body: bytes) -> httpx.Response:
    return await http.post(
        f"/fulfilment-orders/{order_id}/cancellations",
        content=body,
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )


async def test_a_received_order_is_listed_with_its_reference_and_no_news(
    http: httpx.AsyncClient,
) -> None:
    order_id, reference = await create(http, [("85123A", 6)])

    answer = await http.get(f"/fulfilment-orders/{order_id}")

    assert answer.status_code == 200
    order = FulfilmentOrderV1.model_validate_json(answer.content)
    assert (order.id, order.reference, order.status) == (order_id, reference, "received")
    assert (order.shipments, order.cancellations) == ([], [])


async def test_an_unknown_id_is_404(http: httpx.AsyncClient) -> None:
    answer = await http.get("/fulfilment-orders/WH-999999")

    assert answer.status_code == 404
    assert answer.json() == {"error": "not_found"}


async def test_the_shops_cancellations_make_it_partially_cancelled_then_cancelled(
    http: httpx.AsyncClient,
) -> None:
    order_id, _ = await create(http, [("85123A", 6), ("22423", 2)])

    assert (await cancel(http, order_id, b'{"lines":[{"sku":"85123A","quantity":2}]}')).is_success
    partly = FulfilmentOrderV1.model_validate_json(
        (await http.get(f"/fulfilment-orders/{order_id}")).content
    )
    assert (await cancel(http, order_id, b"{}")).is_success
    whole = FulfilmentOrderV1.model_validate_json(
        (await http.get(f"/fulfilment-orders/{order_id}")).content
    )

    # The shop's own cancellations are not the warehouse's: they are not listed.
    assert (partly.status, partly.cancellations) == ("partially_cancelled", [])
    assert (whole.status, whole.cancellations) == ("cancelled", [])


async def test_a_picked_order_is_processing(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    order_id, _ = await create(http, [("85123A", 6)])
    server.simulator.faults.pick_delay_seconds = 0.0

    answer = await http.get(f"/fulfilment-orders/{order_id}")

    assert FulfilmentOrderV1.model_validate_json(answer.content).status == "processing"


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 403)],
    ids=["no token", "wrong token"],
)
async def test_the_token_is_required(
    server: SimulatorServer, http: httpx.AsyncClient, headers: dict[str, str], status: int
) -> None:
    order_id, _ = await create(http, [("85123A", 6)])

    async with httpx.AsyncClient(base_url=server.url, timeout=5) as anonymous:
        answer = await anonymous.get(f"/fulfilment-orders/{order_id}", headers=headers)

    assert answer.status_code == status


async def test_the_rate_cap_applies_with_a_retry_after(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    order_id, _ = await create(http, [("85123A", 6)])
    server.simulator.faults.update({"rate_limit_per_second": 2, "retry_after_seconds": 5})

    statuses = [(await http.get(f"/fulfilment-orders/{order_id}")) for _ in range(3)]

    assert [answer.status_code for answer in statuses] == [200, 200, 429]
    assert float(statuses[2].headers["retry-after"]) > 4


async def test_injected_errors_and_outages_apply(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    order_id, _ = await create(http, [("85123A", 6)])

    server.simulator.faults.update({"error_rate": 1.0})
    erring = await http.get(f"/fulfilment-orders/{order_id}")
    server.simulator.faults.update({"error_rate": 0.0})
    server.simulator.go_down(30)
    down = await http.get(f"/fulfilment-orders/{order_id}")

    assert (erring.status_code, down.status_code) == (503, 503)
    assert server.simulator.statuses[503] == 2


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/fulfilment-orders/WH-000001"), ("GET", "/fulfilment-orders")],
    ids=["POST an order", "GET the orders"],
)
async def test_another_method_is_405(http: httpx.AsyncClient, method: str, path: str) -> None:
    await create(http, [("85123A", 6)])

    answer = await http.request(method, path, content=b"{}", headers={"Idempotency-Key": "k"})

    assert answer.status_code == 405
