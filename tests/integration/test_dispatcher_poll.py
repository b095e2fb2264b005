"""The dispatcher's poll of fulfilment orders with no news, against PostgreSQL and the simulator.

The orders are placed through ``PostgresStock`` with the hand-off on and sent to the warehouse
simulator (a real HTTP server on a port) by the dispatcher itself; the simulator's orders are
then given shipments and cancellations that no webhook ever brought, which only the poll
(``GET /fulfilment-orders/{id}``) finds. A reconcile interval of a second or so keeps the
tests short.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse.client import WarehouseClient
from fulfilment.application.ports import OutcomeT, Stock
from fulfilment.dispatcher import service
from fulfilment.dispatcher.poll import Poller, PollOptions
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions, Halt, read_backlog
from fulfilment.domain.handoff import Answer, WarehouseRequest
from fulfilment.domain.model import Command
from fulfilment.domain.polls import FulfilmentOrderToPoll, PollAnswer
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.dispatcher_metrics import POLL_OUTCOMES, DispatcherMetrics
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import order, shipment
from tests.support.simulated_warehouse import TOKEN, a_client
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

pytestmark = pytest.mark.postgres

STOCK = {"A": 100, "B": 100}


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


@dataclass
class Stores:
    engine: AsyncEngine
    stock: PostgresStock
    requests: PostgresWarehouseRequests

    async def placed(self, *lines: tuple[str, int]) -> uuid.UUID:
        """An order placed (reserved, its fulfilment order pending): its id."""
        command = order(*lines)
        await self.stock.apply(command)
        return command.order_id

    async def scalar(self, sql: str, **parameters: Any) -> Any:
        async with self.engine.connect() as connection:
            return (await connection.execute(sa.text(sql), parameters)).scalar()

    async def execute(self, sql: str, **parameters: Any) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(sa.text(sql), parameters)

    async def status_of(self, order_id: uuid.UUID) -> str:
        return str(
            await self.scalar("SELECT status FROM reservations WHERE order_id = :id", id=order_id)
        )

    async def shipped_units(self, order_id: uuid.UUID) -> int:
        return int(
            await self.scalar(
                "SELECT coalesce(sum(shipped), 0) FROM reservation_lines WHERE order_id = :id",
                id=order_id,
            )
        )

    async def on_hand(self, sku: str) -> int:
        return int(await self.scalar("SELECT on_hand FROM stock_levels WHERE sku = :s", s=sku))

    async def reserved(self, sku: str) -> int:
        return int(await self.scalar("SELECT reserved FROM stock_levels WHERE sku = :s", s=sku))

    async def polled_at(self, order_id: uuid.UUID) -> Any:
        return await self.scalar(
            "SELECT polled_at FROM warehouse_requests"
            " WHERE order_id = :id AND kind = 'fulfilment_order'",
            id=order_id,
        )

    async def accepted_count(self) -> int:
        return int(
            await self.scalar(
                "SELECT count(*) FROM warehouse_requests"
                " WHERE kind = 'fulfilment_order' AND status = 'accepted'"
            )
        )

    async def last_heard(self, seconds_ago: float, order_ids: list[uuid.UUID]) -> None:
        """Move the acceptance of ``order_ids``' fulfilment orders ``seconds_ago`` back."""
        await self.execute(
            "UPDATE warehouse_requests"
            " SET answered_at = now() - make_interval(secs => :seconds)"
            " WHERE order_id = ANY(:ids) AND kind = 'fulfilment_order'",
            seconds=seconds_ago,
            ids=order_ids,
        )


@pytest.fixture
async def stores(engine: AsyncEngine) -> Stores:
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True)
    await stock.put_stock(STOCK)
    return Stores(engine, stock, PostgresWarehouseRequests(engine, retry_budget_seconds=2.0))


class CountingClient(WarehouseClient):
    """The real client, which also notes each call (``("send", order_id)``/``("poll", ...)``,
    in the order made) and each poll's outcome."""

    def __init__(self, inner: WarehouseClient) -> None:
        self._inner = inner
        self.calls: list[tuple[str, uuid.UUID]] = []
        self.polled: list[tuple[uuid.UUID, str]] = []

    async def send(self, request: WarehouseRequest) -> tuple[Answer, float]:
        self.calls.append(("send", request.order_id))
        return await self._inner.send(request)

    async def fetch(self, order: FulfilmentOrderToPoll) -> tuple[PollAnswer, float]:
        self.calls.append(("poll", order.order_id))
        answer, seconds = await self._inner.fetch(order)
        self.polled.append((order.order_id, POLL_OUTCOMES[type(answer)]))
        return answer, seconds

    def polls_of(self, order_id: uuid.UUID, outcome: str | None = None) -> int:
        return sum(
            1 for polled, got in self.polled if polled == order_id and outcome in {None, got}
        )


