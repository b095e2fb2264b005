"""The lock session's ping: what counts as a lost session (the classification alone)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, Gauge

from fulfilment.pump.leader import LockOptions, Pump, PumpEvents


class _Idle(Pump):
    """A pump with nothing of its own to do: the machine alone."""

    name = "idle"
    events = PumpEvents(*(f"idle.{event}" for event in PumpEvents.__slots__))

    def readiness(self) -> dict[str, bool | str]:
        return {"role": str(self.role)}

    def ready(self) -> bool:
        return True

    async def stand_by(self, session: asyncpg.Connection) -> None:
        pass

    async def work(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        pass


class _Connection:
    """Answers every ping with ``error``: a stand-in for the lock's asyncpg session."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.pings: list[tuple[str, float]] = []

    async def fetchval(self, query: str, *, timeout: float) -> int:
        self.pings.append((query, timeout))
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        # What a server killed while it answers leaves in asyncpg's protocol (a failover).
        asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        asyncpg.exceptions.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation"
        ),
        asyncpg.exceptions.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        TimeoutError(),
        ConnectionResetError(),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_ping_that_fails_marks_the_session_lost_and_stops_pinging(error):
    lock = LockOptions("postgresql://unused", key=1, connect_timeout_seconds=1, poll_seconds=0.01)
    pump = _Idle(lock, Gauge("idle_active", "", registry=CollectorRegistry()))
    connection = _Connection(error)
    lost = asyncio.Event()

    await asyncio.wait_for(pump._ping(connection, lost), 2)  # type: ignore[arg-type]

    assert lost.is_set()
    assert connection.pings == [("SELECT 1", 1)]  # once, within the connect timeout
