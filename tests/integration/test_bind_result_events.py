"""``scripts/bind-result-events``: the README's way to take the result events, trying it alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import aio_pika
import pytest

from fulfilment.contracts.topology import EVENTS_EXCHANGE

pytestmark = pytest.mark.rabbitmq

SCRIPT = Path(__file__).parents[2] / "scripts" / "bind-result-events"


def run_script(amqp_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**os.environ, "FULFILMENT_AMQP_URL": amqp_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_queue_it_binds_takes_a_result_event_published_with_mandatory(
    amqp_url: str,
) -> None:
    queue_name = f"try.result-events-{uuid.uuid4().hex[:8]}"
    result = await asyncio.to_thread(run_script, amqp_url, queue_name)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"queue {queue_name} bound to {EVENTS_EXCHANGE} with #\n"

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(on_return_raises=True)
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        await exchange.publish(
            aio_pika.Message(b"{}", type="stock.reserved"),
            routing_key="stock.reserved",
            mandatory=True,
        )
        queue = await channel.get_queue(queue_name)
        message = await queue.get(timeout=5)
        assert message.body == b"{}"
        await message.ack()
        await queue.delete()


def test_an_unreachable_broker_exits_3_with_one_line() -> None:
    result = run_script("amqp://guest:guest@127.0.0.1:1/", "try.result-events")

    assert result.returncode == 3
    assert result.stderr.startswith("bind-result-events: ")
    assert result.stderr.count("\n") == 1