class Running:
    """A dispatcher with its poller, running in a task until :meth:`stop`."""

    def __init__(
        self,
        stores: Stores,
        server: SimulatorServer,
        *,
        after: float,
        rate: float,
        concurrency: int,
        stock: Stock | None = None,
    ) -> None:
        inner, self._http = a_client(server.url, timeout_seconds=2.0, max_connections=concurrency)
        self.client = CountingClient(inner)
        self.metrics = DispatcherMetrics()
        self.poller = Poller(
            stores.requests,
            stock or stores.stock,
            PollOptions(reconcile_after_seconds=after, concurrency=concurrency),
            self.metrics,
        )
        self.dispatcher = Dispatcher(
            stores.requests,
            self.client,
            DispatcherOptions(
                rate_per_second=rate,
                concurrency=concurrency,
                timeout_seconds=2.0,
                poll_seconds=0.05,
            ),
            self.metrics,
            poller=self.poller,
        )
        self.task = asyncio.create_task(self.dispatcher.run())

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        assert value is not None, (name, labels)
        return value

    def polls(self, outcome: str) -> float:
        return self.metric("fulfilment_warehouse_polls_total", outcome=outcome)

    def events(self, event: str, outcome: str) -> float:
        return self.metric(
            "fulfilment_warehouse_events_total", event=event, source="poll", outcome=outcome
        )

    async def stop(self) -> None:
        self.dispatcher.stop()
        await asyncio.wait_for(self.task, 10)
        await self._http.aclose()


@pytest.fixture
async def dispatching(
    stores: Stores, server: SimulatorServer
) -> AsyncIterator[Callable[..., Running]]:
    """Start a dispatcher with its poller (interval ``after`` seconds); stopped at the end."""
    started: list[Running] = []

    def start(
        *,
        after: float = 1.0,
        rate: float = 50.0,
        concurrency: int = 4,
        stock: Stock | None = None,
    ) -> Running:
        running = Running(
            stores, server, after=after, rate=rate, concurrency=concurrency, stock=stock
        )
        started.append(running)
        return running

    yield start
    for running in started:
        if not running.task.done():
            await running.stop()


async def until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        met = condition()
        if not isinstance(met, bool):
            met = await met
        if met:
            return
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def ship(
    server: SimulatorServer, order_id: uuid.UUID, shipment_id: str, *lines: tuple[str, int]
) -> None:
    """The warehouse ships ``lines`` of ``order_id``'s fulfilment order; no webhook says so."""
    warehouse_order = server.simulator.order_by_reference(str(order_id))
    assert warehouse_order is not None
    warehouse_order.shipments.append(
        {
            "shipment_id": shipment_id,
            "fulfilment_order_id": warehouse_order.id,
            "reference": str(order_id),
            "shipped_at": "2026-12-06T10:00:00Z",
            "carrier": "DHL",
            "tracking_numbers": [f"JD{shipment_id}"],
            "tracking_url": None,
            "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
        }
    )
    for sku, quantity in lines:
        # A warehouse in error may ship more than it was asked for.
        warehouse_order.remaining[sku] = max(0, warehouse_order.remaining.get(sku, 0) - quantity)


def cancel(server: SimulatorServer, order_id: uuid.UUID, cancellation_id: str) -> None:
    """The warehouse cancels all that is left of ``order_id``; no webhook says so."""
    warehouse_order = server.simulator.order_by_reference(str(order_id))
    assert warehouse_order is not None
    warehouse_order.cancellations.append(
        {
            "cancellation_id": cancellation_id,
            "fulfilment_order_id": warehouse_order.id,
            "reference": str(order_id),
            "cancelled_at": "2026-12-06T10:01:00Z",
            "reason": "unfulfillable",
        }
    )
    warehouse_order.remaining.clear()


