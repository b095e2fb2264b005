"""Walking a RabbitMQ queue page by page: every message it holds now, each kept or removed.

For DLQs deeper than one look can hold (``inspection.PEEK_LIMIT``); ``fulfilment dlq`` lists,
replays and purges through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import aio_pika
import aiormq.exceptions

from fulfilment.adapters.rabbitmq.inspection import queue_state
from fulfilment.adapters.rabbitmq.publishing import publish_confirmed, resent
from fulfilment.contracts.dead_letter import DEAD_LETTER_TTL_SECONDS, describe_dead_letter
from fulfilment.routes.table import route_to

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

WALK_IDLE_SECONDS = 5.0
"""How long a walk waits for a message the queue's depth promised before it looks whether the
queue still has messages ready (a slow broker) or none (another reader took them)."""

WALK_IDLE_WAITS = 6
"""Waits of ``WALK_IDLE_SECONDS`` a walk makes for one message while the queue has some ready."""


class WalkInProgressError(Exception):
    """Another connection is walking the queue (it holds the walk's lock, :func:`walk_queue`)."""


WALK_HEADER = "x-fulfilment-walk-id"
"""Header of a message a :class:`QueueWalk` put back at the tail of its queue: the walk's id.

A walk that meets a message carrying its own id has gone round the whole queue and stops.
"""

WALK_LOCK_SUFFIX = ".walk-lock"
"""The exclusive queue ``<queue>.walk-lock`` a walk holds so that no other walks ``queue`` at
the same time (:func:`walk_queue`)."""

WALK_PAGE_SIZE = 500
"""Messages a walk holds unacknowledged at most (its prefetch): the page it reads, then settles."""

_NOT_COPIED = frozenset({WALK_HEADER, "x-delivery-count"})
"""Headers a walk does not copy: its own mark (set anew) and the broker's redelivery count,
which in a DLQ counts earlier looks, not the deliveries that killed the message."""


@dataclass(slots=True)
class WalkStats:
    """What a walk did.

    Messages ``taken`` from the queue, ``kept`` (back at its tail) and ``removed``, and
    ``most_held``, the most it held unacknowledged at once.
    """

    taken: int = 0
    kept: int = 0
    removed: int = 0
    most_held: int = 0


class QueueWalk:
    """A walk through the messages a queue holds when it starts, a page at a time.

    A queue cannot be read past its first messages without taking them: a consumer sees at most
    its prefetch (at most 65,535, the AMQP field's size) of unacknowledged messages, and a
    message it returns goes back to the head, where it is delivered again. So the walk *rotates*
    the queue: it consumes with a prefetch of ``page_size``, and settles every message of a page
    with :meth:`settle` before it reads the next one. A message the caller keeps is copied
    (body, properties, headers, marked with the walk's id in :data:`WALK_HEADER`) to the tail of
    the same queue (through ``tail``: the exchange and routing key that reach it), mandatory and
    confirmed; then the whole page is acknowledged at once, which removes the rest (the caller
    has done its own work for them already, e.g. a replay's publish and audit row). One
    ``multiple`` acknowledgement per page, not one per message: with one per message, RabbitMQ
    3.10.8 sometimes put back some acknowledged messages of the last page when the channel
    closed right after (walks of 1,050 and 1,200 left 1,062 and 1,216: copies and originals
    both), likely its quorum-queue client holding back settlements past its limit of commands in
    flight; with one per page, none in every run since.

    Hence the broker holds at most ``page_size`` messages unacknowledged and the process at
    most one page, however deep the queue (:attr:`stats`' ``most_held``). A walk that keeps
    everything leaves the queue as it found it, in the same order. It takes at most the
    queue's depth at the start, and stops early at a message carrying its own id, so it never
    reads a message twice; messages that workers dead-letter meanwhile go to the tail behind
    the ones being walked, and are left for the next walk. A crash between a copy's confirm
    and the original's ack leaves both in the queue: a dead letter seen twice, never none (a
    replay of the second copy is an inbox duplicate). Messages not settled when the walk ends
    (the rest of a page after a failure, or the own copy that stopped it) go back to the head
    of the queue when its channel closes.

    A walk is for a queue no worker consumes (a DLQ): a competing consumer would take the
    pages' messages from under it. The copy carries the original's ``x-death`` as an ordinary
    header: RabbitMQ 3.10 to 3.13 keep it as it is; 4.0 and later no longer interpret an
    ``x-death`` a client sends and deliver it as it was written. The ``user_id`` property is
    not copied (the broker refuses one that is not the walker's own login).
    """

    def __init__(  # noqa: PLR0913 - the connection, the publishing channel, the queue, bounds
        self,
        connection: AbstractConnection,
        confirming: AbstractChannel,
        queue: str,
        *,
        limit: int,
        page_size: int,
        idle_seconds: float,
        tail: tuple[str, str],
        ttl_seconds: float | None = None,
    ) -> None:
        self._connection = connection
        self._tail = tail
        self._ttl_seconds = ttl_seconds
        self._confirming = confirming
        self._channels: list[AbstractChannel] = [confirming]
        self._queue = queue
        self._left = limit
        self._page_size = page_size
        self._idle_seconds = idle_seconds
        self._walk_id = uuid.uuid4().hex
        self._held = 0
        self.stats = WalkStats()

    async def pages(self) -> AsyncIterator[list[AbstractIncomingMessage]]:
        """The queue's messages in queue order, ``page_size`` at most per list.

        Every page must be settled (:meth:`settle`) before the next page is asked for. While
        a page or more is left past the one being read, a consumer with a prefetch of
        ``page_size`` reads it: settling a page lets the broker
        send the next ``page_size``, all of them within the walk. That consumer is cancelled
        while the last such page is still held (so the broker has sent nothing past it), and
        the rest, less than a page, is read by a consumer whose prefetch is exactly what is
        left. So no message past the walk's end is ever sent to it, to be returned to the head
        out of order (a quorum queue does not keep the order of many returns).
        """
        while self._left > 0:
            prefetch = min(self._page_size, self._left)
            channel = await self._connection.channel()
            self._channels.append(channel)
            await channel.set_qos(prefetch_count=prefetch)
            source = await channel.get_queue(self._queue, ensure=False)
            async with source.iterator(no_ack=False) as messages:
                while True:
                    page = await self._read_page(lambda: anext(aiter(messages)))
                    if len(page) == prefetch and self._left >= prefetch:
                        yield page  # the broker sends the next page, all within the walk
                        continue
                    break
            # Cancelled while ``page`` is held: no message past it was sent.
            if page:
                yield page

    async def close(self) -> None:
        """Close the walk's channels: every message not settled goes back to the head."""
        for channel in self._channels:
            if not channel.is_closed:
                await channel.close()

    async def _read_page(
        self, receive: Callable[[], Awaitable[AbstractIncomingMessage | None]]
    ) -> list[AbstractIncomingMessage]:
        """Up to ``page_size`` messages of the walk from ``receive``; fewer at its end."""
        page: list[AbstractIncomingMessage] = []
        waits = 0
        while self._left > 0 and len(page) < self._page_size:
            try:
                async with asyncio.timeout(self._idle_seconds):
                    message = await receive()
            except StopAsyncIteration:
                message = None
            except TimeoutError:
                # A slow broker, or another reader took the rest: wait on while the queue
                # still has messages ready, a few times, then end the walk.
                state = await queue_state(self._connection, self._queue)
                waits += 1
                if state is not None and state.ready > 0 and waits < WALK_IDLE_WAITS:
                    continue
                message = None
            if message is None:
                self._left = 0
                break
            if (message.headers or {}).get(WALK_HEADER) == self._walk_id:
                # Round the whole queue (its depth was counted high): back to the head.
                await message.nack(requeue=True)
                self._left = 0
                break
            self._left -= 1
            self._held += 1
            self.stats.taken += 1
            self.stats.most_held = max(self.stats.most_held, self._held)
            page.append(message)
        return page

    @staticmethod
    async def remove_now(messages: Sequence[AbstractIncomingMessage]) -> None:
        """Acknowledge ``messages`` one by one, before their page is settled.

        For a page cut short by a failure: the messages already done (replayed, purged) leave
        the queue, the rest of the page goes back to its head when the walk ends.
        """
        for message in messages:
            await message.ack()

    async def settle(
        self,
        page: Sequence[AbstractIncomingMessage],
        *,
        keep: Collection[AbstractIncomingMessage] = (),
    ) -> None:
        """Put ``keep`` back at the tail of the queue, then remove the whole ``page``.

        ``keep`` (messages of ``page``) are copied to the tail, each confirmed, in page order;
        then one acknowledgement (``multiple``) removes every message of the page, originals
        of the copies and the rest alike.

        Raises:
            UnroutableError, aiormq.exceptions.DeliveryError, TimeoutError: a copy was not
                confirmed; the whole page stays where it was (copies confirmed before it
                are in the queue twice).
        """
        if not page:
            return
        chosen = {id(message) for message in keep}
        kept = [message for message in page if id(message) in chosen]
        now = datetime.now(UTC)
        async with asyncio.TaskGroup() as group:
            for message in kept:
                group.create_task(
                    publish_confirmed(
                        self._confirming,
                        _copy(message, self._walk_id, self._time_left(message, now)),
                        exchange=self._tail[0],
                        routing_key=self._tail[1],
                        timeout_seconds=self._idle_seconds * 10,
                    )
                )
        await page[-1].ack(multiple=True)
        self._held -= len(page)
        self.stats.kept += len(kept)
        self.stats.removed += len(page) - len(kept)

    def _time_left(self, message: AbstractIncomingMessage, now: datetime) -> float | None:
        """Seconds the copy of ``message`` may stay: what the DLQ's TTL leaves of it.

        The broker counts a message's TTL from when it entered the queue, so a copy would start
        the count again and a DLQ that is walked daily would never drop anything. The copy
        gets the rest as its own ``expiration`` (the broker applies the lower of a message's
        and the queue's TTL), counted from when it was dead-lettered (its
        ``x-fulfilment-dead-lettered-at`` header, else its first ``x-death`` time). None (no
        expiration: the queue's own TTL starts again) when the walk has no TTL, when the
        message does not say when it was dead-lettered, and when that is longer ago than the
        TTL: such a message outlived the stated TTL in the broker already (a DLQ without the
        policy, or with a longer one), and a walk that only looks must not be what drops it.
        """
        if self._ttl_seconds is None:
            return None
        entered = describe_dead_letter(message.headers, message.body).dead_lettered_at
        if entered is None:
            return None
        left = self._ttl_seconds - (now - entered).total_seconds()
        return left if left > 0 else None


def _copy(
    message: AbstractIncomingMessage, walk_id: str, time_left: float | None
) -> aio_pika.Message:
    headers = {
        key: value for key, value in (message.headers or {}).items() if key not in _NOT_COPIED
    }
    headers[WALK_HEADER] = walk_id
    copy = resent(message, headers, as_sent=True)
    if time_left is not None:
        copy.expiration = (
            time_left if message.expiration is None else min(time_left, message.expiration)
        )
    return copy


@contextlib.asynccontextmanager
async def walk_queue(
    connection: AbstractConnection,
    queue: str,
    *,
    page_size: int = WALK_PAGE_SIZE,
    idle_seconds: float = WALK_IDLE_SECONDS,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> AsyncIterator[QueueWalk]:
    """A :class:`QueueWalk` of the messages ``queue`` holds now (none when it is missing).

    One walk per queue at a time: two would each take the depth from the head and see some
    messages twice and others not at all. The walk holds a lock for its whole length, an
    exclusive queue ``<queue>.walk-lock`` (the broker refuses a second connection the same
    exclusive queue, and drops it when its connection closes, so a walker that dies frees
    it); the lock is deleted at the end.

    Kept messages go back to its tail by :func:`~fulfilment.routes.table.route_to`,
    with what ``ttl_seconds`` (the DLQ's ``message-ttl``, ``FULFILMENT_DEAD_LETTER_TTL_SECONDS``)
    leaves of their time (:meth:`QueueWalk._time_left`); None keeps no expiration. Every
    message not settled by the end goes back to the head of the queue.

    Raises:
        WalkInProgressError: another connection walks ``queue``; nothing was taken.
    """
    lock = await connection.channel()
    try:
        await lock.declare_queue(
            f"{queue}{WALK_LOCK_SUFFIX}", exclusive=True, arguments={"x-queue-type": "classic"}
        )
    except aiormq.exceptions.ChannelLockedResource as error:
        msg = (
            f"another `fulfilment dlq` command is walking {queue} (it holds the exclusive"
            f" queue {queue}{WALK_LOCK_SUFFIX}); run it again when that one has ended"
        )
        raise WalkInProgressError(msg) from error
    state = await queue_state(connection, queue)
    confirming = await connection.channel(publisher_confirms=True, on_return_raises=True)
    walk = QueueWalk(
        connection,
        confirming,
        queue,
        limit=state.ready if state else 0,
        page_size=page_size,
        idle_seconds=idle_seconds,
        tail=route_to(queue),
        ttl_seconds=ttl_seconds,
    )
    try:
        yield walk
    finally:
        await walk.close()
        if not lock.is_closed:
            await lock.queue_delete(f"{queue}{WALK_LOCK_SUFFIX}")
            await lock.close()
