"""What the demo's look-ups at the broker do while it waits for the worker to answer a run.

The connection is a fake that fails as aio-pika's does once the broker dropped it: aio-pika
still calls it open, aiormq's connection under it is closed, and a channel asked of it raises
``RuntimeError('<Connection ...> closed')``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from aiormq.exceptions import ConnectionClosed

from fulfilment.cli import run
from fulfilment.tools import demo

REASON = ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure")


@dataclass
class DroppedConnection:
    """An aio-pika connection whose broker closed it with :data:`REASON`."""

    is_closed: bool = False  # as aio-pika 9.5 says after the drop
    transport: Any = None

    def __post_init__(self) -> None:
        closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.set_exception(REASON)
        underlay = SimpleNamespace(is_closed=True, closing=closing)
        self.transport = SimpleNamespace(connection=underlay)

    async def channel(self) -> None:
        msg = '<Connection: "amqp://guest:******@rabbit:5672/shop" at 0x7f> closed'
        raise RuntimeError(msg)


def player(connection: object, echo: list[str] | None = None) -> demo._Player:
    return demo._Player(
        connection=connection,  # type: ignore[arg-type]
        amqp_url="amqp://guest:s3cret@rabbit:5672/shop",
        warehouse=None,  # type: ignore[arg-type]
        consumer="fulfilment",
        worker=None,  # type: ignore[arg-type]
        echo=(echo if echo is not None else []).append,
    )


def test_a_connection_the_broker_dropped_exits_3_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def look() -> str:
        return await player(DroppedConnection())._other_consumers("order_placed")

    with pytest.raises(typer.Exit) as exited:
        run(look())

    assert exited.value.exit_code == 3
    assert capsys.readouterr().err == (
        "fulfilment: the connection to RabbitMQ at amqp://guest:***@rabbit:5672/shop was lost:"
        " ConnectionClosed: [Errno 320] CONNECTION_FORCED - broker forced connection closure\n"
    )


async def test_an_error_on_a_connection_still_open_is_not_taken_for_a_lost_one() -> None:
    connection = DroppedConnection()
    connection.transport.connection.is_closed = False

    with pytest.raises(RuntimeError, match="closed"):
        await player(connection)._other_consumers("order_placed")
