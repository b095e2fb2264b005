"""Background tasks of a worker, and the supervisor that keeps them running.

- :func:`poll_queues`: depth and consumers of every subscribed queue and its DLQ
  (``routes.table.SUBSCRIBED_QUEUES``), by a passive declare (cheap: no message is
  touched), and the age of the oldest message of the DLQs.
- :func:`check_invariants`: the stock invariants of ``fulfilment report``.
- :func:`background`: runs every such task (and any later one: the consumer watchdog, a relay,
  a pruner) under :func:`supervise`, so that no task dies silently.

Every replica runs them, so dashboards and alerts combine the queue gauges with ``max()``.
A task does not catch its own errors: any ``Exception`` reaches the supervisor, which counts
``fulfilment_monitor_errors_total{check}``, logs one line, removes the task's gauges (absent,
not stale, while it cannot measure) and starts the task again after a back-off. It never
stops the worker, nor its shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import aio_pika
import structlog
from sqlalchemy import text

from fulfilment.adapters.postgres.outcomes import adjustment_totals, outcome_report
from fulfilment.adapters.rabbitmq.inspection import QueueState, peek_head, queue_state
from fulfilment.backoff import doubling_wait
from fulfilment.contracts.dead_letter import describe_dead_letter
from fulfilment.observability.metrics import INVARIANTS
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection
    from sqlalchemy.ext.asyncio import AsyncEngine

    from fulfilment.observability.metrics import Metrics

logger = structlog.get_logger("fulfilment.monitors")

CONNECT_SECONDS = 5.0
"""How long one poll waits for a broker connection."""

QUEUE_POLL_TIME_LIMIT_SECONDS = 30.0
"""Longest one poll of the queues may take (connecting has :data:`CONNECT_SECONDS`). A poll
that hangs (on a connection that stopped answering and that the heartbeat has not yet
declared dead) then fails like any other, instead of freezing the gauges at their last
values."""

INVARIANT_CHECK_TIME_LIMIT_SECONDS = 60.0
"""Longest one invariant check may take: its statement timeout (30 s) and a margin for
waiting for a pooled connection and opening it."""

FIRST_RESTART_SECONDS = 1.0
"""Wait before starting a failed task again; doubled after each failure in a row."""

MAX_RESTART_SECONDS = 60.0
"""Longest wait before starting a failed task again. A run that lasted at least this long
counts as a recovery: the next failure waits :data:`FIRST_RESTART_SECONDS` again."""

STOP_SECONDS = 2.0
"""Longest time the shutdown waits for the background tasks to end once cancelled; it comes
out of the orchestrator's grace period, before the drain."""

CANCEL_AGAIN_SECONDS = 0.1
"""Wait between two cancellations of a background task at shutdown. aiormq 7.2 sometimes
swallows a cancellation that lands in the middle of an RPC and then waits for a reply that
never comes; a second cancellation ends it (seen for about one poll in five cancelled in
flight, ended within 0.4 s)."""

DEAD_LETTER_HEAD_REFRESH_SECONDS = 3600.0
"""Longest time between two reads of the DLQ's head when its depth does not fall.

The head is read only when it may have changed (the DLQ was empty, or shrank) and at most this
often otherwise, because each read counts as a delivery of that message on RabbitMQ 3.10 to
4.2: at one read an hour per replica, the DLQ's limit of 1,000,000 deliveries is decades away.
"""

INVARIANT_STATEMENT_TIMEOUT = "30s"
"""``statement_timeout`` of the invariant check, above the worker's few seconds: it reads
whole tables, and must not be cancelled on a large database."""


@dataclasses.dataclass(frozen=True, slots=True)
class BackgroundTask:
    """A task that runs beside the worker from the broker's start until shutdown.

    Attributes:
        check: its name, the ``check`` label of ``fulfilment_monitor_errors_total`` and of its
            log lines; one of ``observability.metrics.MONITOR_CHECKS``.
        run: the task. It returns only when its work is over for good (the consumer watchdog
            once it gave up); an exception it raises is a failure (see :func:`supervise`).
        forget: removes the gauges the task sets, called after each failure, so that they are
            absent until the task measures again (a stale value would hide the outage).
    """

    check: str
    run: Callable[[], Coroutine[Any, Any, None]]
    forget: Callable[[], None] = lambda: None


