"""``fulfilment dlq`` against the real RabbitMQ (and PostgreSQL for the audit table).

No worker runs here: the main queue is left unconsumed, so a replayed message can be read
back from it exactly as the worker would receive it. The broker-side dead-lettering of a
poison message uses ``basic.reject(requeue=true)``, which every RabbitMQ version counts
towards the delivery limit (4.3 stopped counting ``basic.nack`` requeues and plain returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fulfilment.adapters.postgres.dead_letter_audit import Operator
from fulfilment.adapters.rabbitmq.inspection import queue_state
from fulfilment.adapters.rabbitmq.walk import WALK_LOCK_SUFFIX, WalkInProgressError, walk_queue
from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDER_SHIPPED,
    ORDERS_EXCHANGE,
    SubscribedQueue,
)
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.tools import dead_letters, dlq, dlq_commands
from fulfilment.worker.topology import Topology, declare_topology

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DELIVERY_LIMIT = 5  # the e2e harness's limit: one topology per test vhost


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    await declare_topology(amqp_url, Topology(DELIVERY_LIMIT))
    connection = await aio_pika.connect(amqp_url)
    await _purge(connection)
    try:
        yield connection
    finally:
        await _purge(connection)
        await connection.close()


@pytest.fixture
async def audit(clean_database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(clean_database)
    url = make_url(clean_database).set(drivername="postgresql")
    db = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await db.execute("TRUNCATE dead_letter_audit")
    finally:
        await db.close()
    try:
        yield engine
    finally:
        await engine.dispose()


async def _purge(connection: aio_pika.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
        await (await channel.get_queue(name)).purge()
    await channel.close()


def an_event() -> tuple[bytes, str]:
    event_id = uuid.uuid4()
    body = order_placed_body(
        event_id=event_id,
        order_id=uuid.uuid4(),
        placed_at=datetime.now(UTC),
        lines=[("85123A", 1)],
    )
    return body, str(event_id)


async def put_service_dead_letter(
    connection: aio_pika.abc.AbstractConnection,
    body: bytes,
    *,
    message_id: str,
    failure_class: str = "permanent",
    exception_type: str = "MalformedEventError",
    dead_lettered_at: datetime | None = None,
    queue: SubscribedQueue = ORDER_PLACED,
    came_from: tuple[str, str] | None = None,
    extra_headers: dict[str, object] | None = None,
) -> None:
    """A dead letter as the worker publishes it (see worker/dead_lettering.py).

    ``came_from`` is the ``(exchange, routing key)`` of its original headers; without it the
    dead letter does not say (as those of earlier releases).
    """
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    moment = (dead_lettered_at or datetime.now(UTC)).isoformat()
    original = (
        {}
        if came_from is None
        else {h.ORIGINAL_EXCHANGE: came_from[0], h.ORIGINAL_ROUTING_KEY: came_from[1]}
    )
    await exchange.publish(
        aio_pika.Message(
            body,
            message_id=message_id,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={
                "traceparent": "00-abc-def-01",
                h.FAILURE_CLASS: failure_class,
                h.REASON: f"{exception_type}: it failed",
                h.EXCEPTION_TYPE: exception_type,
                h.DELIVERY_COUNT: 0,
                h.ATTEMPTS: 1,
                h.DEAD_LETTERED_AT: moment,
                h.ORIGINAL_QUEUE: queue.name,
                **original,
                **(extra_headers or {}),
                "x-delivery-count": 3,
                "x-first-death-reason": "rejected",
            },
        ),
        routing_key=queue.dead_letter_routing_key,
        mandatory=True,
    )
    await channel.close()


async def poison(connection: aio_pika.abc.AbstractConnection, body: bytes, message_id: str) -> None:
    """Let the broker dead-letter a message by its delivery limit, as crashing workers would."""
    before = await depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    orders = await channel.get_exchange(ORDERS_EXCHANGE)
    await orders.publish(
        aio_pika.Message(body, message_id=message_id, content_type="application/json"),
        routing_key=ORDER_PLACED_ROUTING_KEY,
        mandatory=True,
    )
    queue = await channel.get_queue(ORDER_PLACED_QUEUE)
    for _ in range(DELIVERY_LIMIT * 4):
        message = await queue.get(no_ack=False, fail=False)
        if message is None:
            # A message being requeued is briefly not there: only the DLQ growing says it left.
            if await depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE) > before:
                break
            await asyncio.sleep(0.1)
            continue
        await message.reject(requeue=True)
    await channel.close()
    assert await depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE) > before, (
        "the broker did not dead-letter it"
    )


async def depth(connection: aio_pika.abc.AbstractConnection, name: str) -> int:
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await channel.close()


async def eventually_depth(
    connection: aio_pika.abc.AbstractConnection, name: str, expected: int, timeout: float = 5
) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while await depth(connection, name) != expected:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def audit_rows(engine: AsyncEngine) -> list[dict[str, object]]:
    async with engine.connect() as db:
        rows = await db.exec_driver_sql(
            "SELECT action, event_id, message_id, failure_class, body, operator, comment, run_id,"
            " os_user, host, database_user = session_user AS by_this_role"
            " FROM dead_letter_audit ORDER BY id"
        )
        return [dict(row._mapping) for row in rows]


async def test_list_groups_by_class_and_exception_recognises_poison_and_removes_nothing(
    connection,
) -> None:
    old = datetime.now(UTC) - timedelta(hours=3)
    for index in range(2):
        body, _ = an_event()
        await put_service_dead_letter(
            connection, body, message_id=f"bad-{index}", dead_lettered_at=old
        )
    body, _ = an_event()
    await put_service_dead_letter(
        connection,
        body,
        message_id="bug",
        failure_class="unexpected",
        exception_type="KeyError",
    )
    poisoned, poisoned_id = an_event()
    await poison(connection, poisoned, poisoned_id)

    groups = await dlq.list_groups(connection)

    assert [(group.key, group.count) for group in groups] == [
        ("permanent/MalformedEventError", 2),
        ("poison/-", 1),
        ("unexpected/KeyError", 1),
    ]
    assert groups[0].oldest == old
    poison_group = groups[1]
    assert "delivery_limit" in poison_group.example_reason
    assert poison_group.event_ids == [poisoned_id]
    rendered = dlq_commands.render_groups(groups)
    assert "4 dead letter(s), oldest 3h" in rendered
    # The browsed messages return when the browsing channel closes, a moment later.
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 4)


async def test_a_dry_run_replay_changes_nothing(connection, audit) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(connection, body, message_id=event_id)

    result = await dlq.replay(
        connection,
        dead_letters.Selection(everything=True),
        audit=None,
        execute=False,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment=None,
    )

    assert (result.matched, result.done) == (1, 0)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    assert await depth(connection, ORDER_PLACED_QUEUE) == 0
    assert await audit_rows(audit) == []


async def test_replaying_a_group_republishes_with_ids_kept_and_retry_headers_stripped(
    connection, audit
) -> None:
    chosen, chosen_id = an_event()
    other, _ = an_event()
    await put_service_dead_letter(connection, chosen, message_id=chosen_id)
    await put_service_dead_letter(
        connection, other, message_id="other", failure_class="unexpected", exception_type="KeyError"
    )

    result = await dlq.replay(
        connection,
        dead_letters.Selection(group="permanent/MalformedEventError"),
        audit=audit,
        execute=True,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment="fixed in 0.1.1",
    )

    assert (result.matched, result.done) == (1, 1)
    assert await eventually_depth(
        connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1
    )  # the other group stays
    channel = await connection.channel()
    replayed = await (await channel.get_queue(ORDER_PLACED_QUEUE)).get(no_ack=True)
    await channel.close()
    assert replayed.body == chosen
    assert replayed.message_id == chosen_id
    assert replayed.content_type == "application/json"
    assert replayed.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    headers = replayed.headers
    assert headers["traceparent"] == "00-abc-def-01"  # the producer's own header stays
    assert headers[h.REPLAY_ID] == str(result.run_id)
    assert datetime.fromisoformat(str(headers[h.REPLAYED_AT])) <= datetime.now(UTC)
    stripped = [
        key
        for key in headers
        if key in {"x-death", "x-first-death-reason"}
        or (key.startswith("x-fulfilment-") and key not in h.REPLAY_HEADERS)
    ]
    assert stripped == []
    assert headers[h.REPLAY_COUNT] == 1  # the first replay of this dead letter
    # A fresh delivery: 3.10 reports 0 on a basic.get, later versions leave the header out.
    assert headers.get("x-delivery-count", 0) == 0
    rows = await audit_rows(audit)
    assert len(rows) == 1
    assert rows[0]["action"] == "replayed"
    assert rows[0]["event_id"] == chosen_id
    assert rows[0]["failure_class"] == "permanent"
    assert rows[0]["comment"] == "fixed in 0.1.1"
    assert str(rows[0]["run_id"]) == str(result.run_id)
    assert (rows[0]["operator"], rows[0]["os_user"], rows[0]["host"]) == ("ops", "ops", "test-host")
    assert rows[0]["by_this_role"]  # set by the database, not by the tool


async def test_a_replay_carries_no_priority_or_reply_address_of_the_first_sender(
    connection, audit
) -> None:
    body, event_id = an_event()
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    await exchange.publish(
        aio_pika.Message(
            body,
            message_id=event_id,
            content_type="application/json",
            correlation_id="order-7",
            reply_to=ORDER_PLACED_ROUTING_KEY,
            priority=9,
            headers={h.FAILURE_CLASS: "permanent", h.EXCEPTION_TYPE: "MalformedEventError"},
        ),
        routing_key=ORDER_PLACED.dead_letter_routing_key,
        mandatory=True,
    )
    await channel.close()

    result = await dlq.replay(
        connection,
        dead_letters.Selection(ids=frozenset({event_id})),
        audit=audit,
        execute=True,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment=None,
    )

    assert result.done == 1
    channel = await connection.channel()
    replayed = await (await channel.get_queue(ORDER_PLACED_QUEUE)).get(no_ack=True)
    await channel.close()
    assert replayed.message_id == event_id
    assert replayed.correlation_id == "order-7"
    assert replayed.reply_to is None
    assert not replayed.priority
    assert replayed.expiration is None


async def test_a_replay_that_cannot_be_routed_leaves_the_message_in_the_dlq(
    connection, audit
) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(connection, body, message_id=event_id)
    channel = await connection.channel()
    main = await channel.get_queue(ORDER_PLACED_QUEUE)
    await main.unbind(ORDERS_EXCHANGE, ORDER_PLACED_ROUTING_KEY)
    try:
        with pytest.raises(dead_letters.ReplayStoppedError, match="no queue bound"):
            await dlq.replay(
                connection,
                dead_letters.Selection(ids=frozenset({event_id})),
                audit=audit,
                execute=True,
                rate_per_second=100,
                operator=Operator("ops", "test-host"),
                comment=None,
            )
    finally:
        await main.bind(ORDERS_EXCHANGE, ORDER_PLACED_ROUTING_KEY)
        await channel.close()

    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    assert await audit_rows(audit) == []


async def test_a_purge_writes_the_body_to_the_audit_table_before_removing_the_message(
    connection, audit
) -> None:
    body, event_id = an_event()
    kept, _ = an_event()
    await put_service_dead_letter(connection, body, message_id=event_id)
    await put_service_dead_letter(connection, kept, message_id="kept")

    result = await dlq.purge(
        connection,
        dead_letters.Selection(ids=frozenset({event_id})),
        audit=audit,
        execute=True,
        operator=Operator("ops", "test-host"),
        comment="test order",
    )

    assert (result.matched, result.done) == (1, 1)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    assert await depth(connection, ORDER_PLACED_QUEUE) == 0
    rows = await audit_rows(audit)
    assert [(row["action"], row["event_id"], bytes(row["body"])) for row in rows] == [
        ("purged", event_id, body)
    ]


async def test_show_finds_a_message_by_event_id_and_leaves_it(connection) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(connection, body, message_id="m-1")

    letters = await dlq.find(connection, dead_letters.Selection(ids=frozenset({event_id})))

    assert [letter.message.message_id for letter in letters] == ["m-1"]
    document = letters[0].to_document()
    assert document["headers"][h.FAILURE_CLASS] == "permanent"
    assert event_id in document["body"]
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)


async def test_the_cli_refuses_an_ambiguous_selection() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        dead_letters.Selection.build(["x"], "permanent/-", everything=False)
    with contextlib.suppress(ValueError):
        dead_letters.Selection.build([], None, everything=False)
        pytest.fail("no selection must be refused")


def a_cancel() -> tuple[bytes, str]:
    event_id = uuid.uuid4()
    body = order_cancelled_body(
        event_id=event_id, order_id=uuid.uuid4(), cancelled_at=datetime.now(UTC)
    )
    return body, str(event_id)


def a_shipment() -> tuple[bytes, str]:
    event_id = uuid.uuid4()
    body = order_shipped_body(
        event_id=event_id, order_id=uuid.uuid4(), shipped_at=datetime.now(UTC)
    )
    return body, str(event_id)


async def test_list_groups_the_dead_letters_of_every_dlq_each_under_its_queue(connection) -> None:
    placed, _ = an_event()
    await put_service_dead_letter(connection, placed, message_id="p")
    for index in range(2):
        shipment, _ = a_shipment()
        await put_service_dead_letter(
            connection,
            shipment,
            message_id=f"s-{index}",
            exception_type="EventRefusedError",
            queue=ORDER_SHIPPED,
        )

    groups = await dlq.list_groups(connection)

    assert [(group.queue, group.key, group.count) for group in groups] == [
        (ORDER_SHIPPED.dead_letter_queue, "permanent/EventRefusedError", 2),
        (ORDER_PLACED_DEAD_LETTER_QUEUE, "permanent/MalformedEventError", 1),
    ]
    # A look returns the messages as its channel closes; the queue counts them a moment later.
    assert await eventually_depth(connection, ORDER_SHIPPED.dead_letter_queue, 2)
    only_shipped = await dlq.list_groups(connection, [ORDER_SHIPPED.dead_letter_queue])
    assert [group.queue for group in only_shipped] == [ORDER_SHIPPED.dead_letter_queue]
    rendered = dlq_commands.render_groups(groups)
    assert "3 dead letter(s)" in rendered
    assert ORDER_SHIPPED.dead_letter_queue in rendered


async def test_a_replay_sends_each_dead_letter_back_where_it_came_from(connection, audit) -> None:
    cancel, cancel_id = a_cancel()
    shipment, shipment_id = a_shipment()
    # One says where it came from; the other does not, and goes where its DLQ's queue is bound.
    await put_service_dead_letter(
        connection,
        cancel,
        message_id=cancel_id,
        queue=ORDER_CANCELLED,
        came_from=(ORDERS_EXCHANGE, ORDER_CANCELLED.routing_key),
    )
    await put_service_dead_letter(connection, shipment, message_id=shipment_id, queue=ORDER_SHIPPED)

    result = await dlq.replay(
        connection,
        dead_letters.Selection(everything=True),
        audit=audit,
        execute=True,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment=None,
    )

    assert (result.matched, result.done) == (2, 2)
    assert [letter.queue for letter in result.letters] == [
        ORDER_CANCELLED.dead_letter_queue,
        ORDER_SHIPPED.dead_letter_queue,
    ]
    channel = await connection.channel()
    replayed_cancel = await (await channel.get_queue(ORDER_CANCELLED.name)).get(no_ack=True)
    replayed_shipment = await (await channel.get_queue(ORDER_SHIPPED.name)).get(no_ack=True)
    await channel.close()
    assert (replayed_cancel.body, replayed_cancel.message_id) == (cancel, cancel_id)
    assert (replayed_shipment.body, replayed_shipment.message_id) == (shipment, shipment_id)
    assert await depth(connection, ORDER_PLACED_QUEUE) == 0
    for name in DEAD_LETTER_QUEUES:
        assert await eventually_depth(connection, name, 0)


async def test_replay_and_purge_touch_only_the_queues_they_are_given(connection, audit) -> None:
    placed, placed_id = an_event()
    shipment, shipment_id = a_shipment()
    await put_service_dead_letter(connection, placed, message_id=placed_id)
    await put_service_dead_letter(connection, shipment, message_id=shipment_id, queue=ORDER_SHIPPED)

    result = await dlq.purge(
        connection,
        dead_letters.Selection(everything=True),
        audit=audit,
        execute=True,
        operator=Operator("ops", "test-host"),
        comment=None,
        queues=dead_letters.dead_letter_queues([ORDER_SHIPPED.name]),
    )

    assert (result.matched, result.done) == (1, 1)
    assert [letter.description.event_id for letter in result.letters] == [shipment_id]
    assert await eventually_depth(connection, ORDER_SHIPPED.dead_letter_queue, 0)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    shown = await dlq.find(
        connection, dead_letters.Selection(everything=True), [ORDER_SHIPPED.dead_letter_queue]
    )
    assert shown == []


async def fill_dead_letters(connection: aio_pika.abc.AbstractConnection, count: int) -> list[str]:
    """``count`` service dead letters in the order-placed DLQ, published 200 at a time."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    ids = [str(uuid.uuid4()) for _ in range(count)]
    headers: dict[str, object] = {h.FAILURE_CLASS: "permanent", h.EXCEPTION_TYPE: "Bulk"}
    for start in range(0, count, 200):
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(
                        b'{"event_id": "%s"}' % event_id.encode(),
                        message_id=event_id,
                        headers=headers,  # type: ignore[arg-type] # aio-pika's invariant type
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=ORDER_PLACED.dead_letter_routing_key,
                    mandatory=True,
                )
                for event_id in ids[start : start + 200]
            )
        )
    await channel.close()
    return ids


