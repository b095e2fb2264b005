"""Deliveries as RabbitMQ hands them over, for subscribers on FastStream's in-memory broker.

``TestRabbitBroker`` builds every message as a first delivery and settles nothing; these
helpers build first deliveries and redeliveries alike, hand them to a subscriber the way the
in-memory broker does (``process_message``), and record how the subscriber settled each one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import AsyncMock

import aio_pika
import aiormq
import pytest
from faststream.rabbit import RabbitBroker
from faststream.rabbit.message import RabbitMessage
from faststream.rabbit.subscriber import RabbitSubscriber
from faststream.rabbit.testing import PatchedMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE
from fulfilment.worker.dead_lettering import DeadLetterPublisher


def incoming(
    body: bytes,
    *,
    exchange: str = "orders",
    routing_key: str = "order.placed",
    redelivered: bool = False,
    content_type: str | None = "application/json",
    headers: dict[str, Any] | None = None,
    message_id: str | None = None,
    reply_to: str | None = None,
    channel: AsyncMock | None = None,
) -> PatchedMessage:
    """A delivery of ``body``; a redelivery carries the broker's ``x-delivery-count`` >= 1.

    It comes on ``channel`` (an open channel of its own by default), as delivery tag 1.
    """
    if redelivered:
        headers = {"x-delivery-count": 1, **(headers or {})}
    return PatchedMessage(
        aiormq.abc.DeliveredMessage(
            delivery=spec.Basic.Deliver(
                exchange=exchange,
                routing_key=routing_key,
                redelivered=redelivered,
                # Each delivery comes on a channel of its own (below), so each is its first.
                delivery_tag=1,
            ),
            header=ContentHeader(
                properties=spec.Basic.Properties(
                    content_type=content_type,
                    headers=headers or {},
                    message_id=message_id or uuid.uuid4().hex,
                    reply_to=reply_to,
                )
            ),
            body=body,
            channel=channel or AsyncMock(is_closed=False),
        )
    )


async def deliver(subscriber: RabbitSubscriber, message: PatchedMessage) -> None:
    """Hand ``message`` to ``subscriber`` as the in-memory broker does (errors propagate)."""
    await subscriber.process_message(message)


@contextmanager
def settlements(monkeypatch: pytest.MonkeyPatch, exchange: str) -> Iterator[list[str]]:
    """Record how FastStream settles each delivery from ``exchange``: ``ack``, ``reject`` or
    ``reject:requeue`` (the in-memory broker itself settles nothing)."""
    made: list[str] = []
    ack, reject = RabbitMessage.ack, RabbitMessage.reject

    async def record_ack(self: RabbitMessage, multiple: bool = False) -> None:  # noqa: FBT001, FBT002 - FastStream's signature
        if self.raw_message.exchange == exchange:
            made.append("ack")
        await ack(self, multiple)

    async def record_reject(self: RabbitMessage, requeue: bool = False) -> None:  # noqa: FBT001, FBT002 - FastStream's signature
        if self.raw_message.exchange == exchange:
            made.append("reject:requeue" if requeue else "reject")
        await reject(self, requeue)

    with monkeypatch.context() as patch:
        patch.setattr(RabbitMessage, "ack", record_ack)
        patch.setattr(RabbitMessage, "reject", record_reject)
        yield made


def in_memory_dead_letters(broker: RabbitBroker) -> DeadLetterPublisher:
    """Dead letters published through FastStream's in-memory broker, so that a subscriber bound
    to the dead-letter exchange receives them (the worker's own channel needs a real broker)."""

    async def publish(
        letter: aio_pika.Message, *, routing_key: str, timeout_seconds: float
    ) -> None:
        await broker.publish(
            letter.body,
            exchange=DEAD_LETTER_EXCHANGE,
            routing_key=routing_key,
            headers=letter.headers,
            message_id=letter.message_id,
            correlation_id=letter.correlation_id,
            content_type=letter.content_type,
            content_encoding=letter.content_encoding,
            timestamp=letter.timestamp,
            message_type=letter.type,
            persist=True,
            timeout=timeout_seconds,
        )

    return publish
