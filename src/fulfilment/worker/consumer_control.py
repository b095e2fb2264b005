"""Starting and stopping the consumers on purpose: before a drain, and while the database is down.

Both rest on FastStream 0.7.8's ``RabbitSubscriber`` (the project pins that version): its
drain waits for in-flight handlers *before* ``basic.cancel`` and drops, unacknowledged, every
delivery that arrives meanwhile, spending one delivery attempt of each. Cancelling the
consumers first means no delivery arrives while in-flight handlers finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from fulfilment.backoff import doubling_wait
from fulfilment.worker.faststream_internals import (
    broker_consumer_tags,
    consumed_queue,
    consumer_tag,
    forget_consumer_tag,
)

if TYPE_CHECKING:
    from faststream.rabbit.subscriber import RabbitSubscriber

logger = structlog.get_logger("fulfilment.consumer")

FIRST_CHECK_SECONDS = 1.0
"""Wait before the first look at a database that failed; doubled after each failed look."""
MAX_CHECK_SECONDS = 15.0
"""Longest wait between two looks at a database that keeps failing."""


def consumer_attached(subscriber: RabbitSubscriber) -> bool:
    """Whether the broker still delivers to ``subscriber``'s consumer.

    A consumer tag alone is not enough: the broker cancels consumers by itself (the queue was
    deleted, a node holding it left) and a reconnect may not restore channels (aio-pika #563),
    while FastStream keeps the tag. aiormq drops a tag from its channel's consumers when the
    broker cancels it, so that is what is checked (``worker.faststream_internals``).
    """
    queue = consumed_queue(subscriber)
    tag = consumer_tag(subscriber)
    if queue is None or tag is None or queue.channel.is_closed:
        return False
    return tag in broker_consumer_tags(queue.channel)


class ConsumerWatchdog:
    """Ends the worker when one of its consumers is gone and does not come back.

    Checks every ``check_seconds`` that each subscriber's consumer is attached; after
    ``give_up_seconds`` without one of them (and not paused on purpose) it logs one line and
    calls ``stop`` so the process exits non-zero and the orchestrator starts a fresh one
    (FastStream issue #2758: consumers not re-created after a cluster node left).
    """

    def __init__(
        self,
        subscribers: Sequence[RabbitSubscriber],
        pause: ConsumerPause,
        stop: Callable[[], None],
        *,
        give_up_seconds: float,
        check_seconds: float = 1.0,
    ) -> None:
        self._subscribers = tuple(subscribers)
        self._pause = pause
        self._stop = stop
        self._give_up_seconds = give_up_seconds
        self._check_seconds = check_seconds
        self.gave_up = False

    async def run(self) -> None:
        """Watch until cancelled, or until giving up (then ``stop`` is called once)."""
        missing_since: dict[str, float] = {}  # by queue name
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._check_seconds)
            paused = self._pause.paused
            for subscriber in self._subscribers:
                queue = subscriber.queue.name
                if paused or consumer_attached(subscriber):
                    if missing_since.pop(queue, None) is not None:
                        logger.info("consumer.attached_again", queue=queue)
                    continue
                now = loop.time()
                since = missing_since.get(queue)
                if since is None:
                    missing_since[queue] = now
                    logger.warning("consumer.missing", queue=queue)
                elif now - since >= self._give_up_seconds:
                    logger.error(
                        "consumer.lost",
                        queue=queue,
                        reason=f"no consumer on the queue for {self._give_up_seconds:g} s; exiting",
                    )
                    self.gave_up = True
                    self._stop()
                    return


async def cancel_consumer(subscriber: RabbitSubscriber) -> None:
    """Send ``basic.cancel`` for ``subscriber`` now, keeping its channel for in-flight acks.

    Idempotent. Uses private attributes of ``RabbitSubscriber`` (``worker.faststream_internals``).
    """
    queue = consumed_queue(subscriber)
    tag = consumer_tag(subscriber)
    if queue is not None and tag is not None and not queue.channel.is_closed:
        await queue.cancel(tag)
    forget_consumer_tag(subscriber)


class ConsumerPause:
    """Stops consuming while the database is unavailable, and resumes once it answers.

    A delivery whose handler failed with a transient error past the retry budget goes back to
    the queue (``basic.reject`` with requeue, counted towards the delivery limit on every
    RabbitMQ version), and :meth:`trip` stops this worker taking more, on every subscriber,
    since all of them need the database: without it, an outage longer than the budget would
    run the whole backlog through its delivery attempts in seconds. The database is then
    checked with back-off (1 s doubling to 15 s) and every consumer restarted when it answers.
    A delivery thus spends one attempt per outage, not one per retry.
    """

    def __init__(self, database_ping: Callable[[], Awaitable[None]]) -> None:
        self._subscribers: tuple[RabbitSubscriber, ...] = ()
        self._database_ping = database_ping
        self._task: asyncio.Task[None] | None = None

    def attach(self, subscribers: Sequence[RabbitSubscriber]) -> None:
        """The subscribers to pause; set once, right after they are registered."""
        self._subscribers = tuple(subscribers)

    @property
    def paused(self) -> bool:
        """True from :meth:`trip` until the consumers are attached again."""
        return self._task is not None and not self._task.done()

    def trip(self, reason: str) -> None:
        """Stop consuming (if not already stopped) until the database answers again."""
        if self.paused or not self._subscribers:
            return
        logger.warning("consumer.paused", reason=reason)
        self._task = asyncio.create_task(self._pause_until_healthy(self._subscribers))

    async def close(self) -> None:
        """Stop waiting for the database (at shutdown); the consumers stay stopped."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _pause_until_healthy(self, subscribers: Sequence[RabbitSubscriber]) -> None:
        # Every consumer is cancelled before any drain begins, so no queue takes new
        # deliveries while another one's in-flight deliveries settle.
        for subscriber in subscribers:
            await cancel_consumer(subscriber)
        for subscriber in subscribers:
            await subscriber.stop()  # waits for its in-flight deliveries to settle
        # Not tenacity's AsyncRetrying: the first look at the database comes after a wait,
        # not at once (fulfilment.backoff).
        checks = 0
        while True:
            await asyncio.sleep(
                doubling_wait(checks, first=FIRST_CHECK_SECONDS, cap=MAX_CHECK_SECONDS)
            )
            checks += 1
            try:
                await self._database_ping()
            except Exception as error:  # noqa: BLE001 - any failure means "still down"
                logger.info("consumer.still_paused", reason=f"{type(error).__name__}: {error}")
                continue
            break
        for subscriber in subscribers:
            await subscriber.start()
        logger.info("consumer.resumed")
