"""The dispatcher's scheduled drift check, against PostgreSQL and the warehouse simulator.

The service's stock is loaded through ``PostgresStock`` (orders placed with the hand-off on and
sent by the dispatcher itself); the simulator (a real HTTP server on a port) is given levels
that differ from the service's by known amounts, and the dispatcher's gauges must show them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import httpx
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse.drift import DriftReport, read_drift
from fulfilment.dispatcher.drift import DriftCheck
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import order
from tests.support.simulated_warehouse import TOKEN, a_client
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

pytestmark = pytest.mark.postgres

SERVICE = {"A": 100, "B": 100, "C": 10}


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN), seed=1)) as running:
        yield running


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
async def stock(engine: AsyncEngine) -> PostgresStock:
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    await stock.put_stock(SERVICE)
    return stock


class Running:
    """A dispatcher with a drift check, running in a task until :meth:`stop`; every request
    to the warehouse noted in :attr:`requests` as ``(method, path, monotonic seconds)``."""

    def __init__(
        self,
        engine: AsyncEngine,
        server: SimulatorServer,
        *,
        interval: float,
        rate: float,
        concurrency: int,
        token: str,
    ) -> None:
        self.requests: list[tuple[str, str, float]] = []
        client, self.http = a_client(server.url, token=token, max_connections=concurrency)
        self.http.event_hooks["request"].append(self._note)
        self.metrics = DispatcherMetrics()
        self.reports: list[DriftReport] = []
        read = functools.partial(read_drift, engine, self.http, timeout_seconds=2.0)

        async def noted(gate: AbstractAsyncContextManager[object]) -> DriftReport:
            report = await read(gate)
            self.reports.append(report)
            return report

        self.dispatcher = Dispatcher(
            PostgresWarehouseRequests(engine, retry_budget_seconds=2.0),
            client,
            DispatcherOptions(
                rate_per_second=rate,
                concurrency=concurrency,
                timeout_seconds=2.0,
                poll_seconds=0.05,
            ),
            self.metrics,
            drift=DriftCheck(noted, interval, self.metrics),
        )
        self.task = asyncio.create_task(self.dispatcher.run())

    async def _note(self, request: httpx.Request) -> None:
        self.requests.append((request.method, request.url.path, time.monotonic()))

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def drift(self) -> dict[str, tuple[float | None, float | None]]:
        """``{kind: (skus, units)}`` as exported now."""
        return {
            kind: (
                self.value("fulfilment_stock_drift_skus", kind=kind),
                self.value("fulfilment_stock_drift_units", kind=kind),
            )
            for kind in ("in_flight", "unexplained")
        }

    async def stop(self) -> None:
        self.dispatcher.stop()
        await asyncio.wait_for(self.task, 10)
        await self.http.aclose()


@pytest.fixture
async def dispatching(
    engine: AsyncEngine, server: SimulatorServer
) -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(
        *, interval: float = 0.2, rate: float = 50.0, concurrency: int = 4, token: str = TOKEN
    ) -> Running:
        running = Running(
            engine, server, interval=interval, rate=rate, concurrency=concurrency, token=token
        )
        started.append(running)
        return running

    yield start
    for running in started:
        if not running.task.done():
            await running.stop()


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        met = condition()
        if not isinstance(met, bool):
            met = await met
        if met:
            return
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def accepted(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int(
            await connection.scalar(
                sa.text("SELECT count(*) FROM warehouse_requests WHERE status = 'accepted'")
            )
            or 0
        )


async def test_the_drift_check_exports_a_known_difference_by_kind(
    engine: AsyncEngine,
    stock: PostgresStock,
    server: SimulatorServer,
    dispatching: Callable[..., Running],
) -> None:
    placed = order(("A", 2))
    await stock.apply(placed)
    running = dispatching(interval=0.2)
    await until(lambda: accepted(engine), 10, "the order accepted by the warehouse")
    # The warehouse shipped the order's 2 units of A (the service has not heard: in flight),
    # lost 3 of B and found 2 of C (nobody told the service: unexplained), and keeps 4 of a
    # SKU the service never heard of (unexplained).
    server.simulator.load_stock({"A": 98, "B": 97, "C": 12, "D": 4})
    expected = {"in_flight": (1.0, 2.0), "unexplained": (3.0, 9.0)}
    await until(lambda: running.drift() == expected, 10, f"the gauges at {expected}")

    report = running.reports[-1]
    assert {sku.sku: (sku.difference, str(sku.state)) for sku in report.differing} == {
        "A": (2, "in_flight"),
        "B": (3, "unexplained"),
        "C": (-2, "unexplained"),
        "D": (-4, "unexplained"),
    }
    [held] = report.differing[0].orders
    assert held.order_id == placed.order_id
    checked_at = running.value("fulfilment_stock_drift_checked_timestamp_seconds")
    assert checked_at is not None
    assert abs(checked_at - time.time()) < 5
    assert (running.value("fulfilment_stock_drift_checks_total", outcome="completed") or 0) >= 1
    assert running.value("fulfilment_stock_drift_checks_total", outcome="failed") == 0

    # The warehouse's levels set right: the next check finds nothing unexplained.
    server.simulator.load_stock({"B": 100, "C": 10, "D": 0})
    # D is listed at 0 by the warehouse and unknown to the service: it agrees.
    settled = {"in_flight": (1.0, 2.0), "unexplained": (0.0, 0.0)}
    await until(lambda: running.drift() == settled, 10, f"the gauges at {settled}")

    await running.stop()
    # Not the active dispatcher any more: no figures, rather than stale ones.
    assert running.drift() == {"in_flight": (None, None), "unexplained": (None, None)}
    assert running.value("fulfilment_stock_drift_checked_timestamp_seconds") is None


async def test_the_drift_check_asks_after_every_due_request_was_sent(
    stock: PostgresStock,
    server: SimulatorServer,
    dispatching: Callable[..., Running],
) -> None:
    for index in range(12):
        await stock.apply(order(("A", 1 + index % 2)))
    server.simulator.load_stock(dict(SERVICE))
    running = dispatching(interval=0.5, rate=20.0, concurrency=2)
    await until(
        lambda: running.value("fulfilment_stock_drift_checks_total", outcome="completed") == 1,
        10,
        "a drift check completed",
    )

    sends = [at for method, path, at in running.requests if method == "POST"]
    reads = [at for method, path, at in running.requests if path.endswith("/inventory")]
    assert len(sends) == 12
    assert len(reads) == 1
    assert reads[0] > max(sends)
    # Within the same rate cap: 13 requests at 20 a second take at least 0.6 s.
    assert reads[0] - min(sends) >= 12 / 20 - 0.05


async def test_a_drift_check_the_warehouse_refuses_is_counted_failed_and_exports_no_figures(
    stock: PostgresStock,
    dispatching: Callable[..., Running],
) -> None:
    del stock
    running = dispatching(interval=0.1, token="not-the-token")  # noqa: S106 - a wrong token
    await until(
        lambda: (running.value("fulfilment_stock_drift_checks_total", outcome="failed") or 0) >= 2,
        10,
        "two failed checks",
    )

    assert running.value("fulfilment_stock_drift_checks_total", outcome="completed") == 0
    assert running.drift() == {"in_flight": (None, None), "unexplained": (None, None)}
    assert running.value("fulfilment_stock_drift_checked_timestamp_seconds") is None
