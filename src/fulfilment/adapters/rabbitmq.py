"""Publishing events and inspecting queues, for the command line (not the worker's hot path)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractIncomingMessage

from fulfilment.contracts.dead_letter import (
    DEAD_LETTER_TTL_SECONDS,
    SERVICE_FAILURE_CLASSES,
    describe_dead_letter,
)
from fulfilment.contracts.topology import route_to

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection

PUBLISH_CONCURRENCY = 64
"""Publishes awaiting their confirm at once: enough to hide the round trip, few enough that a
refused publish stops the run quickly."""

BROWSE_IDLE_SECONDS = 1.0
"""How long browsing waits for one more message before deciding the queue has been seen."""

WALK_IDLE_SECONDS = 5.0
"""How long a walk waits for a message the queue's depth promised before it looks whether the
queue still has messages ready (a slow broker) or none (another reader took them)."""

WALK_IDLE_WAITS = 6
"""Waits of ``WALK_IDLE_SECONDS`` a walk makes for one message while the queue has some ready."""


class BrokerUnavailableError(Exception):
    """RabbitMQ cannot be reached, or refused the connection; the message says where.

    A refusal is the subclass :class:`BrokerRefusedError`.
    """


class BrokerRefusedError(BrokerUnavailableError):
    """RabbitMQ answered but refused the login or the virtual host; the message says which."""


class UnroutableError(Exception):
    """The broker returned a mandatory publish: no queue is bound for its routing key."""


class WalkInProgressError(Exception):
    """Another connection is walking the queue (it holds the walk's lock, :func:`walk_queue`)."""


@dataclass(frozen=True, slots=True)
class OutgoingEvent:
    """One event to publish: ``body`` is UTF-8 JSON, ``message_id`` the event id."""

    body: bytes
    message_id: str


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue as a passive declare sees it: ready messages and attached consumers."""

    name: str
    ready: int
    consumers: int


@dataclass
class DeadLetterSummary:
    """What a look at the DLQ found: messages by ``(failure class, reason)`` and event ids.

    The class is the service's ``x-fulfilment-failure-class``, or for messages the broker
    dead-lettered itself one read from ``x-death`` (``poison`` after the delivery limit; see
    ``fulfilment.contracts.dead_letter.FailureClass``).
    """

    seen: int = 0
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    event_ids: set[str] = field(default_factory=set)
    unread: int = 0
    """Messages past the first :data:`PEEK_LIMIT` that the look could not read."""


# RabbitMQ closes the connection with 530 NOT_ALLOWED when asked for a virtual host that does
# not exist or that the user may not use (the two are one answer). aiormq 7.2 checks the reply's
# kind before it reads a Connection.Close, so it raises an InvalidFrameError naming the two
# frames and drops the code; a later aiormq may raise ConnectionClosed(530, text) instead.
_VHOST_REFUSED_FRAMES = ("Connection.OpenOk", "Connection.Close")
_NOT_ALLOWED = 530


def connection_failure(amqp_url: str, error: BaseException) -> BrokerUnavailableError:
    """What a failed connection to ``amqp_url`` means, in one line without the password.

    A :class:`BrokerRefusedError` when the broker answered and refused the login (a wrong user
    or password, aiormq's ``ProbableAuthenticationError`` for ACCESS_REFUSED, or no common
    authentication mechanism) or the virtual host (missing, or not permitted to the user);
    when it refused an operation the user's permissions do not allow (``ACCESS_REFUSED``, 403,
    on a channel: a declaration, a binding, a publish or a read of a name outside them);
    when it presented a TLS certificate that did not verify (``ssl.SSLCertVerificationError``:
    a CA other than the URL's ``cafile``, or a host name the certificate does not name);
    when a TLS file the URL names cannot be read; or when an ``amqps://`` URL's port answers
    without TLS (``WRONG_VERSION_NUMBER``: the plain AMQP port, 5672, say). Retrying mends
    none of these. Otherwise a :class:`BrokerUnavailableError` (refused or reset connection,
    DNS failure, time-out, a closed connection).
    """
    url = aio_pika.connection.make_url(amqp_url)
    where = _without_password(amqp_url)
    user = url.user or "guest"
    refusal = _tls_refusal(error, port=url.port or 5671)  # aiormq's default for amqps://
    if refusal is not None:
        return BrokerRefusedError(f"RabbitMQ at {where}{refusal}")
    if isinstance(
        error,
        aiormq.exceptions.ProbableAuthenticationError | aiormq.exceptions.AuthenticationError,
    ):
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused the login of user {user!r}:"
            f" {type(error).__name__}: {error}"
        )
    if isinstance(error, aiormq.exceptions.ChannelAccessRefused):
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused user {user!r} an operation its permissions do not"
            f" allow: {error.args[0] if error.args else error}"
        )
    frames = str(error)
    vhost_refused = (
        isinstance(error, aiormq.exceptions.InvalidFrameError)
        and all(frame in frames for frame in _VHOST_REFUSED_FRAMES)
    ) or (
        isinstance(error, aiormq.exceptions.ConnectionClosed) and error.args[:1] == (_NOT_ALLOWED,)
    )
    if vhost_refused:
        vhost = url.path[1:].replace("%2F", "/") or "/"  # as aiormq reads it
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused virtual host {vhost!r}: it does not exist, or user"
            f" {user!r} may not use it"
        )
    return BrokerUnavailableError(
        f"RabbitMQ at {where} is not reachable: {type(error).__name__}: {error}"
    )


def closed_reason(connection: AbstractConnection) -> BaseException | None:
    """Why ``connection`` closed under its user (the error its reader stopped on), else None.

    None while it is open, and for a connection that was never opened or that its user
    closed. aio-pika 10.2.1's own ``is_closed`` stays False when the broker drops the connection
    (a restart, a closed socket): only aiormq's connection under it knows, and its ``closing``
    future holds the reason (``ConnectionClosed(320, 'CONNECTION_FORCED ...')``, an
    ``AMQPConnectionError`` for a socket closed without a word).
    """
    underlay = connection.transport
    if underlay is None or not underlay.connection.is_closed:
        return None
    closing = underlay.connection.closing
    if closing.cancelled():
        return ConnectionError("the connection was closed")
    return closing.exception() or ConnectionError("the connection was closed")


@contextlib.contextmanager
def connection_lost(connection: AbstractConnection, amqp_url: str) -> Iterator[None]:
    """Raise a lost ``connection`` (to ``amqp_url``) as a one-line failure without the password.

    For the operations on an open connection that the broker may drop meanwhile: a channel
    asked of a connection aiormq saw close raises a bare ``RuntimeError('<Connection ...>
    closed')``, a frame lost on the way an ``AMQPConnectionError``. Any other error, on a
    connection still open, passes unchanged.

    Raises:
        BrokerUnavailableError: the block failed and the connection is closed, with the
            reason it closed (a ``BrokerRefusedError`` when that reason is a refusal).
    """
    try:
        yield
    except BrokerUnavailableError:
        raise
    except Exception as error:
        reason = closed_reason(connection)
        if reason is None and not isinstance(error, aiormq.exceptions.AMQPConnectionError):
            raise
        failure = connection_failure(amqp_url, reason or error)
        if isinstance(failure, BrokerRefusedError):
            raise failure from error
        cause = reason or error
        msg = (
            f"the connection to RabbitMQ at {_without_password(amqp_url)} was lost:"
            f" {type(cause).__name__}: {cause}"
        )
        raise BrokerUnavailableError(msg) from error


def _without_password(amqp_url: str) -> str:
    """``amqp_url`` as a line may show it: its password, if any, as ``***``."""
    url = aio_pika.connection.make_url(amqp_url)
    return str(url.with_password("***") if url.password is not None else url)


def _tls_refusal(error: BaseException, *, port: int) -> str | None:
    """What in the URL's TLS ``error`` refuses (``: the server's TLS ...``), else None."""
    cause = _tls_cause(error)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            ": the server's TLS certificate did not verify"
            f" (the URL's cafile CA and host name): {type(cause).__name__}: {cause}"
        )
    if cause is not None:
        return (
            ": a TLS file the URL names cannot be read"
            f" (cafile, capath, certfile, keyfile): {type(cause).__name__}: {cause}"
        )
    if _plain_port(error):
        return (
            f" does not speak TLS on port {port}, which amqps:// asks for (the TLS port is"
            f" 5671 by default; amqp:// for the plain port): {type(error).__name__}: {error}"
        )
    return None


def _tls_cause(error: BaseException) -> BaseException | None:
    """The failed certificate check or unreadable TLS file behind ``error``, else None.

    aiormq raises ``AMQPConnectionError`` from the handshake's ``SSLCertVerificationError``
    (an ``OSError``); a CA or certificate file that is missing reaches the caller as the
    ``FileNotFoundError`` (or ``PermissionError``, ``IsADirectoryError``) of building the TLS
    context, before any connection is tried.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        if isinstance(seen, FileNotFoundError | PermissionError | IsADirectoryError):
            return seen
        seen = seen.__cause__
    return None


_PLAIN_ANSWER = "WRONG_VERSION_NUMBER"
"""OpenSSL's reason when the server's first bytes are no TLS record: RabbitMQ's plain port
answers a TLS hello with the AMQP protocol header."""


def _plain_port(error: BaseException) -> bool:
    """True when ``error`` comes from a TLS handshake that a server without TLS answered.

    aiormq raises ``AMQPConnectionError`` from the handshake's ``ssl.SSLError``.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and seen.reason == _PLAIN_ANSWER:
            return True
        seen = seen.__cause__
    return False


@contextlib.asynccontextmanager
async def connect(
    amqp_url: str, *, timeout_seconds: float = 10.0
) -> AsyncIterator[AbstractConnection]:
    """A plain (not robust) connection, closed on exit.

    Raises:
        BrokerUnavailableError: the broker does not answer, or (a ``BrokerRefusedError``)
            refuses the login or the virtual host.
    """
    try:
        connection = await aio_pika.connect(amqp_url, timeout=timeout_seconds)
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as error:
        raise connection_failure(amqp_url, error) from error
    try:
        yield connection
    finally:
        await connection.close()


async def publish_events(
    connection: AbstractConnection,
    events: Sequence[OutgoingEvent],
    *,
    exchange: str,
    routing_key: str,
) -> int:
    """Publish ``events`` persistently and mandatorily to ``exchange``, each confirmed.

    The exchange is declared as a durable topic exchange (idempotent; the contract's
    ``orders``). Returns the number of events confirmed by the broker.

    Raises:
        UnroutableError: no queue is bound for ``routing_key`` (start the worker first: it
            declares its queue); events published before it stay published.
        aiormq.exceptions.DeliveryError: the broker refused a message (e.g. the queue is full).
    """
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        target = await channel.declare_exchange(
            exchange, type=aio_pika.ExchangeType.TOPIC, durable=True
        )
        limit = asyncio.Semaphore(PUBLISH_CONCURRENCY)

        async def publish(event: OutgoingEvent) -> None:
            async with limit:
                message = aio_pika.Message(
                    event.body,
                    message_id=event.message_id,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                try:
                    await target.publish(message, routing_key=routing_key, mandatory=True)
                except aiormq.exceptions.PublishError as error:
                    msg = (
                        f"exchange {exchange!r} has no queue bound for {routing_key!r}: "
                        "start the worker first, it declares its queue"
                    )
                    raise UnroutableError(msg) from error

        async with asyncio.TaskGroup() as group:
            for event in events:
                group.create_task(publish(event))
    except ExceptionGroup as errors:
        raise errors.exceptions[0] from errors
    finally:
        if not channel.is_closed:
            await channel.close()
    return len(events)


async def queue_state(connection: AbstractConnection, name: str) -> QueueState | None:
    """Ready messages and consumers of queue ``name``, or None when it does not exist."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    else:
        result = queue.declaration_result
        return QueueState(name, result.message_count or 0, result.consumer_count or 0)
    finally:
        if not channel.is_closed:
            await channel.close()


async def browse_dead_letters(connection: AbstractConnection, queue: str) -> DeadLetterSummary:
    """Read every message of the DLQ ``queue`` without removing any, and count them.

    See :func:`peek_messages` for how the messages stay in the queue; a DLQ deeper than
    :data:`PEEK_LIMIT` is counted up to it, and the rest is counted as ``unread``.
    """
    summary = DeadLetterSummary()
    state = await queue_state(connection, queue)
    ready = state.ready if state else 0
    for message in await peek_messages(connection, queue, ready):
        _count(summary, message)
    summary.unread = max(0, ready - summary.seen)
    return summary


async def peek_messages(
    connection: AbstractConnection, queue: str, ready: int
) -> list[AbstractIncomingMessage]:
    """The first :data:`PEEK_LIMIT` of ``queue``'s ``ready`` messages, left in it, in order.

    ``ready`` is the queue's depth, read by the caller.

    Messages are received unacknowledged and returned when the channel closes, so they stay
    in the queue in their order. Each look counts as a delivery on quorum queues (on RabbitMQ
    3.10 to 4.2; 4.3 no longer counts returns), which is why the DLQ is declared with a very
    large delivery limit (``fulfilment.worker.topology``). Never use this on a queue that
    workers consume: it would spend their delivery attempts.
    """
    if ready <= 0:
        return []
    seen: list[AbstractIncomingMessage] = []
    channel: AbstractChannel = await connection.channel()
    try:
        wanted = min(ready, PEEK_LIMIT)
        await channel.set_qos(prefetch_count=wanted)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=False) as messages:
            while len(seen) < wanted:
                try:
                    async with asyncio.timeout(BROWSE_IDLE_SECONDS):
                        message = await anext(aiter(messages))
                except (TimeoutError, StopAsyncIteration):
                    break
                seen.append(message)
    finally:
        # Closing without acknowledging returns every browsed message to the queue.
        if not channel.is_closed:
            await channel.close()
    return seen


