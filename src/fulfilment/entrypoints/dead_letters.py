"""Dead letters that explain themselves.

When the service gives up on a delivery it publishes the message, body and ids unchanged, to
the dead-letter exchange with headers saying why, waits for the broker's publisher confirm,
and only then lets the original be acknowledged: a crash between the two leaves a copy in each
queue (at least once), never none. If that publish fails, the handler raises and the
``REJECT_ON_ERROR`` policy rejects the delivery, so the broker dead-letters it by itself
(``x-death`` only, no reason headers): still not lost.
"""

from __future__ import annotations

import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from fulfilment import __version__
from fulfilment.entrypoints.topology import DEAD_LETTER_EXCHANGE, DEAD_LETTER_ROUTING_KEY

if TYPE_CHECKING:
    from faststream.rabbit import RabbitBroker
    from faststream.rabbit.message import RabbitMessage

HEADER_PREFIX = "x-fulfilment-"
MAX_HEADER_TEXT = 1_000
"""Characters kept of an exception message or reason: headers travel with every copy."""
MAX_STACK_FRAMES = 8
"""Innermost frames kept of a stack trace: where it failed, not the whole framework."""


class FailureClass(StrEnum):
    """Why the service gave up on a delivery; the ``x-fulfilment-failure-class`` header.

    ``permanent``: the payload can never succeed (malformed, unknown version); dead-lettered
    on its first delivery. ``transient_exhausted``: the database kept failing in a retryable
    way past the retry budget or the handler deadline; replaying it later is expected to
    succeed. ``unexpected``: an error the service does not know (a bug); replay after the fix.
    """

    PERMANENT = "permanent"
    TRANSIENT_EXHAUSTED = "transient_exhausted"
    UNEXPECTED = "unexpected"


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

    Headers: ``failure-class``, ``reason``, ``exception-type``, ``exception-message``,
    ``stack`` (the innermost :data:`MAX_STACK_FRAMES` frames), ``delivery-count`` (the
    broker's ``x-delivery-count``, 0 on a first delivery), ``dead-lettered-at`` (ISO 8601,
    UTC), ``service-version``, ``host``, ``original-queue``, ``original-exchange`` and
    ``original-routing-key``.
    """
    raw = message.raw_message
    moment = (now or datetime.now(UTC)).isoformat()
    headers: dict[str, Any] = {
        key: value for key, value in (raw.headers or {}).items() if not key.startswith("x-death")
    }
    error = failure.error
    headers.update(
        {
            f"{HEADER_PREFIX}failure-class": str(failure.failure_class),
            f"{HEADER_PREFIX}reason": _clip(failure.reason),
            f"{HEADER_PREFIX}exception-type": type(error).__qualname__ if error else "",
            f"{HEADER_PREFIX}exception-message": _clip(str(error)) if error else "",
            f"{HEADER_PREFIX}stack": _stack(error),
            f"{HEADER_PREFIX}delivery-count": delivery_count(raw.headers),
            f"{HEADER_PREFIX}dead-lettered-at": moment,
            f"{HEADER_PREFIX}service-version": __version__,
            f"{HEADER_PREFIX}host": socket.gethostname(),
            f"{HEADER_PREFIX}original-queue": queue,
            f"{HEADER_PREFIX}original-exchange": raw.exchange or "",
            f"{HEADER_PREFIX}original-routing-key": raw.routing_key or "",
        }
    )
    return headers


async def publish_dead_letter(
    broker: RabbitBroker,
    message: RabbitMessage,
    failure: Failure,
    *,
    queue: str,
    timeout_seconds: float,
) -> None:
    """Publish ``message`` to the DLQ with :func:`dead_letter_headers`, confirmed by the broker.

    Raises:
        aiormq.exceptions.DeliveryError: the broker refused or could not route the message
            (the broker's channel is built with ``on_return_raises=True``).
        TimeoutError: no confirm within ``timeout_seconds``.
    """
    raw = message.raw_message
    await broker.publish(
        raw.body,
        exchange=DEAD_LETTER_EXCHANGE,
        routing_key=DEAD_LETTER_ROUTING_KEY,
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


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_HEADER_TEXT else text[: MAX_HEADER_TEXT - 1] + "…"


def _stack(error: BaseException | None) -> str:
    if error is None or error.__traceback__ is None:
        return ""
    frames = traceback.extract_tb(error.__traceback__)[-MAX_STACK_FRAMES:]
    return _clip(" | ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames))