async def queue_ids(connection: aio_pika.abc.AbstractConnection, name: str) -> list[str]:
    """The message ids of queue ``name`` in order, removing them (the test is over)."""
    ids = []
    channel = await connection.channel()
    queue = await channel.get_queue(name)
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        ids.append(message.message_id or "")
    await channel.close()
    return ids


async def test_list_walks_a_deep_dlq_holding_one_page_and_leaves_it_as_it_was(
    connection, amqp_url: str
) -> None:
    page_size, total, arriving = 100, 3000, 50
    ids = await fill_dead_letters(connection, total)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, total)
    lowest_ready = total
    late: list[str] = []
    walked_all = asyncio.Event()

    async def watch() -> None:
        # From another connection: what the walk holds is what is not ready. Told to stop, not
        # cancelled: a cancel in the middle of aiormq's channel open or close can leave the task
        # waiting for ever on a reply that is not coming (seen on RabbitMQ 3.10.8 and 4.0.5).
        nonlocal lowest_ready, late
        async with await aio_pika.connect(amqp_url) as other:
            while not walked_all.is_set():
                lowest_ready = min(lowest_ready, await depth(other, ORDER_PLACED_DEAD_LETTER_QUEUE))
                if not late:  # a worker dead-letters more while the walk runs
                    late = await fill_dead_letters(other, arriving)
                await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        groups = await dlq.list_groups(
            connection, [ORDER_PLACED_DEAD_LETTER_QUEUE], page_size=page_size
        )
    finally:
        walked_all.set()
        await asyncio.wait_for(watcher, timeout=30)
    counted = sum(group.count for group in groups)
    # It took the dead letters present when it started, some or none of those that came later.
    assert total <= counted <= total + arriving, counted
    assert lowest_ready >= total - page_size, lowest_ready
    assert await eventually_depth(
        connection, ORDER_PLACED_DEAD_LETTER_QUEUE, total + arriving, timeout=15
    ), await depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE)
    remaining = await queue_ids(connection, ORDER_PLACED_DEAD_LETTER_QUEUE)
    assert sorted(remaining) == sorted(ids + late)  # nothing lost, nothing doubled
    walked = [message_id for message_id in remaining if message_id in set(ids)]
    assert walked == ids  # in the same order


