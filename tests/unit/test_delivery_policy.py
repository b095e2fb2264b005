"""The delivery policy with a trivial handler, on FastStream's in-memory broker.

Whatever the event, every delivery ends handled (acknowledged), dead-lettered with a reason
(published, then acknowledged; held while the broker refuses the dead letter), requeued, or
rejected when publishing the dead letter failed otherwise than by a refusal; each writes one
log line and counts one outcome.
``TestRabbitBroker`` has no dead-letter exchange or delivery limit, so settlements are
recorded where FastStream makes them (``deliveries.settlements``); the real broker's
behaviour is tested in ``tests/e2e`` and ``tests/faults``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from unittest.mock import AsyncMock

import aio_pika
import aiormq.exceptions
import pytest
from faststream import FastStream
from faststream.exceptions import SubscriberNotFound
from faststream.rabbit import RabbitBroker, RabbitExchange, RabbitQueue, TestRabbitBroker
from faststream.rabbit.message import RabbitMessage
from faststream.rabbit.subscriber import RabbitSubscriber
from pamqp import commands as spec
from pydantic import BaseModel, ConfigDict
from structlog.testing import capture_logs

from fulfilment.application.ports import TransientError
from fulfilment.contracts.envelope import MAX_BODY_BYTES
from fulfilment.entrypoints.worker import new_metrics
from fulfilment.observability.metrics import Metrics
from fulfilment.observability.tracing import current_traceparent, trace_context
from fulfilment.routes.handling import EventRefusedError, Handled, parse_event
from fulfilment.worker import dead_lettering
from fulfilment.worker.consumer_control import ConsumerPause
from fulfilment.worker.dead_lettering import DeadLetterPublisher
from fulfilment.worker.delivery import DeliveryLimits, DeliveryPolicy, raw_body, subscribe
from tests.support.deliveries import deliver, in_memory_dead_letters, incoming, settlements

EXCHANGE = RabbitExchange("events", durable=True)
QUEUE = RabbitQueue("fulfilment.ping", routing_key="ping")
PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)


class PingV1(BaseModel):
    """The trivial event of these tests, strict as every event of the contract."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="Ping v1")

    version: Literal[1]
    event_id: uuid.UUID
    order_id: uuid.UUID


def a_ping(event_id: uuid.UUID | None = None) -> bytes:
    ping = PingV1(version=1, event_id=event_id or uuid.uuid4(), order_id=uuid.uuid4())
    return ping.model_dump_json().encode()


async def handled(body: bytes) -> Handled:
    """The trivial handler: parse, and call it reserved."""
    ping = parse_event(PingV1, body)
    return Handled(
        event_id=ping.event_id,
        order_id=ping.order_id,
        outcome="reserved",
        labels=("reserved", ""),
        latency_since=PLACED_AT,
        log_fields={"skus": None},
    )


BodyHandler = Callable[[bytes], Awaitable[Handled]]
"""A test's handler: the body in (the harness records the trace context it was given)."""


def failing(error: BaseException) -> BodyHandler:
    async def handler(body: bytes) -> Handled:
        parse_event(PingV1, body)
        raise error

    return handler


@dataclass
class Dlq:
    """The dead-letter queue as the broker shows it to a publisher: it nacks the next
    ``refusals`` dead letters (every one when None), as a full DLQ with ``reject-publish``
    does, and takes the others; ``tries`` says what became of each."""

    publish: DeadLetterPublisher
    refusals: int | None = 0
    tries: list[str] = field(default_factory=list)

    async def __call__(
        self, letter: aio_pika.Message, *, routing_key: str, timeout_seconds: float
    ) -> None:
        if self.refusals is None or self.refusals > 0:
            if self.refusals is not None:
                self.refusals -= 1
            self.tries.append("nack")
            raise aiormq.exceptions.DeliveryError(None, spec.Basic.Nack(delivery_tag=1))
        self.tries.append("confirmed")
        await self.publish(letter, routing_key=routing_key, timeout_seconds=timeout_seconds)


