"""``ChannelAcks`` against a channel that settles deliveries the way RabbitMQ does.

The fake channel keeps the broker's side of AMQP 0-9-1 settlement: the tags it delivered and
not yet had settled, ``basic.ack`` with ``multiple`` settling every such tag up to its own,
and an unknown tag closing the channel (``PRECONDITION_FAILED``). What must hold, whatever the
order the deliveries settle in: a frame never settles a delivery whose ack was not decided
(one still in flight, or one rejected), every decided ack reaches the broker, and acks decided
together with no earlier delivery in flight go out as one frame.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aio_pika
import aiormq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp.header import ContentHeader

from fulfilment.worker.acknowledgements import ChannelAcks

CLOSED = "closed under it"


class UnknownDeliveryTagError(Exception):
    """What the broker answers with a channel error: a settlement of a tag not outstanding."""


@dataclass(eq=False)  # hashed by identity, as an aiormq channel is
class BrokerChannel:
    """The broker's view of one channel's deliveries, and the frames it got."""

    outstanding: set[int] = field(default_factory=set)
    frames: list[tuple[str, int, bool]] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    is_closed: bool = False
    delivered: int = 0

    def deliver(self) -> aio_pika.IncomingMessage:
        self.delivered += 1
        self.outstanding.add(self.delivered)
        return aio_pika.IncomingMessage(
            aiormq.abc.DeliveredMessage(
                delivery=spec.Basic.Deliver(delivery_tag=self.delivered, routing_key="test"),
                header=ContentHeader(properties=spec.Basic.Properties()),
                body=b"{}",
                channel=self,  # type: ignore[arg-type]
            )
        )

    async def basic_ack(
        self, delivery_tag: int, *, multiple: bool = False, wait: bool = True
    ) -> None:
        del wait
        self._settle(delivery_tag)
        self.frames.append(("ack", delivery_tag, multiple))
        covered = {tag for tag in self.outstanding if tag <= delivery_tag} if multiple else set()
        for tag in covered | {delivery_tag}:
            self.outstanding.discard(tag)
            self.acked.add(tag)

    async def basic_reject(
        self, delivery_tag: int, *, requeue: bool = True, wait: bool = True
    ) -> None:
        del requeue, wait
        self._settle(delivery_tag)
        self.frames.append(("reject", delivery_tag, False))
        self.outstanding.discard(delivery_tag)
        self.rejected.add(delivery_tag)

    def _settle(self, tag: int) -> None:
        if tag not in self.outstanding:
            raise UnknownDeliveryTagError(tag)


async def test_acks_decided_together_go_out_as_one_multiple_ack() -> None:
    broker = BrokerChannel()
    acks = ChannelAcks()
    messages = [broker.deliver() for _ in range(5)]

    await asyncio.gather(*(acks.ack(message) for message in messages))

    assert broker.frames == [("ack", 5, True)]
    assert broker.acked == {1, 2, 3, 4, 5}
    assert broker.outstanding == set()


async def test_an_ack_above_a_delivery_in_flight_goes_out_alone_and_leaves_it_unacknowledged() -> (
    None
):
    broker = BrokerChannel()
    acks = ChannelAcks()
    first, second, third = (broker.deliver() for _ in range(3))

    await asyncio.gather(acks.ack(first), acks.ack(third))

    assert broker.frames == [("ack", 1, True), ("ack", 3, False)]
    assert broker.outstanding == {2}

    await acks.ack(second)
    assert broker.frames[-1] == ("ack", 2, True)
    assert broker.outstanding == set()


async def test_a_multiple_ack_passes_over_a_rejected_delivery_without_acknowledging_it() -> None:
    broker = BrokerChannel()
    acks = ChannelAcks()
    first, second, third = (broker.deliver() for _ in range(3))

    await acks.reject(second, requeue=True)
    await asyncio.gather(acks.ack(first), acks.ack(third))

    assert broker.frames == [("reject", 2, False), ("ack", 3, True)]
    assert broker.acked == {1, 3}
    assert broker.rejected == {2}


async def test_a_delivery_never_settled_keeps_the_later_acks_single() -> None:
    broker = BrokerChannel()
    acks = ChannelAcks()
    unsettled, *later = (broker.deliver() for _ in range(4))

    await asyncio.gather(*(acks.ack(message) for message in later))

    assert broker.frames == [("ack", 2, False), ("ack", 3, False), ("ack", 4, False)]
    assert broker.outstanding == {unsettled.delivery_tag}


async def test_an_acknowledged_message_is_locked_so_that_faststream_sends_nothing_more() -> None:
    broker = BrokerChannel()
    message = broker.deliver()

    await ChannelAcks().ack(message)

    assert message.locked


async def test_a_new_channel_numbers_its_deliveries_afresh() -> None:
    acks = ChannelAcks()
    old = BrokerChannel()
    await acks.ack(old.deliver())
    old.is_closed = True
    new = BrokerChannel()

    await asyncio.gather(acks.ack(new.deliver()), acks.ack(new.deliver()))

    assert new.frames == [("ack", 2, True)]


async def test_an_ack_on_a_closed_channel_raises_and_sends_nothing() -> None:
    broker = BrokerChannel()
    message = broker.deliver()
    broker.is_closed = True

    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        await ChannelAcks().ack(message)
    assert broker.frames == []


async def test_a_failed_write_reaches_every_delivery_waiting_on_it() -> None:
    class Failing(BrokerChannel):
        async def basic_ack(self, *_: object, **__: object) -> None:
            raise aiormq.exceptions.ChannelInvalidStateError(CLOSED)

    broker = Failing()
    acks = ChannelAcks()
    results = await asyncio.gather(
        acks.ack(broker.deliver()), acks.ack(broker.deliver()), return_exceptions=True
    )

    assert [type(result) for result in results] == [aiormq.exceptions.ChannelInvalidStateError] * 2


async def test_a_cancelled_waiter_does_not_cancel_the_others_acks() -> None:
    broker = BrokerChannel()
    acks = ChannelAcks()
    first, second = broker.deliver(), broker.deliver()
    waiting = asyncio.create_task(acks.ack(first))
    other = asyncio.create_task(acks.ack(second))
    await asyncio.sleep(0)
    waiting.cancel()

    await other
    assert broker.acked == {1, 2}


# Each delivery is settled one way, in some order, in rounds of the event loop: the acks of a
# round are decided together, as those of one committed batch are.
SETTLEMENTS = st.sampled_from(["ack", "reject", "requeue", "never"])


@settings(max_examples=300, deadline=None)
@given(
    plan=st.lists(SETTLEMENTS, min_size=1, max_size=40),
    order=st.randoms(use_true_random=False),
    rounds=st.integers(min_value=1, max_value=8),
)
def test_whatever_the_order_only_decided_acks_are_acknowledged_and_all_of_them_are(
    plan: list[str], order: object, rounds: int
) -> None:
    broker = BrokerChannel()
    messages = [broker.deliver() for _ in plan]
    settling = [
        (message, how) for message, how in zip(messages, plan, strict=True) if how != "never"
    ]
    order.shuffle(settling)  # type: ignore[attr-defined]

    async def settle_all() -> None:
        acks = ChannelAcks()
        size = max(1, len(settling) // rounds)
        for start in range(0, len(settling), size):
            batch = settling[start : start + size]
            await asyncio.gather(
                *(
                    acks.ack(message)
                    if how == "ack"
                    else acks.reject(message, requeue=how == "requeue")
                    for message, how in batch
                )
            )

    asyncio.run(settle_all())  # an unknown or settled tag would raise out of here

    decided = {message.delivery_tag for message, how in settling if how == "ack"}
    never = {
        message.delivery_tag for message, how in zip(messages, plan, strict=True) if how == "never"
    }
    assert broker.acked == decided
    assert broker.outstanding == never
    assert sum(1 for frame in broker.frames if frame[0] == "ack") <= len(decided)