async def test_show_and_purge_page_past_the_prefetch_limit_in_flat_pages(connection, audit) -> None:
    ids = await fill_dead_letters(connection, 1200)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1200)
    last = dead_letters.Selection(ids=frozenset({ids[-1]}))

    shown = await dlq.find(connection, last, [ORDER_PLACED_DEAD_LETTER_QUEUE], page_size=50)
    assert [letter.message.message_id for letter in shown] == [ids[-1]]
    result = await dlq.purge(
        connection,
        last,
        audit=audit,
        execute=True,
        operator=Operator("ops", "test-host"),
        comment=None,
        queues=[ORDER_PLACED_DEAD_LETTER_QUEUE],
        page_size=50,
    )

    assert (result.matched, result.done, result.most_held) == (1, 1, 50)
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1199)


async def test_a_replay_refuses_a_dead_letter_replayed_the_limit_unless_forced(
    connection, audit
) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(
        connection, body, message_id=event_id, extra_headers={h.REPLAY_COUNT: 3}
    )
    refusals: list[dead_letters.Refusal] = []
    chosen = dead_letters.Selection(ids=frozenset({event_id}))

    async def run(*, force: bool) -> dead_letters.RunResult:
        return await dlq.replay(
            connection,
            chosen,
            audit=audit,
            execute=True,
            rate_per_second=100,
            operator=Operator("ops", "test-host"),
            comment=None,
            rules=dead_letters.ReplayRules(replay_limit=3, force=force),
            on_refused=refusals.append,
        )

    refused = await run(force=False)
    assert (refused.matched, refused.done, refused.refused) == (1, 0, 1)
    assert refusals[0].reason == (
        f"{event_id} in {ORDER_PLACED_DEAD_LETTER_QUEUE} was replayed 3 time(s), the limit is 3 "
        "(FULFILMENT_REPLAY_LIMIT): refused, left in the dead-letter queue; add --force to "
        "replay it again"
    )
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    assert await audit_rows(audit) == []

    forced = await run(force=True)
    assert (forced.done, forced.refused) == (1, 0)
    channel = await connection.channel()
    replayed = await (await channel.get_queue(ORDER_PLACED_QUEUE)).get(no_ack=True)
    await channel.close()
    assert replayed.headers[h.REPLAY_COUNT] == 4


