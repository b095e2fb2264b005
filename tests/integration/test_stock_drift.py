"""``fulfilment stock drift`` under shipments in flight: PostgreSQL, the simulator, the intake.

As in production: the stock store with the hand-off on records a fulfilment order per
reservation; the warehouse client hands them to the simulator, which keeps stock, ships at once
(taking the units off its shelf) and sends signed webhooks to a real ``fulfilment webhooks``
process; the command runs as the program, with its settings from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.domain.handoff import Accepted
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.e2e.harness import free_port
from tests.support.builders import order
from tests.support.simulated_warehouse import TOKEN
from tests.support.webhooks import SECRET, IntakeProcess, intake_env
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

pytestmark = pytest.mark.postgres

LEVELS = {"85123A": 20, "22423": 10, "71053": 5}


@pytest.fixture
async def engine(clean_database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def intake(clean_database: str, tmp_path: Path) -> Iterator[IntakeProcess]:
    """An intake whose port is known, not started: the warehouse's webhooks wait for it."""
    process = IntakeProcess(intake_env(clean_database), tmp_path / "intake.log")
    try:
        yield process
    finally:
        process.stop_quietly()


@pytest.fixture
async def server(intake: IntakeProcess) -> AsyncIterator[SimulatorServer]:
    faults = Faults(
        token=TOKEN,
        ship_delay_seconds=0.0,
        split_rate=0.5,
        webhook_url=intake.url,
        webhook_secrets=(SECRET,),
        webhook_retry_seconds=(0.2,),
    )
    async with SimulatorServer(WarehouseSimulator(faults, seed=5)) as running:
        running.simulator.load_stock(dict(LEVELS))
        yield running


async def hand_over(engine: AsyncEngine, server: SimulatorServer) -> None:
    """Send every recorded fulfilment order to the warehouse and record its answer."""
    store = PostgresWarehouseRequests(engine, retry_budget_seconds=2.0)
    options = WarehouseClientOptions(
        url=server.url,
        token=TOKEN,
        timeout_seconds=5.0,
        ca_file=None,
        max_connections=2,
        user_agent="fulfilment/test",
    )
    async with build_http_client(options) as http:
        client = WarehouseClient(http, timeout_seconds=5.0)
        for request in await store.claim(100, lease_seconds=30.0):
            answer, _ = await client.send(request)
            assert isinstance(answer, Accepted), answer
            await store.record(request, answer)


async def drift(
    database_url: str, server: SimulatorServer, **settings: str
) -> tuple[int, dict[str, Any], str]:
    """``fulfilment stock drift --json`` as a program: exit code, document, standard error.

    ``settings`` replace the environment's (an empty value removes the variable).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(
        {
            "FULFILMENT_DATABASE_URL": database_url,
            "FULFILMENT_WAREHOUSE_URL": server.url,
            "FULFILMENT_WAREHOUSE_TOKEN": TOKEN,
            "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": "50",
            **settings,
        }
    )
    env = {name: value for name, value in env.items() if value}
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("fulfilment")),
        *("stock", "drift", "--json"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, json.loads(out or b"{}"), err.decode()


async def test_shipments_in_flight_are_named_and_the_report_is_clear_once_they_are_recorded(
    clean_database: str, engine: AsyncEngine, server: SimulatorServer, intake: IntakeProcess
) -> None:
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    await stock.put_stock(dict(LEVELS))
    sent: dict[UUID, Counter[str]] = {}
    for lines in [[("85123A", 3), ("22423", 2)], [("85123A", 4)], [("71053", 5), ("22423", 1)]]:
        placed = order(*lines)
        assert (await stock.apply(placed)).reason is None
        sent[placed.order_id] = Counter(dict(lines))
    await hand_over(engine, server)
    # An order the warehouse never got holds units too: they explain nothing.
    waiting = order(("85123A", 2))
    assert (await stock.apply(waiting)).reason is None
    await server.simulator.floor.idle()

    code, in_flight, err = await drift(clean_database, server)

    shipped = Counter[str]()
    for units in sent.values():
        shipped.update(units)
    assert (code, err) == (0, "")
    assert (in_flight["compared"], in_flight["in_flight"], in_flight["unexplained"]) == (3, 3, 0)
    for sku in in_flight["skus"]:
        assert sku["state"] == "in_flight"
        assert sku["difference"] == shipped[sku["sku"]] == sku["in_flight"]
        assert sku["service_on_hand"] == LEVELS[sku["sku"]]
        named = {UUID(held["order_id"]) for held in sku["orders"]}
        assert named == {order_id for order_id, units in sent.items() if sku["sku"] in units}
        assert {held["status"] for held in sku["orders"]} == {"accepted"}
        assert all(held["warehouse_id"].startswith("WH-") for held in sku["orders"])

    intake.start()
    await server.simulator.settled()
    code, settled, err = await drift(clean_database, server)

    assert (code, err) == (0, "")
    assert (settled["compared"], settled["agrees"], settled["skus"]) == (3, 3, [])


async def test_a_loss_the_service_has_not_heard_of_exits_1_naming_its_sku(
    clean_database: str, engine: AsyncEngine, server: SimulatorServer
) -> None:
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    await stock.put_stock(dict(LEVELS))
    server.simulator.faults.update({"webhook_url": f"http://127.0.0.1:{free_port()}/webhooks"})
    server.simulator.shelves.adjust("22423", -3, "lost")
    server.simulator.shelves.adjust("71053", 2, "found")

    code, report, err = await drift(clean_database, server)

    assert code == 1
    assert err.strip() == (
        "fulfilment: 2 SKU(s) differ from the warehouse beyond the orders in flight: 22423, 71053"
    )
    assert [(sku["sku"], sku["difference"], sku["state"]) for sku in report["skus"]] == [
        ("22423", 3, "unexplained"),
        ("71053", -2, "unexplained"),
    ]


@pytest.mark.parametrize(
    ("settings", "code", "reason"),
    [
        ({"FULFILMENT_WAREHOUSE_URL": ""}, 2, "FULFILMENT_WAREHOUSE_URL is not set"),
        ({"FULFILMENT_WAREHOUSE_TOKEN": "wrong"}, 4, "check FULFILMENT_WAREHOUSE_TOKEN"),
    ],
    ids=["no-warehouse", "token-refused"],
)
async def test_without_a_warehouse_to_ask_it_exits_with_one_line_and_no_report(
    clean_database: str, server: SimulatorServer, settings: dict[str, str], code: int, reason: str
) -> None:
    exit_code, report, err = await drift(clean_database, server, **settings)

    assert (exit_code, report) == (code, {})
    assert err.startswith("fulfilment: ")
    assert reason in err
    assert len(err.splitlines()) == 1
