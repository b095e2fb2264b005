"""Fixtures that reach the real services.

Every test session gets its own PostgreSQL database (migrated to head, dropped at the end) and,
where ``rabbitmqctl`` can make one, its own RabbitMQ virtual host, so that sessions running side
by side cannot see each other's stock, inbox or queues. A test that needs a service that does
not answer is skipped on a developer's machine and fails under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from tests.support.services import (
    ADMIN_DATABASE_URL,
    AMQP_URL,
    service_unavailable,
    throwaway_database,
)

if TYPE_CHECKING:
    from tests.e2e.relay_harness import RelayProcess
    from tests.support.private_broker import PrivateBroker


async def _probe_postgres() -> None:
    connection = await asyncpg.connect(ADMIN_DATABASE_URL, timeout=3)
    await connection.close()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """URL (``postgresql+asyncpg://``) of a fresh database migrated to head, for this session."""
    from fulfilment.adapters.postgres.schema import migrate  # noqa: PLC0415 - needs the DB up

    try:
        asyncio.run(_probe_postgres())
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        service_unavailable("PostgreSQL", error)
    with throwaway_database("fulfilment_test") as url:
        migrate(url)
        yield url


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """URL of a RabbitMQ virtual host of this session's own (or ``/`` without rabbitmqctl)."""
    import aio_pika  # noqa: PLC0415

    async def probe() -> None:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
        await connection.close()

    try:
        asyncio.run(probe())
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as error:
        service_unavailable("RabbitMQ", error)
    if shutil.which("rabbitmqctl") is None:
        yield AMQP_URL
        return
    vhost = f"fulfilment-test-{uuid.uuid4().hex[:12]}"
    user = urllib.parse.urlsplit(AMQP_URL).username or "guest"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield AMQP_URL.rstrip("/") + "/" + urllib.parse.quote(vhost, safe="")
    finally:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.fixture(scope="session")
def private_broker() -> Iterator[PrivateBroker]:
    """A RabbitMQ node of the session's own: TLS only, the shipped definitions loaded at boot.

    Its CA (``ca.crt``), a CA that did not sign its certificate (``wrong-ca.crt``) and the
    server certificate, for ``localhost`` only, are made here (``certificates``). The node
    serves the tests of TLS to the broker (``tests/e2e/test_broker_tls.py``) and of the
    shipped users and permissions (``tests/deploy/test_broker_definitions.py``); the
    machine's own broker is not touched.
    """
    from tests.support.certificates import make_ca, make_server_certificate  # noqa: PLC0415
    from tests.support.private_broker import PrivateBroker, PrivateBrokerError, missing_tools  # noqa: PLC0415

    missing = missing_tools()
    if missing:
        service_unavailable("A private RabbitMQ node", FileNotFoundError(", ".join(missing)))
    folder = Path(tempfile.mkdtemp(prefix="fulfilment-rabbit-tls-"))
    tls = folder / "tls"
    tls.mkdir()
    ca_file = make_ca(tls, "ca")
    make_ca(tls, "wrong-ca")
    # localhost only: a URL naming 127.0.0.1 fails the host name check.
    cert_file, key_file = make_server_certificate(tls, "ca", names="DNS:localhost")
    node = PrivateBroker(
        folder / "node",
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        definitions=Path(__file__).parents[1] / "deploy/rabbitmq/definitions.json",
    )
    node.folder.mkdir()
    try:
        node.start()
    except PrivateBrokerError as error:
        node.stop()
        shutil.rmtree(folder, ignore_errors=True)
        service_unavailable("A private RabbitMQ node", error)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def private_vhost_url(amqp_url: str) -> Iterator[str]:
    """URL of a RabbitMQ virtual host of this test's own, deleted after it: for tests that set
    broker policies, which would otherwise reach the session's other tests."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to make a virtual host")
    vhost = f"fulfilment-private-{uuid.uuid4().hex[:12]}"
    user = urllib.parse.urlsplit(amqp_url).username or "guest"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield AMQP_URL.rstrip("/") + "/" + urllib.parse.quote(vhost, safe="")
    finally:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
async def clean_database(database_url: str) -> str:
    """The session database with every table emptied before the test."""
    url = make_url(database_url).set(drivername="postgresql")
    connection = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await connection.execute(
            "TRUNCATE inbox_messages, inbox_pruned, reservation_lines, reservations,"
            " stock_levels, tombstone_lines, delivery_attempts, outbox, warehouse_requests,"
            " warehouse_request_audit, webhook_inbox, warehouse_shipments,"
            " warehouse_shipment_lines, warehouse_cancellations, warehouse_cancellation_lines,"
            " warehouse_discrepancies, invalid_webhooks, invalid_webhook_audit,"
            " warehouse_adjustments CASCADE"
        )
    finally:
        await connection.close()
    return database_url


@pytest.fixture
def relays() -> Iterator[list[RelayProcess]]:
    """Relay processes of one test (``relay_harness.spawn_relay`` adds them); all are killed at
    the end (the e2e and fault suites both start relays)."""
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        relay.stop_quietly()


@pytest.fixture
def worker_env(clean_database: str, amqp_url: str) -> dict[str, str]:
    """Environment of a worker process on this session's database and vhost, with short
    time bounds (``harness.FAST_SETTINGS``) so that tests of failures finish quickly."""
    from tests.e2e.harness import FAST_SETTINGS  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = clean_database
    env["FULFILMENT_AMQP_URL"] = amqp_url
    return env


@pytest.fixture
async def db(clean_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to the emptied session database."""
    url = make_url(clean_database).set(drivername="postgresql")
    connection = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        yield connection
    finally:
        await connection.close()
