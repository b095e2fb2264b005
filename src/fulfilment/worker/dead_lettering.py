"""Dead letters that explain themselves.

When the service gives up on a delivery it publishes the message, body and ids unchanged, to
the dead-letter exchange with headers saying why, waits for the broker's publisher confirm,
and only then lets the original be acknowledged: a crash between the two leaves a copy in each
queue (at least once), never none. If that publish fails, the handler raises and the
``REJECT_ON_ERROR`` policy rejects the delivery, so the broker dead-letters it by itself
(``x-death`` only, no reason headers): still not lost.
"""

from __future__ import annotations

import functools
import socket
import traceback
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fulfilment import __version__
from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.dead_letter import (
    BROKER_HEADER_PREFIXES,
    BROKER_HEADERS,
    HEADER_PREFIX,
    FailureClass,
)
from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE

if TYPE_CHECKING:
    from faststream.rabbit import RabbitBroker
    from faststream.rabbit.message import RabbitMessage

__all__ = [
    "HEADER_PREFIX",
    "Failure",
    "FailureClass",
    "begin_delivery",
    "dead_letter_headers",
    "delivery_count",
    "publish_dead_letter",
    "record_retry",
]

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
    their facts being in the headers below (names in ``fulfilment.contracts.dead_letter``):
    ``failure-class``, ``reason``, ``exception-type``, ``exception-message``, ``stack`` (the
    innermost :data:`MAX_STACK_FRAMES` frames), ``delivery-count`` (the broker's
    ``x-delivery-count``: earlier deliveries, 0 on a first delivery), ``attempts`` (database
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
        if key not in BROKER_HEADERS and not key.startswith(BROKER_HEADER_PREFIXES)
    }
    error = failure.error
    headers.update(
        {
            h.FAILURE_CLASS: str(failure.failure_class),
            h.REASON: _clip(failure.reason),
            h.EXCEPTION_TYPE: type(error).__qualname__ if error else "",
            h.EXCEPTION_MESSAGE: _clip(str(error)) if error else "",
            h.STACK: _stack(error),
            h.DELIVERY_COUNT: delivery_count(raw.headers),
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


async def publish_dead_letter(  # noqa: PLR0913 - each part of the dead letter, by name
    broker: RabbitBroker,
    message: RabbitMessage,
    failure: Failure,
    *,
    queue: str,
    routing_key: str,
    timeout_seconds: float,
) -> None:
    """Publish ``message`` to the DLQ with :func:`dead_letter_headers`, confirmed by the broker.

    ``queue`` is the queue it died in; ``routing_key`` routes it through the dead-letter
    exchange to that queue's DLQ: the queue's ``x-dead-letter-routing-key``, its own name
    (``contracts.topology.SubscribedQueue``), so the broker's dead letters and the service's
    reach the same DLQ.

    Raises:
        aiormq.exceptions.DeliveryError: the broker refused or could not route the message
            (the broker's channel is built with ``on_return_raises=True``).
        TimeoutError: no confirm within ``timeout_seconds``.
    """
    raw = message.raw_message
    await broker.publish(
        raw.body,
        exchange=DEAD_LETTER_EXCHANGE,
        routing_key=routing_key,
        headers=dead_letter_headers(message, failure, queue=queue),
        message_id=raw.message_id,
        correlation_id=raw.correlation_id,
        content_type=raw.content_type,
        content_encoding=raw.content_encoding,
        timestamp=raw.timestamp,
        message_type=raw.type,
        persist=True,
        mandatory=True,
        timeout=timeout_seconds,
    )


def delivery_count(headers: Mapping[str, object] | None) -> int:
    """Earlier deliveries of a message: the broker's ``x-delivery-count``, absent (0) at first.

    Quorum queues set the header on redeliveries; RabbitMQ 4.3 stopped counting plain returns
    and ``basic.nack`` requeues towards it (see README, "Broker versions").
    """
    value = (headers or {}).get("x-delivery-count", 0)
    return value if isinstance(value, int) else 0


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
