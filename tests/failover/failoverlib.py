"""Helpers of the failover suite: the load, the reconnecting look at the primary, the timings.

The load is a plan of the lifecycle suite (``test_lifecycle_faults.lifecycle_plan``: orders on
hot SKUs, cancels, shipments), published wave after wave while the servers change places. A
shipment waits until its order is processed, as a warehouse ships only what was reserved:
one that overtook its order would be dead-lettered ``order_not_reserved``, which is the
lifecycle suite's subject, not this one's.

Timings are read from the workers' own log lines (one ``<event>.handled`` line per delivery,
written once its transaction committed, with its time): the first after the fault is the first
commit on the new primary as a worker sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

import aio_pika
import asyncpg
from faultlib import Cluster
from harness import WorkerProcess
from postgres_pair import connect_primary
from test_lifecycle_faults import Event, LifecyclePlan, publish_plan_events

from fulfilment.contracts.topology import ORDER_SHIPPED
from fulfilment.routes.table import SUBSCRIBED_QUEUES

HANDLED = tuple(f"{queue.event}.handled" for queue in SUBSCRIBED_QUEUES)
"""The log line of a handled (committed, then acknowledged) delivery, per queue."""


class Primary:
    """A plain asyncpg connection to whichever server is primary, opened again when lost.

    The load and the test ask at once: one statement at a time (a lock), so neither sends on
    the connection while the other waits for its answer, nor replaces it unclosed.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    async def fetchval(self, statement: str, *args: object) -> object:
        """One value, retried on a new connection for up to 60 s while the servers move."""
        async with self._lock:
            return await self._fetchval(statement, *args)

    async def _fetchval(self, statement: str, *args: object) -> object:
        deadline = time.monotonic() + 60
        while True:
            try:
                if self._connection is None or self._connection.is_closed():
                    self._connection = await connect_primary(self.url)
                return await self._connection.fetchval(statement, *args)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await self.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def connection(self) -> asyncpg.Connection:
        """The current connection (a new one if lost), for the checks after the run."""
        await self.fetchval("SELECT 1")
        assert self._connection is not None
        return self._connection

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.terminate()
            self._connection = None


async def processed(primary: Primary) -> int:
    """Events the inbox of the primary has recorded."""
    return int(str(await primary.fetchval("SELECT count(*) FROM inbox_messages")))


HOLD_SECONDS = 60.0
"""How long after the last wave a shipment waits for its order at most."""


