from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from builders import order
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.retry import (
    RETRY_LABELS,
    call_with_retry,
    is_transient,
    retry_label,
    sqlstate_of,
)
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.application.ports import TransientError
from fulfilment.domain.model import OutcomeKind, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import Settings

LOCK_NOT_AVAILABLE = "55P03"
CHECK_VIOLATION = "23514"


def settings(database_url, **overrides):
    values = {
        "database_lock_timeout_seconds": 0.2,
        "database_statement_timeout_seconds": 0.5,
        "retry_budget_seconds": 1.5,
        "database_connect_timeout_seconds": 0.5,
    } | overrides
    return Settings(database_url=SecretStr(database_url), **values)


def asyncpg_url(database_url):
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class DriverError(Exception):
    def __init__(self, sqlstate):
        super().__init__(f"driver error {sqlstate}")
        self.sqlstate = sqlstate


def dbapi_error(sqlstate, *, invalidated=False):
    return sa_exc.DBAPIError(
        "SELECT 1", {}, DriverError(sqlstate), connection_invalidated=invalidated
    )


TRANSIENT = [
    "08000",
    "08003",
    "08006",
    "08P01",
    "25006",
    "40001",
    "40P01",
    "55P03",
    "57014",
    "57P01",
]
TRANSIENT += ["57P02", "57P03", "53300"]


@pytest.mark.parametrize("sqlstate", TRANSIENT)
def test_the_named_sqlstates_are_transient(sqlstate):
    assert is_transient(dbapi_error(sqlstate))


@pytest.mark.parametrize(
    "sqlstate", ["23514", "23505", "22023", "22003", "42P01", "42883", "53100", "55000", None]
)
def test_other_database_errors_are_not_transient(sqlstate):
    assert not is_transient(dbapi_error(sqlstate))


def test_an_invalidated_connection_is_transient_whatever_its_sqlstate():
    assert is_transient(dbapi_error(None, invalidated=True))


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "refused"),
        ConnectionResetError(),
        OSError(113, "No route to host"),
        TimeoutError(),
        sa_exc.TimeoutError("QueuePool limit reached"),
    ],
)
def test_failing_to_connect_is_transient(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bug"),
        RuntimeError("bug"),
        asyncio.CancelledError(),
        KeyboardInterrupt(),
        sa_exc.ResourceClosedError("closed"),
        TransientError("already translated"),
    ],
)
def test_anything_else_is_not_transient(error):
    assert not is_transient(error)


@pytest.mark.parametrize(
    ("error", "label"),
    [
        (dbapi_error("40P01"), "deadlock"),
        (dbapi_error("40001"), "serialization_failure"),
        (dbapi_error("55P03"), "lock_timeout"),
        (dbapi_error("57014"), "statement_timeout"),
        (dbapi_error("57P01"), "server_shutdown"),
        (dbapi_error("57P02"), "server_shutdown"),
        (dbapi_error("57P03"), "server_starting"),
        (dbapi_error("53300"), "too_many_connections"),
        (dbapi_error("08006"), "connection"),
        (asyncpg.exceptions.DeadlockDetectedError("deadlock"), "deadlock"),
        (ConnectionRefusedError(111, "Connection refused"), "connection"),
        (dbapi_error(None, invalidated=True), "connection"),
        (sa_exc.TimeoutError("QueuePool limit reached"), "pool_timeout"),
        (dbapi_error("XX000"), "other"),
    ],
)
def test_a_retried_error_is_counted_under_a_fixed_label(error, label):
    assert retry_label(error) == label


@pytest.mark.parametrize("sqlstate", TRANSIENT)
def test_every_transient_sqlstate_has_a_label_of_its_own(sqlstate):
    assert retry_label(dbapi_error(sqlstate)) in set(RETRY_LABELS) - {"other"}


async def test_a_transient_error_is_retried_until_the_budget_is_spent():
    attempts = 0
    seen = []

    async def refused():
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError(111, "Connection refused")

    started = time.monotonic()
    with capture_logs() as logs, pytest.raises(TransientError) as raised:
        await call_with_retry(refused, operation="test", budget_seconds=0.4, on_retry=seen.append)
    elapsed = time.monotonic() - started

    assert elapsed < 0.4 + 0.1
    assert attempts > 1
    assert len(seen) == attempts - 1
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
    assert f"{attempts} attempt(s)" in str(raised.value)
    retries = [log for log in logs if log["event"] == "database_retry"]
    assert [log["attempt"] for log in retries] == list(range(1, attempts))
    assert all(log["operation"] == "test" for log in retries)


async def test_an_error_that_is_not_transient_is_raised_unchanged_on_the_first_attempt():
    attempts = 0

    async def bug():
        nonlocal attempts
        attempts += 1
        raise dbapi_error(CHECK_VIOLATION)

    with pytest.raises(sa_exc.DBAPIError) as raised:
        await call_with_retry(bug, operation="test", budget_seconds=5.0)

    assert attempts == 1
    assert sqlstate_of(raised.value) == CHECK_VIOLATION


async def test_a_cancellation_is_not_retried():
    attempts = 0

    async def cancelled():
        nonlocal attempts
        attempts += 1
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await call_with_retry(cancelled, operation="test", budget_seconds=5.0)

    assert attempts == 1