async def test_a_replay_counts_the_audit_when_the_header_was_lost(connection, audit) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(connection, body, message_id=event_id)  # no replay count
    async with audit.begin() as db:
        for _ in range(2):
            await db.execute(
                sa.text(
                    "INSERT INTO dead_letter_audit (run_id, action, event_id, failure_class,"
                    " exception_type, reason, headers, body, operator)"
                    " VALUES (gen_random_uuid(), 'replayed', :event_id, 'permanent', 'E', 'r',"
                    " '{}', '', 'ops')"
                ),
                {"event_id": event_id},
            )
    refusals: list[dead_letters.Refusal] = []

    result = await dlq.replay(
        connection,
        dead_letters.Selection(ids=frozenset({event_id})),
        audit=audit,
        execute=True,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment=None,
        rules=dead_letters.ReplayRules(replay_limit=2),
        on_refused=refusals.append,
    )

    assert (result.done, result.refused) == (0, 1)
    assert "was replayed 2 time(s), the limit is 2" in refusals[0].reason


async def test_a_replay_refuses_a_dead_letter_older_than_the_processed_id_retention_even_forced(
    connection, audit
) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(
        connection,
        body,
        message_id=event_id,
        dead_lettered_at=datetime.now(UTC) - timedelta(days=31),
    )
    refusals: list[dead_letters.Refusal] = []

    result = await dlq.replay(
        connection,
        dead_letters.Selection(everything=True),
        audit=audit,
        execute=True,
        rate_per_second=100,
        operator=Operator("ops", "test-host"),
        comment=None,
        rules=dead_letters.ReplayRules(force=True, max_age_seconds=30 * 86_400),
        on_refused=refusals.append,
    )

    assert (result.done, result.refused) == (0, 1)
    assert refusals[0].reason == (
        f"{event_id} in {ORDER_PLACED_DEAD_LETTER_QUEUE} was dead-lettered 31d ago, longer than"
        " the processed-id retention (FULFILMENT_PROCESSED_ID_RETENTION_SECONDS=2592000 s): its "
        "inbox row may be pruned, so a replay could apply it twice; refused, left in the "
        "dead-letter queue (--force does not apply)"
    )
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)


