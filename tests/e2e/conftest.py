"""Fixtures of the end-to-end tests: worker and relay processes, and a broker connection."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aio_pika
import pytest
from harness import WorkerProcess

from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes of one test (``harness.spawn`` adds them); all are killed at the end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop_quietly()


@pytest.fixture
def relay_env(worker_env: dict[str, str]) -> dict[str, str]:
    """A worker's environment, with the relay polling every 0.2 s (tests wait less)."""
    return {**worker_env, "FULFILMENT_RELAY_POLL_SECONDS": "0.2"}


@pytest.fixture
async def broker(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    try:
        yield connection
    finally:
        for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
            # A channel each: a queue that is missing closes the channel that asked for it.
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                await (await channel.get_queue(name, ensure=True)).purge()
            with contextlib.suppress(Exception):
                await channel.close()
        await connection.close()
