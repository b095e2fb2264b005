"""One batch of the relay against a channel that confirms, returns, refuses or never answers:
what is marked, what is counted, and what ends the session (``Relay._publish``)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import aiormq
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.header import ContentHeader

from builders import a_relay
from fulfilment.adapters.postgres.outbox import OutboxRow
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.relay import service


class Broker:
    """A channel whose ``basic_publish`` answers by routing key, as the broker would."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, aiormq.spec.Basic.Properties]] = []

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        properties: aiormq.spec.Basic.Properties,
        mandatory: bool,
        wait: bool,
    ) -> aiormq.spec.Basic.Ack:
        assert exchange == "fulfilment.events"
        assert mandatory
        assert not wait  # the batch is queued at once, not one publish per write
        self.published.append((routing_key, body, properties))
        if routing_key == "stock.rejected":  # no queue bound: returned
            returned = aiormq.spec.Basic.Return(312, "NO_ROUTE", exchange, routing_key)
            message = DeliveredMessage(returned, ContentHeader(), body, cast("Any", self))
            raise aiormq.exceptions.PublishError(message, returned)
        if routing_key == "stock.released":  # a queue at its length limit: refused
            raise aiormq.exceptions.DeliveryError(None, aiormq.spec.Basic.Nack(1))
        if routing_key == "stock.shipped":  # no answer
            await asyncio.Event().wait()
        return aiormq.spec.Basic.Ack(1)


def a_row(outbox_id: int, routing_key: str) -> OutboxRow:
    return OutboxRow(
        id=outbox_id,
        event_id=str(uuid.uuid4()),
        order_id=str(uuid.uuid4()),
        routing_key=routing_key,
        body=b'{"version": 1}',
        traceparent=None,
    )


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The ids of each ``mark_published`` call of the relay, in order."""
    calls: list[list[int]] = []

    async def mark_published(_database: object, ids: list[int]) -> list[tuple[str, float]]:
        calls.append(ids)
        return [("stock.reserved", 0.01) for _ in ids]

    monkeypatch.setattr(service, "mark_published", mark_published)
    return calls


def failures(metrics: RelayMetrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value(
        "fulfilment_outbox_publish_failures_total", {"reason": reason}
    )


async def test_a_returned_and_a_refused_row_are_counted_and_left_the_others_marked(
    marked: list[list[int]],
) -> None:
    relay, metrics = a_relay(publish_timeout_seconds=5)
    broker = Broker()
    batch = [a_row(1, "stock.reserved"), a_row(2, "stock.rejected"), a_row(3, "stock.released")]

    confirmed = await relay._publish(cast("Any", None), cast("Any", broker), batch)

    assert confirmed == [1]
    assert marked == [[1]]
    assert [key for key, _, _ in broker.published] == [row.routing_key for row in batch]
    assert failures(metrics, "returned") == 1
    assert failures(metrics, "nacked") == 1
    assert failures(metrics, "connection") == 0


async def test_confirms_that_do_not_come_in_time_end_the_session_after_the_others_are_marked(
    marked: list[list[int]],
) -> None:
    relay, metrics = a_relay(publish_timeout_seconds=0.2)
    batch = [a_row(1, "stock.reserved"), a_row(2, "stock.shipped"), a_row(3, "stock.reserved")]

    with pytest.raises(TimeoutError, match=r"no confirm from the broker in 0\.2 s"):
        await relay._publish(cast("Any", None), cast("Any", Broker()), batch)

    assert marked == [[1, 3]]
    assert failures(metrics, "connection") == 1


class SlowFirstChannel:
    """A channel whose first publish is confirmed after ``first_seconds``, the others at once."""

    def __init__(self, first_seconds: float) -> None:
        self.first_seconds = first_seconds
        self.publishes = 0

    async def basic_publish(self, _body: bytes, **_: object) -> aiormq.spec.Basic.Ack:
        self.publishes += 1
        if self.publishes == 1:
            await asyncio.sleep(self.first_seconds)
        return aiormq.spec.Basic.Ack(self.publishes)


async def test_the_batch_window_counts_from_the_read_so_a_slow_confirm_is_not_followed_by_it(
    monkeypatch: pytest.MonkeyPatch, marked: list[list[int]]
) -> None:
    window = 0.2
    relay, _ = a_relay()
    relay._options = replace(relay._options, batch_window_seconds=window)
    batches = [[a_row(1, "stock.reserved")], [a_row(2, "stock.reserved")]]

    async def next_batch(_database: object, _limit: int) -> list[OutboxRow]:
        if batches:
            return batches.pop(0)
        relay.stop()
        return []

    async def no_gauges(_database: object) -> None:
        return None

    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(service, "next_batch", next_batch)
    monkeypatch.setattr(relay, "_read_backlog", no_gauges)
    monkeypatch.setattr(relay, "pause", pause)
    broker = cast("Any", SimpleNamespace(is_closed=False))

    await relay._publish_until_stopped(
        cast("Any", None), broker, cast("Any", SlowFirstChannel(first_seconds=1.5 * window))
    )

    # Both small batches were published and marked; the first one's confirm took longer
    # than the window, so only the second, confirmed at once, waited: what was left of it.
    assert marked == [[1], [2]]
    assert len(pauses) == 1
    assert window / 2 < pauses[0] <= window
