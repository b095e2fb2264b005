"""``fulfilment webhooks`` as a process among others: the database that stops answering, two
replicas given the same webhooks, the stop signal, and the start's refusals.

Each test starts its own intake processes (the installed program) on the session database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.model import OutcomeKind
from fulfilment.entrypoints.cli import app
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import order
from tests.support.services import admin_execute, throwaway_database
from tests.support.webhooks import (
    IntakeProcess,
    cancellation_body,
    intake_env,
    shipment_body,
    signed_headers,
)

pytestmark = pytest.mark.postgres


class FreezingProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding anything, either way, on every
    connection open or new: a database that does not answer (not one that refuses)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _handle(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        self._writers += [client_writer, server_writer]

        async def pipe(reader, writer) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    await self._thawed.wait()
                    writer.write(data)
                    await writer.drain()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    def freeze(self) -> None:
        """Forward nothing more, either way, until :meth:`thaw`."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def reserved(stock: PostgresStock) -> uuid.UUID:
    await stock.put_stock({"A": 100})
    placed = order(("A", 50))
    assert (await stock.apply(placed)).kind is OutcomeKind.RESERVED
    return placed.order_id


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as http:
        yield http


@pytest.fixture
def intakes() -> AsyncIterator[list[IntakeProcess]]:
    started: list[IntakeProcess] = []
    yield started
    for process in started:
        process.stop_quietly()


async def start_intake(
    intakes: list[IntakeProcess], database_url: str, tmp_path: Path, **env: str
) -> IntakeProcess:
    process = IntakeProcess(
        intake_env(database_url, **env), tmp_path / f"intake-{len(intakes)}.log"
    )
    intakes.append(process)
    # In a thread: the test's loop must go on serving (a proxy may stand in between).
    await asyncio.to_thread(process.start)
    return process


async def test_a_database_that_does_not_answer_is_a_503_with_retry_after_well_within_5_s(
    clean_database, intakes, tmp_path, client, db, reserved
) -> None:
    target = make_url(clean_database)
    proxy = FreezingProxy(target.host or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    through_proxy = target.set(port=port).render_as_string(hide_password=False)
    try:
        intake = await start_intake(intakes, through_proxy, tmp_path)
        body = shipment_body(reserved, [("A", 1)], shipment_id="SHP-503")
        proxy.freeze()
        started = time.monotonic()
        answer = await client.post(intake.url, content=body, headers=signed_headers(body))
        took = time.monotonic() - started
        assert await db.fetchval("SELECT count(*) FROM warehouse_shipments") == 0
        proxy.thaw()
        retried = await client.post(
            intake.url, content=body, headers=signed_headers(body, webhook_id="msg_retry")
        )
    finally:
        await proxy.close()

    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) > 0
    assert answer.json() == {"error": "database_unavailable"}
    assert took < 3.0
    assert retried.status_code == 204
    assert await db.fetchval("SELECT count(*) FROM warehouse_shipments") == 1
    assert 'fulfilment_webhook_refusals_total{reason="database_unavailable"} 1.0' in (
        intake.metrics()
    )


async def test_duplicates_on_two_replicas_sequential_and_concurrent_are_applied_once(
    clean_database, intakes, tmp_path, client, db, reserved
) -> None:
    first, second = [await start_intake(intakes, clean_database, tmp_path) for _ in range(2)]
    shipments = [
        shipment_body(reserved, [("A", 1)], shipment_id=f"SHP-{number}") for number in range(20)
    ]

    async def send(intake: IntakeProcess, body: bytes, webhook_id: str) -> int:
        answer = await client.post(
            intake.url, content=body, headers=signed_headers(body, webhook_id=webhook_id)
        )
        return answer.status_code

    # Sequential: the same webhook to one replica then the other, and again under a new id.
    sequential = [
        await send(intake, shipments[0], webhook_id)
        for intake, webhook_id in ((first, "msg_0"), (second, "msg_0"), (second, "msg_0b"))
    ]
    # Concurrent: each of the others to both replicas at the same instant, twice.
    concurrent = await asyncio.gather(
        *(
            send(intake, body, f"msg_{number}{suffix}")
            for number, body in enumerate(shipments[1:], start=1)
            for intake in (first, second)
            for suffix in ("", "", "-again")
        )
    )

    assert sequential == [204, 204, 204]
    assert set(concurrent) == {204}
    assert await db.fetchval("SELECT count(*) FROM warehouse_shipments") == 20
    assert await db.fetchval("SELECT count(*) FROM webhook_inbox") == 1 + 1 + 19 * 2
    level = await db.fetchrow("SELECT on_hand, reserved FROM stock_levels WHERE sku = 'A'")
    assert dict(level) == {"on_hand": 80, "reserved": 30}
    events = await db.fetchval("SELECT count(*) FROM outbox WHERE routing_key = 'stock.shipped'")
    assert events == 20


