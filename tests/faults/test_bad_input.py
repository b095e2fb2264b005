"""Bad input through the real broker: every malformed delivery is dead-lettered on its first
delivery with a reason a person can read, the worker never stops, and the valid orders
published between them are reserved."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import pytest
from faultlib import LIMIT, Cluster, connect_db, declare, inbox_count
from harness import publish, put_stock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import parse_order_placed
from fulfilment.contracts.order_placed import MAX_LINES, order_placed_body
from fulfilment.contracts.topology import ORDER_PLACED_DEAD_LETTER_QUEUE
from fulfilment.routes.handling import MalformedEventError


def valid_event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "version": 1,
        "event_id": str(uuid.uuid4()),
        "order_id": str(uuid.uuid4()),
        "placed_at": "2010-12-01T08:26:00+00:00",
        "lines": [{"sku": "85123A", "quantity": 1}],
    }
    event.update(changes)
    return event


def encoded(document: object) -> bytes:
    return json.dumps(document).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)

malformed_bodies = st.one_of(
    st.binary(max_size=512),  # random bytes
    st.binary(min_size=1, max_size=64).map(lambda b: b"\xff\xfe" + b),  # not UTF-8
    json_values.filter(lambda v: not isinstance(v, dict)).map(encoded),  # JSON, not an object
    st.integers(min_value=2).map(lambda v: encoded(valid_event(version=v))),  # unknown version
    st.integers(max_value=0).map(
        lambda q: encoded(valid_event(lines=[{"sku": "85123A", "quantity": q}]))
    ),
    st.integers(min_value=1_000_001).map(
        lambda q: encoded(valid_event(lines=[{"sku": "85123A", "quantity": q}]))
    ),
    st.datetimes().map(lambda t: encoded(valid_event(placed_at=t.isoformat()))),  # no offset
    st.sampled_from(["", " 85123A", "85123A ", "x" * 65]).map(
        lambda sku: encoded(valid_event(lines=[{"sku": sku, "quantity": 1}]))
    ),
    st.just(b"\xef\xbb\xbf" + encoded(valid_event())),  # a byte-order mark
    st.just(b"[" * 5_000 + b"]" * 5_000),  # deep nesting
    st.just(encoded(valid_event(lines=[{"sku": "85123A", "quantity": 1}] * (MAX_LINES + 1)))),
    st.just(encoded(valid_event(lines=[]))),
    # JSON that another parser reads differently: a key twice (here `lines`, whose last value
    # the model's parser would keep), `version` or a quantity that is not a JSON integer,
    # non-JSON or out-of-range numbers anywhere.
    st.integers(min_value=1, max_value=1_000).map(
        lambda q: (
            encoded(valid_event())[:-1]
            + f', "lines": [{{"sku": "85123A", "quantity": {q}}}]}}'.encode()
        )
    ),
    st.sampled_from(["true", "1.0", "1e0", "100e-2"]).map(
        lambda v: encoded(valid_event()).replace(b'"version": 1', f'"version": {v}'.encode())
    ),
    st.sampled_from(["1.0", "true", "1e2"]).map(
        lambda q: encoded(valid_event()).replace(b'"quantity": 1', f'"quantity": {q}'.encode())
    ),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", str(2**53), str(-(2**64))]).map(
        lambda n: encoded(valid_event())[:-1] + f', "extension": {n}}}'.encode()
    ),
)

# Well-formed, but holding a value PostgreSQL cannot store as sent (issue: a NUL in a SKU was
# dead-lettered `unexpected`, after the database refused it).
unstorable_bodies = st.one_of(
    st.sampled_from(["85123A\x00", "\x00", "BANK\x00CHARGES"]).map(
        lambda sku: encoded(valid_event(lines=[{"sku": sku, "quantity": 1}]))
    ),
    st.sampled_from(
        [
            "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
            "0001-01-01T00:00:00+00:00",  # -infinity once sent
            "9999-12-31T23:59:59.999999+00:00",  # infinity once sent
            "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        ]
    ).map(lambda placed_at: encoded(valid_event(placed_at=placed_at))),
    st.sampled_from(
        ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]
    ).map(lambda placeholder: encoded(valid_event(event_id=placeholder))),
)


@given(body=st.binary(max_size=2_048), content_type=st.none() | st.text(max_size=40))
def test_any_body_and_content_type_is_either_an_event_or_a_malformed_event_error(
    body: bytes, content_type: str | None
) -> None:
    reason = None
    try:
        parse_order_placed(body, content_type)
    except MalformedEventError as error:
        reason = str(error)
    if reason is not None:  # anything else raised fails the test by itself
        assert reason
        assert "\n" not in reason


@given(body=malformed_bodies | unstorable_bodies)
def test_every_malformed_body_is_refused_with_a_one_line_reason(body: bytes) -> None:
    with pytest.raises(MalformedEventError) as refused:
        parse_order_placed(body, "application/json")
    assert "\n" not in str(refused.value)


@pytest.mark.faults
@pytest.mark.postgres
@pytest.mark.rabbitmq
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=malformed_bodies | unstorable_bodies,
    content_type=st.sampled_from([None, "application/json", "text/plain", "application/xml"]),
    headers=st.dictionaries(
        st.text(min_size=1, max_size=10).filter(lambda k: not k.startswith("x-")),
        st.text(max_size=20) | st.integers(min_value=-(2**31), max_value=2**31 - 1),
        max_size=3,
    ),
)
def test_malformed_deliveries_are_dead_lettered_on_first_delivery_and_valid_ones_go_through(
    running_worker: tuple[aio_pika.abc.AbstractRobustConnection, asyncio.AbstractEventLoop],
    body: bytes,
    content_type: str | None,
    headers: dict[str, Any],
) -> None:
    broker, loop = running_worker
    letter = loop.run_until_complete(
        _publish_and_take_dead_letter(broker, body, content_type, headers)
    )

    assert letter.body == body
    assert letter.headers["x-fulfilment-failure-class"] == "permanent"
    assert letter.headers["x-fulfilment-delivery-count"] == 0
    reason = str(letter.headers["x-fulfilment-reason"])
    assert reason
    assert len(reason) <= 1_000


def test_a_sku_with_a_nul_character_is_dead_lettered_permanent_on_its_first_delivery(
    running_worker: tuple[aio_pika.abc.AbstractRobustConnection, asyncio.AbstractEventLoop],
    clean_database: str,
) -> None:
    # The body of the field report: valid but for a NUL in the SKU, which PostgreSQL's text
    # cannot hold. It was dead-lettered `unexpected` after the database refused it.
    broker, loop = running_worker
    body = encoded(valid_event(lines=[{"sku": "85123A\u0000", "quantity": 1}]))
    assert b'"85123A\\u0000"' in body

    letter = loop.run_until_complete(
        _publish_and_take_dead_letter(broker, body, "application/json", {})
    )

    assert letter.body == body
    assert letter.headers["x-fulfilment-failure-class"] == "permanent"
    assert letter.headers["x-fulfilment-delivery-count"] == 0
    assert letter.headers["x-fulfilment-reason"] == (
        "invalid OrderPlaced v1: lines.0.sku: must not contain NUL (U+0000):"
        " PostgreSQL text cannot store it"
    )
    db = loop.run_until_complete(connect_db(clean_database))
    try:
        assert loop.run_until_complete(inbox_count(db)) == 0
    finally:
        loop.run_until_complete(db.close())


async def test_a_body_of_several_megabytes_is_dead_lettered_and_the_worker_goes_on(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    amqp_url: str,
) -> None:
    await put_stock(db, {"85123A": 100})
    await declare(amqp_url, LIMIT)
    (worker,) = cluster.start(1, wait_ready=True)
    huge = encoded(valid_event(note="x" * 3_000_000))

    letter = await _publish_and_take_dead_letter(broker, huge, "application/json", {})
    assert "exceeds the limit" in str(letter.headers["x-fulfilment-reason"])
    body = order_placed_body(
        event_id=uuid.uuid4(),
        order_id=uuid.uuid4(),
        placed_at=datetime.now(UTC),
        lines=[("85123A", 2)],
    )
    await publish(broker, body)
    await _wait(lambda: _reserved(db, 2))
    assert worker.ready()


@pytest.fixture
def running_worker(cluster: Cluster, amqp_url: str, clean_database: str) -> Any:
    """One worker for every example; a loop of the test's own, as hypothesis calls it sync."""
    loop = asyncio.new_event_loop()
    db = loop.run_until_complete(connect_db(clean_database))
    loop.run_until_complete(put_stock(db, {"85123A": 100}))
    loop.run_until_complete(declare(amqp_url, LIMIT))
    cluster.start(1, wait_ready=True)
    connection = loop.run_until_complete(aio_pika.connect_robust(amqp_url))
    yield connection, loop
    # After every malformed delivery, the worker still runs and still reserves valid orders.
    assert all(w.process is not None and w.process.poll() is None for w in cluster.workers), (
        "a malformed delivery stopped the worker"
    )
    body = order_placed_body(
        event_id=uuid.uuid4(),
        order_id=uuid.uuid4(),
        placed_at=datetime.now(UTC),
        lines=[("85123A", 3)],
    )
    loop.run_until_complete(publish(connection, body))
    loop.run_until_complete(_wait(lambda: _reserved(db, 3)))
    loop.run_until_complete(connection.close())
    loop.run_until_complete(db.close())
    loop.close()


async def _publish_and_take_dead_letter(
    broker: aio_pika.abc.AbstractConnection,
    body: bytes,
    content_type: str | None,
    headers: dict[str, Any],
) -> aio_pika.abc.AbstractIncomingMessage:
    message_id = str(uuid.uuid4())
    await publish(broker, body, message_id=message_id, content_type=content_type, headers=headers)
    channel = await broker.channel()
    queue = await channel.get_queue(ORDER_PLACED_DEAD_LETTER_QUEUE, ensure=True)
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            message = await queue.get(no_ack=True, fail=False)
            if message is not None and message.message_id == message_id:
                return message
            if message is None:
                await asyncio.sleep(0.05)
        pytest.fail(f"no dead letter for {body[:80]!r} within 20 s")
    finally:
        await channel.close()


async def _reserved(db: asyncpg.Connection, units: int) -> bool:
    value = await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'")
    return value == units


async def _wait(predicate: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
