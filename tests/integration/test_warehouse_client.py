"""The warehouse client against the simulator over a real socket: one test per answer."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator

import pytest

from fulfilment.adapters.warehouse.client import WarehouseClient
from fulfilment.domain.handoff import (
    Accepted,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    Retry,
)
from tests.support.simulated_warehouse import TOKEN, a_cancellation, a_client, an_order, order_body
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN))) as running:
        yield running


@pytest.fixture
async def client(server: SimulatorServer) -> AsyncIterator[WarehouseClient]:
    warehouse, http = a_client(server.url)
    async with http:
        yield warehouse


async def test_a_new_order_is_created_and_accepted_with_the_warehouse_id(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    request = an_order(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    answer, seconds = await client.send(request)
    assert isinstance(answer, Accepted)
    assert answer.status_code == 201
    held = server.simulator.order_by_reference(str(request.order_id))
    assert held is not None
    assert answer.warehouse_id == held.id
    assert held.idempotency_key == str(request.idempotency_key)
    assert held.traceparent == request.traceparent
    assert held.lines == [{"sku": "85123A", "quantity": 6}]
    assert seconds > 0


async def test_the_same_key_and_body_again_is_a_replay_with_the_same_id(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    request = an_order()
    first, _ = await client.send(request)
    again, _ = await client.send(request)
    assert isinstance(first, Accepted)
    assert again == Accepted(200, first.answer, first.warehouse_id)
    assert len(server.simulator.orders) == 1


async def test_the_same_key_while_in_flight_is_retried(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    server.simulator.faults.work_seconds = 0.5
    request = an_order()
    first = asyncio.create_task(client.send(request))
    await asyncio.sleep(0.2)
    answer, _ = await client.send(request)
    assert answer == Retry('{"error":"in_flight"}', 409)
    assert isinstance((await first)[0], Accepted)
    assert len(server.simulator.orders) == 1


async def test_a_reference_created_under_another_key_adopts_its_id(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    first, _ = await client.send(request := an_order())
    answer, _ = await client.send(an_order(order_id=request.order_id))
    assert isinstance(first, Accepted)
    assert isinstance(answer, Accepted)
    assert answer.status_code == 409
    assert answer.warehouse_id == first.warehouse_id
    assert len(server.simulator.orders) == 1


async def test_the_same_key_with_another_body_fails(client: WarehouseClient) -> None:
    request = an_order()
    await client.send(request)
    other = an_order(key=request.idempotency_key, order_id=request.order_id, lines=[("X", 1)])
    answer, _ = await client.send(other)
    assert answer == Failed("idempotency_key_reused", '{"error":"idempotency_key_reused"}', 422)


async def test_an_order_the_warehouse_refuses_fails_with_its_answer(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    server.simulator.faults.refused_skus = frozenset({"POISON"})
    answer, _ = await client.send(an_order([("A", 1), ("POISON", 2)]))
    assert answer == Failed("sku_not_stocked", '{"error":"sku_not_stocked","sku":"POISON"}', 422)
    assert server.simulator.orders == {}


async def test_a_malformed_request_fails(client: WarehouseClient) -> None:
    answer, _ = await client.send(an_order(body=b"{not json"))
    assert answer == Failed("malformed_json", '{"error":"malformed_json"}', 400)


async def test_a_cancellation_of_an_order_the_warehouse_does_not_hold_fails(
    client: WarehouseClient,
) -> None:
    answer, _ = await client.send(a_cancellation("WH-999999"))
    assert answer == Failed("not_found", '{"error":"not_found"}', 404)


@pytest.mark.parametrize(("token", "status"), [("", 401), ("wrong", 403)])
async def test_refused_credentials(server: SimulatorServer, token: str, status: int) -> None:
    warehouse, http = a_client(server.url, token=token)
    async with http:
        answer, _ = await warehouse.send(an_order())
    assert isinstance(answer, CredentialsRefused)
    assert answer.status_code == status
    assert server.simulator.orders == {}


@pytest.mark.parametrize("retry_after_format", ["seconds", "http-date"])
async def test_above_the_rate_limit_the_answer_says_how_long_to_wait(
    server: SimulatorServer, client: WarehouseClient, retry_after_format: str
) -> None:
    server.simulator.faults.update(
        {
            "rate_limit_per_second": 1,
            "retry_after_seconds": 5,
            "retry_after_format": retry_after_format,
        }
    )
    assert isinstance((await client.send(an_order()))[0], Accepted)
    answer, _ = await client.send(an_order())
    assert isinstance(answer, RateLimited)
    # An HTTP date has whole seconds, and the simulator rounds it up.
    assert 4 <= answer.after_seconds <= 7
    assert len(server.simulator.orders) == 1


async def test_a_server_error_is_retried(server: SimulatorServer, client: WarehouseClient) -> None:
    server.simulator.faults.error_rate = 1.0
    answer, _ = await client.send(an_order())
    assert answer == Retry('{"error":"unavailable"}', 503)
    assert server.simulator.orders == {}


async def test_a_timeout_after_the_warehouse_committed_is_retried_and_replayed(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"stall_after_commit_rate": 1.0, "stall_seconds": 3})
    warehouse, http = a_client(server.url, timeout_seconds=0.5)
    async with http:
        request = an_order()
        answer, seconds = await warehouse.send(request)
        assert isinstance(answer, Retry)
        assert answer.status_code is None
        assert 0.5 <= seconds < 2
        server.simulator.faults.stall_after_commit_rate = 0.0
        again, _ = await warehouse.send(request)
    assert isinstance(again, Accepted)
    assert again.status_code == 200
    assert len(server.simulator.orders) == 1


async def test_a_connection_refused_is_retried() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    warehouse, http = a_client(f"http://127.0.0.1:{port}/api/v1")
    async with http:
        answer, _ = await warehouse.send(an_order())
    assert isinstance(answer, Retry)
    assert answer.status_code is None
    assert answer.answer.startswith("ConnectError")


async def test_a_warehouse_that_refuses_connections_for_a_while_comes_back(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    server.simulator.go_down(1.0, mode="refuse")
    await asyncio.sleep(0.2)
    answer, _ = await client.send(an_order())
    assert isinstance(answer, Retry)
    assert answer.status_code is None
    await asyncio.sleep(1.5)
    assert isinstance((await client.send(an_order()))[0], Accepted)


@pytest.mark.parametrize(
    ("lines", "status"), [(None, "cancelled"), ([("85123A", 2)], "partially_cancelled")]
)
async def test_a_cancellation_before_picking_is_accepted(
    server: SimulatorServer,
    client: WarehouseClient,
    lines: list[tuple[str, int]] | None,
    status: str,
) -> None:
    created, _ = await client.send(an_order([("85123A", 6)]))
    assert isinstance(created, Accepted)
    assert created.warehouse_id is not None
    answer, _ = await client.send(a_cancellation(created.warehouse_id, lines))
    assert answer == Accepted(201, f'{{"status":"{status}"}}')
    assert [c.status for c in server.simulator.cancellations] == [status]


async def test_a_cancellation_once_picking_began_is_refused(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    server.simulator.faults.pick_delay_seconds = 0.0
    created, _ = await client.send(an_order())
    assert isinstance(created, Accepted)
    assert created.warehouse_id is not None
    answer, _ = await client.send(a_cancellation(created.warehouse_id))
    assert answer == Refused(409, '{"error":"too_late"}')


async def test_requests_in_a_row_share_a_kept_alive_connection(
    server: SimulatorServer, client: WarehouseClient
) -> None:
    for _ in range(20):
        assert isinstance((await client.send(an_order()))[0], Accepted)
    assert len(server.simulator.orders) == 20
    assert len(server.simulator.connections) == 1


def test_the_order_body_helper_is_the_apis_shape() -> None:
    order_id = uuid.uuid4()
    assert order_body(order_id, [("A", 1)]).startswith(b'{"reference":"' + str(order_id).encode())