async def test_sigterm_answers_the_requests_in_flight_then_exits_0(
    clean_database, intakes, tmp_path
) -> None:
    intake = await start_intake(intakes, clean_database, tmp_path)
    bodies = [
        json.dumps(
            {"type": "order.created", "timestamp": "2026-12-06T10:00:00Z", "data": {"n": n}}
        ).encode()
        for n in range(3)
    ]
    # Three requests whose bodies are still arriving when the signal comes.
    connections = []
    for body in bodies:
        reader, writer = await asyncio.open_connection("127.0.0.1", intake.port)
        head = (
            f"POST /webhooks/warehouse HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in signed_headers(body).items())
            + "\r\n"
        ).encode()
        writer.write(head + body[:10])
        await writer.drain()
        connections.append((reader, writer, body))
    await asyncio.sleep(0.3)
    assert intake.process is not None
    intake.process.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    statuses = []
    for reader, writer, body in connections:
        writer.write(body[10:])
        await writer.drain()
        statuses.append(await asyncio.wait_for(reader.readline(), timeout=10))
        writer.close()
    code = await asyncio.to_thread(intake.process.wait, 30)

    assert statuses == [b"HTTP/1.1 204 No Content\r\n"] * 3
    assert code == 0
    assert any(line.get("event") == "webhooks.stopped" for line in intake.log_lines())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", intake.port), timeout=1).close()


async def test_without_secrets_it_refuses_to_start_naming_the_variable(
    clean_database, tmp_path
) -> None:
    env = intake_env(clean_database)
    del env["FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS"]
    process = IntakeProcess(env, tmp_path / "intake.log")

    with pytest.raises(pytest.fail.Exception, match="exited with 2"):
        await asyncio.to_thread(process.start)
    assert "FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS is not set" in process.log_path.read_text()


async def test_a_taken_port_stops_the_start_with_exit_1_naming_its_variable(
    clean_database, tmp_path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        process = IntakeProcess(intake_env(clean_database), tmp_path / "intake.log")
        process.http_port = taken.getsockname()[1]
        with pytest.raises(pytest.fail.Exception, match="exited with 1"):
            await asyncio.to_thread(process.start)
    assert "FULFILMENT_WEBHOOKS_HTTP_PORT" in process.log_path.read_text()


async def test_a_database_that_does_not_answer_at_the_start_is_exit_3(tmp_path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent_url = f"postgresql+asyncpg://postgres@127.0.0.1:{silent.getsockname()[1]}/none"
        env = intake_env(silent_url, FULFILMENT_DATABASE_CONNECT_TIMEOUT_SECONDS="1")
        process = IntakeProcess(env, tmp_path / "intake.log")
        with pytest.raises(pytest.fail.Exception, match="exited with 3"):
            await asyncio.to_thread(process.start)
    assert "webhooks.database_unreachable" in process.log_path.read_text()


def _migrate_as(owner_url: str, runtime_role: str) -> None:
    result = CliRunner().invoke(
        app,
        ["migrate"],
        env={
            "FULFILMENT_DATABASE_URL": owner_url,
            "FULFILMENT_DATABASE_RUNTIME_ROLE": runtime_role,
        },
    )
    assert result.exit_code == 0, result.stderr


def _as(url: str, user: str, driver: str = "postgresql+asyncpg") -> str:
    return (
        make_url(url)
        .set(drivername=driver, username=user, password=None)
        .render_as_string(hide_password=False)
    )


@pytest.fixture
def runtime_database(database_url: str) -> Iterator[tuple[str, str]]:
    """A database of its own owned by a new role, migrated granting a second one the runtime
    privileges: ``(owner URL, runtime URL)``. ``database_url`` only ensures PostgreSQL answers."""
    del database_url
    suffix = uuid.uuid4().hex[:10]
    owner, runtime = f"fulfilment_owner_{suffix}", f"fulfilment_runtime_{suffix}"
    asyncio.run(admin_execute(f"CREATE ROLE {owner} LOGIN"))
    try:
        asyncio.run(admin_execute(f"CREATE ROLE {runtime} LOGIN"))
        with throwaway_database("fulfilment_intake_roles", f"OWNER {owner}") as url:
            _migrate_as(_as(url, owner), runtime)
            yield _as(url, owner), _as(url, runtime)
    finally:
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {runtime}"))
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {owner}"))


async def test_the_intake_does_its_whole_job_as_the_runtime_role(
    runtime_database, intakes, tmp_path
) -> None:
    owner_url, runtime_url = runtime_database
    stock = PostgresStock(
        create_engine(
            database_options(DatabaseSettings(url=SecretStr(owner_url)), DeadlineSettings())
        ),
        consumer="fulfilment",
        retry_budget_seconds=2.0,
    )
    try:
        await stock.put_stock({"A": 10})
        placed, cancelled = order(("A", 2)), order(("A", 3))
        for placement in (placed, cancelled):
            assert (await stock.apply(placement)).kind is OutcomeKind.RESERVED
    finally:
        await stock.engine.dispose()
    intake = await start_intake(intakes, runtime_url, tmp_path)
    answers = []
    async with httpx.AsyncClient(timeout=10) as client:
        for body in (
            shipment_body(placed.order_id, [("A", 2)]),
            cancellation_body(cancelled.order_id, None),
            b'{"type": "shipment.shipped"}',
        ):
            answer = await client.post(intake.url, content=body, headers=signed_headers(body))
            answers.append(answer.status_code)
    intake.terminate()
    owner_db = await asyncpg.connect(owner_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        recorded = [
            await owner_db.fetchval(f"SELECT count(*) FROM {table}")  # noqa: S608
            for table in ("warehouse_shipments", "warehouse_cancellations", "invalid_webhooks")
        ]
        level = await owner_db.fetchrow("SELECT on_hand, reserved FROM stock_levels")
    finally:
        await owner_db.close()

    assert answers == [204, 204, 422]
    assert recorded == [1, 1, 1]
    assert dict(level) == {"on_hand": 8, "reserved": 0}