@dataclass
class Harness:
    subscriber: RabbitSubscriber
    metrics: Metrics
    pause: ConsumerPause
    calls: list[bytes]
    traces: list[str | None]
    dead_letters: list[RabbitMessage]
    settled: list[str]
    dlq: Dlq
    redeliveries: Counter[uuid.UUID] = field(default_factory=Counter)

    async def deliver(self, body: bytes, **properties: Any) -> None:
        await deliver(
            self.subscriber,
            incoming(body, exchange=EXCHANGE.name, routing_key=QUEUE.routing(), **properties),
        )

    def outcomes(self) -> list[str]:
        return [
            f"{labels['outcome']}:{labels['reason']}"
            for metric in self.metrics.registry.collect()
            if metric.name == "fulfilment_events"
            for sample in metric.samples
            if sample.name.endswith("_total")
            for labels in [sample.labels]
            for _ in range(int(sample.value))
        ]

    def value(self, name: str) -> float:
        found = self.metrics.registry.get_sample_value(name)
        assert found is not None, name
        return found


async def _database_down() -> None:
    raise ConnectionRefusedError


async def _harness(
    handler: BodyHandler,
    monkeypatch: pytest.MonkeyPatch,
    *,
    deadline_seconds: float = 5.0,
    delivery_limit: int = 3,
    capture_dead_letters: bool = True,
    dead_letter_hold_seconds: float = 60.0,
) -> AsyncIterator[Harness]:
    broker = RabbitBroker(apply_types=False, logger=logging.getLogger("faststream"))
    FastStream(broker)  # as in the worker, the app gives the broker its context
    dlq = Dlq(in_memory_dead_letters(broker))
    metrics = new_metrics()
    pause = ConsumerPause(_database_down)
    calls: list[bytes] = []
    traces: list[str | None] = []
    dead_letters: list[RabbitMessage] = []
    redeliveries: Counter[uuid.UUID] = Counter()

    async def count_redelivery(event_id: uuid.UUID) -> int:
        redeliveries[event_id] += 1
        return redeliveries[event_id]

    async def counted(body: bytes) -> Handled:
        calls.append(body)
        traces.append(current_traceparent())
        return await handler(body)

    policy = DeliveryPolicy(
        broker,
        metrics=metrics,
        limits=DeliveryLimits(
            handler_deadline_seconds=deadline_seconds,
            dead_letter_publish_seconds=1.0,
            delivery_limit=delivery_limit,
            dead_letter_hold_seconds=dead_letter_hold_seconds,
        ),
        count_redelivery=count_redelivery,
        pause=pause.trip,
        prefetch_count=4,
        publish_dead_letter=dlq,
    )
    subscriber = subscribe(policy, QUEUE, EXCHANGE, counted, name="ping")
    pause.attach([subscriber])
    if capture_dead_letters:
        # Dead letters are routed by the name of the queue they died in.
        @broker.subscriber(
            RabbitQueue("fulfilment.ping.dlq", routing_key=QUEUE.name),
            RabbitExchange("fulfilment.dlx", durable=True),
            decoder=raw_body,
        )
        async def capture(_body: bytes) -> None:
            # The broker runs without FastDepends (apply_types=False), as the worker's does.
            dead_letters.append(broker.context.get_local("message"))

    with settlements(monkeypatch, EXCHANGE.name) as settled:
        async with TestRabbitBroker(broker):
            try:
                yield Harness(
                    subscriber,
                    metrics,
                    pause,
                    calls,
                    traces,
                    dead_letters,
                    settled,
                    dlq,
                    redeliveries,
                )
            finally:
                await pause.close()


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs() as captured:
        yield captured


def lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policy's lines, one per delivery (``ping.*``)."""
    return [line for line in logs if line["event"].startswith("ping.")]


