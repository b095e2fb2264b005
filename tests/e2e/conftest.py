"""Fixtures of the end-to-end tests: a worker environment, a broker connection, the database."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import aio_pika
import asyncpg
import pytest
from harness import FAST_SETTINGS, WorkerProcess
from sqlalchemy.engine import make_url

from fulfilment.entrypoints.topology import DEAD_LETTER_QUEUE, MAIN_QUEUE


@pytest.fixture
def worker_env(clean_database: str, amqp_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = clean_database
    env["FULFILMENT_AMQP_URL"] = amqp_url
    return env


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


@pytest.fixture
async def db(clean_database: str) -> AsyncIterator[asyncpg.Connection]:
    url = make_url(clean_database).set(drivername="postgresql")
    connection = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        yield connection
    finally:
        await connection.close()
