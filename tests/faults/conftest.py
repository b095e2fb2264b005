"""The fault suite: real worker processes killed, brokers restarted, databases cut off.

Each scenario publishes real events, injects its fault, lets the workers finish, and ends with
the product's own reconciliation (``fulfilment.tools.report.reconcile``): every
published event processed or dead-lettered exactly once, and the stock invariants hold. Each
scenario also appends one row to the figures file (``FULFILMENT_TEST_FAULT_FIGURES``, if set),
which the README's "Guarantees" table is written from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
from faultlib import Cluster
from pydantic import SecretStr

from fulfilment.contracts.topology import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings

FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``faults`` (``make test-faults`` selects them)."""
    for item in items:
        if FOLDER in item.path.parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def cluster(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    env = dict(worker_env)
    env["FULFILMENT_LOG_LEVEL"] = "INFO"
    running = Cluster(env, tmp_path)
    yield running
    running.kill_all()


@pytest.fixture
def settings(clean_database: str, amqp_url: str) -> Settings:
    return Settings(database_url=SecretStr(clean_database), amqp_url=SecretStr(amqp_url))


@pytest.fixture
async def broker(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    """A connection to the session's vhost; the service's queues are deleted afterwards, as
    scenarios declare them with delivery limits of their own."""
    connection = await aio_pika.connect_robust(amqp_url)
    try:
        yield connection
    finally:
        await connection.close()
        # A fresh connection: a scenario may have restarted the broker under the first one.
        async with await aio_pika.connect(amqp_url) as cleanup:
            channel = await cleanup.channel()
            for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
                await channel.queue_delete(name)