async def test_a_handled_event_is_acknowledged_logged_and_counted_once(monkeypatch, logs) -> None:
    async for harness in _harness(handled, monkeypatch):
        event_id = uuid.uuid4()
        await harness.deliver(a_ping(event_id), message_id="m-1")

        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["reserved:"]
        assert harness.dead_letters == []
        assert harness.value("fulfilment_order_latency_seconds_count") == 1
        assert harness.value("fulfilment_handler_duration_seconds_count") == 1
        assert harness.value("fulfilment_messages_in_flight") == 0
        [line] = lines(logs)
        assert line["event"] == "ping.handled"
        assert line["event_id"] == str(event_id)
        assert line["outcome"] == "reserved"
        assert line["skus"] is None
        assert line["message_id"] == "m-1"
        assert line["redelivered"] is False
        assert "duration_ms" in line


async def test_a_handled_event_is_acknowledged_on_its_channel_once_by_the_policy(
    monkeypatch,
) -> None:
    channel = AsyncMock(is_closed=False)
    async for harness in _harness(handled, monkeypatch):
        await harness.deliver(a_ping(), channel=channel)

        channel.basic_ack.assert_awaited_once_with(1, multiple=True, wait=True)
        channel.basic_reject.assert_not_awaited()


async def test_an_acknowledgement_its_closed_channel_cannot_take_is_logged_as_lost(
    monkeypatch, logs
) -> None:
    channel = AsyncMock(is_closed=False)
    channel.basic_ack.side_effect = aiormq.exceptions.ChannelInvalidStateError("closed")
    async for harness in _harness(handled, monkeypatch):
        await harness.deliver(a_ping(), message_id="m-1")  # an open channel first
        await harness.deliver(a_ping(), message_id="m-2", channel=channel)

        assert harness.outcomes() == ["reserved:", "reserved:"]
        assert [line["event"] for line in lines(logs)] == [
            "ping.handled",
            "ping.handled",
            "ping.ack_lost",
        ]
        assert lines(logs)[-1]["message_id"] == "m-2"
        assert "ChannelInvalidStateError" in lines(logs)[-1]["reason"]


async def test_a_handled_event_without_a_moment_observes_no_latency(monkeypatch) -> None:
    async def duplicate(body: bytes) -> Handled:
        ping = parse_event(PingV1, body)
        return Handled(ping.event_id, ping.order_id, "duplicate:event", ("duplicate", "event"))

    async for harness in _harness(duplicate, monkeypatch):
        await harness.deliver(a_ping())

        assert harness.outcomes() == ["duplicate:event"]
        assert harness.value("fulfilment_order_latency_seconds_count") == 0


@pytest.mark.parametrize(
    ("body", "content_type", "reason", "handler_calls"),
    [
        (b"\xff\xfe not json", "application/json", "invalid Ping v1", 1),
        (b'{"version": 2}', "application/json", "version", 1),
        (a_ping(), "application/xml", "content type", 0),
        (b" " * (MAX_BODY_BYTES + 1), "application/json", "exceeds the limit", 0),
    ],
    ids=["not-utf8", "unknown-version", "xml", "too-large"],
)
async def test_a_malformed_body_is_dead_lettered_as_permanent_and_acknowledged(
    monkeypatch, logs, body: bytes, content_type: str, reason: str, handler_calls: int
) -> None:
    async for harness in _harness(handled, monkeypatch):
        await harness.deliver(body, content_type=content_type, message_id="m-2")

        assert len(harness.dead_letters) == 1
        letter = harness.dead_letters[0]
        assert letter.headers["x-fulfilment-failure-class"] == "permanent"
        assert reason in letter.headers["x-fulfilment-reason"]
        assert letter.headers["x-fulfilment-exception-type"] == "MalformedEventError"
        assert letter.headers["x-fulfilment-original-queue"] == QUEUE.name
        assert letter.body == body
        assert letter.message_id == "m-2"
        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["dead_lettered:permanent"]
        assert len(harness.calls) == handler_calls
        [line] = lines(logs)
        assert line["event"] == "ping.dead_lettered"
        assert line["outcome"] == "dead_lettered:permanent"
        assert "event_id" not in line  # the body was never understood as an event


