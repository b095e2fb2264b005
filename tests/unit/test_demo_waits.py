"""What the demo's look-ups at the broker do while it waits for the worker to answer a run.

Another consumer on the queue stops it at once; a connection the broker dropped ends it with
one line and exit 3. The connection is a fake that fails as aio-pika's does once the broker
dropped it: aio-pika still calls it open, aiormq's connection under it is closed, and a
channel asked of it raises ``RuntimeError('<Connection ...> closed')``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from aiormq.exceptions import ConnectionClosed

from fulfilment.adapters.rabbitmq.inspection import QueueState
from fulfilment.demo import player as demo
from fulfilment.demo.errors import DemoError
from fulfilment.entrypoints.cli.exits import run

DAY = SimpleNamespace(name="2010-12-01")

REASON = ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure")


@dataclass
class DroppedConnection:
    """An aio-pika connection whose broker closed it with :data:`REASON`."""

    is_closed: bool = False  # as aio-pika 10.2.1 says after the drop
    transport: Any = None

    def __post_init__(self) -> None:
        closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.set_exception(REASON)
        underlay = SimpleNamespace(is_closed=True, closing=closing)
        self.transport = SimpleNamespace(connection=underlay)

    async def channel(self) -> None:
        msg = '<Connection: "amqp://guest:******@rabbit:5672/shop" at 0x7f> closed'
        raise RuntimeError(msg)


def player(connection: object, echo: list[str] | None = None) -> demo.Player:
    return demo.Player(
        connection=connection,  # type: ignore[arg-type]
        amqp_url="amqp://guest:s3cret@rabbit:5672/shop",
        stock=None,  # type: ignore[arg-type]
        consumer="fulfilment",
        worker=None,  # type: ignore[arg-type]
        handoff=None,  # type: ignore[arg-type]
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


@dataclass
class SilentWorker:
    """A worker that answers ``answers`` deliveries of ``order_placed`` and then no more."""

    answers: list[int]
    log: str = "/tmp/worker.log"  # noqa: S108 - named in messages only

    async def answered(self) -> Counter[str]:
        count = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return Counter(order_placed=count)


def watched(monkeypatch: pytest.MonkeyPatch, consumers: int) -> None:
    """The demo looks every poll, and finds ``consumers`` on each queue."""

    async def queue_state(_connection: object, name: str) -> QueueState:
        return QueueState(name, ready=3, consumers=consumers)

    monkeypatch.setattr(demo, "queue_state", queue_state)
    monkeypatch.setattr(demo, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(demo, "SETTLE_POLL_SECONDS", 0.001)


async def test_another_consumer_on_the_queue_stops_the_demo_at_the_first_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watched(monkeypatch, consumers=2)
    lines: list[str] = []
    playing = player(object(), lines)
    playing._worker = SilentWorker([0])  # type: ignore[assignment]

    with pytest.raises(DemoError) as stopped:
        async with asyncio.timeout(5):  # the stall would take SETTLE_STALL_SECONDS
            await playing._settle(DAY, "order_placed", answered=3)

    assert str(stopped.value) == (
        "2010-12-01: waiting for 3 order_placed events; 2 consumers on fulfilment.order-placed:"
        " another worker takes the demo's events (stop it, or give the demo a virtual host of"
        " its own in FULFILMENT_AMQP_URL)"
    )
    assert lines == []


async def test_the_demo_s_own_worker_alone_on_the_queue_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watched(monkeypatch, consumers=1)
    lines: list[str] = []
    playing = player(object(), lines)
    playing._worker = SilentWorker([0, 0, 1, 3])  # type: ignore[assignment]

    await playing._settle(DAY, "order_placed", answered=3)

    assert lines[:1] == ["2010-12-01: waiting for 3 order_placed events"]
