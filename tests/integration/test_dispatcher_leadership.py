"""One active dispatcher per database: the advisory lock, a standby, and the take-over."""

from __future__ import annotations

import asyncio

import pytest

from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.dispatcher.leadership import Leadership, Role

pytestmark = pytest.mark.postgres


async def test_one_replica_is_active_and_a_standby_takes_over_when_it_stops(
    clean_database: str,
) -> None:
    url = asyncpg_dsn(clean_database)
    replicas = [Leadership(url, connect_timeout_seconds=2, poll_seconds=0.1) for _ in range(2)]
    stops = [asyncio.Event(), asyncio.Event()]
    active_at: list[int] = []
    standbys = [0, 0]

    def runner(number: int):
        async def active(lost: asyncio.Event) -> None:
            active_at.append(number)
            done = [asyncio.create_task(lost.wait()), asyncio.create_task(stops[number].wait())]
            await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.cancel()

        async def standby() -> None:
            standbys[number] += 1

        return asyncio.create_task(replicas[number].run(active, standby, stops[number]))

    first = runner(0)
    await asyncio.sleep(0.5)
    second = runner(1)
    await asyncio.sleep(0.5)
    assert [replica.role for replica in replicas] == [Role.ACTIVE, Role.STANDBY]
    assert active_at == [0]
    assert standbys[1] > 0
    stops[0].set()
    await asyncio.wait_for(first, 5)
    for _ in range(50):
        if replicas[1].role is Role.ACTIVE:
            break
        await asyncio.sleep(0.05)
    assert replicas[1].role is Role.ACTIVE
    assert active_at == [0, 1]
    stops[1].set()
    await asyncio.wait_for(second, 5)