async def test_an_unknown_error_dead_letters_as_unexpected_with_the_exception(
    monkeypatch, logs
) -> None:
    async for harness in _harness(failing(KeyError("bug")), monkeypatch):
        event_id = uuid.uuid4()
        await harness.deliver(a_ping(event_id), message_id="m-3")

        [letter] = harness.dead_letters
        assert letter.headers["x-fulfilment-failure-class"] == "unexpected"
        assert letter.headers["x-fulfilment-exception-type"] == "KeyError"
        assert "test_delivery_policy.py" in letter.headers["x-fulfilment-stack"]
        assert letter.message_id == "m-3"
        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["dead_lettered:unexpected"]
        [line] = lines(logs)
        assert line["event"] == "ping.dead_lettered"
        assert line["event_id"] == str(event_id)
        assert line["exc_info"] is not None


async def test_a_refused_event_is_dead_lettered_as_permanent_under_its_own_reason(
    monkeypatch, logs
) -> None:
    refusal = EventRefusedError("order_not_reserved", "order 42 cannot be shipped: it is released")
    async for harness in _harness(failing(refusal), monkeypatch):
        event_id = uuid.uuid4()
        await harness.deliver(a_ping(event_id), message_id="m-4")

        [letter] = harness.dead_letters
        assert letter.headers["x-fulfilment-failure-class"] == "permanent"
        assert letter.headers["x-fulfilment-reason"] == (
            "order_not_reserved: order 42 cannot be shipped: it is released"
        )
        assert letter.headers["x-fulfilment-exception-type"] == "EventRefusedError"
        assert letter.headers["x-fulfilment-original-queue"] == QUEUE.name
        assert letter.message_id == "m-4"
        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["dead_lettered:order_not_reserved"]
        [line] = lines(logs)
        assert line["event"] == "ping.dead_lettered"
        assert line["outcome"] == "dead_lettered:order_not_reserved"
        assert line["event_id"] == str(event_id)  # a well-formed event: its ids are logged
        assert line["exc_info"] is None  # not a bug: no stack trace in the log


async def test_each_outcome_is_counted_under_the_subscription_s_event(monkeypatch) -> None:
    async for harness in _harness(handled, monkeypatch):
        await harness.deliver(a_ping())

        assert (
            harness.metrics.registry.get_sample_value(
                "fulfilment_events_total",
                {"event": "ping", "outcome": "reserved", "reason": ""},
            )
            == 1
        )


async def test_a_transient_error_requeues_the_delivery_and_pauses_the_consumers(
    monkeypatch, logs
) -> None:
    error = TransientError("connection refused")
    async for harness in _harness(failing(error), monkeypatch):
        event_id = uuid.uuid4()
        await harness.deliver(a_ping(event_id))

        assert harness.settled == ["reject:requeue"]
        assert harness.dead_letters == []
        assert harness.outcomes() == ["requeued:transient"]
        assert harness.pause.paused
        [line] = lines(logs)
        assert line["event"] == "ping.requeued"
        assert line["reason"] == "database: connection refused"
        assert line["event_id"] == str(event_id)


async def test_the_handler_deadline_requeues_the_delivery_and_pauses_the_consumers(
    monkeypatch, logs
) -> None:
    async def slow(body: bytes) -> Handled:
        await asyncio.sleep(5)
        return await handled(body)

    async for harness in _harness(slow, monkeypatch, deadline_seconds=0.05):
        await harness.deliver(a_ping())

        assert harness.settled == ["reject:requeue"]
        assert harness.outcomes() == ["requeued:transient"]
        assert harness.pause.paused
        [line] = lines(logs)
        assert line["reason"] == "handler deadline of 0.05 s exceeded"