@dataclasses.dataclass
class _DeadLetterHead:
    depth: int = 0
    read_at: float = float("-inf")
    dead_lettered_at: float | None = None
    """When the DLQ's head was dead-lettered (Unix seconds); None while the DLQ is empty."""


def queue_monitor(amqp_url: str, metrics: Metrics, *, interval_seconds: float) -> BackgroundTask:
    """:func:`poll_queues` as the background task ``queues``; it forgets the queue gauges."""
    return BackgroundTask(
        "queues",
        lambda: poll_queues(amqp_url, metrics, interval_seconds=interval_seconds),
        forget=metrics.forget_queues,
    )


async def poll_queues(amqp_url: str, metrics: Metrics, *, interval_seconds: float) -> None:
    """Poll the queues every ``interval_seconds`` on a connection of its own, until cancelled.

    Sets ``fulfilment_queue_messages_ready{queue}``, ``fulfilment_queue_consumers{queue}`` and
    the oldest age of the DLQs. Each poll has :data:`QUEUE_POLL_TIME_LIMIT_SECONDS`. Raises
    whatever a poll failed with (``OSError``, ``TimeoutError``, AMQP errors, aiormq's
    ``RuntimeError`` on a connection the broker closed, ...), after closing its connection: its
    supervisor removes the queue series of every queue (a stale "1 consumer" would hide an
    outage) and starts it again.
    """
    heads = {name: _DeadLetterHead() for name in DEAD_LETTER_QUEUES}
    connection = await aio_pika.connect(amqp_url, timeout=CONNECT_SECONDS)
    try:
        while True:
            async with asyncio.timeout(QUEUE_POLL_TIME_LIMIT_SECONDS):
                await poll_once(connection, metrics, heads)
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
    if message is None:  # taken meanwhile (a replay, a purge): look again at the next poll
        head.depth = 0
        return
    moment = (
        describe_dead_letter(message.headers, message.body).dead_lettered_at or message.timestamp
    )
    head.dead_lettered_at = moment.timestamp() if moment else time.time()


async def _closed(connection: AbstractConnection) -> None:
    if not connection.is_closed:
        # Closing a connection the broker already dropped may fail in many ways (aiormq
        # raises RuntimeError, for one); the failure that brought us here is the one to report.
        with contextlib.suppress(Exception):
            await connection.close()


def invariant_monitor(
    engine: AsyncEngine, metrics: Metrics, *, interval_seconds: float
) -> BackgroundTask:
    """:func:`check_invariants` as the background task ``invariants``; it forgets its gauges."""
    return BackgroundTask(
        "invariants",
        lambda: check_invariants(engine, metrics, interval_seconds=interval_seconds),
        forget=metrics.forget_invariants,
    )


async def check_invariants(
    engine: AsyncEngine, metrics: Metrics, *, interval_seconds: float
) -> None:
    """Check the stock invariants every ``interval_seconds`` until cancelled.

    Sets ``fulfilment_stock_invariant_violations{invariant}``, and
    ``fulfilment_stock_short_skus`` and ``fulfilment_stock_short_units`` (the shortage rule:
    short after a reported loss, not a violation), and the adjustments recorded by source
    and reason (``observability.metrics.RecordedAdjustments``: the only counters of an
    operator's ``stock adjust``), from one REPEATABLE READ snapshot
    (``fulfilment.adapters.postgres.outcomes``). Each check has
    :data:`INVARIANT_CHECK_TIME_LIMIT_SECONDS`; raises whatever a check failed with, for its
    supervisor to count, remove the gauges and start it again.
    """
    while True:
        async with asyncio.timeout(INVARIANT_CHECK_TIME_LIMIT_SECONDS):
            async with engine.connect() as connection:
                snapshot = await connection.execution_options(isolation_level="REPEATABLE READ")
                async with snapshot.begin():
                    await snapshot.execute(
                        text(f"SET LOCAL statement_timeout = '{INVARIANT_STATEMENT_TIMEOUT}'")
                    )
                    report = await outcome_report(snapshot)
                    adjustments = await adjustment_totals(snapshot)
        checks = report.invariants
        counts = {
            "stock_out_of_bounds": checks.stock_out_of_bounds,
            "reserved_mismatches": checks.reserved_mismatches,
            "inbox_unaccounted": abs(checks.inbox_unaccounted),
            "orphan_lines": checks.orphan_lines,
            "shipped_mismatches": checks.shipped_mismatches,
        }
        for invariant in INVARIANTS:
            metrics.stock_invariant_violations.labels(invariant).set(counts[invariant])
        metrics.stock_short_skus.measured(report.shortage.skus)
        metrics.stock_short_units.measured(report.shortage.units)
        metrics.adjustments_recorded.measured(
            {
                (totals.source, totals.reason): (
                    totals.adjustments,
                    totals.units_in,
                    totals.units_out,
                )
                for totals in adjustments
            }
        )
        if not checks.ok:
            logger.error("monitor.invariants_broken", **dataclasses.asdict(checks))
        await asyncio.sleep(interval_seconds)


