"""The private attributes ``worker.faststream_internals`` reads, on the installed libraries.

An upgrade of FastStream or aio-pika that renames or moves them fails here, not in a worker
whose consumer control silently sees no consumer.
"""

from __future__ import annotations

import typing

import aio_pika
import aiormq
import aiormq.abc
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.subscriber import RabbitSubscriber

from fulfilment.worker.faststream_internals import (
    CHANNEL_ATTRIBUTE,
    SUBSCRIBER_ATTRIBUTES,
    broker_consumer_tags,
    consumed_queue,
    consumer_tag,
    forget_consumer_tag,
)


def _subscriber() -> RabbitSubscriber:
    subscriber = RabbitBroker().subscriber(RabbitQueue("test.internals"))
    assert isinstance(subscriber, RabbitSubscriber)
    return subscriber


def test_a_real_subscriber_has_the_attributes_read_and_none_before_it_starts() -> None:
    subscriber = _subscriber()

    for name in SUBSCRIBER_ATTRIBUTES:
        assert name in RabbitSubscriber.__slots__
        assert getattr(subscriber, name) is None
    assert consumed_queue(subscriber) is None
    assert consumer_tag(subscriber) is None


def test_the_consumer_tag_is_read_and_forgotten_through_the_attribute() -> None:
    subscriber = _subscriber()
    subscriber._consumer_tag = "ctag1.abc"

    assert consumer_tag(subscriber) == "ctag1.abc"
    forget_consumer_tag(subscriber)
    assert subscriber._consumer_tag is None
    assert consumer_tag(subscriber) is None


def test_aio_pikas_channel_holds_the_aiormq_channel_under_the_attribute_read() -> None:
    hints = typing.get_type_hints(aio_pika.Channel)
    underlay = typing.get_args(hints[CHANNEL_ATTRIBUTE])[0]  # Optional[UnderlayChannel]

    assert typing.get_type_hints(underlay)["channel"] is aiormq.abc.AbstractChannel
    assert "consumers" in aiormq.Channel.__init__.__code__.co_names


def test_a_channel_without_its_aiormq_channel_delivers_to_no_consumer() -> None:
    class Closed:
        _channel = None

    assert broker_consumer_tags(Closed()) == frozenset()  # type: ignore[arg-type]