async def test_a_database_that_does_not_answer_is_a_transient_error_within_the_budget():
    engine = create_engine(
        database_options(
            settings(
                "postgresql://postgres@127.0.0.1:1/nowhere",
                database_lock_timeout_seconds=0.1,
                database_statement_timeout_seconds=0.2,
                retry_budget_seconds=0.5,
            )
        )
    )
    warehouse = PostgresWarehouse(engine, consumer="fulfilment", retry_budget_seconds=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(TransientError) as raised:
            await warehouse.apply(order(("A", 1)))
    finally:
        await engine.dispose()

    assert time.monotonic() - started < 0.5 + 0.5 + 0.2
    assert isinstance(raised.value.__cause__, OSError)


@contextlib.asynccontextmanager
async def row_locked(database_url, sku):
    """Hold ``FOR UPDATE`` on one stock row from another connection until the block ends."""
    connection = await asyncpg.connect(asyncpg_url(database_url))
    try:
        transaction = connection.transaction()
        await transaction.start()
        await connection.execute("SELECT 1 FROM stock_levels WHERE sku = $1 FOR UPDATE", sku)
        yield
        await transaction.rollback()
    finally:
        await connection.close()


async def release_after(seconds, lock):
    await asyncio.sleep(seconds)
    await lock.__aexit__(None, None, None)


@pytest.fixture
async def make_warehouse(clean_database):
    engines = []

    def make(*, retries=None, **overrides):
        configured = settings(clean_database, **overrides)
        engine = create_engine(database_options(configured))
        engines.append(engine)
        return PostgresWarehouse(
            engine,
            consumer="fulfilment",
            retry_budget_seconds=configured.retry_budget_seconds,
            on_retry=None if retries is None else retries.append,
        )

    yield make
    for engine in engines:
        await engine.dispose()


async def inbox_rows(database_url, event_id):
    connection = await asyncpg.connect(asyncpg_url(database_url))
    try:
        return await connection.fetchval(
            "SELECT count(*) FROM inbox_messages WHERE event_id = $1", event_id
        )
    finally:
        await connection.close()


@pytest.mark.postgres
async def test_a_lock_held_past_the_lock_timeout_is_retried_and_then_succeeds(
    make_warehouse, clean_database
):
    retries = []
    warehouse = make_warehouse(retries=retries, retry_budget_seconds=3.0)
    await warehouse.put_stock({"A": 10})
    lock = row_locked(clean_database, "A")
    await lock.__aenter__()
    releaser = asyncio.create_task(release_after(0.7, lock))

    started = time.monotonic()
    with capture_logs() as logs:
        outcome = await warehouse.apply(order(("A", 4)))
    elapsed = time.monotonic() - started
    await releaser

    assert outcome.kind is OutcomeKind.RESERVED
    assert elapsed >= 0.6
    assert retries
    assert {sqlstate_of(error) for error in retries} == {LOCK_NOT_AVAILABLE}
    assert {log["sqlstate"] for log in logs if log["event"] == "database_retry"} == {
        LOCK_NOT_AVAILABLE
    }
    assert await warehouse.stock(["A"]) == {"A": StockLevel(10, 4)}


@pytest.mark.postgres
async def test_a_lock_held_past_the_budget_is_a_transient_error_and_writes_nothing(
    make_warehouse, clean_database
):
    warehouse = make_warehouse(retry_budget_seconds=1.0)
    await warehouse.put_stock({"A": 10})
    command = order(("A", 4))

    async with row_locked(clean_database, "A"):
        started = time.monotonic()
        with pytest.raises(TransientError) as raised:
            await warehouse.apply(command)
        elapsed = time.monotonic() - started

    # The last attempt starts within the budget and waits at most the lock timeout.
    assert 1.0 - 0.5 <= elapsed < 1.0 + 0.2 + 0.3
    assert sqlstate_of(raised.value.__cause__) == LOCK_NOT_AVAILABLE
    assert await inbox_rows(clean_database, command.event_id) == 0
    assert await warehouse.stock(["A"]) == {"A": StockLevel(10, 0)}
    # The redelivery that follows a transient failure then goes through.
    assert (await warehouse.apply(command)).kind is OutcomeKind.RESERVED


@pytest.mark.postgres
async def test_a_statement_past_the_statement_timeout_is_cancelled_by_the_server(
    make_warehouse,
):
    warehouse = make_warehouse(retry_budget_seconds=1.0)

    async def slow():
        async with warehouse.engine.connect() as connection:
            await connection.execute(sa.text("SELECT pg_sleep(5)"))

    started = time.monotonic()
    with pytest.raises(TransientError) as raised:
        await call_with_retry(slow, operation="test", budget_seconds=1.0)

    assert time.monotonic() - started < 1.0 + 0.5 + 0.3
    assert sqlstate_of(raised.value.__cause__) == "57014"


@pytest.mark.postgres
async def test_the_engine_sets_the_server_time_outs_and_names_the_application(make_warehouse):
    warehouse = make_warehouse()

    async with warehouse.engine.connect() as connection:
        shown = [
            await connection.scalar(sa.text(f"SHOW {name}"))
            for name in ["statement_timeout", "lock_timeout", "application_name"]
        ]

    assert shown == ["500ms", "200ms", "fulfilment"]


@pytest.mark.postgres
async def test_a_connection_killed_mid_statement_is_retried_on_a_new_one(
    make_warehouse, clean_database
):
    retries = []
    warehouse = make_warehouse(
        retries=retries,
        database_lock_timeout_seconds=2.0,
        database_statement_timeout_seconds=2.5,
        retry_budget_seconds=5.0,
    )
    await warehouse.put_stock({"A": 10})
    admin = await asyncpg.connect(asyncpg_url(clean_database))
    try:
        async with row_locked(clean_database, "A"):
            reserving = asyncio.create_task(warehouse.apply(order(("A", 1))))
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
    finally:
        await admin.close()

    assert outcome.kind is OutcomeKind.RESERVED
    assert retries
    assert all(is_transient(error) for error in retries)
    assert await warehouse.stock(["A"]) == {"A": StockLevel(10, 1)}
