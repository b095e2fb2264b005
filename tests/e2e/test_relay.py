"""The relay against the real RabbitMQ and PostgreSQL: ``fulfilment relay`` as a subprocess,
outbox rows written by the test as the SQL functions write them."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.e2e.harness import wait_for
from tests.e2e.relay_harness import (
    RelayProcess,
    assert_in_order_per_order,
    bind_events_queue,
    insert_outbox,
    lifecycle_rows,
    spawn_relay,
    take,
    unpublished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_each_outbox_row_arrives_on_fulfilment_events_with_its_properties_in_id_order(
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    queue = await bind_events_queue(broker)
    relay = spawn_relay(relays, relay_env, tmp_path)
    events = await insert_outbox(db, lifecycle_rows(4), traceparent=TRACEPARENT)

    messages = await take(queue, len(events))

    assert_in_order_per_order(messages, events)
    by_id = {str(event.event_id): event for event in events}
    for message in messages:
        event = by_id[str(message.message_id)]
        assert message.routing_key == event.routing_key
        assert message.type == event.routing_key
        assert message.correlation_id == str(event.order_id)
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.headers["traceparent"] == TRACEPARENT
        assert json.loads(message.body) == event.body
    await wait_for(lambda: _none_unpublished(db), what="every row marked published")
    assert relay.metric("fulfilment_outbox_published_total", 'routing_key="stock.shipped"') == 4
    assert relay.metric("fulfilment_relay_active") == 1
    assert relay.readiness()["role"] == "active"
    code, _ = relay.terminate()
    assert code == 0


async def test_the_events_about_a_sku_arrive_with_the_sku_as_their_correlation_id(
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    queue = await bind_events_queue(broker)
    relay = spawn_relay(relays, relay_env, tmp_path)
    await db.execute("INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', 5, 5)")
    # A loss the warehouse reported: record_adjustments() writes stock.adjusted, the trigger
    # of stock_levels stock.shortage; the two are about the SKU, in that order.
    await db.execute(
        "SELECT * FROM record_adjustments('fulfilment', $1, ARRAY['ADJ-1'], ARRAY['msg-1'],"
        " ARRAY['webhook'], ARRAY['A'], ARRAY[-2], ARRAY['damaged'], ARRAY[now()],"
        " ARRAY[NULL], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL])",
        [uuid.uuid4()],
    )

    messages = await take(queue, 2)

    assert [(m.routing_key, m.correlation_id) for m in messages] == [
        ("stock.shortage", "A"),
        ("stock.adjusted", "A"),
    ]
    assert json.loads(messages[0].body)["short"] == 2
    await wait_for(lambda: _none_unpublished(db), what="every row marked published")
    assert relay.metric("fulfilment_outbox_published_total", 'routing_key="stock.adjusted"') == 1
    assert relay.metric("fulfilment_outbox_published_total", 'routing_key="stock.shortage"') == 1
    code, _ = relay.terminate()
    assert code == 0


async def _none_unpublished(db: asyncpg.Connection) -> bool:
    return await unpublished(db) == 0


@pytest.mark.parametrize("point", ["after_publish", "before_publish"])
async def test_a_relay_killed_at_a_crash_point_leaves_no_gap_and_repeats_only_event_ids(
    point: str,
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    queue = await bind_events_queue(broker)
    events = await insert_outbox(db, lifecycle_rows(5))
    crashing = spawn_relay(
        relays,
        {**relay_env, "FULFILMENT_TEST_CRASH_PLAN": f"{point}:1"},
        tmp_path,
        wait_ready=False,
    )
    assert crashing.process is not None
    assert crashing.process.wait(timeout=60) == -signal.SIGKILL
    assert await unpublished(db) == len(events)  # the crash came before any mark

    spawn_relay(relays, relay_env, tmp_path)
    await wait_for(lambda: _none_unpublished(db), what="every row marked published")
    first_batch = 5  # one row per order: the crashed batch held each order's first row
    expected = len(events) + (first_batch if point == "after_publish" else 0)
    messages = await take(queue, expected)

    assert_in_order_per_order(messages, events)
    ids = [str(m.message_id) for m in messages]
    duplicated = {i for i in ids if ids.count(i) > 1}
    if point == "after_publish":
        assert duplicated == {str(e.event_id) for e in events if e.routing_key == "stock.reserved"}
    else:
        assert duplicated == set()
    assert await queue.get(fail=False) is None


async def test_of_two_relays_one_publishes_and_the_other_takes_over_when_it_is_killed(
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    queue = await bind_events_queue(broker)
    first = spawn_relay(relays, relay_env, tmp_path)
    second = spawn_relay(relays, relay_env, tmp_path)
    roles = sorted(relay.readiness()["role"] for relay in (first, second))
    assert roles == ["active", "standby"]
    active, standby = (first, second) if first.readiness()["role"] == "active" else (second, first)
    assert standby.metric("fulfilment_relay_active") == 0

    before = await insert_outbox(db, lifecycle_rows(3))
    await take(queue, len(before))
    await wait_for(lambda: _none_unpublished(db), what="the first rows marked")
    assert (
        sum(
            standby.metric("fulfilment_outbox_published_total", f'routing_key="{key}"')
            for key in ("stock.reserved", "stock.released", "stock.shipped")
        )
        == 0
    )

    active.kill()
    after = await insert_outbox(db, lifecycle_rows(3))

    async def took_over() -> bool:
        return standby.readiness().get("role") == "active"

    await wait_for(took_over, what="the standby to take the lock")
    messages = await take(queue, len(after))
    assert_in_order_per_order(messages, after)
    await wait_for(lambda: _none_unpublished(db), what="the later rows marked")
    assert await queue.get(fail=False) is None


async def test_a_returned_row_holds_back_the_later_rows_of_its_order_only(
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    # Only stock.reserved is routed at first: a stock.rejected is returned (mandatory). No
    # other queue of the session's vhost may be bound with "#" (the demo's is deleted after
    # its tests), or the row would be routed there instead.
    queue = await bind_events_queue(broker, "stock.reserved")
    held, other = uuid.uuid4(), uuid.uuid4()
    returned, behind, free = await insert_outbox(
        db, [(held, "stock.rejected"), (held, "stock.reserved"), (other, "stock.reserved")]
    )
    relay = spawn_relay(relays, relay_env, tmp_path)

    [message] = await take(queue, 1)
    assert message.message_id == str(free.event_id)

    async def returned_twice() -> bool:
        return relay.metric("fulfilment_outbox_publish_failures_total", 'reason="returned"') >= 2

    await wait_for(returned_twice, what="the row returned and tried again")
    # The later row of the held order was never published beside or after it.
    assert await unpublished(db) == 2
    assert await queue.get(fail=False) is None

    channel = await broker.channel()
    await queue.bind(await channel.get_exchange("fulfilment.events"), routing_key="stock.rejected")
    messages = await take(queue, 2)
    assert [m.message_id for m in messages] == [str(returned.event_id), str(behind.event_id)]
    await wait_for(lambda: _none_unpublished(db), what="every row marked published")
