"""One active pump per lock: the advisory lock, a standby, and the take-over."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, Gauge

from fulfilment.adapters.postgres.advisory_lock import DISPATCHER_LOCK_KEY
from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.pump.leader import LockOptions, Pump, PumpEvents, Role

pytestmark = pytest.mark.postgres


class Replica(Pump):
    """A pump that counts its standby duties and notes when it becomes active."""

    name = "replica"
    events = PumpEvents(*(f"replica.{event}" for event in PumpEvents.__slots__))

    def __init__(self, lock: LockOptions, number: int, active_at: list[int]) -> None:
        super().__init__(lock, Gauge("replica_active", "", registry=CollectorRegistry()))
        self.number = number
        self.active_at = active_at
        self.standbys = 0

    def readiness(self) -> dict[str, bool | str]:
        return {"role": str(self.role)}

    def ready(self) -> bool:
        return self.role is not Role.CONNECTING

    async def stand_by(self, session: asyncpg.Connection) -> None:
        del session
        self.standbys += 1

    async def work(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        del session
        self.active_at.append(self.number)
        done = [asyncio.create_task(lost.wait()), asyncio.create_task(self.stopping.wait())]
        await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.cancel()


async def test_one_replica_is_active_and_a_standby_takes_over_when_it_stops(
    clean_database: str,
) -> None:
    lock = LockOptions(
        asyncpg_dsn(clean_database),
        key=DISPATCHER_LOCK_KEY,
        connect_timeout_seconds=2,
        poll_seconds=0.1,
    )
    active_at: list[int] = []
    replicas = [Replica(lock, number, active_at) for number in range(2)]

    first = asyncio.create_task(replicas[0].run())
    await asyncio.sleep(0.5)
    second = asyncio.create_task(replicas[1].run())
    await asyncio.sleep(0.5)
    assert [replica.role for replica in replicas] == [Role.ACTIVE, Role.STANDBY]
    assert active_at == [0]
    assert replicas[1].standbys > 0
    replicas[0].stop()
    await asyncio.wait_for(first, 5)
    for _ in range(50):
        if replicas[1].role is Role.ACTIVE:
            break
        await asyncio.sleep(0.05)
    assert replicas[1].role is Role.ACTIVE
    assert active_at == [0, 1]
    replicas[1].stop()
    await asyncio.wait_for(second, 5)
