"""The worker's background monitors, and its probes, after the broker closes its connections.

Only the worker's own connections are closed: those of the session's vhost whose client port
the worker's process holds; and only the session's vhost has its permissions cleared, for a
few seconds, to keep the worker out. The broker and every other connection are left alone.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika
import asyncpg
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fulfilment.contracts.topology import ORDER_PLACED_DEAD_LETTER_QUEUE, ORDER_PLACED_QUEUE
from fulfilment.settings import Settings
from tests.e2e.harness import WorkerProcess, put_stock
from tests.e2e.harness import publish as publish_body
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    Order,
    assert_reconciled,
    declare,
    publish,
    record_figures,
    run_until_settled,
    synthetic_orders,
)
from tests.support.services import AMQP_PORT

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ORDERS = 300
CLOSES = 3
"""How many times the worker's connections are closed, each once it has recovered, before the
last time (with its reconnects refused)."""

POLL_SECONDS = "1"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


def vhost_of(amqp_url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(amqp_url).path.lstrip("/")) or "/"


def worker_connections(worker: WorkerProcess, vhost: str) -> list[str]:
    """Broker pids of the connections in ``vhost`` whose client socket the worker holds."""
    assert worker.process is not None
    ports = {
        socket.laddr.port
        for socket in psutil.Process(worker.process.pid).net_connections("tcp")
        if socket.raddr and socket.raddr.port == AMQP_PORT
    }
    listing = rabbitmqctl("list_connections", "pid", "peer_port", "vhost")
    rows = [line.split("\t") for line in listing.splitlines()]
    return [pid for pid, port, where in rows if where == vhost and int(port) in ports]


def scrape(worker: WorkerProcess) -> Samples:
    """The worker's ``/metrics`` as ``(name, sorted labels) -> value``."""
    url = f"http://127.0.0.1:{worker.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def readiness(worker: WorkerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{worker.port}/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as error:
        return dict(json.loads(error.read()))


async def eventually(check: Callable[[], bool], *, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def monitor_errors(worker: WorkerProcess) -> float | None:
    return value(scrape(worker), "fulfilment_monitor_errors_total", check="queues")


def consumers(worker: WorkerProcess) -> float | None:
    return value(scrape(worker), "fulfilment_queue_consumers", queue=ORDER_PLACED_QUEUE)


async def close_connections(worker: WorkerProcess, vhost: str) -> int:
    """Close the worker's two connections (its consumer's and its monitor's); return 2."""
    pids = await asyncio.to_thread(worker_connections, worker, vhost)
    assert len(pids) == 2, "the worker's broker connection and its monitor's"
    for pid in pids:
        await asyncio.to_thread(rabbitmqctl, "close_connection", pid, "fault suite")
    return len(pids)


async def test_the_monitor_after_connection_closes(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=31)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    (worker,) = cluster.start(
        1, wait_ready=True, FULFILMENT_QUEUE_POLL_INTERVAL_SECONDS=POLL_SECONDS
    )
    vhost = vhost_of(amqp_url)

    closed = 0
    for round_ in range(1, CLOSES + 1):
        closed += await close_connections(worker, vhost)
        # The failed poll is counted, the monitor comes back, and so does the worker.
        await eventually(lambda r=round_: monitor_errors(worker) == r, what="a counted failure")
        await eventually(lambda: consumers(worker) == 1, what="the consumer reported again")
        await eventually(worker.ready, what="the worker to be ready again")

    # Kept out: the broker refuses the worker's reconnects (this vhost's permissions only)
    # for a while. aio-pika reconnects at once after a close when its last attempt is older
    # than its 5 s interval, so only a refused reconnect makes the outage last for sure.
    user = urllib.parse.urlsplit(amqp_url).username or "guest"
    await asyncio.to_thread(rabbitmqctl, "clear_permissions", "-p", vhost, user)
    try:
        closed += await close_connections(worker, vhost)
        # Neither readiness nor the gauges claim a broker the worker cannot reach.
        await eventually(lambda: readiness(worker)["broker"] is False, what="broker: false")
        await eventually(lambda: consumers(worker) is None, what="the queue gauges to go")
        assert (
            value(scrape(worker), "fulfilment_queue_messages_ready", queue=ORDER_PLACED_QUEUE)
            is None
        )
    finally:
        await asyncio.to_thread(rabbitmqctl, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    await eventually(lambda: consumers(worker) == 1, what="the monitor back after the outage")
    await eventually(worker.ready, what="the worker ready after the outage")

    malformed = Order(uuid.uuid4(), ())
    await publish_body(
        broker,
        json.dumps({"event_id": str(malformed.event_id), "lines": "not a list"}).encode(),
        message_id=str(malformed.event_id),
    )
    await run_until_settled(cluster, db, broker, ORDERS + 1, restart=False)

    dead_letters = "fulfilment_queue_messages_ready"
    age = "fulfilment_dead_letters_oldest_age_seconds"

    def dead_letter_seen() -> bool:
        # One poll sets the depth, then reads the DLQ's head and sets the age: a scrape in
        # between sees the depth of 1 and the age of the empty DLQ (0).
        metrics = scrape(worker)
        return value(metrics, dead_letters, queue=ORDER_PLACED_DEAD_LETTER_QUEUE) == 1 and bool(
            value(metrics, age)
        )

    await eventually(dead_letter_seen, what="the DLQ depth gauge at 1 and its age above 0")
    first = value(scrape(worker), age)
    await asyncio.sleep(2)
    later = value(scrape(worker), age)
    errors = monitor_errors(worker)
    code, _ = worker.terminate()

    assert first is not None
    assert later is not None
    assert first > 0
    assert later >= first + 1.5
    assert errors is not None
    assert errors > CLOSES  # one per close, and at least one while kept out
    assert len(cluster.log_events("monitor.failed")) == errors
    assert code == 0, worker.log_tail(20)
    result = await assert_reconciled(settings, [*orders, malformed], dead_lettered=1)
    record_figures(
        "monitor after connection closes",
        f"rabbitmqctl close_connection on the worker's {closed} connections in {CLOSES + 1} "
        f"rounds (the last with reconnects refused), {POLL_SECONDS} s queue poll, then a "
        "malformed body",
        result,
        reason="permanent",
        dead_letter_gauge=1,
        dead_letter_age_seconds=round(later, 1),
        monitor_errors=int(errors),
        sigterm_exit_code=code,
    )
