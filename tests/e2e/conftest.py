"""Fixtures of the end-to-end tests: worker processes and a broker connection."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aio_pika
import pytest
from harness import WorkerProcess

from fulfilment.contracts.topology import DEAD_LETTER_QUEUE, MAIN_QUEUE


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes of one test (``harness.spawn`` adds them); all are killed at the end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop_quietly()


@pytest.fixture
async def broker(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    try:
        yield connection
    finally:
        channel = await connection.channel()
        for name in (MAIN_QUEUE, DEAD_LETTER_QUEUE):
            with contextlib.suppress(Exception):
                await (await channel.get_queue(name, ensure=True)).purge()
        await connection.close()
