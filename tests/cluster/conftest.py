"""The cluster suite: workers against a private three-node RabbitMQ cluster (make test-cluster).

Its tests are marked ``cluster`` and run only when the marker expression names ``cluster``
(``pytest -m cluster``): a plain ``pytest`` or ``pytest -m "not faults"`` leaves them out, as
they take minutes and start brokers of their own. One cluster serves the whole session
(``rabbit_cluster``); every test uses its ``/`` virtual host and deletes the service's queues
afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
from pydantic import SecretStr

from fulfilment.contracts.topology import ORDER_PLACED_DEAD_LETTER_QUEUE, ORDER_PLACED_QUEUE
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from tests.cluster.rabbit_cluster import ClusterError, RabbitCluster, missing_tools
from tests.e2e.harness import FAST_SETTINGS
from tests.faults.faultlib import Cluster
from tests.support.markers import run_only_when_named
from tests.support.services import service_unavailable

FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``cluster``; leave them out unless ``-m`` names the marker."""
    run_only_when_named("cluster", FOLDER, config, items)


STARTED_IN: list[float] = []
"""Seconds the session's cluster took to start, for the summary."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how long the private cluster took to come up (three nodes, joined, proxy)."""
    for seconds in STARTED_IN:
        terminalreporter.write_line(f"private RabbitMQ cluster up in {seconds:.1f} s")


@pytest.fixture(scope="session")
def rabbit_cluster() -> Iterator[RabbitCluster]:
    """Three clustered RabbitMQ nodes behind HAProxy, for the session; removed at the end."""
    missing = missing_tools()
    if missing:
        service_unavailable("the private RabbitMQ cluster", FileNotFoundError(", ".join(missing)))
    cluster = RabbitCluster(Path(tempfile.mkdtemp(prefix="fulfilment-cluster-")))
    try:
        cluster.start()
    except ClusterError as error:
        cluster.stop()
        service_unavailable("the private RabbitMQ cluster", error)
    STARTED_IN.append(cluster.started_in)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(rabbit_cluster: RabbitCluster) -> str:
    """The cluster's one address; every node runs again before the test."""
    for node in rabbit_cluster.nodes:
        if not node.running():
            rabbit_cluster.start_node(node)
    if rabbit_cluster.proxy is None:
        rabbit_cluster.start_proxy()
    return rabbit_cluster.amqp_url()


@pytest.fixture
async def cluster_broker(cluster_url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    """A connection to the cluster (through the proxy), for the test to look with; the
    service's queues are deleted afterwards, on a fresh connection."""
    connection = await aio_pika.connect(cluster_url)
    try:
        yield connection
    finally:
        if not connection.is_closed:
            await connection.close()
        await delete_service_queues(cluster_url)


async def delete_service_queues(cluster_url: str) -> None:
    """Delete the service's queues that the scenarios declare, on a fresh connection."""
    async with await aio_pika.connect(cluster_url) as cleanup:
        channel = await cleanup.channel()
        for name in (ORDER_PLACED_QUEUE, ORDER_PLACED_DEAD_LETTER_QUEUE):
            await channel.queue_delete(name)


@pytest.fixture
def cluster_settings(clean_database: str, cluster_url: str) -> Settings:
    """The tools' settings for the session's database and the cluster (reconciliation)."""
    return Settings(
        database=DatabaseSettings(url=SecretStr(clean_database)),
        broker=BrokerSettings(amqp_url=SecretStr(cluster_url)),
    )


@pytest.fixture
def workers(clean_database: str, cluster_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Worker processes on the session's database and the cluster's one address; killed
    afterwards, and the queues deleted then (a running worker declares a deleted queue again,
    undoing ``cluster_broker``'s deletion, which comes first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = clean_database
    env["FULFILMENT_AMQP_URL"] = cluster_url
    env["FULFILMENT_LOG_LEVEL"] = "INFO"
    running = Cluster(env, tmp_path)
    yield running
    running.kill_all()
    # In a thread of its own: the test's event loop is pytest-asyncio's, not this one's.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, delete_service_queues(cluster_url)).result()