async def test_what_no_webhook_brought_is_found_by_the_poll_and_applied_once(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    # The warehouse ships (in one to three shipments) and cancels some units on its own, and
    # sends no webhook: only the poll hears of it.
    server.simulator.faults.update(
        {"ship_delay_seconds": 0.2, "split_rate": 0.6, "max_shipments": 3, "cancel_rate": 0.3}
    )
    placed = [await stores.placed(("A", 1 + i % 4), ("B", 2)) for i in range(8)]
    running = dispatching(after=0.5)

    await until(lambda: _none_reserved(stores, placed), 30, "every order settled by the poll")
    await server.simulator.settled()
    polls = [running.client.polls_of(order_id) for order_id in placed]
    await asyncio.sleep(1.5)  # three intervals
    await running.stop()

    record = server.simulator.record()
    assert record["webhooks"] == []
    made = {shipment["shipment_id"]: shipment for shipment in record["shipments"]}
    async with stores.engine.connect() as connection:
        rows = (
            await connection.execute(
                sa.text("SELECT shipment_id, source, outcome, webhook_id FROM warehouse_shipments")
            )
        ).all()
        cancelled = set(
            (
                await connection.execute(
                    sa.text("SELECT cancellation_id FROM warehouse_cancellations")
                )
            ).scalars()
        )
    assert sorted(row.shipment_id for row in rows) == sorted(made)
    assert {(row.source, row.outcome, row.webhook_id) for row in rows} == {
        ("poll", "shipped", None)
    }
    assert cancelled == {c["cancellation_id"] for c in record["cancellations"]}
    for sku, loaded in STOCK.items():
        units = sum(
            line["quantity"] for s in made.values() for line in s["lines"] if line["sku"] == sku
        )
        assert (await stores.on_hand(sku), await stores.reserved(sku)) == (loaded - units, 0)
    shipped_orders = {shipment["reference"] for shipment in made.values()}
    assert [await stores.status_of(order_id) for order_id in placed] == [
        "shipped" if str(order_id) in shipped_orders else "released" for order_id in placed
    ]
    assert await stores.scalar("SELECT count(*) FROM webhook_inbox") == 0
    assert await stores.scalar("SELECT count(*) FROM warehouse_discrepancies") == 0
    assert running.events("shipment", "shipped") == len(made)
    assert running.events("cancellation", "released") == len(cancelled)
    # Once it holds nothing, an order is not asked about again.
    assert [running.client.polls_of(order_id) for order_id in placed] == polls


async def _none_reserved(stores: Stores, order_ids: list[uuid.UUID]) -> bool:
    return not await stores.scalar(
        "SELECT count(*) FROM reservations WHERE order_id = ANY(:ids) AND status = 'reserved'",
        ids=order_ids,
    )


async def _shipped(stores: Stores, order_id: uuid.UUID) -> bool:
    return await stores.status_of(order_id) == "shipped"


async def test_a_second_poll_of_what_was_applied_changes_nothing(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    order_id = await stores.placed(("A", 5))
    running = dispatching(after=0.5)
    await until(lambda: bool(server.simulator.orders), 10, "the fulfilment order sent")
    ship(server, order_id, "SHP-1", ("A", 2))
    await until(lambda: running.events("shipment", "shipped") == 1, 10, "the first poll applied")
    outbox = await stores.scalar("SELECT count(*) FROM outbox")
    applied_by = running.client.polls_of(order_id)

    await until(lambda: running.client.polls_of(order_id) >= applied_by + 2, 10, "two more")
    await running.stop()

    assert await stores.status_of(order_id) == "reserved"
    assert await stores.shipped_units(order_id) == 2
    assert (await stores.on_hand("A"), await stores.reserved("A")) == (98, 3)
    assert await stores.scalar("SELECT count(*) FROM warehouse_shipments") == 1
    assert await stores.scalar("SELECT count(*) FROM outbox") == outbox
    assert running.events("shipment", "shipped") == 1
    assert running.events("shipment", "duplicate") >= 2
    assert running.metric("fulfilment_warehouse_discrepancies_total", kind="more_than_held") == 0


async def test_a_cancellation_found_by_the_poll_releases_what_the_order_still_holds(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    order_id = await stores.placed(("A", 5))
    running = dispatching(after=0.5)
    await until(lambda: bool(server.simulator.orders), 10, "the fulfilment order sent")
    ship(server, order_id, "SHP-1", ("A", 2))
    cancel(server, order_id, "CXL-1")

    await until(lambda: _shipped(stores, order_id), 10, "settled by the poll")
    await running.stop()

    assert (await stores.on_hand("A"), await stores.reserved("A")) == (98, 0)
    assert running.events("shipment", "shipped") == 1
    assert running.events("cancellation", "released") == 1
    assert await stores.scalar("SELECT source FROM warehouse_cancellations") == "poll"


async def test_what_a_polled_shipment_could_not_take_is_kept_and_counted_as_discrepancies(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    order_id = await stores.placed(("A", 2))
    running = dispatching(after=0.5)
    await until(lambda: bool(server.simulator.orders), 10, "the fulfilment order sent")
    # More of A than the order holds, and B, which it never held.
    ship(server, order_id, "SHP-OVER", ("A", 3), ("B", 1))

    await until(lambda: _shipped(stores, order_id), 10, "shipped by the poll")
    await running.stop()

    async with stores.engine.connect() as connection:
        kept = (
            await connection.execute(
                sa.text(
                    "SELECT kind, sku, quantity, source, source_id FROM warehouse_discrepancies"
                    " ORDER BY sku"
                )
            )
        ).all()
    assert [tuple(row) for row in kept] == [
        ("more_than_held", "A", 1, "shipment", "SHP-OVER"),
        ("sku_not_held", "B", 1, "shipment", "SHP-OVER"),
    ]
    assert (await stores.on_hand("A"), await stores.on_hand("B")) == (98, 100)
    assert running.events("shipment", "shipped") == 1
    discrepancies = "fulfilment_warehouse_discrepancies_total"
    assert running.metric(discrepancies, kind="more_than_held") == 1
    assert running.metric(discrepancies, kind="sku_not_held") == 1


async def test_an_order_with_recent_news_is_not_polled(
    stores: Stores, dispatching: Callable[..., Running]
) -> None:
    quiet = await stores.placed(("A", 1))
    heard = await stores.placed(("A", 2))
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 2), 10, "sent")
    await sending.stop()
    await stores.last_heard(60, [quiet, heard])
    await stores.execute(
        "UPDATE warehouse_requests SET news_at = now() - interval '1 second' WHERE order_id = :id",
        id=heard,
    )

    running = dispatching(after=30)
    await until(lambda: running.client.polls_of(quiet) == 1, 10, "the quiet order polled")
    await asyncio.sleep(1.0)
    await running.stop()

    assert running.client.polls_of(heard) == 0
    assert await stores.polled_at(heard) is None
    assert await stores.polled_at(quiet) is not None
    # Asked about once: the next poll is an interval (30 s) later.
    assert running.client.polls_of(quiet) == 1


async def _accepted(stores: Stores, count: int) -> bool:
    return await stores.accepted_count() == count


async def test_polls_wait_behind_the_sends_and_hold_the_rate_cap(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    due = [await stores.placed(("A", 1)) for _ in range(6)]
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 6), 10, "the first orders sent")
    await sending.stop()
    await stores.last_heard(60, due)
    later = [await stores.placed(("B", 1)) for _ in range(8)]
    server.simulator.requests_per_second.clear()

    running = dispatching(after=30, rate=4, concurrency=4)
    await until(
        lambda: all(running.client.polls_of(order_id) == 1 for order_id in due), 20, "all polled"
    )
    await running.stop()

    kinds = [kind for kind, _ in running.client.calls]
    # Every request due was sent before the first poll.
    assert kinds[: len(later)] == ["send"] * len(later)
    assert set(kinds[len(later) :]) == {"poll"}
    # Counted by the second each request arrived in, which on a loaded machine may be the
    # next one after the limiter let it go: one more than the cap is that, not a burst
    # (uncapped, the 14 requests land within the same second).
    assert server.simulator.max_requests_per_second() <= 4 + 1
    assert running.polls("answered") == 6


async def test_a_429_to_a_poll_holds_every_request_until_its_retry_after(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    due = [await stores.placed(("A", 1)) for _ in range(10)]
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 10), 10, "sent")
    await sending.stop()
    await stores.last_heard(60, due)
    server.simulator.faults.update({"rate_limit_per_second": 3, "retry_after_seconds": 1})

    running = dispatching(after=30, rate=20, concurrency=4)
    await until(
        lambda: (
            all(running.client.polls_of(order_id) >= 1 for order_id in due)
            and running.polls("answered") == 10
        ),
        20,
        "all answered",
    )
    await running.stop()

    assert running.polls("rate_limited") >= 1
    assert server.simulator.statuses[429] == running.polls("rate_limited")
    assert server.simulator.early_requests == 0
    # A poll answered 429 was not recorded: it was asked again once the gate opened.
    assert all([await stores.polled_at(order_id) is not None for order_id in due])


