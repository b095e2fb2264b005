"""The simulator's own surface: its admin endpoints and its command line."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from fulfilment.domain.handoff import Accepted, Retry
from tests.support.simulated_warehouse import TOKEN, a_client, an_order
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

SIMULATOR = Path(__file__).parents[2] / "simulator"


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN))) as running:
        yield running


async def test_knobs_change_at_run_time_through_the_admin_endpoint(
    server: SimulatorServer,
) -> None:
    client, http = a_client(server.url)
    async with http, httpx.AsyncClient(base_url=server.admin_url) as admin:
        changed = await admin.post("/faults", json={"error_rate": 1.0})
        assert changed.status_code == 200
        assert changed.json()["error_rate"] == 1.0
        assert isinstance((await client.send(an_order()))[0], Retry)
        await admin.post("/faults", json={"error_rate": 0.0})
        request = an_order()
        assert isinstance((await client.send(request))[0], Accepted)
        orders = (await admin.get("/orders")).json()
        stats = (await admin.get("/stats")).json()
    assert [order["reference"] for order in orders["orders"]] == [str(request.order_id)]
    assert stats["requests_total"] == 2
    assert stats["statuses"] == {"201": 1, "503": 1}


@pytest.mark.parametrize("changes", [{"no_such_knob": 1}, {"error_rate": "often"}, [1, 2]], ids=str)
async def test_an_unknown_knob_or_value_is_refused(server: SimulatorServer, changes) -> None:
    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        answer = await admin.post("/faults", json=changes)
        knobs = (await admin.get("/faults")).json()
    assert answer.status_code == 400
    assert knobs["error_rate"] == 0.0


async def test_down_for_some_seconds_in_refuse_mode_refuses_connections_then_serves(
    server: SimulatorServer,
) -> None:
    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        await admin.post("/faults", json={"down_mode": "refuse", "down_for_seconds": 1})
    await asyncio.sleep(0.3)  # the server stops in a task of the event loop
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((server.host, server.port), timeout=1).close()
    client, http = a_client(server.url)
    async with http:
        for _ in range(40):
            answer, _ = await client.send(an_order())
            if isinstance(answer, Accepted):
                break
            await asyncio.sleep(0.1)
    assert isinstance(answer, Accepted)


def test_the_command_line_serves_and_prints_the_url_to_configure() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with subprocess.Popen(
        [sys.executable, "-m", "warehouse_simulator", "--port", str(port), "--token", "t0"],
        env={**os.environ, "PYTHONPATH": str(SIMULATOR)},
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert f"FULFILMENT_WAREHOUSE_URL=http://127.0.0.1:{port}/api/v1" in line
            assert "FULFILMENT_WAREHOUSE_TOKEN=t0" in line
            answer = httpx.get(f"http://127.0.0.1:{port}/_simulator/stats", timeout=5)
            assert answer.json()["orders"] == 0
        finally:
            process.terminate()
        assert process.wait(timeout=10) == 0


def test_a_port_taken_is_one_line_naming_it_not_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "warehouse_simulator", "--port", str(port)],
            env={**os.environ, "PYTHONPATH": str(SIMULATOR)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 1
    expected = (
        f"warehouse simulator: cannot listen on 127.0.0.1:{port}: Address already in use;"
        " choose another with --port (make: WAREHOUSE_PORT=...)"
    )
    assert done.stderr.strip().splitlines() == [expected]


async def test_a_request_cut_off_in_its_body_is_not_handled_and_its_retry_is_the_first(
    server: SimulatorServer,
) -> None:
    # A client killed between writing the headers and the body: a real server never handles
    # such a request, so the key stays unused and the same request sent again creates the
    # order (not 422 idempotency_key_reused against an empty body).
    request = an_order()
    assert request.body is not None
    path = server.simulator.base_path + "/fulfilment-orders"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server.host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Idempotency-Key: {request.idempotency_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(request.body)}\r\n\r\n"
    ).encode()
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + request.body[:5])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.2)

    client, http = a_client(server.url)
    async with http:
        answer, _ = await client.send(request)

    assert isinstance(answer, Accepted), answer
    assert answer.status_code == 201
    assert len(server.simulator.orders) == 1
