"""The failover suite: workers and a relay on a private PostgreSQL primary and standby whose
places change under load (make test-failover).

Its tests are marked ``failover`` and run only when the marker expression names ``failover``
(``pytest -m failover``): a plain ``pytest`` leaves them out, as they take minutes and start
servers of their own. One pair of servers (``postgres_pair``) serves the whole session, its
database migrated once; each test finds both servers running, the standby streaming, and every
table empty. The machine's RabbitMQ carries the messages (the session's virtual host).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from fulfilment.adapters.postgres.schema import migrate
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from tests.e2e.harness import FAST_SETTINGS
from tests.failover.postgres_pair import PairError, PostgresPair, connect_primary, missing_tools
from tests.faults.faultlib import Cluster
from tests.support.markers import run_only_when_named
from tests.support.services import service_unavailable

FOLDER = Path(__file__).parent
DATABASE = "fulfilment"

TABLES = (
    "inbox_messages, inbox_pruned, reservation_lines, reservations, stock_levels,"
    " tombstone_lines, delivery_attempts, outbox, warehouse_requests, warehouse_request_audit,"
    " webhook_inbox, warehouse_shipments, warehouse_shipment_lines, warehouse_cancellations,"
    " warehouse_cancellation_lines, warehouse_discrepancies, invalid_webhooks,"
    " invalid_webhook_audit"
)
"""Every table a scenario fills (``tests/conftest.py``'s ``clean_database`` empties the same)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``failover``; leave them out unless ``-m`` names the marker."""
    run_only_when_named("failover", FOLDER, config, items)


@pytest.fixture(scope="session")
def postgres_pair() -> Iterator[PostgresPair]:
    """A primary and a synchronous standby of the session's own, the service's schema
    migrated on the primary; stopped and removed at the end."""
    missing = missing_tools()
    if missing:
        service_unavailable("a private PostgreSQL pair", FileNotFoundError(", ".join(missing)))
    pair = PostgresPair(Path(tempfile.mkdtemp(prefix="fulfilment-failover-")))
    try:
        pair.create()
        pair.sql(pair.primary, f"CREATE DATABASE {DATABASE}")
        migrate(pair.url(DATABASE))
    except PairError as error:
        pair.destroy()
        service_unavailable("a private PostgreSQL pair", error)
    try:
        yield pair
    finally:
        pair.destroy()


@pytest.fixture
async def failover_url(postgres_pair: PostgresPair) -> str:
    """The service's URL over both servers, the pair healed and every table emptied."""
    await asyncio.to_thread(postgres_pair.heal)
    url = postgres_pair.url(DATABASE)
    db = await connect_primary(url)
    try:
        await db.execute(f"TRUNCATE {TABLES} CASCADE")
    finally:
        await db.close()
    return url


@pytest.fixture
def failover_env(failover_url: str, amqp_url: str) -> dict[str, str]:
    """Environment of a worker or relay on the pair (both hosts) and the session's vhost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = failover_url
    env["FULFILMENT_AMQP_URL"] = amqp_url
    env["FULFILMENT_LOG_LEVEL"] = "INFO"
    env["FULFILMENT_RELAY_POLL_SECONDS"] = "0.2"
    return env


@pytest.fixture
def workers(failover_env: dict[str, str], tmp_path: Path, amqp_url: str) -> Iterator[Cluster]:
    """Worker processes of a scenario; killed afterwards, and the service's queues deleted
    then (a running worker would declare a deleted queue again)."""
    running = Cluster(failover_env, tmp_path)
    yield running
    running.kill_all()
    # In a thread of its own: the test's event loop is pytest-asyncio's, not this one's.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, delete_service_queues(amqp_url)).result()


async def delete_service_queues(amqp_url: str) -> None:
    """Delete every queue of the service on the session's vhost, on a fresh connection."""
    async with await aio_pika.connect(amqp_url) as cleanup:
        channel = await cleanup.channel()
        for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
            await channel.queue_delete(name)