@dataclass
class Load:
    """Publishes a plan's waves, one every ``interval`` seconds, shipments held back until
    their order is in the inbox; :meth:`done` waits until every event is published, or, after
    :meth:`stop`, every event of the waves published so far (:meth:`as_published`)."""

    plan: LifecyclePlan
    broker: aio_pika.abc.AbstractConnection
    primary: Primary
    interval: float = 0.25
    published: int = 0
    _held: list[Event] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _published_ids: set[uuid.UUID] = field(default_factory=set)
    _stopping: bool = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        """Publish no further wave; the shipments held back still go out."""
        self._stopping = True

    @property
    def publishing(self) -> bool:
        """Whether waves are still being published (not stopped, the plan not run out)."""
        return self._task is not None and not self._task.done() and not self._stopping

    async def cancel(self) -> None:
        """End the publishing at once (a test that failed half-way)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def done(self, timeout: float = 300) -> None:
        assert self._task is not None
        await asyncio.wait_for(self._task, timeout)

    def as_published(self) -> LifecyclePlan:
        """The plan cut down to the events published (after :meth:`done`). Every arrival order
        of an order's events leaves the same state (no order is both cancelled and shipped), so
        the in-order sequence of the published ones is what the service must have applied: an
        order whose cancels were never published stays reserved, an early cancel of an order
        never published stays the tombstone it left."""
        sent = self._published_ids
        return LifecyclePlan(
            in_order=[event for event in self.plan.in_order if event.event_id in sent],
            early=[event for event in self.plan.early if event.event_id in sent],
            waves=[
                kept
                for wave in self.plan.waves
                if (kept := [event for event in wave if event.event_id in sent])
            ],
        )

    async def _run(self) -> None:
        await self._publish(self.plan.early)
        for wave in self.plan.waves:
            if self._stopping:
                break
            await self._publish([event for event in wave if event.queue is not ORDER_SHIPPED])
            self._held += [event for event in wave if event.queue is ORDER_SHIPPED]
            await self._release_shipments()
            await asyncio.sleep(self.interval)
        deadline = time.monotonic() + HOLD_SECONDS
        while self._held and time.monotonic() < deadline:
            await self._release_shipments()
            await asyncio.sleep(self.interval)
        # An order lost by an asynchronous failover never arrives: its shipment goes anyway.
        await self._publish(self._held)
        self._held = []

    async def _publish(self, events: list[Event]) -> None:
        await publish_plan_events(self.broker, events)
        self.published += len(events)
        self._published_ids.update(event.event_id for event in events)

    async def _release_shipments(self) -> None:
        if not self._held:
            return
        placed = {e.order_id: e.event_id for e in self.plan.in_order if e.lines is not None}
        wanted = [placed[event.order_id] for event in self._held]
        done = await self.primary.fetchval(
            "SELECT array_agg(event_id::text) FROM inbox_messages WHERE event_id = ANY($1::uuid[])",
            wanted,
        )
        processed_orders = set(done) if isinstance(done, list) else set()
        ready = [event for event in self._held if str(placed[event.order_id]) in processed_orders]
        self._held = [event for event in self._held if event not in ready]
        await self._publish(ready)


def handled_lines(workers: Cluster) -> list[tuple[float, str]]:
    """(epoch seconds, event id) of every handled delivery of every worker, in time order."""
    lines = []
    for worker in workers.workers:
        for line in WorkerProcess({}, worker.log_path).log_lines():
            if line.get("event") in HANDLED:
                when = datetime.fromisoformat(str(line["timestamp"])).timestamp()
                lines.append((when, str(line["event_id"])))
    return sorted(lines)


@dataclass(frozen=True)
class Timings:
    """How processing went around the fault (epoch seconds in, seconds and rates out)."""

    recover_seconds: float
    """From the fault to the first delivery handled after the promotion: the first commit on
    the new primary, as a worker sees it."""
    longest_pause_seconds: float
    """Longest stretch after the fault with no delivery handled."""
    rate_before: float
    """Deliveries handled per second in the 10 s before the fault."""
    rate_during: float
    """Per second from the fault to 10 s after the first commit after it."""
    rate_after: float
    """Per second in the 10 s that followed that (the backlog draining)."""


WINDOW_SECONDS = 10.0


def timings(workers: Cluster, fault: float, promoted: float, end: float) -> Timings:
    """The :class:`Timings` of ``workers`` around ``fault`` (epoch seconds), whose new primary
    serves from ``promoted``, up to ``end``."""
    times = [when for when, _ in handled_lines(workers)]
    after = [t for t in times if t > fault]
    first = next((t for t in after if t > promoted), end)
    points = [fault, *(t for t in after if t < end), end]
    pause = max(b - a for a, b in itertools.pairwise(points))

    def rate(start: float, stop: float) -> float:
        span = max(stop - start, 1e-9)
        return round(sum(start <= t < stop for t in times) / span, 1)

    recovered = first + WINDOW_SECONDS
    return Timings(
        recover_seconds=round(first - fault, 2),
        longest_pause_seconds=round(pause, 2),
        rate_before=rate(fault - WINDOW_SECONDS, fault),
        rate_during=rate(fault, recovered),
        rate_after=rate(recovered, recovered + WINDOW_SECONDS),
    )


def acknowledged(workers: Cluster) -> set[uuid.UUID]:
    """Event ids of every delivery a worker handled (and so acknowledged)."""
    return {uuid.UUID(event_id) for _, event_id in handled_lines(workers)}