async def supervise(task: BackgroundTask, metrics: Metrics) -> None:
    """Run ``task`` until it returns, or until cancelled, surviving any ``Exception``.

    After each failure: ``fulfilment_monitor_errors_total{check}`` goes up by one, one
    warning line ``monitor.failed`` names the check, the error and the wait, ``task.forget``
    removes the task's gauges, and ``task.run`` starts again after
    :data:`FIRST_RESTART_SECONDS`, doubled for each failure in a row up to
    :data:`MAX_RESTART_SECONDS`. That is a plain loop rather than tenacity: a task is not
    one call retried until it succeeds but a loop that must be restarted whatever stopped it
    (its waits are ``fulfilment.backoff``'s),
    and which errors it may fail with is exactly what cannot be listed (a ``RuntimeError``
    from aiormq's ``channel()`` on a closed connection once killed the queue monitor for
    good). ``CancelledError`` (shutdown) is not an ``Exception`` and ends it.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None  # noqa: S101 - a coroutine awaited by a task
    failures = 0  # in a row
    while True:
        started = loop.time()
        try:
            await task.run()
        except Exception as error:  # a supervisor outlives any failure of its task
            if current.cancelling():
                # Shutdown began and the task's clean-up failed: restarting it now would keep
                # the worker from stopping. The stop hook logs the error.
                raise
            if loop.time() - started >= MAX_RESTART_SECONDS:
                failures = 0  # it ran well for a while: a new failure
            wait = doubling_wait(failures, first=FIRST_RESTART_SECONDS, cap=MAX_RESTART_SECONDS)
            failures += 1
            metrics.monitor_errors.labels(task.check).inc()
            task.forget()
            logger.warning(
                "monitor.failed",
                check=task.check,
                error=_describe(error),
                restart_in_seconds=wait,
            )
            await asyncio.sleep(wait)
        else:
            return


def background(
    tasks: Sequence[BackgroundTask], metrics: Metrics
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """Start and stop hooks running each of ``tasks`` under :func:`supervise`.

    Returns ``(start, stop)``: ``start`` creates one asyncio task per background task;
    ``stop`` cancels them (again every :data:`CANCEL_AGAIN_SECONDS`) and waits until they end,
    for :data:`STOP_SECONDS` at most. ``stop`` never raises: it runs as a shutdown hook, and a
    hook that raises makes FastStream skip the rest of the shutdown (the consumer's cancel and
    the drain) and the worker exit 1.
    """
    running: dict[asyncio.Task[None], BackgroundTask] = {}

    async def start() -> None:
        running.update((asyncio.create_task(supervise(task, metrics)), task) for task in tasks)

    async def stop() -> None:
        ended = await asyncio.gather(*(_cancel(supervisor) for supervisor in running))
        for (supervisor, task), done in zip(running.items(), ended, strict=True):
            if not done:
                logger.error("monitor.stop_timed_out", check=task.check, seconds=STOP_SECONDS)
                continue
            error = None if supervisor.cancelled() else supervisor.exception()
            if error is not None:
                logger.error("monitor.stop_failed", check=task.check, error=_describe(error))
        running.clear()

    return start, stop


async def _cancel(task: asyncio.Task[None]) -> bool:
    """Cancel ``task`` until it ends, for :data:`STOP_SECONDS` at most; whether it ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_SECONDS
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait([task], timeout=min(CANCEL_AGAIN_SECONDS, deadline - loop.time()))
    return task.done()


def _describe(error: BaseException) -> str:
    """``Type: message`` on one line, or the type alone when the message is empty."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