async def test_a_warehouse_down_opens_the_circuit_for_the_polls_and_they_resume_after(
    stores: Stores,
    server: SimulatorServer,
    dispatching: Callable[..., Running],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    due = [await stores.placed(("A", 1)) for _ in range(10)]
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 10), 10, "sent")
    await sending.stop()
    await stores.last_heard(60, due)
    monkeypatch.setattr(service, "CIRCUIT_THRESHOLD", 3)
    outage = 4.0
    server.simulator.go_down(outage)
    before = server.simulator.requests_total

    running = dispatching(after=1.0, rate=50, concurrency=4)
    await until(lambda: running.dispatcher.halt is Halt.CIRCUIT_OPEN, 5, "the circuit open")
    await asyncio.sleep(outage - 1.5)
    during = server.simulator.requests_total - before
    assert running.dispatcher.halt is Halt.CIRCUIT_OPEN
    await until(
        lambda: all(running.client.polls_of(order_id, "answered") for order_id in due),
        30,
        "every order answered after",
    )
    await running.stop()

    # Up to the threshold (and the polls in flight beside them), then a probe at a time.
    assert during <= 3 + 2 + 3
    assert running.polls("retry") >= 3
    assert running.dispatcher.readiness()["halt"] == "none"


async def test_refused_credentials_halt_the_polls_until_a_probe_is_answered(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    due = [await stores.placed(("A", 1)) for _ in range(4)]
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 4), 10, "sent")
    await sending.stop()
    await stores.last_heard(60, due)
    server.simulator.faults.token = "rotated"  # noqa: S105 - the simulator's token

    running = dispatching(after=30, rate=50, concurrency=4)
    await until(
        lambda: running.dispatcher.halt is Halt.CREDENTIALS_REFUSED, 5, "the credentials halt"
    )
    await asyncio.sleep(1.5)
    refused = server.simulator.statuses[403]
    assert all([await stores.polled_at(order_id) is None for order_id in due])
    server.simulator.faults.token = TOKEN
    await until(lambda: running.polls("answered") == 4, 20, "every order asked about")
    await running.stop()

    # The polls in flight when the first 403 came, then a probe at a time.
    assert refused <= 2 + 3
    assert running.polls("credentials_refused") == refused
    assert running.dispatcher.readiness()["halt"] == "none"