async def test_dlq_list_says_when_the_virtual_host_has_none_of_the_service_s_queues(
    private_vhost_url: str,
) -> None:
    from fulfilment.tools.dlq_commands import list_command  # noqa: PLC0415 - this test only

    lines: list[str] = []
    await list_command(private_vhost_url, as_json=False, echo=lines.append)

    assert lines == [
        "the dead-letter queues are empty",
        (
            f"note: no queue {', '.join(DEAD_LETTER_QUEUES)} in this virtual host: is"
            " FULFILMENT_AMQP_URL the service's? (the worker declares them at start)"
        ),
    ]


async def test_a_walk_leaves_each_dead_letter_only_what_the_ttl_left_it(connection) -> None:
    """The copy a walk puts back expires when the original would have (the TTL counted from
    when it was dead-lettered), so a DLQ that is listed every day still drops each dead letter
    after the TTL. One that outlived the TTL already (a DLQ without the policy) is not dropped
    by a walk: its copy carries no expiration, and the queue's own TTL decides."""
    now = datetime.now(UTC)
    young_body, young = an_event()
    old_body, old = an_event()
    await put_service_dead_letter(
        connection, young_body, message_id=young, dead_lettered_at=now - timedelta(days=3)
    )
    await put_service_dead_letter(
        connection, old_body, message_id=old, dead_lettered_at=now - timedelta(days=20)
    )
    everything = dead_letters.Selection(everything=True)

    groups = await dlq.list_groups(
        connection, [ORDER_PLACED_DEAD_LETTER_QUEUE]
    )  # the 14 days' default
    assert sum(group.count for group in groups) == 2
    # Read without setting an expiration of its own: each copy keeps the one it was given.
    letters = await dlq.find(
        connection, everything, [ORDER_PLACED_DEAD_LETTER_QUEUE], ttl_seconds=None
    )
    expirations = {letter.message.message_id: letter.message.expiration for letter in letters}
    assert expirations.keys() == {young, old}
    assert expirations[old] is None
    assert expirations[young] is not None
    assert abs(expirations[young] - timedelta(days=11).total_seconds()) < 60, expirations

    # A TTL that leaves the young one two seconds: gone after them, however often it was walked.
    ttl = timedelta(days=3).total_seconds() + 2
    await dlq.list_groups(connection, [ORDER_PLACED_DEAD_LETTER_QUEUE], ttl_seconds=ttl)
    await asyncio.sleep(2.5)
    letters = await dlq.find(
        connection, everything, [ORDER_PLACED_DEAD_LETTER_QUEUE], ttl_seconds=None
    )
    assert [letter.message.message_id for letter in letters] == [old]