async def test_a_dead_letter_publish_failing_but_by_a_refusal_rejects_the_delivery_for_the_broker(
    monkeypatch, logs
) -> None:
    async for harness in _harness(
        failing(KeyError("bug")), monkeypatch, capture_dead_letters=False
    ):
        # Nothing is bound to the dead-letter exchange: the in-memory publish raises its own
        # error, not a refusal of the broker (a refusal holds the delivery: tests below).
        with pytest.raises(SubscriberNotFound):
            await harness.deliver(a_ping())

        assert harness.settled == ["reject"]
        assert harness.value("fulfilment_dead_letter_publish_failures_total") == 1
        assert harness.outcomes() == ["dead_lettered:broker_rejected"]
        assert lines(logs) == []
        assert harness.value("fulfilment_messages_in_flight") == 0


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_lettering, "DEAD_LETTER_RETRY_FIRST_SECONDS", 0.01)


@pytest.mark.usefixtures("quick_retries")
async def test_a_refused_dead_letter_holds_the_delivery_until_the_broker_takes_it(
    monkeypatch, logs
) -> None:
    async for harness in _harness(failing(KeyError("bug")), monkeypatch):
        harness.dlq.refusals = 3
        delivered = asyncio.create_task(harness.deliver(a_ping(), message_id="m-4"))
        await asyncio.sleep(0.02)
        assert harness.settled == []  # held: neither acknowledged nor rejected
        assert harness.value("fulfilment_dead_letters_held") == 1
        await delivered

        assert harness.dlq.tries == ["nack", "nack", "nack", "confirmed"]
        [letter] = harness.dead_letters
        assert letter.message_id == "m-4"
        assert letter.headers["x-fulfilment-failure-class"] == "unexpected"
        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["dead_lettered:unexpected"]
        assert harness.value("fulfilment_dead_letter_publish_failures_total") == 3
        assert harness.value("fulfilment_dead_letters_held") == 0
        refused = [line for line in lines(logs) if line["event"] == "ping.dead_letter_refused"]
        assert [line["retry_in_seconds"] for line in refused] == [0.01, 0.02, 0.04]
        assert "Basic.Nack" in refused[0]["reason"]
        assert lines(logs)[-1]["event"] == "ping.dead_lettered"
        assert lines(logs)[-1]["held_seconds"] >= 0


@pytest.mark.usefixtures("quick_retries")
async def test_a_dead_letter_refused_past_the_hold_sends_the_delivery_back_to_its_queue(
    monkeypatch, logs
) -> None:
    async for harness in _harness(
        failing(KeyError("bug")), monkeypatch, dead_letter_hold_seconds=0.05
    ):
        harness.dlq.refusals = None
        await harness.deliver(a_ping())

        assert set(harness.dlq.tries) == {"nack"}
        assert harness.dead_letters == []
        assert harness.settled == ["reject:requeue"]
        assert harness.outcomes() == ["requeued:dead_letter_refused"]
        assert harness.value("fulfilment_dead_letters_held") == 0
        assert not harness.pause.paused  # the database is fine: other deliveries go on
        assert lines(logs)[-1]["event"] == "ping.requeued"
        assert lines(logs)[-1]["failure_class"] == "unexpected"


