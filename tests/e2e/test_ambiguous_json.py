"""An order that two JSON parsers could read differently is refused, not reserved.

The field report: a body with ``lines`` twice was reserved with the last value, 900 units
where a consumer keeping the first ``lines`` read 1. Through the real worker, each such body
is dead-lettered ``permanent`` on its first delivery with a reason naming the problem, and
nothing is reserved for it.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import ORDER_PLACED_QUEUE
from tests.e2e.harness import (
    WorkerProcess,
    drain_dead_letters,
    order_event,
    publish,
    put_stock,
    spawn,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


def twice(key_and_value: bytes) -> bytes:
    body, _ = order_event([("85123A", 1)])
    return body[:-1] + b", " + key_and_value + b"}"


AMBIGUOUS = {
    "lines-twice": (twice(b'"lines": [{"sku": "85123A", "quantity": 900}]'), "'lines'"),
    "version-true": (
        order_event([("85123A", 1)])[0].replace(b'"version":1', b'"version":true'),
        "version: true",
    ),
    "version-float": (
        order_event([("85123A", 1)])[0].replace(b'"version":1', b'"version":1.0'),
        "version: 1.0",
    ),
    "nan-extension": (twice(b'"extension": NaN'), "NaN"),
}


async def test_ambiguous_orders_are_dead_lettered_as_permanent_and_nothing_is_reserved(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await put_stock(db, {"85123A": 1_000})
    spawn(workers, worker_env, tmp_path)
    for name, (body, _) in AMBIGUOUS.items():
        assert body.count(b"version") == 1, name  # the body is what the case says
        await publish(broker, body, message_id=name)
    valid, valid_id = order_event([("85123A", 2)])
    await publish(broker, valid, message_id=valid_id)

    letters = await drain_dead_letters(broker, expect=len(AMBIGUOUS))

    by_id = {letter.message_id: letter for letter in letters}
    assert set(by_id) == set(AMBIGUOUS)
    for name, (body, reason) in AMBIGUOUS.items():
        headers = by_id[name].headers
        assert by_id[name].body == body
        assert headers["x-fulfilment-failure-class"] == "permanent"
        assert headers["x-fulfilment-delivery-count"] == 0
        assert headers["x-fulfilment-original-queue"] == ORDER_PLACED_QUEUE
        assert reason in str(headers["x-fulfilment-reason"]), name

    async def valid_reserved() -> bool:
        return await db.fetchval("SELECT count(*) FROM reservations") == 1

    await wait_for(valid_reserved, what="the valid order reserved")
    await asyncio.sleep(0.5)
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 2
    assert (
        await db.fetchval(
            "SELECT count(*) FROM reservations WHERE event_id <> $1", uuid.UUID(valid_id)
        )
        == 0
    )
