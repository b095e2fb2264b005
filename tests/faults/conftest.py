"""The fault suite: real worker processes killed, brokers restarted, databases cut off.

Each scenario publishes real events, injects its fault, lets the workers finish, and ends with
the product's own reconciliation (``fulfilment.tools.report.reconcile``): every
published event processed or dead-lettered exactly once, and the stock invariants hold. Each
scenario also appends one row to the figures file (``FULFILMENT_TEST_FAULT_FIGURES``, if set),
which the table of docs/guarantees.md is written from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
from pydantic import SecretStr

from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from tests.e2e.harness import free_port
from tests.e2e.warehouse_harness import DispatcherProcess
from tests.faults.faultlib import Cluster
from tests.faults.return_path import RoundRobin

FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``faults`` (``make test-faults`` selects them)."""
    for item in items:
        if FOLDER in item.path.parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def cluster(worker_env: dict[str, str], tmp_path: Path, amqp_url: str) -> Iterator[Cluster]:
    """Worker processes of a scenario; killed afterwards, and the queues deleted then.

    A worker declares its queue again when it is deleted under its consumer, so the ``broker``
    fixture's deletion, which comes first, may be undone while the workers still run.
    """
    env = dict(worker_env)
    env["FULFILMENT_LOG_LEVEL"] = "INFO"
    running = Cluster(env, tmp_path)
    yield running
    running.kill_all()
    # In a thread of its own: the test's event loop is pytest-asyncio's, not this one's.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, delete_service_queues(amqp_url)).result()


@pytest.fixture
def dispatchers() -> Iterator[list[DispatcherProcess]]:
    """Dispatcher processes of a scenario (``warehouse_harness.start_dispatcher`` adds them);
    killed afterwards."""
    started: list[DispatcherProcess] = []
    yield started
    for dispatcher in started:
        dispatcher.stop_quietly()


@pytest.fixture
def balancer() -> Iterator[RoundRobin]:
    """The round-robin in front of two intake ports (nothing serves them yet): the one URL
    the warehouse sends its webhooks to (``return_path.Intakes`` starts the replicas)."""
    running = RoundRobin([free_port(), free_port()])
    running.start()
    yield running
    running.stop()


@pytest.fixture
def settings(clean_database: str, amqp_url: str) -> Settings:
    return Settings(
        database=DatabaseSettings(url=SecretStr(clean_database)),
        broker=BrokerSettings(amqp_url=SecretStr(amqp_url)),
    )


@pytest.fixture
async def broker(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    """A connection to the session's vhost; the service's queues are deleted before and
    after, as scenarios declare them with delivery limits of their own (and the suites before
    this one, on the same vhost, with theirs)."""
    await delete_service_queues(amqp_url)
    connection = await aio_pika.connect_robust(amqp_url)
    try:
        yield connection
    finally:
        await connection.close()
        await delete_service_queues(amqp_url)


async def delete_service_queues(amqp_url: str) -> None:
    """Delete every queue of the service on the session's vhost."""
    # A fresh connection: a scenario may have restarted the broker under the test's own.
    async with await aio_pika.connect(amqp_url) as cleanup:
        channel = await cleanup.channel()
        for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
            await channel.queue_delete(name)
