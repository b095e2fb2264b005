"""The relay: a pump (``pump.leader``) that publishes the outbox in ``id`` order.

One relay is active among its replicas: the one whose PostgreSQL session holds the advisory
lock (``adapters.postgres.advisory_lock.RELAY_LOCK_KEY``). The others stand by, trying the lock
every ``poll_seconds`` and reading the backlog, and take over when the holder's session ends
(it exited, crashed, or lost its connection). A lock rather than partitioning the rows among
replicas: per-order order needs
every row of an order to go through one publisher, and one publisher is also what keeps the
``id`` order of rows of different orders; a partition by order would need a rebalancing
protocol where the lock needs none, and one relay publishes far faster than the service
writes (docs/design.md, "Result events and the relay").

The active relay reads, marks and listens on that same session, so a relay that lost its lock
can no longer read or mark rows. It wakes on ``NOTIFY fulfilment_outbox`` and polls every
``poll_seconds`` as well (a notification is lost while the session is down). Each batch is
published at once, with publisher confirms and ``mandatory``; ``published_at`` is set only for
the rows the broker confirmed. A returned or refused row stays unpublished and is retried,
after a back-off, before any later row of its order (``outbox.next_batch``). At least once: a
relay that dies between the confirm and the mark publishes those rows again, with the same
``event_id``; consumers dedupe on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, cast

import aiormq
import asyncpg
import structlog
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from fulfilment.adapters.postgres.advisory_lock import RELAY_LOCK_KEY
from fulfilment.adapters.postgres.errors import SESSION_LOST_ERRORS
from fulfilment.adapters.postgres.outbox import (
    NOTIFY_CHANNEL,
    OutboxRow,
    backlog,
    mark_published,
    next_batch,
)
from fulfilment.backoff import doubling_wait
from fulfilment.contracts.topology import EVENTS_EXCHANGE
from fulfilment.observability.relay_metrics import CONNECTION, NACKED, RETURNED, RelayMetrics
from fulfilment.observability.tracing import (
    context_of,
    records_children_of_traceparent,
    traceparent_of,
)
from fulfilment.pump.leader import LockOptions, Pump, PumpEvents, Role

logger = structlog.get_logger("fulfilment.relay")
tracer = trace.get_tracer("fulfilment.relay")

RECONNECT_ERRORS: tuple[type[Exception], ...] = (
    *SESSION_LOST_ERRORS,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
)
"""What ends a relay's session and makes it connect again: the database's session lost
(``adapters.postgres.errors.SESSION_LOST_ERRORS``), or a broker that is down, restarting or
closed the connection or channel."""

RETRY_FIRST_SECONDS = 1.0
"""Back-off before the rows of a batch the broker returned or refused are published again;
doubled after each such batch in a row."""
RETRY_MAX_SECONDS = 30.0
"""Longest back-off before a returned or refused row is published again."""

PERSISTENT = 2
"""AMQP ``delivery_mode`` of a persistent message."""


class BrokerConnection(aiormq.Connection):
    """An aiormq connection whose write queue holds a whole batch of publishes.

    aiormq 7.2.4 bounds a connection's queue of frames to write at ``FRAME_BUFFER_SIZE``
    (10; ``Connection.__init__``), and ``Channel.basic_publish`` puts its frames there while it
    holds the channel's lock (``channel.py``). With a batch of 100 the eleventh publish waits
    for room holding the lock, and the rest of the batch then goes one publish per turn of the
    event loop, each turn a hand-over of the lock, a wake-up of the writer and a poll of the
    sockets: a fifth of the relay's CPU per event on uvloop (``bench/relay_throughput.py``).
    Unbounded (0), a batch's publishes are all queued in one turn and written in the next.
    The relay queues one batch and waits for its confirms before the next, so the queue never
    holds more than ``batch_size`` publishes and a heartbeat.
    """

    FRAME_BUFFER_SIZE = 0


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """What the relay needs, built by its root from the settings.

    Attributes:
        amqp_url: RabbitMQ URL.
        database_url: PostgreSQL URL for asyncpg (``postgresql://``).
        batch_size: most rows read and published at once.
        poll_seconds: how often the active relay looks at the outbox without a notification,
            and a standby tries the lock and reads the backlog.
        batch_window_seconds: after a batch smaller than ``batch_size``, how long from that
            batch's read the relay lets rows gather before it reads the next one (0: at once).
        connect_timeout_seconds: time allowed to open each connection.
        publish_timeout_seconds: time a batch may wait for its confirms before the broker
            connection is taken for lost.
        app_id: the messages' ``app_id`` (``fulfilment-<version>``).
    """

    amqp_url: str = field(repr=False)
    database_url: str = field(repr=False)
    batch_size: int
    poll_seconds: float
    batch_window_seconds: float
    connect_timeout_seconds: float
    publish_timeout_seconds: float
    app_id: str


class RelayHooks:
    """Points of a batch where a subclass may act; the relay's own hooks do nothing.

    The fault suite's subclass kills the process at them (``tests/faults/crash_plan.py``), so
    that the relay's code carries no crash injection.
    """

    def before_publish(self, batch: Sequence[OutboxRow]) -> None:
        """Called with a batch read from the outbox, before any of it is published."""

    def after_publish(self, batch: Sequence[OutboxRow]) -> None:
        """Called once the batch's publishes are done (confirmed or failed), before the marks."""


class Relay(Pump):
    """One relay process: :meth:`run` until :meth:`stop` (``pump.leader``).

    Its session to PostgreSQL holds the lock, and the active relay reads, marks and listens
    on it, so it is not pinged beside (:attr:`Pump.pings`); a broker connection and a channel
    with publisher confirms are opened beside it.
    """

    name: ClassVar[str] = "relay"
    events: ClassVar[PumpEvents] = PumpEvents(
        starting="relay.starting",
        standing_by="relay.standing_by",
        active="relay.active",
        connection_lost="relay.connection_lost",
        reconnecting="relay.reconnecting",
        stopped="relay.stopped",
    )
    reconnect_errors: ClassVar[tuple[type[Exception], ...]] = RECONNECT_ERRORS
    pings: ClassVar[bool] = False

    def __init__(
        self, options: RelayOptions, metrics: RelayMetrics, hooks: RelayHooks | None = None
    ) -> None:
        """A relay that does nothing until :meth:`run`; ``hooks`` default to doing nothing."""
        super().__init__(
            LockOptions(
                database_url=options.database_url,
                key=RELAY_LOCK_KEY,
                connect_timeout_seconds=options.connect_timeout_seconds,
                poll_seconds=options.poll_seconds,
            ),
            metrics.active,
        )
        self._options = options
        self._metrics = metrics
        self._hooks = hooks or RelayHooks()
        self._database: asyncpg.Connection | None = None
        self._broker: BrokerConnection | None = None
        self._channel: aiormq.Channel | None = None
        self._backlog_read_at = float("-inf")

    def readiness(self) -> dict[str, bool | str]:
        """``{"broker": connected, "database": connected, "role": "active"|"standby"|...}``."""
        return {
            "broker": self._broker is not None and not self._broker.is_closed,
            "database": self._database is not None and not self._database.is_closed(),
            "role": str(self.role),
        }

    def ready(self) -> bool:
        """Connected to both services, and either publishing or standing by for the lock.

        A standby replica is ready: it is doing its job, which is to wait.
        """
        checks = self.readiness()
        connected = bool(checks["broker"]) and bool(checks["database"])
        return connected and self.role is not Role.CONNECTING

    @contextlib.asynccontextmanager
    async def connected(self, session: asyncpg.Connection) -> AsyncIterator[None]:
        """The broker connection and its confirming channel, for the time of ``session``.

        Raises:
            RECONNECT_ERRORS: the broker did not answer, or closed the connection.
        """
        options = self._options
        broker = BrokerConnection(options.amqp_url)
        try:
            await asyncio.wait_for(broker.connect(), options.connect_timeout_seconds)
            broker.closing.add_done_callback(lambda _closing: self.wake())
            # aiormq 7.2.4's Connection.channel builds an aiormq.Channel, whose
            # basic_publish takes the wait that AbstractChannel does not declare.
            channel = cast(
                "aiormq.Channel",
                await broker.channel(publisher_confirms=True, on_return_raises=True),
            )
            await channel.exchange_declare(EVENTS_EXCHANGE, exchange_type="topic", durable=True)
            self._database, self._broker, self._channel = session, broker, channel
            yield
        finally:
            self._database = self._broker = self._channel = None
            await _quietly(broker.close())

    async def stand_by(self, session: asyncpg.Connection) -> None:
        """Read the backlog for its gauges (at most once per ``poll_seconds``)."""
        await self._read_backlog(session)

    async def work(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Listen for the outbox's notifications and publish until stopped or a loss."""
        del lost  # seen as an error of the session's next statement
        broker, channel = self._broker, self._channel
        assert broker is not None  # noqa: S101 - opened by connected()
        assert channel is not None  # noqa: S101 - opened by connected()
        await session.add_listener(NOTIFY_CHANNEL, self._notified)
        await self._publish_until_stopped(session, broker, channel)

    async def _publish_until_stopped(
        self, database: asyncpg.Connection, broker: BrokerConnection, channel: aiormq.Channel
    ) -> None:
        # Not tenacity's AsyncRetrying: the session goes on between the tries, reading the
        # backlog and the next batch (fulfilment.backoff).
        failed_batches = 0  # in a row
        while not self.stopping.is_set():
            if broker.is_closed:
                raise ConnectionError("the broker closed the relay's connection")  # noqa: EM101, TRY003 - a reconnect, logged by the retry
            # A notification before this read is answered by it.
            self._wake.clear()
            await self._read_backlog(database)
            read_at = time.monotonic()
            batch = await next_batch(database, self._options.batch_size)
            if not batch:
                await self.wait(self._options.poll_seconds)
                continue
            confirmed = await self._publish(database, channel, batch)
            if len(confirmed) < len(batch):
                await self.pause(
                    doubling_wait(failed_batches, first=RETRY_FIRST_SECONDS, cap=RETRY_MAX_SECONDS)
                )
                failed_batches += 1
                continue
            failed_batches = 0
            if len(batch) < self._options.batch_size:
                # The worker commits every few milliseconds, each commit a notification: read
                # at once, the relay would publish batches of a few rows, and each batch costs
                # a read, a mark and the confirms' round trip whatever its size. A short window
                # lets the rows of several commits go in one batch (docs/performance.md).
                # It counts from this batch's read: rows have gathered while the batch was
                # published and marked, so a slow confirm is not followed by a whole window more
                # (docs/records/2026-12-04-end-to-end-at-prefetch-64.md).
                left = self._options.batch_window_seconds - (time.monotonic() - read_at)
                if left > 0:
                    await self.pause(left)

    async def _publish(
        self, database: asyncpg.Connection, channel: aiormq.Channel, batch: list[OutboxRow]
    ) -> list[int]:
        """Publish ``batch`` at once and mark what the broker confirmed; return those ids.

        Raises:
            RECONNECT_ERRORS: the broker connection was lost, or the batch's confirms did not
                all come within ``publish_timeout_seconds``; the confirmed rows are marked
                first, the others are published again after the reconnect.
        """
        self._hooks.before_publish(batch)
        spans = [
            _publish_span(row) if records_children_of_traceparent(row.traceparent) else None
            for row in batch
        ]
        # A task per row: basic_publish returns only once its confirm came. wait=False: a
        # publish does not wait for the writer to send it (the confirm says it was), so the
        # whole batch is queued in one turn of the event loop (BrokerConnection).
        publishes = [
            asyncio.create_task(
                channel.basic_publish(
                    row.body,
                    exchange=EVENTS_EXCHANGE,
                    routing_key=row.routing_key,
                    properties=message_properties(row, self._options.app_id, spans[index]),
                    mandatory=True,
                    wait=False,
                )
            )
            for index, row in enumerate(batch)
        ]
        timeout = self._options.publish_timeout_seconds
        # gather cancels what is left when the timeout comes, and returns once every publish
        # is done, so each one below has its outcome.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*publishes, return_exceptions=True)
        confirmed: list[int] = []
        lost: BaseException | None = None
        for index, (row, publish) in enumerate(zip(batch, publishes, strict=True)):
            if (span := spans[index]) is not None:
                _end_publish_span(span, publish)
            if publish.cancelled():
                lost = TimeoutError(f"no confirm from the broker in {timeout:g} s")
            elif (error := publish.exception()) is None:
                confirmed.append(row.id)
            elif isinstance(error, aiormq.exceptions.DeliveryError):
                # PublishError (a DeliveryError) is a Basic.Return: no queue is bound.
                reason = RETURNED if isinstance(error, aiormq.exceptions.PublishError) else NACKED
                self._metrics.failures[reason].inc()
                logger.warning(
                    "relay.publish_failed",
                    reason=reason,
                    event_id=row.event_id,
                    routing_key=row.routing_key,
                    outbox_id=row.id,
                )
            else:
                lost = error
        self._hooks.after_publish(batch)
        if confirmed:
            self._metrics.record_published(await mark_published(database, confirmed))
        if lost is not None:
            self._metrics.failures[CONNECTION].inc()
            raise lost
        return confirmed

    async def _read_backlog(self, database: asyncpg.Connection) -> None:
        """Set the backlog gauges, at most once per ``poll_seconds`` (it counts the rows)."""
        if time.monotonic() - self._backlog_read_at < self._options.poll_seconds:
            return
        self._backlog_read_at = time.monotonic()
        self._metrics.set_backlog(*await backlog(database))

    def _notified(self, *_: object) -> None:
        self.wake()


def message_properties(
    row: OutboxRow, app_id: str, span: Span | None = None
) -> aiormq.spec.Basic.Properties:
    """The properties of ``row``'s message: the bytes that aio_pika.Message sent before.

    The ``traceparent`` header is the publish ``span``'s context, else (tracing off, or the
    row's context not sampled: no publish span) the row's own. ``priority`` 0, and empty
    ``headers`` without a trace, are what aio_pika 10.2's ``Message.properties`` set
    (``message.py``).
    """
    traceparent = row.traceparent if span is None else traceparent_of(span.get_span_context())
    return aiormq.spec.Basic.Properties(
        content_type="application/json",
        delivery_mode=PERSISTENT,
        priority=0,
        message_id=row.event_id,
        message_type=row.routing_key,
        correlation_id=row.subject,
        headers={"traceparent": traceparent} if traceparent else {},
        app_id=app_id,
    )


def _publish_span(row: OutboxRow) -> Span:
    """The ``PRODUCER`` span of ``row``'s publish, child of the span that wrote the row.

    Started before the publish and ended at its confirm (:func:`_end_publish_span`); its
    ``fulfilment.outbox.lag_seconds`` is the time from the row's commit to its read.
    """
    return tracer.start_span(
        f"publish {EVENTS_EXCHANGE}",
        context=context_of(row.traceparent),
        kind=SpanKind.PRODUCER,
        attributes={
            # OpenTelemetry semantic conventions for messaging (RabbitMQ).
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": EVENTS_EXCHANGE,
            "messaging.rabbitmq.destination.routing_key": row.routing_key,
            "messaging.message.id": row.event_id,
            "messaging.message.conversation_id": row.subject,
            "messaging.message.body.size": len(row.body),
            **({"fulfilment.order_id": row.order_id} if row.order_id is not None else {}),
            **({"fulfilment.sku": row.sku} if row.sku is not None else {}),
            "fulfilment.outbox.id": row.id,
            "fulfilment.outbox.lag_seconds": round(row.age_seconds, 6),
        },
    )


def _end_publish_span(span: Span, publish: asyncio.Task[object]) -> None:
    """End a publish span with the publish's outcome: confirmed, refused, or lost."""
    if publish.cancelled():
        span.set_status(StatusCode.ERROR, "no confirm from the broker in time")
    elif (error := publish.exception()) is not None:
        span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
    span.end()


async def _quietly(closing: Awaitable[object]) -> None:
    """Await a close of a connection that may be broken already; its errors say nothing new."""
    try:
        await closing
    except (*RECONNECT_ERRORS, asyncpg.PostgresError):
        pass