@pytest.mark.usefixtures("quick_retries")
async def test_a_held_redelivery_does_not_hold_up_the_other_deliveries(monkeypatch) -> None:
    buggy = a_ping()
    bug = failing(KeyError("bug"))

    async def handler(body: bytes) -> Handled:
        return await (bug if body == buggy else handled)(body)

    async for harness in _harness(handler, monkeypatch, delivery_limit=10):
        # The DLQ refuses every dead letter until the end, so the redelivery stays held
        # whatever the other delivery takes under load (no race with its next try).
        harness.dlq.refusals = None
        held = asyncio.create_task(harness.deliver(buggy, redelivered=True))
        while not harness.dlq.tries:
            assert not held.done()
            await asyncio.sleep(0)
        assert harness.value("fulfilment_dead_letters_held") == 1

        other = asyncio.create_task(harness.deliver(a_ping()))
        # Were the redelivery's gate kept while it is held, the other delivery would wait
        # for the hold to end (60 s), after the held one.
        done, _ = await asyncio.wait({held, other}, return_when=asyncio.FIRST_COMPLETED)

        assert done == {other}
        await other
        assert harness.settled == ["ack"]  # the other delivery went past the held one
        assert harness.value("fulfilment_dead_letters_held") == 1
        harness.dlq.refusals = 0
        await held
        assert harness.settled == ["ack", "ack"]
        assert harness.outcomes() == ["reserved:", "dead_lettered:unexpected"]


async def test_a_cancelled_delivery_is_neither_acknowledged_nor_rejected(monkeypatch) -> None:
    async for harness in _harness(failing(asyncio.CancelledError()), monkeypatch):
        with pytest.raises(asyncio.CancelledError):
            await harness.deliver(a_ping())

        assert harness.settled == []
        assert harness.dead_letters == []
        assert harness.outcomes() == []
        assert harness.value("fulfilment_messages_in_flight") == 0


async def test_a_first_delivery_is_not_counted_as_a_redelivery(monkeypatch) -> None:
    async for harness in _harness(handled, monkeypatch, delivery_limit=1):
        await harness.deliver(a_ping())

        assert harness.redeliveries == {}
        assert harness.outcomes() == ["reserved:"]


async def test_an_event_redelivered_up_to_the_limit_is_poison_and_is_not_handled(
    monkeypatch, logs
) -> None:
    async for harness in _harness(handled, monkeypatch, delivery_limit=3):
        event_id = uuid.uuid4()
        body = a_ping(event_id)

        # Delivery 2 (the first redelivery) is handled; delivery 3 is poison, unprocessed.
        await harness.deliver(body, redelivered=True)
        await harness.deliver(body, redelivered=True)

        assert harness.redeliveries == {event_id: 2}
        assert len(harness.calls) == 1
        [letter] = harness.dead_letters
        assert letter.headers["x-fulfilment-failure-class"] == "poison"
        assert "delivered 3 times" in letter.headers["x-fulfilment-reason"]
        assert harness.settled == ["ack", "ack"]
        assert harness.outcomes() == ["reserved:", "dead_lettered:poison"]
        assert lines(logs)[-1]["event_id"] == str(event_id)


async def test_a_redelivery_without_a_readable_event_id_is_not_counted_but_refused(
    monkeypatch,
) -> None:
    async for harness in _harness(handled, monkeypatch, delivery_limit=1):
        await harness.deliver(b'{"version": 1}', redelivered=True)

        assert harness.redeliveries == {}
        [letter] = harness.dead_letters
        assert letter.headers["x-fulfilment-failure-class"] == "permanent"


async def test_a_redelivery_runs_alone(monkeypatch) -> None:
    release = asyncio.Event()
    running: list[str] = []
    overlapped: list[bool] = []

    async def gated(body: bytes) -> Handled:
        ping = parse_event(PingV1, body)
        overlapped.append(bool(running))
        running.append(str(ping.event_id))
        try:
            await release.wait()
        finally:
            running.remove(str(ping.event_id))
        return await handled(body)

    async for harness in _harness(gated, monkeypatch, delivery_limit=10):
        first = [asyncio.create_task(harness.deliver(a_ping())) for _ in range(2)]
        await asyncio.sleep(0.01)
        again = asyncio.create_task(harness.deliver(a_ping(), redelivered=True))
        await asyncio.sleep(0.01)
        assert len(running) == 2  # first deliveries share the gate; the redelivery waits
        release.set()
        await asyncio.gather(*first, again)

        assert overlapped == [False, True, False]
        assert harness.outcomes() == ["reserved:"] * 3