async def test_a_second_walk_of_the_same_dlq_is_refused_until_the_first_ends_or_dies(
    connection, amqp_url: str
) -> None:
    body, event_id = an_event()
    await put_service_dead_letter(connection, body, message_id=event_id)
    lock = f"{ORDER_PLACED_DEAD_LETTER_QUEUE}{WALK_LOCK_SUFFIX}"

    async with (
        walk_queue(connection, ORDER_PLACED_DEAD_LETTER_QUEUE),
        await aio_pika.connect(amqp_url) as other,
    ):
        with pytest.raises(WalkInProgressError) as refused:
            await dlq.list_groups(other, [ORDER_PLACED_DEAD_LETTER_QUEUE])
        assert str(refused.value) == (
            "another `fulfilment dlq` command is walking"
            f" {ORDER_PLACED_DEAD_LETTER_QUEUE} (it holds the exclusive queue {lock}); run it"
            " again when that one has ended"
        )
        # Another DLQ is not locked.
        assert await dlq.list_groups(other, [ORDER_SHIPPED.dead_letter_queue]) == []
    assert await queue_state(connection, lock) is None  # deleted at the end

    # A walker whose connection dies frees the lock with it.
    dying = await aio_pika.connect(amqp_url)
    held = walk_queue(dying, ORDER_PLACED_DEAD_LETTER_QUEUE)
    await held.__aenter__()
    await dying.close()
    groups = await dlq.list_groups(connection, [ORDER_PLACED_DEAD_LETTER_QUEUE])
    assert [group.count for group in groups] == [1]  # the dead letter is still there, once
    await held.__aexit__(None, None, None)


