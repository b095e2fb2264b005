"""The reservation's hot path: one round trip per order, on the asyncpg pool or the engine.

No pre-ping and no reset is paid for it; a connection that died in the pool costs a retry.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest
from pydantic import SecretStr
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from builders import order
from fulfilment.adapters.postgres.engine import ENGINE_POOL_SIZE, create_engine, create_pool
from fulfilment.adapters.postgres.retry import is_transient
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.application.ports import TransientError
from fulfilment.domain.model import OutcomeKind, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import Settings

POOL_SIZE = 4


class CountingProtocol:
    """Forwards to asyncpg's protocol, recording each call that talks to the server.

    asyncpg's query loggers do not see prepared statements (SQLAlchemy's way of executing), so
    the requests are counted where every one of them goes out: the connection's protocol.
    """

    REQUESTS = frozenset(
        {"prepare", "bind_execute", "bind_execute_many", "bind", "execute", "query"}
        | {"close_statement", "copy_in", "copy_out"}
    )

    def __init__(self, protocol, requests):
        self._protocol = protocol
        self._requests = requests

    def __getattr__(self, name):
        attribute = getattr(self._protocol, name)
        if name not in self.REQUESTS:
            return attribute

        def request(*args, **kwargs):
            self._requests.append(name)
            return attribute(*args, **kwargs)

        return request


def count_requests(connection, requests):
    connection._protocol = CountingProtocol(connection._protocol, requests)


@pytest.fixture(params=["pool", "engine"])
async def warehouse_with_queries(request, clean_database):
    """A warehouse reserving on the asyncpg pool (the worker's) or on the engine's connections,
    with a ``watch()`` that records every request to PostgreSQL from its open connections."""
    settings = Settings(
        database_url=SecretStr(clean_database),
        database_pool_size=POOL_SIZE,
        retry_budget_seconds=5.0,
    )
    engine = create_engine(database_options(settings))
    pool = await create_pool(database_options(settings)) if request.param == "pool" else None
    requests: list[str] = []
    retries: list[BaseException] = []

    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection, _record):
        count_requests(dbapi_connection.driver_connection, requests)

    async def watch():
        """Count the requests of the pool's open connections too (asyncpg has no hook)."""
        if pool is not None:
            held = [await pool.acquire() for _ in range(pool.get_size())]
            for connection in held:
                count_requests(connection._con, requests)  # under asyncpg's pool proxy
                await pool.release(connection)
        requests.clear()

    warehouse = PostgresWarehouse(
        engine,
        consumer="fulfilment",
        retry_budget_seconds=settings.retry_budget_seconds,
        on_retry=retries.append,
        pool=pool,
        pool_size=POOL_SIZE,
        # One order per transaction: the failover test below needs every connection in use.
        batch_max=1,
    )
    try:
        yield warehouse, requests, retries, watch
    finally:
        if pool is not None:
            pool.terminate()
        await engine.dispose()


@pytest.mark.postgres
async def test_a_reservation_is_one_round_trip_on_a_pooled_connection(warehouse_with_queries):
    warehouse, requests, _, watch = warehouse_with_queries
    await warehouse.put_stock({"A": 10, "B": 10})
    await warehouse.apply(order(("A", 1)))  # opens the connection, prepares the statement
    await watch()

    outcome = await warehouse.apply(order(("A", 1), ("B", 2), ("A", 3)))

    assert outcome.kind is OutcomeKind.RESERVED
    assert requests == ["bind_execute"]


@pytest.mark.postgres
async def test_pooled_connections_dropped_by_a_failover_cost_no_reservation(
    warehouse_with_queries, clean_database, request
):
    warehouse, _, retries, _ = warehouse_with_queries
    await warehouse.put_stock({"A": 100})
    # Fill the pool with idle connections, as a worker between two bursts has it.
    await asyncio.gather(*(warehouse.apply(order(("A", 1))) for _ in range(POOL_SIZE)))
    admin_url = make_url(clean_database).set(drivername="postgresql")
    admin = await asyncpg.connect(admin_url.render_as_string(hide_password=False))
    try:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'fulfilment' AND datname = current_database()"
        )
    finally:
        await admin.close()
    on_pool = request.node.callspec.params["warehouse_with_queries"] == "pool"
    # Every connection reservations run on: the pool's, or all of the engine's.
    assert killed >= (POOL_SIZE if on_pool else ENGINE_POOL_SIZE)

    outcomes = await asyncio.gather(*(warehouse.apply(order(("A", 1))) for _ in range(POOL_SIZE)))

    assert [outcome.kind for outcome in outcomes] == [OutcomeKind.RESERVED] * POOL_SIZE
    # The engine finds a dead connection by using it, and retries; asyncpg's pool replaces a
    # connection it already saw closed when it hands it out, so needs no retry.
    assert all(is_transient(error) for error in retries)
    assert await warehouse.stock(["A"]) == {"A": StockLevel(100, 2 * POOL_SIZE)}


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (asyncpg.exceptions.DeadlockDetectedError("deadlock detected"), True),
        (asyncpg.exceptions.LockNotAvailableError("lock timeout"), True),
        (asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation"), True),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), True),
        (asyncpg.InterfaceError("cannot call Connection.fetchrow(): connection is closed"), True),
        (asyncpg.exceptions.CheckViolationError("reserved within on_hand"), False),
        (asyncpg.InterfaceError("the server expects 6 arguments, 5 were passed"), False),
    ],
)
def test_the_pool_s_errors_are_classified_like_the_engine_s(error, transient):
    assert is_transient(error) is transient