async def peek_head(connection: AbstractConnection, queue: str) -> AbstractIncomingMessage | None:
    """The message at the head of ``queue`` (its oldest), left in place; None when empty.

    One ``basic.get`` returned with ``basic.nack(requeue=True)``: on RabbitMQ 4.3+ that return
    is not counted towards the delivery limit; on 3.10 to 4.2 it is, one count per look.
    """
    channel = await connection.channel()
    try:
        source = await channel.get_queue(queue, ensure=False)
        message = await source.get(no_ack=False, fail=False)
        if message is not None:
            await message.nack(requeue=True)
        return message
    finally:
        if not channel.is_closed:
            await channel.close()


WALK_HEADER = "x-fulfilment-walk-id"
"""Header of a message a :class:`QueueWalk` put back at the tail of its queue: the walk's id.

A walk that meets a message carrying its own id has gone round the whole queue and stops.
"""

PEEK_LIMIT = 65_535
"""Most messages :func:`peek_messages` reads: the largest prefetch (an AMQP short), since it
holds every message it reads unacknowledged. Deeper queues are paged by :class:`QueueWalk`."""

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


def resent(
    message: AbstractIncomingMessage,
    headers: Mapping[str, Any],
    *,
    app_id: str | None = None,
    as_sent: bool = False,
) -> aio_pika.Message:
    """A persistent message with ``message``'s body, ids and content properties, and ``headers``.

    How a received message is sent again: as a dead letter (``worker.dead_lettering``), as a
    replay (``tools.dlq``), as a walk's copy (:class:`QueueWalk`). ``app_id`` replaces the
    sender's when given. Priority, reply address and expiration are dropped unless
    ``as_sent``: a dead letter must not expire in its DLQ nor be answered, and a replay is the
    operator's decision, not to be reordered, answered or expired by what the first sender
    asked for; a walk's copy stands in for the message it replaces, so it keeps them.
    """
    return aio_pika.Message(
        message.body,
        headers=dict(headers),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority if as_sent else None,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to if as_sent else None,
        expiration=message.expiration if as_sent else None,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id if app_id is None else app_id,
    )


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

    Kept messages go back to its tail by :func:`~fulfilment.contracts.topology.route_to`,
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


