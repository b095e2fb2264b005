"""Helpers of the cluster suite: a steady publisher, the faults' waits, and recovery times.

Load is a publisher sending orders at a steady rate, with publisher confirms, while three
workers consume them through the cluster's one address. Recovery is read afterwards from the
workers' own log lines (one ``order_placed.handled`` line per delivery, with its time): the
longest stretch after the fault began in which no delivery was handled, by the service as a
whole and by each worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import aio_pika
import aiormq.exceptions

from fulfilment.contracts.topology import (
    ORDER_PLACED_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from tests.cluster.rabbit_cluster import ClusterError, Node, RabbitCluster
from tests.e2e.harness import WorkerProcess
from tests.faults.faultlib import Cluster, Order

HANDLED = "order_placed.handled"
"""The log line each worker writes for a handled delivery (``worker.delivery``)."""


@dataclass
class SteadyPublisher:
    """Publishes ``orders`` in turn at ``rate`` per second until :meth:`stop`, each confirmed.

    The publisher stands for the checkout service: it connects to the nodes directly, moves
    to the next node when one fails, and sends an unconfirmed order again (the same event, so
    at least once). :attr:`published` are the orders confirmed, in order; an order is never
    left half-sent when it stops.
    """

    urls: list[str]
    orders: list[Order]
    rate: float = 100.0
    published: list[Order] = field(default_factory=list)
    retries: int = 0
    longest_wait: float = 0.0
    """Longest time between two confirms while running, in seconds."""
    _stopping: bool = False
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[Order]:
        """Stop after the order in flight is confirmed; return the orders published."""
        self._stopping = True
        assert self._task is not None
        await self._task
        return self.published

    async def _run(self) -> None:
        url = 0
        connection: aio_pika.abc.AbstractConnection | None = None
        exchange: aio_pika.abc.AbstractExchange | None = None
        last = time.monotonic()
        for order in self.orders:
            if self._stopping:
                break
            event = order.event()
            while True:
                try:
                    if connection is None or connection.is_closed or exchange is None:
                        connection = await aio_pika.connect(self.urls[url], timeout=3)
                        channel = await connection.channel(
                            publisher_confirms=True, on_return_raises=True
                        )
                        exchange = await channel.get_exchange(ORDERS_EXCHANGE)
                    await exchange.publish(
                        aio_pika.Message(
                            event.body,
                            message_id=event.message_id,
                            content_type="application/json",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=ORDER_PLACED_ROUTING_KEY,
                        mandatory=True,
                        timeout=10,
                    )
                    break
                except (
                    OSError,
                    TimeoutError,
                    aio_pika.exceptions.AMQPError,
                    aiormq.exceptions.ChannelInvalidStateError,  # a RuntimeError, not an AMQPError
                ):
                    self.retries += 1
                    if connection is not None:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(connection.close(), 2)
                    connection = exchange = None
                    url = (url + 1) % len(self.urls)
                    await asyncio.sleep(0.1)
            now = time.monotonic()
            self.longest_wait = max(self.longest_wait, now - last)
            last = now
            self.published.append(order)
            await asyncio.sleep(max(0.0, 1 / self.rate - (time.monotonic() - now)))
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


def handled_times(path: Path) -> list[float]:
    """Times (epoch seconds) of the handled deliveries in one worker's log file."""
    return sorted(
        datetime.fromisoformat(str(line["timestamp"])).timestamp()
        for line in WorkerProcess({}, path).log_lines()
        if line.get("event") == HANDLED
    )


def longest_pause(times: list[float], start: float, end: float) -> float:
    """The longest stretch of ``[start, end]`` without one of ``times``, in seconds."""
    points = [start, *(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(points))


@dataclass(frozen=True)
class Recovery:
    """How long consumption paused after a fault began, in seconds."""

    service: float
    """Longest stretch in which no worker handled a delivery."""
    slowest_worker: float
    """Longest stretch in which one worker handled none (the worst of the three)."""


def recovery(workers: Cluster, start: float, end: float) -> Recovery:
    """The pauses in consumption of ``workers`` between ``start`` and ``end`` (epoch seconds)."""
    per_worker = [handled_times(worker.log_path) for worker in workers.workers]
    merged = sorted(t for times in per_worker for t in times)
    return Recovery(
        service=longest_pause(merged, start, end),
        slowest_worker=max(longest_pause(times, start, end) for times in per_worker),
    )


def handled_since(workers: Cluster, moment: float) -> bool:
    """Whether every worker has handled a delivery after ``moment`` (epoch seconds)."""
    return all(
        any(t > moment for t in handled_times(worker.log_path)) for worker in workers.alive()
    )


@dataclass
class Watch:
    """Restarts workers that die while a fault runs (counted), as an orchestrator would."""

    workers: Cluster
    restarts: int = 0
    consumers_hit: int = 0
    """Consumers (one per worker) whose connection was on a node the fault struck."""

    def tick(self) -> None:
        self.restarts += self.workers.restart_dead()

    async def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tick()
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    async def until_recovered(
        self, moment: float, *, at_least: float = 3, most: float = 60
    ) -> None:
        """Keep the load on until every worker handled a delivery after ``moment`` (and
        ``at_least`` seconds passed), or ``most`` seconds passed."""
        deadline = time.monotonic() + most
        await self.sleep(at_least)
        while time.monotonic() < deadline and not handled_since(self.workers, moment):
            await self.sleep(0.5)


async def ctl(cluster: RabbitCluster, what: str, node: Node, *args: str) -> str:
    """A control command in a thread, so the load goes on meanwhile."""
    command = {"ctl": cluster.ctl, "upgrade": cluster.upgrade}[what]
    return await asyncio.to_thread(command, node, *args)


async def all_members_online(cluster: RabbitCluster, watch: Watch, timeout: float = 90) -> None:
    """Wait until every member of the main queue runs again and it has a leader."""
    deadline = time.monotonic() + timeout
    info: dict[str, object] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(ClusterError):
            info = await asyncio.to_thread(cluster.queue_info, ORDER_PLACED_QUEUE)
            members = info.get("members") or []
            online = info.get("online") or []
            if len(members) == len(cluster.nodes) and sorted(online) == sorted(members):  # type: ignore[arg-type]
                return
        await watch.sleep(0.5)
    msg = f"the main queue's members did not all come back within {timeout:g} s: {info}"
    raise AssertionError(msg)