async def test_a_reply_address_gets_no_reply_and_changes_nothing(monkeypatch) -> None:
    async for harness in _harness(handled, monkeypatch):
        # Nothing listens at the address: a reply would raise on the in-memory broker.
        await harness.deliver(a_ping(), reply_to="fulfilment.nowhere")

        assert harness.settled == ["ack"]
        assert harness.outcomes() == ["reserved:"]
        assert harness.dead_letters == []


async def test_a_first_delivery_counts_no_earlier_delivery_whatever_its_headers_say(
    monkeypatch, logs
) -> None:
    async for harness in _harness(failing(KeyError("bug")), monkeypatch, delivery_limit=2):
        forged = {"x-delivery-count": 4, "x-fulfilment-delivery-count": 9, "x-fulfilment-x": 1}
        await harness.deliver(a_ping(), headers=forged)

        [letter] = harness.dead_letters
        assert letter.headers["x-fulfilment-delivery-count"] == 0
        assert "x-delivery-count" not in letter.headers
        assert "x-fulfilment-x" not in letter.headers
        assert harness.redeliveries == {}  # not counted towards poison either
        assert harness.outcomes() == ["dead_lettered:unexpected"]
        [line] = lines(logs)
        assert line["delivery_count"] == 0


async def test_a_redelivery_counts_the_brokers_deliveries_and_keeps_the_replay_headers(
    monkeypatch,
) -> None:
    async for harness in _harness(failing(KeyError("bug")), monkeypatch, delivery_limit=10):
        replayed = {"x-delivery-count": 3, "x-fulfilment-replay-id": "run-1"}
        await harness.deliver(a_ping(), redelivered=True, headers=replayed)
        await harness.deliver(a_ping(), redelivered=True, headers={"x-delivery-count": "3"})

        first, second = harness.dead_letters
        assert first.headers["x-fulfilment-delivery-count"] == 3
        assert first.headers["x-fulfilment-replay-id"] == "run-1"
        assert second.headers["x-fulfilment-delivery-count"] == 1  # unreadable: at least 1


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": TRACEPARENT}, TRACEPARENT),
        ({"traceparent": TRACEPARENT.encode()}, TRACEPARENT),
        ({"traceparent": "01-" + TRACEPARENT[3:] + "-later"}, "01-" + TRACEPARENT[3:] + "-later"),
        ({}, None),
        (None, None),
        ({"traceparent": 7}, None),
        ({"traceparent": TRACEPARENT.upper()}, None),
        ({"traceparent": TRACEPARENT + "-later"}, None),
        ({"traceparent": "ff-" + TRACEPARENT[3:]}, None),
        ({"traceparent": "00-" + "0" * 32 + TRACEPARENT[35:]}, None),
        ({"traceparent": TRACEPARENT[:36] + "0" * 16 + "-01"}, None),
        ({"traceparent": "00-abc-def-01"}, None),
    ],
    ids=[
        "valid",
        "bytes",
        "later-version",
        "absent",
        "no-headers",
        "not-text",
        "upper-case",
        "appended-to-00",
        "version-ff",
        "zero-trace-id",
        "zero-parent-id",
        "short",
    ],
)
def test_the_trace_context_is_the_traceparent_header_when_it_is_valid_w3c(
    headers, expected
) -> None:
    assert trace_context(headers) == expected


async def test_the_handler_gets_the_delivery_s_trace_context(monkeypatch) -> None:
    async for harness in _harness(handled, monkeypatch):
        await harness.deliver(a_ping(), headers={"traceparent": TRACEPARENT})
        await harness.deliver(a_ping(), headers={"traceparent": "not a trace context"})
        await harness.deliver(a_ping())

        assert harness.traces == [TRACEPARENT, None, None]
        assert harness.settled == ["ack", "ack", "ack"]
