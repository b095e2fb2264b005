"""Dead letters that explain themselves.

When the service gives up on a delivery it publishes the message, body and ids unchanged, to
the dead-letter exchange with headers saying why, waits for the broker's publisher confirm,
and only then lets the original be acknowledged: a crash between the two leaves a copy in each
queue (at least once), never none. While the broker refuses the dead letter (a full DLQ), the
delivery policy holds the original unacknowledged and tries again (``publish_holding``), on a
new channel each time (:class:`DeadLetterChannel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import aio_pika
import aiormq.exceptions

from fulfilment import __version__
from fulfilment.adapters.rabbitmq.publishing import resent
from fulfilment.backoff import doubling_wait
from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.dead_letter import (
    BROKER_HEADER_PREFIXES,
    BROKER_HEADERS,
    HEADER_PREFIX,
    REPLAY_HEADERS,
    FailureClass,
)
from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE

if TYPE_CHECKING:
    from faststream.rabbit.message import RabbitMessage

    from fulfilment.observability.metrics import Metrics

__all__ = [
    "HEADER_PREFIX",
    "DeadLetterChannel",
    "DeadLetterPublisher",
    "Failure",
    "FailureClass",
    "begin_delivery",
    "dead_letter_headers",
    "dead_letter_message",
    "delivery_count",
    "publish_holding",
    "record_retry",
]

DEAD_LETTER_RETRY_FIRST_SECONDS = 1.0
"""Wait before trying a refused dead letter again; doubled after each refusal."""
DEAD_LETTER_RETRY_MAX_SECONDS = 30.0
"""Longest wait between two tries of a dead letter the broker keeps refusing."""

DEAD_LETTER_REFUSALS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,  # a nack (DeliveryError), a return (PublishError), a channel
    aiormq.exceptions.ChannelInvalidStateError,  # its channel closed under it
    TimeoutError,  # no confirm in time
    ConnectionError,
)
"""How a broker refuses a dead letter: each is tried again while the delivery is held."""

MAX_HEADER_TEXT = 1_000
"""Characters kept of an exception message or reason: headers travel with every copy."""
MAX_STACK_FRAMES = 8
"""Innermost frames kept of a stack trace: where it failed, not the whole framework."""


@dataclass(slots=True)
class _Retries:
    """Database retries of the current delivery, fed by the retry policy's hook."""

    count: int = 0
    first_failure_at: datetime | None = None


_retries: ContextVar[_Retries | None] = ContextVar("fulfilment_delivery_retries", default=None)
"""Per delivery: each delivery runs in a task of its own (aiormq starts one per delivery), and
the retry hook runs in the handler's task, so a context variable attributes retries to the
right delivery without passing anything through the use case or the warehouse port."""


def begin_delivery() -> None:
    """Forget the retries of any earlier delivery handled in this context (cheap: no object)."""
    _retries.set(None)