async def publish_confirmed(
    channel: AbstractChannel,
    message: aio_pika.Message,
    *,
    exchange: str,
    routing_key: str,
    timeout_seconds: float,
) -> None:
    """Publish ``message`` mandatorily on a confirming channel and wait for the broker's ack.

    ``channel`` must be opened with ``publisher_confirms=True, on_return_raises=True``.

    Raises:
        UnroutableError: no queue is bound for ``routing_key`` on ``exchange``.
        aiormq.exceptions.DeliveryError: the broker refused the message (e.g. a full queue).
        TimeoutError: no confirm within ``timeout_seconds``.
    """
    target = await channel.get_exchange(exchange, ensure=False)
    try:
        await target.publish(
            message, routing_key=routing_key, mandatory=True, timeout=timeout_seconds
        )
    except aiormq.exceptions.PublishError as error:
        msg = f"exchange {exchange!r} has no queue bound for {routing_key!r}"
        raise UnroutableError(msg) from error


async def declare_bound_queue(
    connection: AbstractConnection, queue: str, *, exchange: str, binding_key: str
) -> None:
    """Declare the durable topic ``exchange``, a durable classic ``queue``, and bind them.

    Idempotent. The exchange is declared with the arguments the service gives it (durable
    topic), so declaring it before the service does is the same as after.

    Raises:
        aiormq.exceptions.ChannelPreconditionFailed: ``queue`` or ``exchange`` exists with
            other arguments.
    """
    channel = await connection.channel()
    try:
        source = await channel.declare_exchange(
            exchange, type=aio_pika.ExchangeType.TOPIC, durable=True
        )
        target = await channel.declare_queue(queue, durable=True)
        await target.bind(source, routing_key=binding_key)
    finally:
        if not channel.is_closed:
            await channel.close()


