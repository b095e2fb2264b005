"""Starting and stopping the consumer on purpose: before a drain, and while the database is down.

Both rest on FastStream 0.7.8's ``RabbitSubscriber`` (the project pins that version): its
drain waits for in-flight handlers *before* ``basic.cancel`` and drops, unacknowledged, every
delivery that arrives meanwhile, spending one delivery attempt of each. Cancelling the
consumer first means no delivery arrives while in-flight handlers finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog

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
    broker cancels it, so that is what is checked. Private state of the pinned versions
    (FastStream 0.7.8, aio-pika 10.2.1).
    """
    queue = subscriber._queue_obj  # noqa: SLF001
    tag = subscriber._consumer_tag  # noqa: SLF001
    if queue is None or tag is None or queue.channel.is_closed:
        return False
    underlay = getattr(queue.channel, "_channel", None)
    return underlay is not None and tag in underlay.channel.consumers


class ConsumerWatchdog:
    """Ends the worker when its consumer is gone and does not come back.

    Checks every ``check_seconds``; after ``give_up_seconds`` without a consumer (and not
    paused on purpose) it logs one line and calls ``stop`` so the process exits non-zero and
    the orchestrator starts a fresh one (FastStream issue #2758: consumers not re-created after
    a cluster node left).
    """

    def __init__(
        self,
        subscriber: RabbitSubscriber,
        pause: ConsumerPause,
        stop: Callable[[], None],
        *,
        give_up_seconds: float,
        check_seconds: float = 1.0,
    ) -> None:
        self._subscriber = subscriber
        self._pause = pause
        self._stop = stop
        self._give_up_seconds = give_up_seconds
        self._check_seconds = check_seconds
        self.gave_up = False

    async def run(self) -> None:
        """Watch until cancelled, or until giving up (then ``stop`` is called once)."""
        missing_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._check_seconds)
            if self._pause.paused or consumer_attached(self._subscriber):
                if missing_since is not None:
                    logger.info("consumer.attached_again")
                missing_since = None
                continue
            now = loop.time()
            if missing_since is None:
                missing_since = now
                logger.warning("consumer.missing")
            elif now - missing_since >= self._give_up_seconds:
                logger.error(
                    "consumer.lost",
                    reason=f"no consumer on the queue for {self._give_up_seconds:g} s; exiting",
                )
                self.gave_up = True
                self._stop()
                return


async def cancel_consumer(subscriber: RabbitSubscriber) -> None:
    """Send ``basic.cancel`` for ``subscriber`` now, keeping its channel for in-flight acks.

    Idempotent. Uses private attributes of ``RabbitSubscriber`` (pinned FastStream 0.7.8).
    """
    queue = subscriber._queue_obj  # noqa: SLF001
    tag = subscriber._consumer_tag  # noqa: SLF001
    if queue is not None and tag is not None and not queue.channel.is_closed:
        await queue.cancel(tag)
    subscriber._consumer_tag = None  # noqa: SLF001


class ConsumerPause:
    """Stops consuming while the database is unavailable, and resumes once it answers.

    A delivery whose reservation failed with a transient error past the retry budget goes back
    to the queue (``basic.reject`` with requeue, counted towards the delivery limit on every
    RabbitMQ version), and :meth:`trip` stops this worker taking more: without it, an outage
    longer than the budget would run the whole backlog through its delivery attempts in
    seconds. The database is then checked with back-off (1 s doubling to 15 s) and the
    consumer restarted when it answers. A delivery thus spends one attempt per outage, not one
    per retry.
    """

    def __init__(self, database_ping: Callable[[], Awaitable[None]]) -> None:
        self._subscriber: RabbitSubscriber | None = None
        self._database_ping = database_ping
        self._task: asyncio.Task[None] | None = None

    def attach(self, subscriber: RabbitSubscriber) -> None:
        """The subscriber to pause; set once, right after it is registered."""
        self._subscriber = subscriber

    @property
    def paused(self) -> bool:
        """True from :meth:`trip` until the consumer is attached again."""
        return self._task is not None and not self._task.done()

    def trip(self, reason: str) -> None:
        """Stop consuming (if not already stopped) until the database answers again."""
        if self.paused or self._subscriber is None:
            return
        logger.warning("consumer.paused", reason=reason)
        self._task = asyncio.create_task(self._pause_until_healthy(self._subscriber))

    async def close(self) -> None:
        """Stop waiting for the database (at shutdown); the consumer stays stopped."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _pause_until_healthy(self, subscriber: RabbitSubscriber) -> None:
        await cancel_consumer(subscriber)
        await subscriber.stop()  # waits for the in-flight deliveries to settle
        wait = FIRST_CHECK_SECONDS
        while True:
            await asyncio.sleep(wait)
            try:
                await self._database_ping()
            except Exception as error:  # noqa: BLE001 - any failure means "still down"
                logger.info("consumer.still_paused", reason=f"{type(error).__name__}: {error}")
                wait = min(wait * 2, MAX_CHECK_SECONDS)
                continue
            break
        await subscriber.start()
        logger.info("consumer.resumed")
