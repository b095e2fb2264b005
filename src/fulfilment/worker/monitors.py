"""Background checks of a worker that keep the broker and database gauges current.

- :func:`poll_queues`: depth and consumers of every subscribed queue and its DLQ
  (``contracts.topology.SUBSCRIBED_QUEUES``), by a passive declare (cheap: no message is
  touched), and the age of the oldest message of the DLQs.
- :func:`check_invariants`: the stock invariants of ``fulfilment report``.

Every replica runs them, so dashboards and alerts combine the queue gauges with ``max()``. A
failed check counts ``fulfilment_monitor_errors_total{check}`` and is tried again at the next
interval; it never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq.exceptions
import structlog
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.rabbitmq import QueueState, peek_head, queue_state
from fulfilment.contracts.dead_letter import describe_dead_letter
from fulfilment.contracts.topology import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection
    from sqlalchemy.ext.asyncio import AsyncEngine

    from fulfilment.observability.metrics import Metrics

logger = structlog.get_logger("fulfilment.monitors")

CONNECT_SECONDS = 5.0
"""How long one poll waits for a broker connection."""

DEAD_LETTER_HEAD_REFRESH_SECONDS = 3600.0
"""Longest time between two reads of the DLQ's head when its depth does not fall.

The head is read only when it may have changed (the DLQ was empty, or shrank) and at most this
often otherwise, because each read counts as a delivery of that message on RabbitMQ 3.10 to
4.2: at one read an hour per replica, the DLQ's limit of 1,000,000 deliveries is decades away.
"""

INVARIANT_STATEMENT_TIMEOUT = "30s"
"""``statement_timeout`` of the invariant check, above the worker's few seconds: it reads
whole tables, and must not be cancelled on a large database."""

QUEUE_ERRORS = (OSError, TimeoutError, aiormq.exceptions.AMQPError)
"""What a broker poll may fail with; anything else is a bug and is raised."""


@dataclasses.dataclass
class _DeadLetterHead:
    depth: int = 0
    read_at: float = float("-inf")
    dead_lettered_at: float | None = None
    """When the DLQ's head was dead-lettered (Unix seconds); None while the DLQ is empty."""


async def poll_queues(amqp_url: str, metrics: Metrics, *, interval_seconds: float) -> None:
    """Poll the queues every ``interval_seconds`` until cancelled.

    Sets ``fulfilment_queue_messages_ready{queue}``, ``fulfilment_queue_consumers{queue}`` and
    the oldest age of the DLQs. While the broker cannot be reached the queue series are removed
    (a stale "1 consumer" would hide an outage) and the alert on absent series takes over.
    """
    heads = {name: _DeadLetterHead() for name in DEAD_LETTER_QUEUES}
    connection: AbstractConnection | None = None
    try:
        while True:
            try:
                if connection is None or connection.is_closed:
                    connection = await aio_pika.connect(amqp_url, timeout=CONNECT_SECONDS)
                await poll_once(connection, metrics, heads)
            except QUEUE_ERRORS as error:
                metrics.monitor_errors.labels("queues").inc()
                metrics.queue_ready.clear()
                metrics.queue_consumers.clear()
                logger.warning("monitor.queues_failed", error=f"{type(error).__name__}: {error}")
                await _closed(connection)
                connection = None
            await asyncio.sleep(interval_seconds)
    finally:
        await _closed(connection)


async def poll_once(
    connection: AbstractConnection, metrics: Metrics, heads: dict[str, _DeadLetterHead]
) -> None:
    """One poll of every queue (see :func:`poll_queues`); a missing queue counts as empty.

    ``heads`` holds what is known of each DLQ's head; the age gauge is the oldest of them.
    """
    for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
        state = await queue_state(connection, name) or QueueState(name, ready=0, consumers=0)
        metrics.queue_ready.labels(name).set(state.ready)
        metrics.queue_consumers.labels(name).set(state.consumers)
        if name in heads:
            await _refresh_dead_letter_head(connection, heads[name], name, state.ready)
    oldest = [head.dead_lettered_at for head in heads.values() if head.dead_lettered_at]
    metrics.set_oldest_dead_letter(min(oldest, default=None))


async def _refresh_dead_letter_head(
    connection: AbstractConnection, head: _DeadLetterHead, queue: str, depth: int
) -> None:
    previous, head.depth = head.depth, depth
    if depth == 0:
        head.dead_lettered_at = None
        return
    now = time.monotonic()
    if (
        previous != 0
        and depth >= previous
        and now - head.read_at < DEAD_LETTER_HEAD_REFRESH_SECONDS
    ):
        return
    message = await peek_head(connection, queue)
    head.read_at = now
    if message is None:
        return
    moment = (
        describe_dead_letter(message.headers, message.body).dead_lettered_at or message.timestamp
    )
    head.dead_lettered_at = moment.timestamp() if moment else time.time()


async def _closed(connection: AbstractConnection | None) -> None:
    if connection is not None and not connection.is_closed:
        with contextlib.suppress(*QUEUE_ERRORS):
            await connection.close()


async def check_invariants(
    engine: AsyncEngine, metrics: Metrics, *, interval_seconds: float
) -> None:
    """Check the stock invariants every ``interval_seconds`` until cancelled.

    Sets ``fulfilment_stock_invariant_violations{invariant}`` from one REPEATABLE READ
    snapshot (``fulfilment.adapters.postgres.outcomes``); a failed check keeps the last
    values and counts a monitor error.
    """
    while True:
        try:
            async with engine.connect() as connection:
                snapshot = await connection.execution_options(isolation_level="REPEATABLE READ")
                async with snapshot.begin():
                    await snapshot.execute(
                        text(f"SET LOCAL statement_timeout = '{INVARIANT_STATEMENT_TIMEOUT}'")
                    )
                    report = await outcome_report(snapshot)
        except (OSError, TimeoutError, DBAPIError, SQLAlchemyError) as error:
            metrics.monitor_errors.labels("invariants").inc()
            logger.warning("monitor.invariants_failed", error=f"{type(error).__name__}: {error}")
        else:
            checks = report.invariants
            violations = metrics.stock_invariant_violations
            violations.labels("stock_out_of_bounds").set(checks.stock_out_of_bounds)
            violations.labels("reserved_mismatches").set(checks.reserved_mismatches)
            violations.labels("inbox_unaccounted").set(abs(checks.inbox_unaccounted))
            violations.labels("orphan_lines").set(checks.orphan_lines)
            if not checks.ok:
                logger.error("monitor.invariants_broken", **dataclasses.asdict(checks))
        await asyncio.sleep(interval_seconds)


def background(
    *checks: Callable[[], Coroutine[Any, Any, None]],
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """Start and stop hooks running ``checks`` as tasks beside the worker.

    Returns ``(start, stop)``: ``start`` creates one task per check; ``stop`` cancels them and
    waits until they end.
    """
    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        tasks.extend(asyncio.create_task(check()) for check in checks)

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tasks.clear()

    return start, stop