async def test_a_404_is_counted_asked_again_an_interval_later_and_the_dispatcher_goes_on(
    stores: Stores, dispatching: Callable[..., Running]
) -> None:
    lost = await stores.placed(("A", 1))
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 1), 10, "sent")
    await sending.stop()
    await stores.execute(
        "UPDATE warehouse_requests SET warehouse_id = 'WH-NOWHERE',"
        " answered_at = now() - interval '1 minute' WHERE order_id = :id",
        id=lost,
    )

    running = dispatching(after=1.0)
    await until(lambda: running.polls("not_found") >= 1, 10, "the 404")
    later = await stores.placed(("B", 1))
    await until(lambda: _accepted(stores, 2), 10, "a request sent after it")
    await until(lambda: running.polls("not_found") >= 2, 10, "asked again")
    assert not running.task.done()
    await running.stop()

    assert await stores.polled_at(lost) is not None
    assert await stores.status_of(lost) == "reserved"
    assert running.client.calls.count(("send", later)) == 1


class BrokenStock(PostgresStock):
    """A stock store whose ``apply`` fails as a bug would, not as a database outage."""

    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:
        msg = f"cannot apply {type(command).__name__}"
        raise RuntimeError(msg)


async def test_a_poll_that_cannot_be_applied_is_asked_again_an_interval_later_and_stops_nothing(
    stores: Stores, server: SimulatorServer, dispatching: Callable[..., Running]
) -> None:
    broken = await stores.placed(("A", 1))
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 1), 10, "sent")
    await sending.stop()
    await stores.last_heard(60, [broken])
    ship(server, broken, "SHP-BROKEN", ("A", 1))
    stock = BrokenStock(
        stores.engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True
    )

    running = dispatching(after=1.0, stock=stock)
    await until(lambda: running.client.polls_of(broken) >= 1, 10, "the first poll")
    later = await stores.placed(("B", 1))
    await until(lambda: _accepted(stores, 2), 10, "a request sent after it")
    await asyncio.sleep(1.5)
    assert not running.task.done()
    await running.stop()

    assert await stores.polled_at(broken) is not None
    # An interval apart (a second), not at every turn of the loop (every 50 ms).
    assert running.client.polls_of(broken) <= 4
    assert running.client.calls.count(("send", later)) == 1
    assert await stores.status_of(broken) == "reserved"


