"""Helpers of the end-to-end tests: worker processes, publishing, looking into queues."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.topology import (
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)

FAST_SETTINGS = {
    "FULFILMENT_PREFETCH_COUNT": "16",
    "FULFILMENT_DELIVERY_LIMIT": "5",
    "FULFILMENT_HANDLER_DEADLINE_SECONDS": "8",
    "FULFILMENT_RETRY_BUDGET_SECONDS": "6",
    "FULFILMENT_GRACEFUL_TIMEOUT_SECONDS": "10",
    "FULFILMENT_ORCHESTRATOR_GRACE_PERIOD_SECONDS": "15",
    "FULFILMENT_DATABASE_STATEMENT_TIMEOUT_SECONDS": "3",
    "FULFILMENT_DATABASE_LOCK_TIMEOUT_SECONDS": "1",
    "FULFILMENT_LOG_FORMAT": "json",
}


CRASH_PLAN_VARIABLE = "FULFILMENT_TEST_CRASH_PLAN"
"""Where a scenario puts the fault suite's crash plan (``tests/faults/crash_plan.py``)."""

CRASHING = Path(__file__).parents[1] / "faults" / "crashing.py"
"""The fault suite's entry of the worker and the relay, run instead of the programs when the
environment holds a crash plan: the production roots with the plan's crash points."""


def program(name: str, env: dict[str, str], python: str = sys.executable) -> list[str]:
    """The command that starts ``name`` (``worker``, ``relay`` or ``dispatcher``) with ``env``.

    The program installed beside ``python`` (this suite's, or another release's environment:
    ``tests/upgrade``), or the fault suite's crashing one when ``env`` holds a plan.
    """
    if env.get(CRASH_PLAN_VARIABLE):
        return [python, str(CRASHING), name]
    if name == "worker":
        return [python, "-m", "fulfilment"]
    return [str(Path(python).with_name("fulfilment")), name]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class WorkerProcess:
    """One ``python -m fulfilment`` child with its own HTTP port and log file.

    With a crash plan in ``env`` (:data:`CRASH_PLAN_VARIABLE`) the child is the fault suite's
    crashing worker (:func:`program`). ``python`` is the interpreter of the environment the
    program is installed in: this suite's, or a previous release's (``tests/upgrade``).
    """

    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    python: str = sys.executable

    def start(self, *, wait_ready: bool = True) -> None:
        """Start the process; wait until it reports ready unless it may crash at once."""
        self.env["FULFILMENT_HTTP_PORT"] = str(self.port)
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                program("worker", self.env, self.python), env=self.env, stdout=log, stderr=log
            )
        if not wait_ready:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"worker exited with {self.process.returncode}: {self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.2)
        pytest.fail(f"worker not ready within 60 s: {self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/health/ready", timeout=2
            ) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def terminate(self, timeout: float = 30) -> tuple[int, float]:
        """SIGTERM; return the exit code and the seconds it took to exit."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        return code, time.monotonic() - started

    def stop_pressing(self, signum: int, *, every: float = 0.02, timeout: float = 30) -> int:
        """Send ``signum`` every ``every`` seconds until the process exits; its exit code.

        As an operator pressing Ctrl-C again and again does, or ``uv run``, which forwards a
        SIGINT to its child twice: one of them lands after the event loop has closed.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"still running {timeout} s after the first signal: {self.log_tail()}")
            self.process.send_signal(signum)
            time.sleep(every)
        return self.process.returncode

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop_quietly(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def log_tail(self, count: int = 5) -> str:
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-count:])


def spawn(workers: list[WorkerProcess], env: dict[str, str], tmp_path: Path) -> WorkerProcess:
    worker = WorkerProcess(dict(env), tmp_path / f"worker-{len(workers)}.log")
    workers.append(worker)
    worker.start()
    return worker


def order_event(
    lines: list[tuple[str, int]], *, event_id: uuid.UUID | None = None
) -> tuple[bytes, str]:
    """A valid OrderPlaced body and its event id."""
    event_id = event_id or uuid.uuid4()
    body = order_placed_body(
        event_id=event_id,
        order_id=uuid.uuid5(uuid.NAMESPACE_URL, f"order:{event_id}"),
        placed_at=datetime.now(UTC),
        lines=lines,
    )
    return body, str(event_id)


async def put_stock(db: asyncpg.Connection, levels: dict[str, int]) -> None:
    """Create stock rows with these on-hand units and nothing reserved."""
    await db.executemany(
        "INSERT INTO stock_levels (sku, on_hand) VALUES ($1, $2)", list(levels.items())
    )


async def publish(
    connection: aio_pika.abc.AbstractConnection,
    body: bytes,
    *,
    message_id: str | None = None,
    content_type: str | None = "application/json",
    headers: dict[str, Any] | None = None,
    routing_key: str = ORDER_PLACED_ROUTING_KEY,
) -> None:
    """Publish to ``orders`` persistently, confirmed, failing on an unroutable message."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        exchange = await channel.declare_exchange(
            ORDERS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        await exchange.publish(
            aio_pika.Message(
                body,
                message_id=message_id,
                content_type=content_type,
                headers=headers or {},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=routing_key,
            mandatory=True,
        )
    finally:
        await channel.close()


async def queue_depth(connection: aio_pika.abc.AbstractConnection, name: str) -> int:
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await channel.close()


async def drain_dead_letters(
    connection: aio_pika.abc.AbstractConnection, *, expect: int, timeout: float = 20
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take (and acknowledge) ``expect`` messages from the DLQ, failing after ``timeout``."""
    channel = await connection.channel()
    queue = await channel.get_queue(ORDER_PLACED_DEAD_LETTER_QUEUE, ensure=True)
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout
    while len(taken) < expect and time.monotonic() < deadline:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            await asyncio.sleep(0.2)
            continue
        taken.append(message)
    await channel.close()
    return taken


async def wait_for(predicate: Any, *, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