def record_retry() -> None:
    """Count one failed database attempt of the current delivery (the retry policy's hook)."""
    retries = _retries.get()
    if retries is None:
        retries = _Retries(first_failure_at=datetime.now(UTC))
        _retries.set(retries)
    retries.count += 1


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure: ``reason`` is one human-readable line."""

    failure_class: FailureClass
    reason: str
    error: BaseException | None = None


def dead_letter_headers(
    message: RabbitMessage, failure: Failure, *, queue: str, now: datetime | None = None
) -> dict[str, Any]:
    """The original headers plus ``x-fulfilment-*`` headers describing ``failure``.

    The producer's headers are kept; the broker's dead-letter and redelivery headers
    (``x-death``, ``x-delivery-count``, ``x-first-death-*``, ``x-last-death-*``) are dropped,
    their facts being in the headers below, and so is every ``x-fulfilment-*`` header the
    delivery carried but the two a replay adds (``replay-id``, ``replayed-at``): whatever a
    sender wrote in them, a dead letter's headers say what the service saw. Written (names in
    ``fulfilment.contracts.dead_letter``):
    ``failure-class``, ``reason``, ``exception-type``, ``exception-message``, ``stack`` (the
    innermost :data:`MAX_STACK_FRAMES` frames), ``delivery-count`` (earlier deliveries, see
    :func:`delivery_count`: 0 on a first delivery), ``attempts`` (database
    attempts in the last delivery: retries + 1), ``first-failure-at`` and ``last-failure-at``
    (the first failed attempt of the last delivery, and the final failure), ``dead-lettered-at``
    (ISO 8601, UTC), ``service-version``, ``host``, ``original-queue``, ``original-exchange``
    and ``original-routing-key``.
    """
    raw = message.raw_message
    moment = (now or datetime.now(UTC)).isoformat()
    retries = _retries.get()
    headers: dict[str, Any] = {
        key: value
        for key, value in (raw.headers or {}).items()
        if key not in BROKER_HEADERS
        and not key.startswith(BROKER_HEADER_PREFIXES)
        and (not key.startswith(HEADER_PREFIX) or key in REPLAY_HEADERS)
    }
    error = failure.error
    headers.update(
        {
            h.FAILURE_CLASS: str(failure.failure_class),
            h.REASON: _clip(failure.reason),
            h.EXCEPTION_TYPE: type(error).__qualname__ if error else "",
            h.EXCEPTION_MESSAGE: _clip(str(error)) if error else "",
            h.STACK: _stack(error),
            h.DELIVERY_COUNT: delivery_count(raw.headers, redelivered=bool(raw.redelivered)),
            h.ATTEMPTS: 1 + (retries.count if retries else 0),
            h.FIRST_FAILURE_AT: (
                retries.first_failure_at.isoformat()
                if retries and retries.first_failure_at
                else moment
            ),
            h.LAST_FAILURE_AT: moment,
            h.DEAD_LETTERED_AT: moment,
            h.SERVICE_VERSION: __version__,
            h.HOST: _host(),
            h.ORIGINAL_QUEUE: queue,
            h.ORIGINAL_EXCHANGE: raw.exchange or "",
            h.ORIGINAL_ROUTING_KEY: raw.routing_key or "",
        }
    )
    return headers


def dead_letter_message(
    message: RabbitMessage, failure: Failure, *, queue: str
) -> aio_pika.Message:
    """The dead letter of ``message``: its body, ids and properties, :func:`dead_letter_headers`.

    Persistent; no expiration, priority or reply address (a dead letter must not expire in
    the DLQ, nor be answered), ``app_id`` the service's.
    """
    return resent(
        message.raw_message,
        dead_letter_headers(message, failure, queue=queue),
        app_id=f"fulfilment-{__version__}",
    )


class DeadLetterPublisher(Protocol):
    """Publishes one dead letter to the dead-letter exchange with ``mandatory``, confirmed.

    Dead letters are routed by the name of the queue they died in (``routing_key``), which is
    how each queue's DLQ is bound to the dead-letter exchange (``contracts.topology``).
    Returns once the broker confirmed the message; raises otherwise, e.g.
    ``aiormq.exceptions.DeliveryError`` (a nack), ``aiormq.exceptions.PublishError`` (returned:
    no queue bound) or ``TimeoutError`` (no confirm within ``timeout_seconds``).
    """

    async def __call__(
        self, letter: aio_pika.Message, *, routing_key: str, timeout_seconds: float
    ) -> None:
        """Publish ``letter``; return once confirmed, raise otherwise."""


class DeadLetterChannel:
    """Dead letters on a channel of the broker's connection of their own, renewed after an error.

    A quorum queue with ``reject-publish`` overflow that refused a message from a channel goes
    on refusing every later one from that channel, even once its length cap is lifted; a new
    channel is taken at once (RabbitMQ 3.10.8, verified). Publishing dead letters on the
    broker's default channel would leave the worker unable to dead-letter anything after the
    DLQ was full once. So dead letters have a channel of their own, closed after any failed
    publish: the next try opens a new one.

    ``connect`` returns the broker's (robust) connection: ``RabbitBroker.connect``, which is
    idempotent; the channel closes with that connection when the broker stops.
    """

    def __init__(self, connect: Callable[[], Awaitable[aio_pika.abc.AbstractConnection]]) -> None:
        self._connect = connect
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._opening = asyncio.Lock()

    async def publish(
        self, letter: aio_pika.Message, *, routing_key: str, timeout_seconds: float
    ) -> None:
        """Publish ``letter`` (a :class:`DeadLetterPublisher`), confirmed by the broker.

        Raises:
            aiormq.exceptions.DeliveryError: the broker refused (nack) or returned it.
            TimeoutError: no confirm within ``timeout_seconds``.
            aiormq.exceptions.AMQPError, ConnectionError: the channel or connection failed.
        """
        channel = await self._open()
        try:
            exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE, ensure=False)
            await exchange.publish(
                letter, routing_key=routing_key, mandatory=True, timeout=timeout_seconds
            )
        except Exception:
            await self._discard(channel)
            raise

    async def _open(self) -> aio_pika.abc.AbstractChannel:
        async with self._opening:  # deliveries failing together open one channel, not many
            if self._channel is None or self._channel.is_closed:
                connection = await self._connect()
                self._channel = await connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
            return self._channel

    async def _discard(self, channel: aio_pika.abc.AbstractChannel) -> None:
        if self._channel is channel:
            self._channel = None
        if not channel.is_closed:
            with contextlib.suppress(Exception):  # it failed already; the next try opens anew
                await channel.close()


async def publish_holding(
    publish: Callable[[], Awaitable[None]],
    *,
    hold_seconds: float,
    metrics: Metrics,
    refused: Callable[[BaseException, float, float | None], None],
) -> float | None:
    """Publish a dead letter by ``publish``, confirmed; try again while the broker refuses it.

    The caller holds its delivery unacknowledged meanwhile, so the message stays in its queue.
    Returns the seconds it was held (0.0 when the first try was confirmed), or None when the
    broker still refused the dead letter after ``hold_seconds`` (the caller sends the delivery
    back to its queue). Each refusal (:data:`DEAD_LETTER_REFUSALS`) counts in
    ``fulfilment_dead_letter_publish_failures_total`` and calls ``refused`` with the error,
    the seconds held so far and the wait before the next try (None: no more tries); while
    held, the delivery counts in ``fulfilment_dead_letters_held``.

    Raises:
        Exception: anything but a refusal from ``publish``, counted as a failure too.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Not tenacity's AsyncRetrying: the give-up is decided on the next wait, and logged with
    # it, before that wait is slept (fulfilment.backoff).
    refusals = 0
    held = False
    try:
        while True:
            try:
                await publish()
            except DEAD_LETTER_REFUSALS as error:
                metrics.dead_letter_publish_failures.inc()
                if not held:
                    held = True
                    metrics.dead_letters_held.inc()
                held_seconds = loop.time() - started
                wait = doubling_wait(
                    refusals,
                    first=DEAD_LETTER_RETRY_FIRST_SECONDS,
                    cap=DEAD_LETTER_RETRY_MAX_SECONDS,
                )
                refusals += 1
                give_up = held_seconds + wait > hold_seconds
                refused(error, held_seconds, None if give_up else wait)
                if give_up:
                    return None
                await asyncio.sleep(wait)
            except Exception:
                metrics.dead_letter_publish_failures.inc()
                raise
            else:
                return loop.time() - started
    finally:
        if held:
            metrics.dead_letters_held.dec()