async def test_the_gauge_counts_the_accepted_orders_holding_units_with_no_news(
    stores: Stores, dispatching: Callable[..., Running]
) -> None:
    # _recent: accepted now, and left so.
    old, _recent, heard, polled, done = [await stores.placed(("A", 1)) for _ in range(5)]
    pending = await stores.placed(("A", 1))
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 6), 10, "sent")
    await sending.stop()
    await stores.execute(
        "UPDATE warehouse_requests SET status = 'pending', answered_at = NULL,"
        " warehouse_id = NULL WHERE order_id = :id",
        id=pending,
    )
    await stores.last_heard(600, [old, heard, polled, done, pending])
    await stores.execute(
        "UPDATE warehouse_requests SET news_at = now() WHERE order_id = :id", id=heard
    )
    await stores.execute(
        "UPDATE warehouse_requests SET polled_at = now() WHERE order_id = :id", id=polled
    )
    await stores.stock.apply(shipment(done))
    metrics = DispatcherMetrics()
    poller = Poller(
        stores.requests,
        stores.stock,
        PollOptions(reconcile_after_seconds=60, concurrency=4),
        metrics,
    )

    await read_backlog(stores.requests, metrics, poller)

    # old, and polled (a poll that found nothing is no news); not recent (accepted now),
    # heard (a shipment recorded now), done (holds nothing), pending (not accepted).
    assert metrics.registry.get_sample_value("fulfilment_warehouse_orders_without_news") == 2


async def test_the_due_orders_are_the_longest_unheard_of_first_by_the_latest_of_their_times(
    stores: Stores, dispatching: Callable[..., Running]
) -> None:
    first, second, third, heard, polled = [await stores.placed(("A", 1)) for _ in range(5)]
    sending = dispatching(after=3600)
    await until(lambda: _accepted(stores, 5), 10, "sent")
    await sending.stop()
    for order_id, seconds in ((first, 300), (second, 200), (third, 100)):
        await stores.last_heard(seconds, [order_id])
    # Accepted long ago, but heard of (a shipment) or asked about (a poll) lately.
    await stores.last_heard(900, [heard, polled])
    await stores.execute(
        "UPDATE warehouse_requests SET news_at = now() - interval '10 seconds'"
        " WHERE order_id = :id",
        id=heard,
    )
    await stores.execute(
        "UPDATE warehouse_requests SET polled_at = now() - interval '10 seconds'"
        " WHERE order_id = :id",
        id=polled,
    )

    def ids(due: list[FulfilmentOrderToPoll]) -> list[uuid.UUID]:
        return [order.order_id for order in due]

    everything = await stores.requests.due_polls(10, after_seconds=60)
    two = await stores.requests.due_polls(2, after_seconds=60)
    first_id = everything[0].request_id
    but_the_first = await stores.requests.due_polls(10, after_seconds=60, excluding=[first_id])
    longer = await stores.requests.due_polls(10, after_seconds=150)
    await stores.requests.record_polls([first_id])
    after_a_poll = await stores.requests.due_polls(10, after_seconds=60)

    assert ids(everything) == [first, second, third]
    assert ids(two) == [first, second]
    assert ids(but_the_first) == [second, third]
    assert ids(longer) == [first, second]
    assert ids(after_a_poll) == [second, third]
    assert all(order.warehouse_id.startswith("WH-") for order in everything)
    with pytest.raises(ValueError, match="limit"):
        await stores.requests.due_polls(0, after_seconds=60)
