"""The warehouse client's inventory read against the simulator: pages, rate cap, retries, refusals.

The client is the dispatcher's (``build_http_client`` with its options) and the limiter the
dispatcher's shape (``rate_limiter``); the warehouse is the simulator on a real socket.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiolimiter import AsyncLimiter

from fulfilment.adapters.warehouse.client import WarehouseClientOptions, build_http_client
from fulfilment.adapters.warehouse.inventory import (
    InventoryRefusedError,
    InventoryUnavailableError,
    read_inventory,
)
from fulfilment.dispatcher.service import rate_limiter
from tests.support.simulated_warehouse import TOKEN
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

LEVELS = {f"SKU-{number:03d}": number for number in range(7)}


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN), seed=3)) as running:
        running.simulator.load_stock(LEVELS)
        yield running


def client(server: SimulatorServer, token: str = TOKEN) -> httpx.AsyncClient:
    return build_http_client(
        WarehouseClientOptions(
            url=server.url,
            token=token,
            timeout_seconds=2.0,
            ca_file=None,
            max_connections=2,
            user_agent="fulfilment/test",
        )
    )


def limiter() -> AsyncLimiter:
    return rate_limiter(1000.0)


async def test_every_page_is_read_and_the_counts_are_the_shelves(server: SimulatorServer) -> None:
    async with client(server) as http:
        inventory = await read_inventory(http, limiter(), timeout_seconds=2.0, page_limit=3)

    assert inventory.on_hand == LEVELS
    assert inventory.pages == 3
    assert server.simulator.statuses == {200: 3}


async def test_an_empty_inventory_is_one_page(server: SimulatorServer) -> None:
    server.simulator.shelves.on_hand.clear()
    async with client(server) as http:
        inventory = await read_inventory(http, limiter(), timeout_seconds=2.0)

    assert (inventory.on_hand, inventory.pages) == ({}, 1)


async def test_the_reads_keep_the_rate_cap(server: SimulatorServer) -> None:
    started = time.monotonic()
    async with client(server) as http:
        inventory = await read_inventory(http, rate_limiter(2.0), timeout_seconds=2.0, page_limit=1)

    assert inventory.pages == 7
    assert server.simulator.max_requests_per_second() <= 2
    assert time.monotonic() - started >= 2.5


async def test_a_429_is_waited_out_then_the_page_is_read_and_nothing_comes_early(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"rate_limit_per_second": 2, "retry_after_seconds": 0.5})
    async with client(server) as http:
        inventory = await read_inventory(http, limiter(), timeout_seconds=2.0, page_limit=1)

    assert inventory.on_hand == LEVELS
    assert server.simulator.statuses[429] > 0
    assert server.simulator.early_requests == 0


async def test_a_5xx_is_tried_again(server: SimulatorServer) -> None:
    server.simulator.faults.update({"error_rate": 0.5})
    async with client(server) as http:
        inventory = await read_inventory(
            http, limiter(), timeout_seconds=2.0, page_limit=1, backoff_seconds=0.01
        )

    assert inventory.on_hand == LEVELS
    assert server.simulator.statuses[503] > 0


async def test_a_warehouse_down_gives_up_after_the_attempts(server: SimulatorServer) -> None:
    server.simulator.go_down(60)
    async with client(server) as http:
        with pytest.raises(InventoryUnavailableError, match="503"):
            await read_inventory(http, limiter(), timeout_seconds=2.0, backoff_seconds=0.01)

    assert server.simulator.requests_total == 5


@pytest.mark.parametrize("token", ["", "wrong"], ids=["none", "wrong"])
async def test_refused_credentials_stop_at_once(server: SimulatorServer, token: str) -> None:
    async with client(server, token) as http:
        with pytest.raises(InventoryRefusedError, match="FULFILMENT_WAREHOUSE_TOKEN"):
            await read_inventory(http, limiter(), timeout_seconds=2.0)

    assert server.simulator.requests_total == 1
