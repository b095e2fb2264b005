"""Helpers of the relay's tests: relay processes, outbox rows, a queue on ``fulfilment.events``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import EVENTS_EXCHANGE
from tests.e2e.harness import WorkerProcess, free_port, program

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))


@dataclass
class OutboxEvent:
    """An outbox row as a test wrote it: what the message published from it must carry."""

    event_id: uuid.UUID
    order_id: uuid.UUID
    routing_key: str
    body: dict[str, Any]
    traceparent: str | None


def event_body(routing_key: str, order_id: uuid.UUID, event_id: uuid.UUID) -> dict[str, Any]:
    """A result event's body as the SQL functions write it (product contract, "Result events")."""
    body: dict[str, Any] = {
        "version": 1,
        "event_id": str(event_id),
        "causation_id": str(uuid.uuid4()),
        "order_id": str(order_id),
        "occurred_at": datetime.now(UTC).isoformat(),
    }
    if routing_key == "stock.rejected":
        body |= {"reason": "insufficient_stock", "skus": ["A-1"]}
    elif routing_key == "stock.released":
        body |= {"lines": [{"sku": "A-1", "quantity": 1}], "order_status": "released"}
    else:
        body |= {"lines": [{"sku": "A-1", "quantity": 1}]}
    return body


async def insert_outbox(
    db: asyncpg.Connection,
    rows: list[tuple[uuid.UUID, str]],
    *,
    traceparent: str | None = None,
) -> list[OutboxEvent]:
    """Write one outbox row per ``(order_id, routing_key)``, in this order (so in ``id`` order),
    in one transaction that notifies ``fulfilment_outbox``, as the SQL functions do."""
    events = []
    async with db.transaction():
        for order_id, routing_key in rows:
            event_id = uuid.uuid4()
            body = event_body(routing_key, order_id, event_id)
            await db.execute(
                "INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)"
                " VALUES ($1, $2, $3, $4::jsonb, $5)",
                event_id,
                order_id,
                routing_key,
                json.dumps(body),
                traceparent,
            )
            events.append(OutboxEvent(event_id, order_id, routing_key, body, traceparent))
        await db.execute("SELECT pg_notify('fulfilment_outbox', '')")
    return events


async def bind_events_queue(
    connection: aio_pika.abc.AbstractConnection, *routing_keys: str
) -> aio_pika.abc.AbstractQueue:
    """A new exclusive queue bound to ``fulfilment.events`` with ``routing_keys`` (``#``)."""
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(exclusive=True)
    for key in routing_keys or ("#",):
        await queue.bind(exchange, key)
    return queue


async def take(
    queue: aio_pika.abc.AbstractQueue, count: int, timeout: float = 60
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """``count`` messages from ``queue``, acknowledged, in arrival order; fails when short."""
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout
    while len(taken) < count and time.monotonic() < deadline:
        message = await queue.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.1)
            continue
        taken.append(message)
    if len(taken) < count:
        pytest.fail(f"{len(taken)} of {count} messages arrived within {timeout:g} s")
    return taken


async def take_events(
    queue: aio_pika.abc.AbstractQueue, expected: set[str], timeout: float = 120
) -> Counter[str]:
    """Every message of ``queue`` by ``message_id``, consumed until each of ``expected`` came
    and a second passed without another (so duplicates in flight are counted too)."""
    received: Counter[str] = Counter()
    last = time.monotonic()

    async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal last
        received[str(message.message_id)] += 1
        last = time.monotonic()

    tag = await queue.consume(take, no_ack=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if expected <= set(received) and time.monotonic() - last > 1:
                break
            await asyncio.sleep(0.1)
    finally:
        await queue.cancel(tag)
    return received


async def unpublished(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))


class RelayProcess(WorkerProcess):
    """One ``fulfilment relay`` child with its own HTTP port and log file.

    With a crash plan in ``env`` the child is the fault suite's crashing relay (``program``).
    """

    def start(self, *, wait_ready: bool = True) -> None:
        self.env["FULFILMENT_RELAY_HTTP_PORT"] = str(self.port)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                program("relay", self.env, self.python), env=self.env, stdout=log, stderr=log
            )
        if not wait_ready:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"relay exited with {self.process.returncode}: {self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.2)
        pytest.fail(f"relay not ready within 60 s: {self.log_tail()}")

    def readiness(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/health/ready", timeout=2
            ) as response:
                return dict(json.loads(response.read()))
        except OSError:
            return {}

    def metric(self, name: str, labels: str = "") -> float:
        """The value of a series of ``/metrics``; ``labels`` as written: ``reason="returned"``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as page:
            text = page.read().decode()
        series = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        msg = f"{series} not in /metrics"
        raise AssertionError(msg)


def spawn_relay(
    relays: list[RelayProcess], env: dict[str, str], tmp_path: Path, *, wait_ready: bool = True
) -> RelayProcess:
    relay = RelayProcess(dict(env), tmp_path / f"relay-{len(relays)}.log")
    relays.append(relay)
    relay.start(wait_ready=wait_ready)
    return relay


def lifecycle_rows(orders: int) -> list[tuple[uuid.UUID, str]]:
    """Rows of ``orders`` orders, interleaved: reserved, released, shipped for each."""
    ids = [uuid.uuid4() for _ in range(orders)]
    return [
        (order_id, key)
        for key in ("stock.reserved", "stock.released", "stock.shipped")
        for order_id in ids
    ]


def assert_in_order_per_order(
    messages: list[aio_pika.abc.AbstractIncomingMessage], events: list[OutboxEvent]
) -> None:
    """Per order, the first arrival of each event follows the outbox's order (``events``)."""
    first_seen: list[str] = []
    for message in messages:
        if message.message_id not in first_seen:
            first_seen.append(str(message.message_id))
    assert sorted(first_seen) == sorted(str(event.event_id) for event in events)
    for order_id in {event.order_id for event in events}:
        expected = [str(e.event_id) for e in events if e.order_id == order_id]
        assert [m for m in first_seen if m in expected] == expected


class TcpGate:
    """A TCP proxy on a fixed local port to ``host:port`` that a test closes and opens again.

    Closed (as it starts), nothing listens on :attr:`port`, so a connection is refused as by a
    server that is down; :meth:`close` also cuts the connections that went through it.
    """

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def open(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        self._writers += [client_writer, server_writer]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))
