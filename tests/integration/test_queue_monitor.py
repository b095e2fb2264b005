"""The supervised queue monitor against the real RabbitMQ, when the broker closes its connection.

The monitor runs in this process; its connection is the one this process opened when the
monitor started (told apart by its client port). Nothing else is closed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable

import aio_pika
import psutil
import pytest

from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDER_PLACED,
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
)
from fulfilment.observability.metrics import Metrics
from fulfilment.worker.monitors import queue_monitor, supervise
from fulfilment.worker.topology import Topology, declare_topology
from tests.support.services import AMQP_PORT, service_unavailable

pytestmark = pytest.mark.rabbitmq


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def broker_ports() -> set[int]:
    """Client ports of this process's connections to the broker."""
    return {
        socket.laddr.port
        for socket in psutil.Process(os.getpid()).net_connections("tcp")
        if socket.raddr and socket.raddr.port == AMQP_PORT
    }


def close_connections(amqp_url: str, ports: set[int]) -> int:
    """Close the connections of the session's vhost from ``ports``; return how many."""
    vhost = urllib.parse.unquote(urllib.parse.urlsplit(amqp_url).path.lstrip("/")) or "/"
    listing = rabbitmqctl("list_connections", "pid", "peer_port", "vhost")
    rows = [line.split("\t") for line in listing.splitlines()]
    pids = [pid for pid, port, where in rows if where == vhost and int(port) in ports]
    for pid in pids:
        rabbitmqctl("close_connection", pid, "test")
    return len(pids)


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - state of the code under test, not an event
            await asyncio.sleep(0.01)


async def test_the_queue_monitor_survives_its_connection_closed_by_the_broker(
    amqp_url: str,
) -> None:
    if shutil.which("rabbitmqctl") is None:
        service_unavailable("rabbitmqctl", FileNotFoundError("rabbitmqctl"))
    await declare_topology(amqp_url, Topology(delivery_limit=5))
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    consumers = ("fulfilment_queue_consumers", {"queue": ORDER_PLACED_QUEUE})
    dead_letters = ("fulfilment_queue_messages_ready", {"queue": ORDER_PLACED_DEAD_LETTER_QUEUE})
    age = "fulfilment_dead_letters_oldest_age_seconds"
    failures = ("fulfilment_monitor_errors_total", {"check": "queues"})
    others = await asyncio.to_thread(broker_ports)
    monitor = asyncio.create_task(
        supervise(queue_monitor(amqp_url, metrics, interval_seconds=0.2), metrics)
    )
    try:
        await until(lambda: value(*consumers) == 0)
        ports = await asyncio.to_thread(broker_ports) - others  # the monitor's connection

        assert await asyncio.to_thread(close_connections, amqp_url, ports) == 1

        # The failed poll is counted and its series removed, not left at their last values...
        await until(lambda: value(*failures) == 1)
        assert (value(*consumers), value(*dead_letters), value(age)) == (None, None, None)
        # ... and the monitor comes back by itself, and sees what happens next.
        await until(lambda: value(*consumers) == 0)
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
            await exchange.publish(
                aio_pika.Message(b"{}"), routing_key=ORDER_PLACED.dead_letter_routing_key
            )
            await until(lambda: value(*dead_letters) == 1)
            await until(lambda: (value(age) or 0) > 0)
            await (await channel.get_queue(ORDER_PLACED_DEAD_LETTER_QUEUE)).purge()
        assert value(*failures) == 1
    finally:
        monitor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await monitor