async def take_messages(
    connection: AbstractConnection,
    queue: str,
    handle: Callable[[AbstractIncomingMessage], None],
    *,
    prefetch: int,
    idle_seconds: float,
) -> int:
    """Remove the messages ``queue`` holds now: ``handle`` each, then acknowledge it.

    At most ``prefetch`` messages are unacknowledged at once, so memory stays bounded however
    deep the queue is. Messages that arrive meanwhile are left for later. Returns how many
    were taken (0 when the queue is missing or empty). If ``handle`` raises, the message and
    those after it stay in the queue.

    Raises:
        TimeoutError: no message came for ``idle_seconds`` while the queue still counted some
            (another consumer took them).
    """
    state = await queue_state(connection, queue)
    if state is None or state.ready == 0:
        return 0
    channel: AbstractChannel = await connection.channel()
    taken = 0
    try:
        await channel.set_qos(prefetch_count=prefetch)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=False) as messages:
            while taken < state.ready:
                async with asyncio.timeout(idle_seconds):
                    message = await anext(aiter(messages))
                handle(message)
                await message.ack()
                taken += 1
    finally:
        # Closing returns every message received and not acknowledged, prefetched included.
        if not channel.is_closed:
            await channel.close()
    return taken


def _count(summary: DeadLetterSummary, message: AbstractIncomingMessage) -> None:
    described = describe_dead_letter(message.headers, message.body)
    written = described.failure_class in SERVICE_FAILURE_CLASSES
    reason = described.reason.split(":", 1)[0] if written else ""
    summary.seen += 1
    summary.by_reason[str(described.failure_class), reason] += 1
    if described.event_id is not None:
        summary.event_ids.add(described.event_id)