@pytest.mark.postgres
async def test_a_pool_connection_killed_mid_statement_is_retried_on_a_new_one(clean_database):
    settings = Settings(
        database_url=SecretStr(clean_database),
        database_lock_timeout_seconds=2.0,
        database_statement_timeout_seconds=2.5,
        retry_budget_seconds=5.0,
    )
    database = database_options(settings)
    engine = create_engine(database)
    pool = await create_pool(database)
    retries: list[BaseException] = []
    warehouse = PostgresWarehouse(
        engine, consumer="fulfilment", retry_budget_seconds=5.0, on_retry=retries.append, pool=pool
    )
    admin_url = make_url(clean_database).set(drivername="postgresql")
    admin = await asyncpg.connect(admin_url.render_as_string(hide_password=False))
    holder = await asyncpg.connect(admin_url.render_as_string(hide_password=False))
    try:
        await warehouse.put_stock({"A": 10})
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM stock_levels WHERE sku = 'A' FOR UPDATE")
            reserving = asyncio.create_task(warehouse.apply(order(("A", 1))))
            killed = 0
            for _ in range(100):
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = 'fulfilment' AND wait_event_type = 'Lock'"
                )
                if killed:
                    break
                await asyncio.sleep(0.02)
            assert killed == 1
        outcome = await reserving
        stock = await warehouse.stock(["A"])
    finally:
        await holder.close()
        await admin.close()
        pool.terminate()
        await engine.dispose()

    assert outcome.kind is OutcomeKind.RESERVED
    assert retries
    assert all(is_transient(error) for error in retries)
    assert stock == {"A": StockLevel(10, 1)}


class SilencingProxy:
    """A TCP proxy to PostgreSQL that can make its open connections stop answering, as a
    network partition does, while new connections still get through."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open: list[asyncio.StreamWriter] = []
        self._silenced: set[asyncio.StreamWriter] = set()
        self._server_sides: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def silence_open_connections(self) -> None:
        self._silenced.update(self._open)

    async def _handle(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        self._open.append(client_writer)
        self._server_sides.append(server_writer)

        async def pipe(reader, writer) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    if client_writer not in self._silenced:
                        writer.write(data)
                        await writer.drain()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    async def close(self) -> None:
        """Close every connection, so that clients still waiting on a silenced one see it end."""
        for writer in [*self._open, *self._server_sides]:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_pool_connection_that_stops_answering_costs_a_retry_not_the_worker(
    clean_database,
):
    target = make_url(clean_database)
    proxy = SilencingProxy(target.host or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    settings = Settings(
        database_url=SecretStr(target.set(port=port).render_as_string(hide_password=False)),
        database_lock_timeout_seconds=0.5,
        database_statement_timeout_seconds=1.0,
        retry_budget_seconds=4.0,
    )
    database = database_options(settings)
    engine = create_engine(database)
    pool = await create_pool(database)
    warehouse = PostgresWarehouse(
        engine, consumer="fulfilment", retry_budget_seconds=4.0, pool=pool, pool_size=2
    )
    try:
        await warehouse.put_stock({"A": 100})
        await asyncio.gather(*(warehouse.apply(order(("A", 1))) for _ in range(4)))
        proxy.silence_open_connections()

        # Without a client-side bound the batch would wait on its silent connection for as long
        # as the kernel keeps the socket, and hold its slot all that time.
        async with asyncio.timeout(15):
            during = await asyncio.gather(
                *(warehouse.apply(order(("A", 1))) for _ in range(4)), return_exceptions=True
            )
            after = await asyncio.gather(*(warehouse.apply(order(("A", 1))) for _ in range(4)))
    finally:
        await proxy.close()
        pool.terminate()
        await engine.dispose()

    assert all(
        getattr(result, "kind", None) is OutcomeKind.RESERVED or isinstance(result, TransientError)
        for result in during
    ), during
    assert [outcome.kind for outcome in after] == [OutcomeKind.RESERVED] * 4


def test_a_protocol_out_of_step_with_a_dying_connection_is_transient_bare_or_wrapped():
    bare = asyncpg.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    wrapper = RuntimeError("adapted by the dialect")
    wrapper.__cause__ = bare
    wrapped = sa_exc.DBAPIError("SELECT 1", {}, wrapper)

    assert is_transient(bare)
    assert is_transient(wrapped)