@pytest.mark.parametrize(
    ("command", "chosen"),
    [
        ("replay --yes", dead_letters.Selection(ids=frozenset({"no-such-event"}))),
        ("replay", dead_letters.Selection(ids=frozenset({"no-such-event"}))),
        ("purge --yes", dead_letters.Selection(group="poison/NoSuchError")),
        ("show", dead_letters.Selection(ids=frozenset({"no-such-event"}))),
    ],
)
async def test_an_id_or_group_that_matches_no_dead_letter_fails_in_one_line(
    connection,
    audit,
    amqp_url: str,
    clean_database: str,
    command: str,
    chosen: dead_letters.Selection,
) -> None:
    from fulfilment.adapters.postgres.engine import DatabaseOptions  # noqa: PLC0415 - this test
    from fulfilment.tools.command import CommandError, ToolOptions  # noqa: PLC0415 - this test
    from fulfilment.tools.dlq_commands import (  # noqa: PLC0415 - this test only
        purge_command,
        replay_command,
        show_command,
    )

    body, _ = an_event()
    await put_service_dead_letter(connection, body, message_id="m-1")
    options = ToolOptions(
        amqp_url=amqp_url,
        database=DatabaseOptions(clean_database, 5.0, 5.0, 5.0, 5.0, 2),
        consumer="fulfilment",
    )
    lines: list[str] = []
    verb, *flags = command.split()
    execute = flags == ["--yes"]
    run = {
        "replay": lambda: replay_command(
            options,
            chosen,
            execute=execute,
            rate_per_second=100.0,
            operator=None,
            comment=None,
            echo=lines.append,
        ),
        "purge": lambda: purge_command(
            options, chosen, execute=execute, operator=None, comment=None, echo=lines.append
        ),
        "show": lambda: show_command(amqp_url, chosen, limit=10, as_json=False, echo=lines.append),
    }[verb]

    with pytest.raises(CommandError) as failed:
        await run()

    # A typo is not "replayed 0 of 0 dead letter(s)" with exit 0.
    assert failed.value.exit_code == 1
    assert str(failed.value) == (
        f"no dead letter matches {chosen.describe()} in {', '.join(DEAD_LETTER_QUEUES)}"
    )
    assert lines == []
    assert await eventually_depth(connection, ORDER_PLACED_DEAD_LETTER_QUEUE, 1)
    assert await audit_rows(audit) == []


@pytest.mark.usefixtures("connection")  # the topology, its DLQs emptied
async def test_all_on_empty_dead_letter_queues_is_no_failure(amqp_url: str) -> None:
    from fulfilment.tools.dlq_commands import show_command  # noqa: PLC0415 - this test only

    lines: list[str] = []
    await show_command(
        amqp_url,
        dead_letters.Selection(everything=True),
        limit=10,
        as_json=False,
        echo=lines.append,
    )

    assert lines == ["no dead letter matches"]
