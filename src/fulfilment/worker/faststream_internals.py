"""The private state of FastStream's ``RabbitSubscriber`` (and aio-pika's channel) the worker reads.

The consumer control (``worker.consumer_control``) needs what neither library offers in public:
the queue a subscriber consumes from, its consumer tag, and the aiormq channel under aio-pika's
robust one, whose consumers the broker's own cancels remove. They are the attributes of the
pinned versions (FastStream 0.7.8, aio-pika 10.2.1), read here alone, so that an upgrade that
moves them fails one test (``tests/unit/test_faststream_internals.py``) and changes one module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aio_pika.abc
    from faststream.rabbit.subscriber import RabbitSubscriber

SUBSCRIBER_ATTRIBUTES = ("_queue_obj", "_consumer_tag")
"""The private attributes of ``RabbitSubscriber`` this module reads (and writes)."""

CHANNEL_ATTRIBUTE = "_channel"
"""aio-pika's channel's attribute holding the aiormq channel (None while it is closed)."""


def consumed_queue(subscriber: RabbitSubscriber) -> aio_pika.abc.AbstractQueue | None:
    """The aio-pika queue ``subscriber`` consumes from; None before it started."""
    return subscriber._queue_obj  # noqa: SLF001 - FastStream has no public accessor


def consumer_tag(subscriber: RabbitSubscriber) -> str | None:
    """``subscriber``'s consumer tag; None when it is not consuming (or was cancelled)."""
    tag = subscriber._consumer_tag  # noqa: SLF001 - FastStream has no public accessor
    return None if tag is None else str(tag)


def forget_consumer_tag(subscriber: RabbitSubscriber) -> None:
    """Clear ``subscriber``'s consumer tag, as FastStream does once it cancelled the consumer.

    Its ``stop()`` then sends no second ``basic.cancel`` for a consumer already cancelled.
    """
    subscriber._consumer_tag = None  # noqa: SLF001 - FastStream has no public setter


def broker_consumer_tags(channel: aio_pika.abc.AbstractChannel) -> frozenset[str]:
    """The consumer tags the broker still delivers to on ``channel`` (none while it is closed).

    aiormq drops a tag from its channel's consumers when the broker cancels it (the queue was
    deleted, a node holding it left), which aio-pika's channel does not say.
    """
    underlay = getattr(channel, CHANNEL_ATTRIBUTE, None)
    if underlay is None:
        return frozenset()
    return frozenset(underlay.channel.consumers)