def delivery_count(headers: Mapping[str, object] | None, *, redelivered: bool) -> int:
    """Earlier deliveries of a message: 0 on a first delivery, else the broker's count (>= 1).

    ``redelivered`` is the broker's flag of the delivery, which no sender can set; the
    ``x-delivery-count`` header is only believed with it. A quorum queue writes the header on
    redeliveries, but passes a first delivery's headers on as the sender wrote them (RabbitMQ
    3.10, verified: a published ``x-delivery-count: 4`` reached the consumer). RabbitMQ 4.3
    stopped counting plain returns and ``basic.nack`` requeues towards the header (docs/design.md,
    "Broker versions"), hence at least 1 on any redelivery.
    """
    if not redelivered:
        return 0
    value = (headers or {}).get("x-delivery-count")
    counted = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return max(1, counted)


@functools.cache
def _host() -> str:
    # The pod's name in Kubernetes: read once, it does not change while the process runs.
    return socket.gethostname()


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_HEADER_TEXT else text[: MAX_HEADER_TEXT - 1] + "…"


def _stack(error: BaseException | None) -> str:
    if error is None or error.__traceback__ is None:
        return ""
    frames = traceback.extract_tb(error.__traceback__)[-MAX_STACK_FRAMES:]
    return _clip(" | ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames))
