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


def run_script(
    amqp_url: str | None, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "FULFILMENT_AMQP_URL"}
    if amqp_url is not None:
        env["FULFILMENT_AMQP_URL"] = amqp_url
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=cwd,
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


async def test_a_queue_bound_to_one_routing_key_takes_only_that_kind(amqp_url: str) -> None:
    queue_name = f"try.shipments-{uuid.uuid4().hex[:8]}"
    result = await asyncio.to_thread(
        run_script, amqp_url, queue_name, "--routing-key", "stock.shipped"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"queue {queue_name} bound to {EVENTS_EXCHANGE} with stock.shipped\n"

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        for routing_key in ("stock.reserved", "stock.shipped"):
            await exchange.publish(
                aio_pika.Message(routing_key.encode(), type=routing_key), routing_key=routing_key
            )
        queue = await channel.get_queue(queue_name)
        message = await queue.get(timeout=5)
        assert message.body == b"stock.shipped"
        await message.ack()
        assert await queue.get(fail=False, timeout=1) is None
        await queue.delete()


def test_an_unreachable_broker_exits_3_with_one_line() -> None:
    result = run_script("amqp://guest:guest@127.0.0.1:1/", "try.result-events")

    assert result.returncode == 3
    assert result.stderr.startswith("bind-result-events: ")
    assert result.stderr.count("\n") == 1


def test_the_broker_url_in_the_env_file_is_the_one_it_binds_on(tmp_path: Path) -> None:
    # A URL only the .env file names: a closed port, so the run shows which URL it used.
    (tmp_path / ".env").write_text("FULFILMENT_AMQP_URL=amqp://guest:guest@127.0.0.1:1/\n")

    result = run_script(None, "try.result-events", cwd=tmp_path)

    assert result.returncode == 3
    assert "127.0.0.1:1" in result.stderr


def test_a_virtual_host_the_broker_refuses_exits_4_as_the_service_does(amqp_url: str) -> None:
    missing = amqp_url.rsplit("/", 1)[0] + f"/no-such-vhost-{uuid.uuid4().hex[:8]}"

    result = run_script(missing, "try.result-events")

    assert result.returncode == 4, result.stderr
    assert "virtual host" in result.stderr
    assert result.stderr.count("\n") == 1


def test_an_invalid_setting_exits_2_naming_the_variable(tmp_path: Path) -> None:
    result = run_script("http://not-amqp/", "try.result-events", cwd=tmp_path)

    assert result.returncode == 2
    assert "FULFILMENT_AMQP_URL" in result.stderr
